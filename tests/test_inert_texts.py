"""Text from a recipe is inert where the tool posts it (#27 §17, §21): the problem discussion the bot opens on the Hub
(the real bot over HTTP, the real `hf-export run --push` subprocess, the Hub emulator) quotes a hostile recipe key
without a mention, an image or a link; the `hf-export init` summary escapes every table cell the one way
(`exporters.report.markdown.cell`).
"""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from tests.test_bot import REPO, bot_settings, main_update, start_bot, upload_model  # noqa: F401 (a fixture)
from tests.test_bot_outcomes import description, run_job

HOSTILE = "@everyone ![x](https://evil.example/a.png)"


def _html(text: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(text)


@pytest.mark.slow
def test_a_hostile_recipe_key_in_the_problem_discussion_mentions_and_shows_nothing(hf_env, tmp_path, start_bot):
    from tests.models import tiny_llama

    hub = hf_env
    folder = tiny_llama(tmp_path / "model", recipe=None)
    (folder / "export_config.json").write_text('{\n  "export_format": "dynamo",\n  "mode": "model",\n'
                                               f'  "{HOSTILE}": true\n}}\n')
    upload_model(hub, folder)
    bot = start_bot(bot_settings(hub, tmp_path))
    job = run_job(bot, main_update(hub), timeout=60)
    assert job.status == "failed" and "discussion #1" in job.reason, (job.reason, job.error)
    [thread] = hub.discussions(REPO)
    text = description(thread)
    row = next(line for line in text.splitlines() if line.startswith("| [4]("))
    html = _html(text.split("<!-- ")[0])
    assert "<img" not in html and not [url for url in re.findall(r'href="([^"]*)"', html) if "evil" in url], html
    assert "@everyone" not in text and "https://evil" not in text, row  # no mention, no address to link
    assert "everyone" in row and "evil.example/a.png" in row, "the key is still shown, escaped"
    rendered = _html(row)
    assert "<img" not in rendered and re.findall(r'href="([^"]*)"', rendered) == [row[6:row.index(")")]], rendered


def test_every_init_summary_cell_is_escaped_like_the_reports():
    """`hf-export init`'s summary escapes its cells with `markdown.cell` (pipes, newlines and `<`): a note quoting
    an upstream error that holds `<!--` or a tag stays text."""
    from exporters.init.decide import FormatResult
    from exporters.init.propose import InitResult
    from exporters.init.summary import render_markdown
    from exporters.report.markdown import cell
    from exporters.status import LEFT_OUT

    note = "onnx: left out — upstream said <!-- hidden | rest\nof it <b>bold</b>"
    result = InitResult(model="acme/x", family="text", mode="model", components=["model"], recipe={},
                        formats=[FormatResult("onnx", status=LEFT_OUT, reason="x")], notes=[note], elapsed_s=1.0,
                        versions={})
    markdown = render_markdown(result)
    assert f"- {cell(note, 4000)}" in markdown
    assert "<!--" not in markdown and "<b>" not in markdown
    assert "&lt;!-- hidden \\| rest of it &lt;b>bold&lt;/b>" in markdown


def test_the_reasons_an_unverified_target_gives_in_the_pr_and_card_are_inert():
    """A reason quotes the recipe's dim names and the model's inputs (`dynamic_shapes` names are the owner's
    text): the PR description and the model card show it without a mention, an image or a link."""
    from exporters.publish.texts import card_section, pr_description
    from tests.test_publish_decide import _report_target, _text_plan

    plan = _text_plan(unverified=True)
    plan.report["targets"][0] = _report_target("onnx", "unverified", [f"model: probe {HOSTILE}=64 did not run (x)"])
    for text in (card_section(plan), pr_description(plan)):
        html = _html(text.split("<!-- ")[0])
        assert "<img" not in html and "evil.example" not in "".join(re.findall(r'href="([^"]*)"', html)), html
        assert "@everyone" not in text and "https://evil" not in text
        assert "everyone" in text and "evil.example/a.png" in text, "the reason is still shown, escaped"

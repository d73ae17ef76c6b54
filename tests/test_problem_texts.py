"""What a repo that cannot be exported is told (#20 §1), as plain units: the problem from the library's errors, its
discussion text (each recipe error with its JSON path and its line linked at the commit), the decision that keeps one
discussion per repo, `OUT/problem.json` from the real CLI; and report tables that upstream text cannot hide.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.errors import RecipeError, RemoteCodeError
from exporters.publish import HubView, ThreadState, decide, texts
from exporters.publish.markers import MARKER_TAG, parse_marker
from exporters.publish.problem import (
    Problem,
    problem_description,
    problem_from_error,
    problem_marker,
    problem_title,
    read_problem,
)
from exporters.recipe.load import load_recipe_file
from exporters.report.markdown import render_markdown
from tests.conftest import run_cli

SHA = "c0ffee" + "0" * 34
HUB = "https://hub.example"
BAD_RECIPE = """{
  "exports": [
    {
      "export_format": "onnx",
      "opset_version": "eighteen"
    }
  ],
  "<!--": 1
}
"""


def _recipe_problem(tmp_path: Path) -> Problem:
    path = tmp_path / "export_config.json"
    path.write_text(BAD_RECIPE)
    try:
        load_recipe_file(path)
    except RecipeError as err:
        problem = problem_from_error(err)
        assert problem is not None
        return problem
    raise AssertionError("the recipe should not validate")


def test_recipe_problem_lists_each_error_with_its_path_and_linked_line(tmp_path):
    problem = _recipe_problem(tmp_path)
    assert (problem.kind, problem.file) == ("recipe", "export_config.json")
    assert problem.lines() == ["line 5, $.exports[0].opset_version: Input should be a valid integer",
                               "line 8, $.<!--: unknown key '<!--'"]
    text = problem_description(problem, repo_id="acme/tiny", source_sha=SHA, endpoint=HUB, notes=["Stop me: X."])
    blob = f"{HUB}/acme/tiny/blob/{SHA}/export_config.json"
    assert f"| [5]({blob}#L5) | `$.exports[0].opset_version` | Input should be a valid integer |" in text
    assert f"| [8]({blob}#L8) | $.&lt;!-- | unknown key '&lt;!--' |" in text
    assert "**What to do**: fix the lines above and push to `main`" in text and "hf-export check" in text
    assert "Stop me: X." in text
    before_marker, marker = text.split(f"<!-- {MARKER_TAG}")
    assert "<!--" not in before_marker  # a key of the owner's JSON cannot hide the rest of the text
    assert parse_marker(text) == problem_marker(problem, SHA)
    assert problem_title(problem, SHA) == "Export blocked: the recipe export_config.json is invalid (source c0ffee0)"
    assert texts.NOTES == [] and "Stop me" not in problem_description(problem, repo_id="acme/tiny", source_sha=SHA,
                                                                       endpoint=HUB)


def test_remote_code_problem_is_worded_for_the_reader():
    err = RemoteCodeError("acme/x needs code from its repo; this is refused unless the operator allows it with "
                          "`trust_remote_code`", option="trust_remote_code")
    problem = problem_from_error(err)
    assert problem is not None and problem.kind == "remote_code" and problem.problems == ()
    names = {"trust_remote_code": "the bot's allow-list"}
    text = problem_description(problem, repo_id="acme/x", source_sha=SHA, endpoint=HUB, names=names)
    assert "> acme/x needs code from its repo; this is refused unless the operator allows it with the bot's " \
           "allow-list" in text
    assert "`trust_remote_code`" not in text and "/blob/" not in text
    assert problem_from_error(ValueError("not ours")) is None
    scrubbed = Problem("model", "cannot read with hf_abcdefghijkl and s3cret-value").scrubbed(["s3cret-value"])
    assert scrubbed.message == "cannot read with hf_*** and ***"


def test_one_discussion_per_repo_whatever_the_cause(tmp_path):
    """A problem shares the slot of a failed run's report: the open one is updated, the same problem at the same
    commit changes nothing, a newer commit's thread supersedes an older commit's problem."""
    problem = _recipe_problem(tmp_path)
    marker = problem_marker(problem, SHA)
    failed_run = {"kind": "failure", "recipe": "repo", "base": "main", "source_sha": "a" * 40, "failed": ["onnx"]}
    open_failure = ThreadState(4, False, "open", failed_run)
    decision = decide(marker, HubView((open_failure,)))
    assert (decision.operation, decision.thread) == ("discussion", open_failure)
    same = ThreadState(5, False, "open", marker)
    assert decide(marker, HubView((same,))).operation == "unchanged"
    other = Problem("model", "cannot load")
    assert decide(problem_marker(other, SHA), HubView((same,))).thread == same  # updated, not a second one
    closed = ThreadState(5, False, "closed", marker)
    assert decide(problem_marker(other, SHA), HubView((closed,))).thread is None  # a new discussion
    newer = ThreadState(6, True, "open", {"kind": "exports", "recipe": "repo", "base": "main", "source_sha": "b" * 40})
    assert decide(marker, HubView((newer,), history=("b" * 40, SHA))).operation == "superseded"


def test_cli_records_what_stopped_a_run_in_problem_json(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (bad / "export_config.json").write_text(BAD_RECIPE)
    run = run_cli("run", "--no-bench", str(bad), "--out", str(tmp_path / "out-bad"), "--quiet")
    assert run.returncode == 2, run.stderr
    problem = read_problem(tmp_path / "out-bad")
    assert problem is not None and problem.kind == "recipe" and problem.file == "export_config.json"
    assert [(p.path, p.line) for p in problem.problems] == [("$.exports[0].opset_version", 5), ("$.<!--", 8)]

    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["MyForCausalLM"],
                                                    "auto_map": {"AutoModelForCausalLM": "modeling.MyForCausalLM"}}))
    (custom / "export_config.json").write_text(json.dumps({"export_format": "dynamo", "mode": "model"}))
    run = run_cli("run", "--no-bench", str(custom), "--out", str(tmp_path / "out-custom"), "--quiet")
    assert run.returncode == 2, run.stderr
    problem = read_problem(tmp_path / "out-custom")
    assert problem is not None and problem.kind == "remote_code" and problem.option == "trust_remote_code"
    assert "auto_map" in problem.message and not (tmp_path / "out-custom" / "report.json").exists()


def test_upstream_text_cannot_hide_the_rest_of_the_report():
    """`cell` escapes `<`: an upstream message opening an HTML comment stays in its table cell."""
    report = {
        "status": "failed", "source": {"model": "acme/tiny", "revision": SHA},
        "recipe": {"file": "export_config.json", "sha256": "f" * 64}, "versions": {"torch": "2.13"},
        "targets": [
            {"name": "onnx", "export_format": "onnx", "mode": "model", "status": "failed",
             "error": {"type": "ExportError", "message": "op <!-- unsupported --> here <b>bold</b>"},
             "components": [{"name": "model", "checks": [
                 {"probe": "seq=9", "verdict": "failed", "error": "<!-- hidden probe error", "outputs": []}]}]},
            {"name": "dynamo", "export_format": "dynamo", "mode": "model", "status": "passed", "components": []},
        ],
    }
    markdown = render_markdown(report)
    assert "<!--" not in markdown and "<b>" not in markdown
    summary_row = next(line for line in markdown.splitlines() if line.startswith("| `onnx` |"))
    assert "op &lt;!-- unsupported --> here &lt;b>bold&lt;/b>" in summary_row
    assert "> **ExportError**: op &lt;!-- unsupported -->" in markdown
    assert "&lt;!-- hidden probe error" in markdown
    assert "### ✅ `dynamo`" in markdown  # what follows the hostile text is still there


def test_the_action_summary_says_what_the_discussion_says(tmp_path):
    """The Action's job summary for a run stopped before any export is the library's text (`problem_body`), as the
    bot's discussion is: a Hub repo's recipe lines linked on the Hub, remote code worded with the Action's inputs."""
    from types import SimpleNamespace

    from action.main import OPTION_NAMES
    from action.summary import problem_markdown, recipe_url

    problem = _recipe_problem(tmp_path)
    hub_model = SimpleNamespace(github=SimpleNamespace(repository="acme/widgets", sha="f" * 40,
                                                       server_url="https://github.com"),
                                model_path=None, model="acme/tiny", hf_endpoint=HUB, revision=None)
    url = recipe_url(hub_model, None, "export_config.json")
    assert url == f"{HUB}/acme/tiny/blob/main/export_config.json"
    assert recipe_url(hub_model, "models/my recipe.json", "my recipe.json") == \
        f"https://github.com/acme/widgets/blob/{'f' * 40}/models/my%20recipe.json"
    summary = problem_markdown("acme/tiny", "Invalid export recipe", problem, file_url=url, run_url="https://run")
    discussion = problem_description(problem, repo_id="acme/tiny", source_sha=SHA, endpoint=HUB)
    for text, at in ((summary, "main"), (discussion, SHA)):
        assert f"| [5]({HUB}/acme/tiny/blob/{at}/export_config.json#L5) | `$.exports[0].opset_version` | Input " \
               "should be a valid integer |" in text
        assert "**What to do**: fix the lines above and push" in text
    assert summary.startswith("### ❌ Export of `acme/tiny`: **error**\n\n**Invalid export recipe**: the recipe "
                              "`export_config.json` is invalid. No export ran")
    assert "<!--" not in summary and "[Workflow run](https://run)" in summary

    refused = problem_from_error(RemoteCodeError("acme/x runs its own code; allow it with `trust_remote_code`",
                                                 option="trust_remote_code"))
    summary = problem_markdown("acme/x", "Remote code refused", refused, names=OPTION_NAMES)
    assert "> acme/x runs its own code; allow it with the input `trust-remote-code: true`" in summary
    assert "was allowed (the input `trust-remote-code: true`)" in summary

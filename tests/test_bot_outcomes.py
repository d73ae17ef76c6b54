"""Every outcome reaches the repo, and the bot is easy to live with (#20 §1, §3).

The real bot over HTTP (uvicorn on a loopback port) with the `local` backend (the real `hf-export run --push` in a
subprocess), the Hub emulator (webhook payloads are its own events; pushes and a maintainer's actions go through
the real `huggingface_hub` client), the status page in headless Chromium, and a few thousand jobs in the real SQLite
store. Exports are the tiny Llama with a one-graph dynamo recipe (about 10 s each on 2 cores).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from huggingface_hub import CommitOperationAdd, HfApi

from bot.texts import OPT_OUT_FILE, OPT_OUT_NOTE
from exporters.publish.markers import parse_marker
from exporters.publish.texts import CLOSING_IS_FINE
from tests.servers.hub_fixtures import BOT_USER, TEST_TOKEN
from tests.test_bot import (  # noqa: F401  (start_bot is a fixture)
    MODEL_RECIPE,
    REPO,
    bot_settings,
    chromium_dom,
    job_done,
    main_update,
    pull_requests,
    sha,
    start_bot,
    upload_model,
    wait_for,
)

BAD_RECIPE = '{\n  "export_format": "dynamo",\n  "mode": "model",\n  "dynamik": true\n}\n'  # line 4: $.dynamik
WORSE_RECIPE = """{
  "exports": [
    {
      "name": "graph",
      "export_format": "dynamo",
      "mode": "model",
      "opset": 18
    }
  ]
}
"""  # line 7: $.exports[0].opset
GOOD_RECIPE = json.dumps(MODEL_RECIPE, indent=2) + "\n"


def push(hub, files: dict[str, str], message: str, repo_id: str = REPO) -> str:
    """Commit `files` to main as the repo's owner; the new head."""
    api = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    operations = [CommitOperationAdd(path, content.encode()) for path, content in files.items()]
    return api.create_commit(repo_id, operations, commit_message=message).oid


def run_job(bot, event: dict[str, Any], timeout: float = 150):
    answer = bot.post(event).json()
    assert answer["status"] == "queued", answer
    return wait_for(job_done(bot.store, answer["job"]), timeout, f"job {answer['job']} to end")


def description(thread: dict[str, Any]) -> str:
    return thread["events"][0]["data"]["latest"]["raw"]


def comments(thread: dict[str, Any]) -> list[str]:
    return [e["data"]["latest"]["raw"] for e in thread["events"] if e["type"] == "comment"]


def hub_state(hub, repo_id: str = REPO) -> list[tuple]:
    """Everything the bot could have said on the repo: every thread, its status, title and events."""
    return [(d["num"], d["status"], d["title"], len(d["events"])) for d in hub.discussions(repo_id)]


def test_a_repo_hears_every_outcome_in_one_discussion(hf_env, tmp_path, start_bot):
    """invalid recipe on main → one discussion with the JSON path and the line; a second bad push updates it; the fix
    → the PR, the discussion closed with a comment; a maintainer's closed PR is not reopened by an unchanged rerun; a
    push that changes nothing says nothing; back to exported inputs closes a newer discussion; a changed recipe opens
    a new PR; the opt-out file silences the bot."""
    from tests.models import tiny_llama

    hub = hf_env
    # one layer: the outcomes read the jobs, threads and PRs, not the model's depth (#48)
    folder = tiny_llama(tmp_path / "model", recipe=None, layers=1)
    (folder / "export_config.json").write_text(BAD_RECIPE)
    first = upload_model(hub, folder)
    bot = start_bot(bot_settings(hub, tmp_path))

    # 1. an invalid recipe: one discussion, each error with its JSON path and its line linked at the commit
    job = run_job(bot, main_update(hub), timeout=30)
    assert job.status == "failed" and job.exit_code is None, (job.reason, job.error)  # nothing was exported
    assert job.error == "line 4, $.dynamik: unknown key 'dynamik'; did you mean 'dynamic'?"
    assert job.reason.startswith("invalid recipe in export_config.json; opened discussion #1")
    [thread] = hub.discussions(REPO)
    assert (thread["isPullRequest"], thread["author"], thread["status"]) == (False, BOT_USER, "open")
    assert job.operation == "discussion" and job.discussion_url.endswith(f"/{REPO}/discussions/{thread['num']}")
    assert thread["title"] == f"Export blocked: the recipe export_config.json is invalid (source {first[:7]})"
    text = description(thread)
    assert (f"| [4]({hub.url}/{REPO}/blob/{first}/export_config.json#L4) | `$.dynamik` | unknown key 'dynamik'; "
            "did you mean 'dynamic'? |") in text
    assert "**What to do**: fix the lines above and push to `main`" in text and OPT_OUT_NOTE in text
    assert parse_marker(text)["source_sha"] == first
    assert not pull_requests(hub)

    # 2. a second bad push updates the same discussion (description rewritten, a comment for watchers)
    second = push(hub, {"export_config.json": WORSE_RECIPE}, "Try a list of exports")
    job = run_job(bot, main_update(hub), timeout=30)
    assert job.status == "failed" and job.error.startswith("line 7, $.exports[0].opset: unknown key 'opset'")
    assert "updated discussion #1" in job.reason
    [thread] = hub.discussions(REPO)
    text = description(thread)
    assert f"| [7]({hub.url}/{REPO}/blob/{second}/export_config.json#L7) | `$.exports[0].opset` |" in text
    assert "$.dynamik" not in text and thread["title"].endswith(f"(source {second[:7]})")
    assert comments(thread)[-1].startswith(f"Still blocked at source `{second[:7]}`")

    # the status page (headless Chromium) shows the failed job's error line and links its discussion
    dom = chromium_dom(f"{bot.url}/", tmp_path)
    row = re.search(rf'<tr class="job" data-job-id="{job.id}" data-status="failed">.*?</tr>', dom, re.S).group(0)
    assert "line 7, $.exports[0].opset: unknown key 'opset'" in row
    assert f'href="{job.discussion_url}"' in row and f'href="{hub.url}/{REPO}"' in row
    assert f'href="{hub.url}/{REPO}/commit/{second}"' in row

    # 3. the fix: the PR, and the discussion closed with a comment
    fixed = push(hub, {"export_config.json": GOOD_RECIPE}, "Fix the recipe")
    exported = run_job(bot, main_update(hub))
    assert exported.status == "succeeded" and exported.operation == "created", (exported.reason, exported.error)
    [pr] = pull_requests(hub)
    [discussion] = [d for d in hub.discussions(REPO) if not d["isPullRequest"]]
    assert discussion["status"] == "closed"
    assert comments(discussion)[-1] == f"Resolved: the exports of source `{fixed[:7]}` pass; see #{pr['num']}."
    pr_text = description(pr)
    assert f"{CLOSING_IS_FINE}\n{OPT_OUT_NOTE}" in pr_text  # one paragraph: closing is fine, how to stop the bot
    dom = chromium_dom(f"{bot.url}/", tmp_path)
    row = re.search(rf'<tr class="job" data-job-id="{exported.id}" data-status="succeeded">.*?</tr>', dom,
                    re.S).group(0)
    assert f'href="{exported.pr_url}"' in row and ">PR</a>" in row

    # 4. a maintainer closes the PR; an unchanged rerun (`@bot export`) exports again but reopens nothing, says nothing
    alice = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    alice.change_discussion_status(REPO, pr["num"], "closed")
    ask = alice.create_discussion(REPO, "Exports again?", description="hi")
    alice.comment_discussion(REPO, ask.num, f"@{BOT_USER} export")
    before = hub_state(hub)
    rerun = run_job(bot, hub.events()[-1])
    assert rerun.status == "succeeded" and rerun.operation == "unchanged", (rerun.reason, rerun.error)
    assert f"PR #{pr['num']} (closed; not reopened for the same inputs)" in rerun.reason
    assert hub_state(hub) == before and [p["status"] for p in pull_requests(hub)] == ["closed"]

    # 5. a push that changes nothing the export reads says nothing on the Hub; the status page says why
    push(hub, {"README.md": "# tiny\n"}, "Describe the model")
    quiet = run_job(bot, main_update(hub), timeout=30)
    assert quiet.status == "skipped" and "nothing changed: already exported by job" in quiet.reason
    assert f"PR #{pr['num']}" in quiet.reason and hub_state(hub) == before
    assert quiet.reason in chromium_dom(f"{bot.url}/", tmp_path)

    # 6. broken again: a new discussion; back to the exported recipe: skipped, and that discussion closed
    push(hub, {"export_config.json": BAD_RECIPE}, "Break it again")
    broken = run_job(bot, main_update(hub), timeout=30)
    assert broken.status == "failed" and "opened discussion" in broken.reason
    reverted = push(hub, {"export_config.json": GOOD_RECIPE}, "Revert")
    skipped = run_job(bot, main_update(hub), timeout=30)
    assert skipped.status == "skipped" and "already exported" in skipped.reason, skipped.reason
    assert f"closed discussion #{broken.discussion_url.rsplit('/', 1)[-1]}" in skipped.reason
    again = next(d for d in hub.discussions(REPO) if broken.discussion_url.endswith(f"/{d['num']}"))
    assert again["status"] == "closed" and comments(again)[-1].startswith(f"Resolved: `main` is now at "
                                                                           f"`{reverted[:7]}`")
    assert [p["status"] for p in pull_requests(hub)] == ["closed"]

    # 7. a changed recipe opens a new PR (the closed one stays closed)
    changed = dict(MODEL_RECIPE, name="graph")
    push(hub, {"export_config.json": json.dumps(changed, indent=2)}, "Name the target")
    renamed = run_job(bot, main_update(hub))
    assert renamed.status == "succeeded" and renamed.operation == "created", (renamed.reason, renamed.error)
    assert sorted(p["status"] for p in pull_requests(hub)) == ["closed", "open"]

    # 8. the opt-out file: nothing is exported or said, the status page says why
    state = hub_state(hub)
    push(hub, {OPT_OUT_FILE: "", "export_config.json": BAD_RECIPE}, "No bot here")
    silenced = run_job(bot, main_update(hub), timeout=30)
    assert silenced.status == "skipped" and f"opted out of the bot ({OPT_OUT_FILE}" in silenced.reason
    assert hub_state(hub) == state


def test_a_model_that_cannot_load_or_needs_its_code_is_told(hf_env, tmp_path, start_bot):
    """Exit 2 of the export run with OUT/problem.json: the worker tells the repo, worded for the bot's readers."""
    hub = hf_env
    repos = {"alice/custom": {"model_type": "llama", "architectures": ["MyForCausalLM"],
                              "auto_map": {"AutoModelForCausalLM": "modeling.MyForCausalLM"}},
             "alice/unknown": {"model_type": "llama", "architectures": ["NoSuchForCausalLM"]}}
    for repo_id, config in repos.items():
        folder = tmp_path / repo_id.replace("/", "--")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "export_config.json").write_text(GOOD_RECIPE)
        upload_model(hub, folder, repo_id)
    bot = start_bot(bot_settings(hub, tmp_path, concurrency=2))
    custom = run_job(bot, main_update(hub, "alice/custom"), timeout=90)
    unknown = run_job(bot, main_update(hub, "alice/unknown"), timeout=90)

    assert custom.status == "failed" and custom.exit_code == 2, (custom.reason, custom.error)
    assert custom.reason.startswith("loading the model would run code from its repo, which is not allowed here "
                                    "(exit 2); opened discussion #1")
    assert "the bot's `trust_remote_code_repos` setting (ask the bot's operator)" in custom.error
    [thread] = hub.discussions("alice/custom")
    text = description(thread)
    assert "auto_map" in text and "the bot's `trust_remote_code_repos` setting" in text
    assert "`trust_remote_code`" not in text.split("<!--")[0] and OPT_OUT_NOTE in text
    assert custom.log_path and Path(custom.log_path).is_file()

    assert unknown.status == "failed" and "the model cannot be loaded (exit 2)" in unknown.reason, unknown.reason
    [thread] = hub.discussions("alice/unknown")
    assert "'NoSuchForCausalLM'" in description(thread) and "**What to do**: make sure the model loads" in \
        description(thread)


def test_status_page_pages_through_thousands_of_jobs(hub, tmp_path, start_bot):
    """3,000 jobs in the real SQLite store: newest first, 50 a page, every job on exactly one page going older, the
    same pages coming back newer, a status filter, and each failed job's error and links."""
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry"), embedded_worker=False)
    total = 3000
    for n in range(total):
        bot.store.enqueue(f"alice/model-{n % 40}", sha(n + 1))
    for n in range(0, total, 100):  # every 100th job fails on its recipe, with a discussion
        job = bot.store.claim("w", lease_seconds=60)
        bot.store.finish(job.id, "w", "failed", reason="invalid recipe in export_config.json",
                         error=f"line {n % 9 + 2}, $.exports[0].opset: unknown key 'opset' <!-- #{job.id}",
                         discussion_url=f"{hub.url}/{job.repo}/discussions/{job.id}")
    failed = {j.id for j in bot.store.list(limit=500, status="failed")}
    assert len(failed) == total // 100

    def page(url: str) -> tuple[list[int], dict[str, str], str]:
        answer = bot.get(url)
        assert answer.status_code == 200, answer.text
        ids = [int(i) for i in re.findall(r'<tr class="job" data-job-id="(\d+)"', answer.text)]
        nav = dict((rel, href.replace("&amp;", "&")) for rel, href in
                   re.findall(r'<a rel="(first|prev|next)" href="([^"]+)"', answer.text))
        return ids, nav, answer.text

    seen, url, pages = [], "/", []
    while url:
        ids, nav, html_text = page(url)
        assert ids == sorted(ids, reverse=True) and 0 < len(ids) <= 50
        seen += ids
        pages.append(ids)
        url = nav.get("next")
    assert seen == list(range(total, 0, -1)) and len(pages) == total // 50
    assert "first" not in page("/")[1] and "next" not in page(f"/?before={pages[-1][0]}")[1]
    ids, nav, _ = page(f"/?before={pages[-2][-1]}")  # the last page, then back newer, page by page
    for expected in reversed(pages[:-1][-5:]):
        ids, nav, _ = page(nav["prev"])
        assert ids == expected
    ids, nav, html_text = page("/?status=failed&limit=10")
    assert ids == sorted(failed, reverse=True)[:10] and nav["next"] == f"/?status=failed&limit=10&before={ids[-1]}"
    row = re.search(rf'<tr class="job" data-job-id="{ids[0]}" .*?</tr>', html_text, re.S).group(0)
    assert f"$.exports[0].opset: unknown key &#x27;opset&#x27; &lt;!-- #{ids[0]}" in row
    assert f'href="{hub.url}/alice/model-' in row and f'/discussions/{ids[0]}"' in row and "<!--" not in row
    assert "failed: 30" in html_text and f"all: {total}" in html_text
    assert bot.get("/?status=nope").status_code == 400
    assert len(bot.get(f"/jobs?before={ids[0]}&limit=5").json()["jobs"]) == 5
    dom = chromium_dom(f"{bot.url}/?before={pages[10][0]}", tmp_path)  # a page deep down, in a browser
    assert f'data-job-id="{pages[10][1]}"' in dom and 'rel="next"' in dom and 'rel="prev"' in dom

"""Publishing under two of everything (#13 §2), on the wire: the real `hf-export` CLI and `publish_report` against the
Hub emulator, with real exports of a tiny BERT (two one-graph dynamo targets, a few seconds each).

- two runs racing for one repo (the emulator holds each PR-opening commit for a while, so both have listed the
  repo's PRs before either opens one) end with one open PR;
- a run of an older commit after a newer one published pushes nothing (`superseded`), and so does a run whose
  commit `main` has moved past with other model files or recipe;
- `--target a` keeps the PR's other targets; a second recipe file publishing to the same repo leaves the first
  one's artifacts and report alone.
"""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporters.publish import parse_marker, publish_report
from tests.servers.hub_fixtures import BOT_TOKEN
from tests.test_publish import HubEnv, env  # noqa: F401  (the module-scoped Hub environment)

A = {"name": "a", "export_format": "dynamo", "mode": "model"}
B = {"name": "b", "export_format": "dynamo", "mode": "model"}
C = {"name": "c", "export_format": "dynamo", "mode": "model"}


def prs(env: HubEnv, repo_id: str) -> list[dict[str, Any]]:
    return [d for d in env.hub.discussions(repo_id) if d["isPullRequest"]]


def pr_files(env: HubEnv, repo_id: str, num: int) -> dict[str, bytes]:
    return env.hub.files(repo_id, f"refs/pr/{num}")


@dataclass
class Story:
    repo_id: str
    heads: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)
    outs: dict[str, Path] = field(default_factory=dict)


@pytest.fixture(scope="module")
def story(env: HubEnv, tmp_path_factory: pytest.TempPathFactory) -> Story:
    """alice/two: publish a and b; a new commit; `--target a` publishes a again; the first commit's run comes late;
    the PR is merged; a second recipe file (edge.json, target c) publishes to the same repo."""
    from tests.models import tiny_bert

    state = Story("alice/two")
    root = tmp_path_factory.mktemp("two")
    folder = tiny_bert(root / "model", {"exports": [A, B]})
    state.heads["first"] = env.upload_model(state.repo_id, folder)
    out = root / "out"
    state.runs["full"] = env.cli("run", "--no-bench", state.repo_id, "--push", "--out", str(out))
    state.outs["first"] = root / "snapshot-first"
    shutil.copytree(out, state.outs["first"])
    state.files["full"] = pr_files(env, state.repo_id, 1)
    state.commits["full"] = len(env.hub.commits(state.repo_id, "refs/pr/1"))

    api = env.api()
    api.upload_file(path_or_fileobj=b"# Using the model\n", path_in_repo="USAGE.md", repo_id=state.repo_id,
                    commit_message="Add usage notes")  # a new commit; the PR still merges cleanly
    state.heads["second"] = env.hub.head(state.repo_id)
    state.runs["partial"] = env.cli("run", "--no-bench", state.repo_id, "--push", "--target", "a", "--out", str(out))
    state.files["partial"] = pr_files(env, state.repo_id, 1)
    state.commits["partial"] = len(env.hub.commits(state.repo_id, "refs/pr/1"))

    late = root / "late"  # the run of the first commit, arriving after the second one published
    shutil.copytree(state.outs["first"], late)
    state.runs["late"] = env.cli("run", "--no-bench", state.repo_id, "--revision", state.heads["first"], "--target", "a",
                                 "--push",
                                 "--out", str(late))
    state.outs["late"] = late
    state.commits["late"] = len(env.hub.commits(state.repo_id, "refs/pr/1"))
    state.files["late"] = pr_files(env, state.repo_id, 1)

    env.api().merge_pull_request(state.repo_id, 1)  # the owner merges: main now holds a and b
    edge = root / "edge.json"
    edge.write_text(json.dumps({"exports": [C]}))
    state.runs["edge"] = env.cli("run", "--no-bench", state.repo_id, "--config", str(edge), "--push",
                                 "--out", str(root / "edge"))
    edge_pr = prs(env, state.repo_id)[-1]["num"]
    state.files["edge"] = pr_files(env, state.repo_id, edge_pr)
    state.files["main"] = env.hub.files(state.repo_id, "main")
    return state


def test_the_first_run_publishes_both_targets(story: Story) -> None:
    assert story.runs["full"].returncode == 0, story.runs["full"].stderr[-3000:]
    assert {"exports/a/model.pt2", "exports/b/model.pt2"} <= set(story.files["full"])


def test_a_partial_run_updates_its_target_and_keeps_the_others(env: HubEnv, story: Story) -> None:
    run = story.runs["partial"]
    assert run.returncode == 0 and "publish: updated" in run.stderr, run.stderr[-3000:]
    files = story.files["partial"]
    assert files["exports/b/model.pt2"] == story.files["full"]["exports/b/model.pt2"]  # b untouched
    assert "exports/a/model.pt2" in files
    report = json.loads(files["exports/report.json"])
    assert [t["name"] for t in report["targets"]] == ["a", "b"]
    assert report["targets"][1]["carried_from"] == story.heads["first"]
    assert report["source"]["revision"] == story.heads["second"]
    [pr] = [d for d in env.hub.discussions(story.repo_id) if d["num"] == 1]
    marker = parse_marker(pr["events"][0]["data"]["latest"]["raw"])
    assert marker["published"] == ["a", "b"] and marker["source_sha"] == story.heads["second"]


def test_a_run_of_an_older_commit_after_a_newer_one_is_superseded(story: Story) -> None:
    run = story.runs["late"]
    assert run.returncode == 0, run.stderr[-3000:]
    assert "publish: superseded" in run.stderr and story.heads["second"][:7] in run.stderr
    assert story.commits["late"] == story.commits["partial"]  # nothing pushed
    assert story.files["late"] == story.files["partial"]
    outcome = json.loads((story.outs["late"] / "publish.json").read_text())
    assert outcome["operation"] == "superseded" and outcome["pr_num"] is None


def test_a_second_recipe_file_leaves_the_first_ones_artifacts_alone(story: Story) -> None:
    run = story.runs["edge"]
    assert run.returncode == 0 and "publish: created" in run.stderr, run.stderr[-3000:]
    files, main = story.files["edge"], story.files["main"]
    assert {"exports/a/model.pt2", "exports/b/model.pt2", "exports/report.json"} <= set(main)
    for path in ("exports/a/model.pt2", "exports/b/model.pt2", "exports/report.json", "exports/report.md"):
        assert files[path] == main[path], path  # neither deleted nor overwritten
    assert "exports/c/model.pt2" in files and "exports/report.edge.json" in files
    card = files["README.md"].decode()
    assert card.count("<!-- export-action:exports:start -->") == 1  # the first recipe's card section stays
    assert card.count("<!-- export-action:exports:start recipe=edge.json -->") == 1


def test_a_run_whose_commit_main_moved_past_is_superseded(env: HubEnv, story: Story,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.models import tiny_bert

    repo_id = "alice/moved"
    root = tmp_path_factory.mktemp("moved")
    env.upload_model(repo_id, tiny_bert(root / "model", {"exports": [A]}))
    out = root / "out"
    assert env.cli("run", "--no-bench", repo_id, "--out", str(out)).returncode == 0
    env.push_recipe(repo_id, {"exports": [{**A, "validation": {"atol": 1e-4}}]})  # main moves: the recipe changes
    result = publish_report(repo_id, out, token=BOT_TOKEN, endpoint=env.url)
    assert result.operation == "superseded" and "changes the model or its recipe" in result.message
    assert env.hub.discussions(repo_id) == [] and "refs/pr/1" not in env.hub.refs(repo_id)


def test_two_racing_publishes_end_with_one_open_pr(env: HubEnv, story: Story) -> None:
    repo_id = "alice/race"
    env.api().create_repo(repo_id)
    env.hub.delay("POST", rf"^/api/models/{repo_id}/commit/", 1.5)  # both runs list the PRs before either opens one
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def publish() -> None:
        barrier.wait()
        try:
            results.append(publish_report(repo_id, story.outs["first"], token=BOT_TOKEN, endpoint=env.url))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    pulls = prs(env, repo_id)
    assert len(pulls) == 2  # both opened one: the race happened
    assert [p["status"] for p in pulls] == ["open", "closed"]  # the lower number won
    closing = pulls[1]["events"][-2]["data"]["latest"]["raw"]
    assert "another run opened #1" in closing
    assert sorted(r.operation for r in results) == ["created", "unchanged"]
    assert {r.pr_num for r in results} == {1}
    loser = next(r for r in results if r.operation == "unchanged")
    assert "PR #2" in loser.message and "was closed" in loser.message
    # the closed duplicate never counts again: a rerun finds #1
    again = publish_report(repo_id, story.outs["first"], token=BOT_TOKEN, endpoint=env.url)
    assert again.operation == "unchanged" and again.pr_num == 1


def test_unverified_targets_are_published_only_when_asked_and_say_what_did_not_run(
        env: HubEnv, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.models import tiny_bert

    repo_id = "alice/unverified"
    root = tmp_path_factory.mktemp("unverified")
    # the traced probe runs; every unseen shape larger than it is over the limit and skipped
    recipe = {"exports": [{**A, "dynamic": True}], "validation": {"max_probe_elements": 1}}
    env.upload_model(repo_id, tiny_bert(root / "model", recipe))
    out = root / "out"
    plain = env.cli("run", "--no-bench", repo_id, "--push", "--out", str(out))
    assert plain.returncode == 1 and "publish: discussion" in plain.stderr, plain.stderr[-3000:]
    assert prs(env, repo_id) == []  # counted like a failure: no artifact published
    opted = env.cli("run", "--no-bench", repo_id, "--push", "--publish-unverified", "--out", str(out))
    assert opted.returncode == 1 and "publish: created" in opted.stderr, opted.stderr[-3000:]
    [pr] = prs(env, repo_id)
    text = pr["events"][0]["data"]["latest"]["raw"]
    assert "unverified: a" in pr["title"]
    assert "`a` is published unverified" in text and "max_probe_elements" in text
    report = json.loads((out / "report.json").read_text())
    checks = [c for c in report["targets"][0]["components"][0]["checks"]]
    ran = sum(c["verdict"] == "passed" for c in checks)
    assert 1 <= ran < len(checks), checks  # the traced probe ran, the larger unseen shapes did not
    assert f"compared with the eager model at {ran} probe" in text  # the sentence says what ran, not a fixed claim
    card = env.hub.file(repo_id, "README.md", pr["ref"]).decode()
    assert "`a` is published unverified" in card and "max_probe_elements" in card
    discussion = next(d for d in env.hub.discussions(repo_id) if not d["isPullRequest"])
    assert discussion["status"] == "open"  # not resolved: a check still did not run

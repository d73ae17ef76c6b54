"""End-to-end tests of the GitHub Action: `python -m action` run as the runner runs it, against both emulators.

Each scenario runs the entrypoint in a process of its own (forked warm, tests/cli_launcher.py) with `INPUT_*` variables, a `GITHUB_EVENT_PATH` event file,
fresh `GITHUB_OUTPUT` / `GITHUB_STEP_SUMMARY` files, `GITHUB_API_URL` pointing at the GitHub emulator and
`hf-endpoint` at the Hub emulator. Scenarios export once (module-scoped fixtures) and several tests read the result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import cli_launcher
from tests.conftest import teardown_marker
from tests.models import tiny_llama
from tests.servers.github import GitHubEmulator
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER

ROOT = Path(__file__).resolve().parents[1]
GH_TOKEN, GH_LOGIN = "ghs_action_token", "github-actions[bot]"
GH_OTHER_TOKEN, GH_OTHER_LOGIN = "ghp_someone_else", "someone"
REPO, PR = "acme/widgets", 7
HEAD_SHA = "89abcdef0123456789abcdef0123456789abcdef"
PASSING = {"export_format": "dynamo", "mode": "model"}
# The scenarios' models have one decoder layer: what they check is the Action around the export, not its depth (#48)
MARKER = "<!-- hf-export-action model="

pytestmark = pytest.mark.slow


# ── Harness ───────────────────────────────────────────────────────────────────


@dataclass
class ActionRun:
    returncode: int
    stdout: str
    stderr: str
    outputs: dict[str, str]
    summary: str

    @property
    def log(self) -> str:
        return self.stdout + self.stderr

    def report(self) -> dict[str, Any]:
        return json.loads(self.outputs["report-json"])


def parse_outputs(text: str) -> dict[str, str]:
    """Read a GITHUB_OUTPUT file as the runner does: `k=v` lines and `k<<DELIM` blocks."""
    outputs: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            outputs[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if line:
            name, value = line.split("=", 1)
            outputs[name] = value
        i += 1
    return outputs


def pr_event(number: int = PR) -> dict[str, Any]:
    return {
        "action": "synchronize", "number": number,
        "pull_request": {"number": number, "head": {"sha": HEAD_SHA, "ref": "add-recipe"}, "base": {"ref": "main"}},
        "repository": {"full_name": REPO},
    }


def run_action(workspace: Path, inputs: dict[str, str], *, github: GitHubEmulator | None, hub_url: str | None,
               event_name: str = "pull_request", event: dict[str, Any] | None = None,
               underscored: tuple[str, ...] = (), cold: bool = False) -> ActionRun:
    """Run `python -m action` like the runner: inputs as `INPUT_<NAME>` (hyphens kept), fresh output files. It is
    forked from the CLI launcher, which has imported the environment-blind part of the stack (tests/cli_launcher.py,
    #48: the same process, exit code, outputs and files as a cold start); `cold=True` starts a cold interpreter (a
    run whose log is read for what importing the stack prints)."""
    workspace.mkdir(parents=True, exist_ok=True)
    runner = Path(workspace.parent / f"{workspace.name}-runner")
    runner.mkdir(exist_ok=True)
    index = len(list(runner.glob("event-*.json")))
    event_path = runner / f"event-{index}.json"
    event_path.write_text(json.dumps(event if event is not None else pr_event()))
    output_file, summary_file = runner / f"output-{index}", runner / f"summary-{index}"
    output_file.write_text("")
    summary_file.write_text("")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INPUT_", "GITHUB_", "HF_", "HUGGING", "RUNNER_"))}
    env.update({
        "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "CI": "true", "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(event_path), "GITHUB_REPOSITORY": REPO,
        "GITHUB_WORKSPACE": str(workspace), "GITHUB_SERVER_URL": "https://github.com", "GITHUB_RUN_ID": "4242",
        "GITHUB_SHA": HEAD_SHA, "GITHUB_OUTPUT": str(output_file), "GITHUB_STEP_SUMMARY": str(summary_file),
        "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(runner / f"hf-home-{index}"),
    })
    if github is not None:
        env["GITHUB_API_URL"] = github.url
    if hub_url is not None:
        env["INPUT_HF-ENDPOINT"] = hub_url
    for name, value in inputs.items():
        key = name.upper()
        env[f"INPUT_{key.replace('-', '_') if name in underscored else key}"] = value
    proc = cli_launcher.launch([], env, workspace, 600, warm=False if cold else None, module="action").done
    return ActionRun(proc.returncode, proc.stdout, proc.stderr, parse_outputs(output_file.read_text()),
                     summary_file.read_text())


def github_emulator(*, bot_user_forbidden: bool = False) -> GitHubEmulator:
    emulator = GitHubEmulator({GH_TOKEN: GH_LOGIN, GH_OTHER_TOKEN: GH_OTHER_LOGIN},
                              bot_user_forbidden=bot_user_forbidden)
    emulator.create_repo(REPO, default_branch="main")
    emulator.create_pull(REPO, PR, "Add export recipe", HEAD_SHA, base="main", head_ref="add-recipe")
    return emulator.start()


def upload_model(hub, repo_id: str, folder: Path) -> str:
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return hub.create_model_repo(repo_id, files, author=repo_id.split("/")[0])


def bot_comments(github: GitHubEmulator) -> list:
    return [c for c in github.comments(REPO, PR) if c.login == GH_LOGIN]


def run_inputs(model: str, **extra: str) -> dict[str, str]:
    return {"model": model, "hf-token": BOT_TOKEN, "github-token": GH_TOKEN, **extra}


ALL_RUNS: list[ActionRun] = []


# ── Scenario: a pull_request run, then a rerun ────────────────────────────────


@pytest.fixture(scope="module")
def pr_scenario(hub_server, tmp_path_factory):
    """Run the Action twice for the same PR on a Hub model (a rerun is a fresh container: new workspace)."""
    base = tmp_path_factory.mktemp("action-pr")
    repo_id = "alice/tiny-llama-pr"
    head = upload_model(hub_server, repo_id, tiny_llama(base / "model", recipe=PASSING, layers=1))
    with github_emulator(bot_user_forbidden=True) as github:  # GET /user is 403 for GITHUB_TOKEN, as on GitHub
        other = github.add_comment(REPO, PR, f"quoting the bot: {MARKER}{repo_id} -->", GH_OTHER_LOGIN)
        # cold, both: test_the_log_has_no_import_chatter_of_the_stack reads what importing the stack prints
        first = run_action(base / "ws1", run_inputs(repo_id, jobs="2"), github=github, hub_url=hub_server.url,
                           underscored=("github-token",), cold=True)
        after_first = {"comments": github.comments(REPO, PR), "discussions": hub_server.discussions(repo_id),
                       "refs": hub_server.refs(repo_id), "pr_files": sorted(hub_server.files(repo_id, "refs/pr/1"))}
        second = run_action(base / "ws2", run_inputs(repo_id), github=github, hub_url=hub_server.url, cold=True)
        after_second = {"comments": github.comments(REPO, PR), "discussions": hub_server.discussions(repo_id),
                        "refs": hub_server.refs(repo_id)}
    ALL_RUNS.extend([first, second])
    return {"repo_id": repo_id, "head": head, "first": first, "second": second, "after_first": after_first,
            "after_second": after_second, "other_comment": other, "workspace": base / "ws1"}


def test_pull_request_run_writes_outputs_and_summary(pr_scenario):
    run = pr_scenario["first"]
    assert run.returncode == 0, run.log[-4000:]
    assert run.outputs["status"] == "passed"
    assert run.outputs["pr-operation"] == "created"
    assert run.outputs["pr-url"].endswith(f"/{pr_scenario['repo_id']}/discussions/1")
    assert run.outputs["report-path"] == "export-out/report.json"
    assert (pr_scenario["workspace"] / run.outputs["report-path"]).is_file()
    assert json.loads(run.outputs["targets"]) == ["dynamo"]
    report = run.report()
    assert report["status"] == "passed"
    assert report["jobs"] == 2  # the input `jobs`, passed to the library
    assert report["targets"][0]["bench"]["size_bytes"] > 0  # benchmarked by default
    assert report["source"] == {**report["source"], "model": pr_scenario["repo_id"], "revision": pr_scenario["head"]}
    assert "### ✅ Export of `alice/tiny-llama-pr`: **passed** (1/1 targets passed)" in run.summary
    assert f"**Hub PR:** opened [#1]({run.outputs['pr-url']})" in run.summary and "## Export report" in run.summary
    assert re.search(r"^::group::✅ dynamo: dynamo, model mode — passed$", run.stdout, re.M)
    assert run.stdout.count("::group::") == run.stdout.count("::endgroup::")


def test_pull_request_run_opens_the_hub_pr(pr_scenario):
    prs = [d for d in pr_scenario["after_first"]["discussions"] if d["isPullRequest"]]
    assert len(prs) == 1 and prs[0]["author"] == BOT_USER and prs[0]["status"] == "open"
    refs = pr_scenario["after_first"]["refs"]
    assert refs["refs/heads/main"] == pr_scenario["head"]  # nothing pushed to main
    assert {"exports/dynamo/model.pt2", "exports/report.json", "exports/report.md"} <= set(
        pr_scenario["after_first"]["pr_files"])


def test_pull_request_run_posts_one_sticky_comment(pr_scenario):
    comments = pr_scenario["after_first"]["comments"]
    mine = [c for c in comments if c.login == GH_LOGIN]
    assert len(mine) == 1
    body = mine[0].body
    assert f"{MARKER}{pr_scenario['repo_id']} -->" in body
    assert "**passed**" in body and pr_scenario["first"].outputs["pr-url"] in body
    assert "https://github.com/acme/widgets/actions/runs/4242" in body
    # someone else's comment quoting the marker is never taken over
    other = next(c for c in comments if c.id == pr_scenario["other_comment"])
    assert other.body.startswith("quoting the bot")


def test_rerun_edits_the_comment_and_leaves_the_hub_pr_unchanged(pr_scenario):
    second = pr_scenario["second"]
    assert second.returncode == 0, second.log[-4000:]
    assert second.outputs["pr-operation"] == "unchanged"
    assert second.outputs["pr-url"] == pr_scenario["first"].outputs["pr-url"]
    before = [c for c in pr_scenario["after_first"]["comments"] if c.login == GH_LOGIN]
    after = [c for c in pr_scenario["after_second"]["comments"] if c.login == GH_LOGIN]
    assert [c.id for c in after] == [c.id for c in before]
    assert after[0].updated_at >= before[0].updated_at
    assert "unchanged" in after[0].body
    assert pr_scenario["after_second"]["discussions"] == pr_scenario["after_first"]["discussions"]
    assert pr_scenario["after_second"]["refs"] == pr_scenario["after_first"]["refs"]
    assert "**Hub PR:** unchanged" in second.summary


# ── Scenario: a bad recipe in the workspace ───────────────────────────────────

BAD_RECIPE = """{
  "exports": [
    {
      "export_format": "dynamo",
      "opset": 18
    }
  ]
}
"""


@pytest.fixture(scope="module")
def bad_recipe_scenario(tmp_path_factory):
    base = tmp_path_factory.mktemp("action-bad")
    workspace = base / "ws"
    folder = tiny_llama(workspace / "models" / "tiny", recipe=None)
    (folder / "export_config.json").write_text(BAD_RECIPE)
    with github_emulator() as github:
        run = run_action(workspace, run_inputs("models/tiny"), github=github, hub_url=None)
        comments = bot_comments(github)
    ALL_RUNS.append(run)
    return {"run": run, "comments": comments}


def test_bad_recipe_fails_with_an_annotation_on_its_line(bad_recipe_scenario):
    run = bad_recipe_scenario["run"]
    assert run.returncode == 2, run.log[-4000:]
    assert re.search(r"^::error file=models/tiny/export_config\.json,line=5,title=Invalid export recipe::"
                     r"\$\.exports\[0\]\.opset: unknown key 'opset'", run.stdout,
                     re.M), run.stdout
    assert run.outputs["status"] == "error" and run.outputs["pr-operation"] == "none"
    # the summary says what the bot says on the Hub (the library's words): the line linked at this commit, what to do
    blob = f"https://github.com/{REPO}/blob/{HEAD_SHA}/models/tiny/export_config.json"
    assert "**Invalid export recipe**: the recipe `export_config.json` is invalid." in run.summary
    assert f"| [5]({blob}#L5) | `$.exports[0].opset` | unknown key 'opset'" in run.summary
    assert "**What to do**: fix the lines above and push again (`hf-export check export_config.json`" in run.summary
    comments = bad_recipe_scenario["comments"]
    assert len(comments) == 1 and "unknown key 'opset'" in comments[0].body


def test_missing_required_input_is_an_error(tmp_path):
    run = run_action(tmp_path / "ws", {"model": "", "mode": "sideways"}, github=None, hub_url=None)
    assert run.returncode == 2
    assert "::error title=Invalid input 'model'::required" in run.stdout
    assert "::error title=Invalid input 'mode'::expected one of run%2C list-targets%2C aggregate" not in run.stdout
    assert "::error title=Invalid input 'mode'::expected one of run, list-targets, aggregate" in run.stdout
    assert run.outputs["status"] == "error"


# Loaded first by the interpreter (`sitecustomize`): marks the exit handlers and the interpreter's teardown (a global's
# finalizer, which writes with what it holds: builtins may be gone by then)
TEARDOWN_MARKER = teardown_marker('os.environ["TEARDOWN_MARKS"]')


def test_the_action_ends_with_its_code_and_exit_handlers_but_without_the_interpreters_teardown(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TEARDOWN_MARKER)
    marks = tmp_path / "marks"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "TEARDOWN_MARKS": str(marks),
           "GITHUB_OUTPUT": str(tmp_path / "output")}
    proc = subprocess.run([sys.executable, "-m", "action"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2  # the missing model, as test_missing_required_input_is_an_error
    assert "::error title=Invalid input 'model'::required" in proc.stdout
    assert parse_outputs((tmp_path / "output").read_text())["status"] == "error"  # written and flushed
    assert marks.read_text().split() == ["atexit"]


# ── The log starts with the run, not the stack's import chatter ──────────────

# What importing the stack prints when nothing mutes it (exporters/quiet.py): torchao's CUDA kernels that do not load
# on a CPU machine, torch's pytree about torchao's enums.
IMPORT_CHATTER = ("Failed to load", "_C_mxfp8", "_C_cutlass", "is an Enum subclass", "torch/utils/_pytree.py")


def test_the_log_has_no_import_chatter_of_the_stack(pr_scenario):
    """A model exported for real (the stack imported, the model loaded, a forked export, the benchmark's forkserver)
    and its rerun: the logs have the runs' own lines only. (The pull_request scenario's runs: a run of its own
    exported the same tiny model again, #48.)"""
    first = pr_scenario["first"]
    assert first.returncode == 0 and first.outputs["status"] == "passed", first.log[-4000:]
    assert re.search(r"^::group::✅ dynamo: dynamo, model mode — passed$", first.stdout, re.M)  # the stack ran
    for run in (first, pr_scenario["second"]):
        chatter = [line for line in run.log.splitlines() if any(word in line for word in IMPORT_CHATTER)]
        assert not chatter, "\n".join(chatter)


# ── Scenario: a failing target blocks the Hub PR ──────────────────────────────


@pytest.fixture(scope="module")
def failing_scenario(hub_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("action-fail")
    repo_id = "alice/tiny-llama-fail"
    recipe = {"exports": [{**PASSING, "name": "slow", "timeout": 0.01}]}  # killed long before it can finish
    upload_model(hub_server, repo_id, tiny_llama(base / "model", recipe=recipe, layers=1))
    with github_emulator() as github:
        run = run_action(base / "ws", run_inputs(repo_id, benchmark="false"), github=github, hub_url=hub_server.url)
        comments = bot_comments(github)
    ALL_RUNS.append(run)
    return {"run": run, "comments": comments, "discussions": hub_server.discussions(repo_id),
            "refs": hub_server.refs(repo_id)}


def test_failing_target_blocks_the_hub_pr(failing_scenario):
    run = failing_scenario["run"]
    assert run.returncode == 1, run.log[-4000:]
    assert run.outputs["status"] == "failed"
    assert run.outputs["pr-operation"] == "none" and run.outputs["pr-url"] == ""
    assert [t["status"] for t in run.report()["targets"]] == ["timed_out"]
    assert "::error title=Export target 'slow' timed_out::TimeoutError: " in run.stdout
    discussions = failing_scenario["discussions"]
    assert not any(d["isPullRequest"] for d in discussions)
    assert not any(ref.startswith("refs/pr/") for ref in failing_scenario["refs"])
    assert len(discussions) == 1 and run.outputs["discussion-url"].endswith("/discussions/1")


def test_failing_target_comment_says_why(failing_scenario):
    comments = failing_scenario["comments"]
    assert len(comments) == 1
    body = comments[0].body
    assert "**failed** (0/1 targets passed)" in body
    assert "**Hub PR:** not opened" in body
    assert "`slow` timed_out: TimeoutError" in body
    assert "so no artifact was published" in body


# ── Scenario: matrix (list-targets → one leg per target → aggregate) ──────────


@pytest.fixture(scope="module")
def matrix_scenario(hub_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("action-matrix")
    repo_id = "alice/tiny-llama-matrix"
    recipe = {"exports": [{**PASSING, "name": "a"}, {**PASSING, "name": "b", "dynamic": True}]}
    head = upload_model(hub_server, repo_id, tiny_llama(base / "model", recipe=recipe, layers=1))
    runs: dict[str, ActionRun] = {}
    with github_emulator() as github:
        runs["plan"] = run_action(base / "plan", {**run_inputs(repo_id), "mode": "list-targets"}, github=github,
                                  hub_url=hub_server.url)
        plan = runs["plan"].outputs
        aggregate_ws = base / "aggregate"
        for target in json.loads(plan.get("targets", "[]")):
            leg_ws = base / f"leg-{target}"
            runs[target] = run_action(
                leg_ws, {**run_inputs(repo_id), "targets": target, "revision": plan["revision"], "open-pr": "false",
                         "comment": "false", "output-dir": "export-out", "benchmark": "false"},
                github=github, hub_url=hub_server.url)
            # actions/upload-artifact (name: export-<target>) + download-artifact (path: export-parts)
            shutil.copytree(leg_ws / "export-out", aggregate_ws / "export-parts" / f"export-{target}")
        after_legs = {"comments": bot_comments(github), "discussions": hub_server.discussions(repo_id)}
        runs["dry-run"] = run_action(aggregate_ws, {**run_inputs(repo_id), "mode": "aggregate", "dry-run": "true",
                                                    "targets": plan.get("targets", "")},
                                     github=github, hub_url=hub_server.url)
        after_dry_run = {"comments": bot_comments(github), "discussions": hub_server.discussions(repo_id)}
        runs["aggregate"] = run_action(aggregate_ws, {**run_inputs(repo_id), "mode": "aggregate",
                                                      "targets": plan.get("targets", "")},
                                       github=github, hub_url=hub_server.url)
        comments = bot_comments(github)
    ALL_RUNS.extend(runs.values())
    return {"repo_id": repo_id, "head": head, "runs": runs, "after_legs": after_legs, "comments": comments,
            "after_dry_run": after_dry_run,
            "discussions": hub_server.discussions(repo_id), "files": hub_server.files(repo_id, "refs/pr/1")
            if "refs/pr/1" in hub_server.refs(repo_id) else {}, "workspace": aggregate_ws}


def test_list_targets_outputs_a_matrix(matrix_scenario):
    plan = matrix_scenario["runs"]["plan"]
    assert plan.returncode == 0, plan.log[-4000:]
    assert json.loads(plan.outputs["targets"]) == ["a", "b"]
    assert json.loads(plan.outputs["matrix"]) == {"include": [
        {"target": "a", "format": "dynamo", "device": "cpu"}, {"target": "b", "format": "dynamo", "device": "cpu"}]}
    assert plan.outputs["revision"] == matrix_scenario["head"]
    assert "| `a` | dynamo |" in plan.summary


def test_matrix_legs_export_one_target_each_and_publish_nothing(matrix_scenario):
    for target in ("a", "b"):
        leg = matrix_scenario["runs"][target]
        assert leg.returncode == 0, leg.log[-4000:]
        assert [t["name"] for t in leg.report()["targets"]] == [target]
        assert leg.report()["targets"][0]["bench"] is None  # input benchmark: false
        assert leg.outputs["pr-operation"] == "none"
    assert matrix_scenario["after_legs"] == {"comments": [], "discussions": []}


def test_aggregate_dry_run_publishes_nothing(matrix_scenario):
    run = matrix_scenario["runs"]["dry-run"]
    assert run.returncode == 0, run.log[-4000:]
    assert run.outputs["status"] == "passed" and run.outputs["pr-operation"] == "none"
    assert "**Hub PR (dry run):** not opened — dry run: would open a new pull request" in run.summary
    assert matrix_scenario["after_dry_run"]["discussions"] == []
    assert len(matrix_scenario["after_dry_run"]["comments"]) == 1


def test_aggregate_opens_one_pr_and_writes_one_comment(matrix_scenario):
    run = matrix_scenario["runs"]["aggregate"]
    assert run.returncode == 0, run.log[-4000:]
    assert run.outputs["status"] == "passed" and run.outputs["pr-operation"] == "created"
    report = json.loads((matrix_scenario["workspace"] / run.outputs["report-path"]).read_text())
    assert [t["name"] for t in report["targets"]] == ["a", "b"]
    assert [p["part"] for p in report["aggregated_from"]] == ["export-a", "export-b"]
    assert (matrix_scenario["workspace"] / "export-out" / "b" / "model.pt2").is_file()
    prs = [d for d in matrix_scenario["discussions"] if d["isPullRequest"]]
    assert len(prs) == 1 and len(matrix_scenario["discussions"]) == 1
    assert {"exports/a/model.pt2", "exports/b/model.pt2", "exports/report.json"} <= set(matrix_scenario["files"])
    assert [c.id for c in matrix_scenario["comments"]] == [c.id for c in matrix_scenario["after_dry_run"]["comments"]]
    assert "(2/2 targets passed)" in matrix_scenario["comments"][0].body
    assert run.outputs["pr-url"] in matrix_scenario["comments"][0].body
    assert "Merged from 2 report part(s)" in matrix_scenario["comments"][0].body


def test_aggregate_reports_a_missing_leg_and_refuses_mixed_parts(matrix_scenario, tmp_path):
    from exporters.report.aggregate import AggregateError, aggregate

    parts = matrix_scenario["workspace"] / "export-parts"
    only_a = tmp_path / "parts"
    shutil.copytree(parts / "export-a", only_a / "export-a")
    report = aggregate(only_a, tmp_path / "out", expected=["a", "b"])
    assert report["status"] == "failed"
    assert [(t["name"], t["status"], (t.get("error") or {}).get("type")) for t in report["targets"]] == [
        ("a", "passed", None), ("b", "failed", "MissingPart")]
    # an artifact damaged in transfer fails its target
    damaged = tmp_path / "damaged"
    shutil.copytree(parts, damaged)
    with (damaged / "export-b" / "b" / "model.pt2").open("ab") as handle:
        handle.write(b"x")
    report = aggregate(damaged, tmp_path / "out2")
    assert [t["status"] for t in report["targets"]] == ["passed", "failed"]
    assert report["targets"][1]["error"]["type"] == "ArtifactMismatch"
    # legs of different commits cannot be merged
    mixed = tmp_path / "mixed"
    shutil.copytree(parts, mixed)
    part = json.loads((mixed / "export-b" / "report.json").read_text())
    part["source"]["revision"] = "0" * 40
    (mixed / "export-b" / "report.json").write_text(json.dumps(part))
    with pytest.raises(AggregateError, match="disagree on revision"):
        aggregate(mixed, tmp_path / "out3")


def obeyed_commands(stdout: str) -> list[str]:
    """The workflow-command lines the runner acts on: none between `::stop-commands::TOKEN` and `::TOKEN::`."""
    obeyed, stopped = [], None
    for line in stdout.splitlines():
        if stopped is not None:
            stopped = None if line == f"::{stopped}::" else stopped
            continue
        if line.startswith("::stop-commands::"):
            stopped = line.removeprefix("::stop-commands::")
        elif line.startswith("::"):
            obeyed.append(line)
    return obeyed


def test_a_workflow_command_inside_an_upstream_log_is_shown_not_obeyed(matrix_scenario, hub_server, tmp_path):
    workspace = tmp_path / "ws"
    shutil.copytree(matrix_scenario["workspace"] / "export-parts", workspace / "export-parts")
    log = workspace / "export-parts" / "export-a" / "logs" / "a.log"
    log.write_text(log.read_text() + "\n::error::pwned\n::add-mask::pwned\n::set-output name=status::pwned\n")
    run = run_action(workspace, {**run_inputs(matrix_scenario["repo_id"]), "mode": "aggregate", "open-pr": "false",
                                 "comment": "false", "targets": '["a", "b"]'}, github=None, hub_url=hub_server.url)
    assert run.returncode == 0, run.log[-4000:]
    assert "\n::error::pwned\n" in run.stdout  # the log is shown as it is...
    obeyed = obeyed_commands(run.stdout)
    assert obeyed and not [line for line in obeyed if "pwned" in line]  # ...and none of its commands is obeyed
    assert run.stdout.count("::stop-commands::") >= 2  # the merge log and each target's group


def test_markdown_around_log_excerpts_keeps_its_fences_closed():
    from action.github import MAX_COMMENT_CHARS, fit_comment
    from action.summary import run_markdown
    from exporters.report.markdown import close_fences

    report_md = "## Export report\n\n````\n" + "log line\n" * 10 + "```` not a close\n"  # cut mid-fence
    report = {"status": "failed", "source": {"model": "o/m"}, "targets": [
        {"name": "a", "export_format": "onnx", "mode": "model", "status": "failed",
         "error": {"type": "E", "message": "boom <!-- swallow the rest"}}]}
    text = run_markdown(report, report_md, None)
    body, _, tail = text.rpartition("</details>")
    assert close_fences(body) == body and "&lt;!-- swallow" in text and "<!-- swallow" not in text
    long = "intro\n```\n" + "x" * MAX_COMMENT_CHARS
    cut = fit_comment(long)
    assert len(cut) <= MAX_COMMENT_CHARS and close_fences(cut) == cut


# ── Across scenarios ──────────────────────────────────────────────────────────


def test_tokens_never_appear_unmasked(pr_scenario, bad_recipe_scenario, failing_scenario, matrix_scenario):
    assert len(ALL_RUNS) >= 9
    for run in ALL_RUNS:
        for line in run.log.splitlines():
            if line.startswith("::add-mask::"):
                continue
            for token in (BOT_TOKEN, GH_TOKEN):
                assert token not in line, f"token leaked: {line[:200]}"
        masks = [line for line in run.stdout.splitlines() if line.startswith("::add-mask::")]
        assert f"::add-mask::{BOT_TOKEN}" in masks and f"::add-mask::{GH_TOKEN}" in masks
        first_mask = run.stdout.index("::add-mask::")
        assert run.stdout[:first_mask].strip() == ""  # masks come before anything else
        for value in run.outputs.values():
            assert BOT_TOKEN not in value and GH_TOKEN not in value


def test_workflow_command_escaping():
    from action.commands import command, format_outputs, truncate_summary

    assert command("error", "50% done\r\nnext", file="a,b:c.json", line=3, title="T: x") == (
        "::error file=a%2Cb%3Ac.json,line=3,title=T%3A x::50%25 done%0D%0Anext")
    text = format_outputs({"status": "passed", "report-json": '{"a": 1}', "note": "two\nlines"})
    assert parse_outputs(text) == {"status": "passed", "report-json": '{"a": 1}', "note": "two\nlines"}
    big = "é" * (1024 * 1024)
    cut = truncate_summary(big)
    assert len(cut.encode()) <= 1024 * 1024 and cut.endswith("the full report is `report.md`.\n")


def test_settings_accept_hyphenated_and_underscored_inputs(tmp_path):
    from action.settings import Settings, SettingsError

    env = {"INPUT_MODEL": "org/name", "INPUT_OPEN-PR": "false", "INPUT_FAIL_ON_ERROR": "no",
           "INPUT_TARGETS": '["a", "b"]', "GITHUB_WORKSPACE": str(tmp_path)}
    settings = Settings.from_env(env)
    assert (settings.open_pr, settings.fail_on_error, settings.targets) == (False, False, ["a", "b"])
    assert settings.hub_repo_id == "org/name" and settings.output_dir == tmp_path / "export-out"
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"INPUT_MODEL": "x/y", "INPUT_DRY-RUN": "maybe", "INPUT_DEVICE": "tpu",
                           "INPUT_JOBS": "0", "GITHUB_WORKSPACE": str(tmp_path)})
    assert sorted(name for name, _ in err.value.problems) == ["device", "dry-run", "jobs"]
    assert Settings.from_env({**env, "INPUT_JOBS": "auto"}).jobs is None

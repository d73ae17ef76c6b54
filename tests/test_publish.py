"""Publishing to the Hub, end to end: the real `hf-export` CLI (`run MODEL --push`) against the Hub emulator, the
real `huggingface_hub` client on both sides, the published artifacts downloaded and run.

Each scenario exports once (module-scoped fixtures) and the tests assert on what it left on the emulator.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporters.publish import (
    CARD_END,
    CARD_START,
    PublishError,
    parse_marker,
    publish_report,
    render_marker,
    update_model_card,
)
from tests.conftest import run_cli
from tests.servers.hub import HubEmulator
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN

PROMPT = {"1": {"name": "prompt", "min": 2, "max": 64}}
DYNAMO = {
    "name": "dynamo", "export_format": "dynamo", "mode": "generation",
    "prefer_deferred_runtime_asserts_over_guards": True,
    "components": {
        "prefill": {"dynamic_shapes": {"input_ids": PROMPT, "position_ids": PROMPT}},
        "decode": {"dynamic_shapes": {"cache.layers.*.keys": {"2": {"name": "past", "min": 2, "max": 128}},
                                      "cache.layers.*.values": {"2": {"name": "past", "min": 2, "max": 128}}}},
    },
}
# The failing scenario's passing target: one graph (no decode, no generation parity to check): what it shows is a
# passing target published beside a failing one, which one graph shows as well as two (#48)
ONE_GRAPH = {"name": "dynamo", "export_format": "dynamo", "mode": "model"}
BROKEN = {"name": "broken", "export_format": "dynamo", "mode": "model", "dynamic_shapes": {"nope": ["auto"]}}
# No test here reads a timing: a published run's benchmark (tokens per second in the PR's and the card's table) is
# asserted by tests/test_variants.py, which runs in this module's Hub environment with the benchmark on.
NO_BENCH = "--no-bench"
# One layer: what is published, pinned and loaded is every layer's alike; no check here reads the depth (#48: the
# module exports a dynamo target four times, once per new revision)
LAYERS = 1
CARD = "---\nlicense: apache-2.0\ntags:\n- tiny\n---\n# Tiny\n\nThe owner's words.\n"


def recipe(*targets: dict[str, Any], max_new_tokens: int = 4) -> dict[str, Any]:
    return {"schema_version": 1, "exports": [copy.deepcopy(t) for t in targets],
            "inputs": {"prompt": "hello world the model export graph", "batch_size": 1},
            "generation": {"max_new_tokens": max_new_tokens}}


# ── Environment ───────────────────────────────────────────────────────────────


@dataclass
class HubEnv:
    hub: HubEmulator
    home: Path
    cli_env: dict[str, str]
    outputs: list[str] = field(default_factory=list)  # every CLI stdout/stderr, checked for the token

    @property
    def url(self) -> str:
        return self.hub.url

    def api(self, token: str = TEST_TOKEN):
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.url, token=token)

    def cli(self, *args: str, token: str = BOT_TOKEN) -> subprocess.CompletedProcess:
        result = run_cli(*args, "--quiet", env={**self.cli_env, "HF_TOKEN": token}, timeout=600)
        self.outputs += [result.stdout, result.stderr]
        return result

    def upload_model(self, repo_id: str, folder: Path) -> str:
        """Create the repo and upload the model as its owner (alice), through the real client."""
        api = self.api()
        api.create_repo(repo_id)
        api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message="Upload tiny model")
        return self.hub.head(repo_id)

    def push_recipe(self, repo_id: str, data: dict[str, Any]) -> str:
        self.api().upload_file(path_or_fileobj=json.dumps(data, indent=2).encode(), path_in_repo="export_config.json",
                               repo_id=repo_id, commit_message="Change the export recipe")
        return self.hub.head(repo_id)


@pytest.fixture(scope="module")
def env(hub_server: HubEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    """The session's Hub emulator, emptied, with huggingface_hub pointed at it for this module (import-time
    constants patched, as `hf_env` does per test)."""
    from huggingface_hub import constants, hf_api

    hub_server.reset()
    home = tmp_path_factory.mktemp("hf-home")
    patched = {
        "ENDPOINT": hub_server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub_server.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_DISABLE_XET": True, "HF_HUB_DISABLE_TELEMETRY": True, "HF_HUB_OFFLINE": False,
        "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HUGGINGFACE_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"), "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
    }
    cli_env = {"HF_ENDPOINT": hub_server.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HOME": str(home / "cli"), "HF_HUB_OFFLINE": "0",
               "EXPORT_ACTION_STATE_DIR": str(home / "state")}  # the signing key of reused results
    with pytest.MonkeyPatch.context() as patch:
        for name, value in patched.items():
            patch.setattr(constants, name, value, raising=False)
        patch.setattr(hf_api.api, "endpoint", hub_server.url)
        patch.delenv("HF_TOKEN", raising=False)
        yield HubEnv(hub_server, home, cli_env)


def pr_marker(hub: HubEmulator, repo_id: str, num: int) -> dict[str, Any]:
    discussion = next(d for d in hub.discussions(repo_id) if d["num"] == num)
    return parse_marker(discussion["events"][0]["data"]["latest"]["raw"]) or {}


def description(hub: HubEmulator, repo_id: str, num: int) -> str:
    discussion = next(d for d in hub.discussions(repo_id) if d["num"] == num)
    return discussion["events"][0]["data"]["latest"]["raw"]


def all_text(hub: HubEmulator, repo_id: str) -> str:
    """Every discussion text and every text file on every ref, to look for the token in."""
    texts = [json.dumps(hub.discussions(repo_id))]
    for ref in hub.refs(repo_id):
        texts += [data.decode(errors="ignore") for data in hub.files(repo_id, ref).values()]
    return "\n".join(texts)


# ── Scenario: a passing model, published, then re-run ────────────────────────


@dataclass
class Published:
    repo_id: str
    runs: dict[str, subprocess.CompletedProcess]
    heads: dict[str, str]  # main's head before each run
    pr_commits: dict[str, int]  # commits on refs/pr/1 after each run
    discussions: dict[str, list[dict[str, Any]]]  # the repo's discussions after each run
    description: dict[str, str]
    out: Path
    snapshot: Path  # a copy of OUT after the first run
    refs_after_dry: set[str] = field(default_factory=set)  # the repo's refs after the dry run


@pytest.fixture(scope="module")
def published(env: HubEnv, tmp_path_factory: pytest.TempPathFactory) -> Published:
    from tests.models import tiny_llama

    repo_id = "alice/tiny"
    folder = tiny_llama(tmp_path_factory.mktemp("tiny"), recipe=recipe(DYNAMO), layers=LAYERS)
    (folder / "README.md").write_text(CARD)
    out = tmp_path_factory.mktemp("out-tiny")
    state = Published(repo_id, {}, {}, {}, {}, {}, out, tmp_path_factory.mktemp("snapshot") / "out")
    state.heads["first"] = env.upload_model(repo_id, folder)

    def run(name: str) -> None:
        state.runs[name] = env.cli("run", NO_BENCH, repo_id, "--push", "--out", str(out))
        state.pr_commits[name] = len(env.hub.commits(repo_id, "refs/pr/1")) if "refs/pr/1" in env.hub.refs(
            repo_id) else 0
        state.discussions[name] = env.hub.discussions(repo_id)
        state.description[name] = description(env.hub, repo_id, 1) if state.discussions[name] else ""

    # The README's order: a dry run first (it exports and prints the plan, pushes nothing), then the push, which
    # reuses the dry run's export (the same revision and output folder): one export for both (#48)
    state.runs["dry"] = env.cli("run", NO_BENCH, repo_id, "--dry-run", "--out", str(out))
    state.discussions["dry"] = env.hub.discussions(repo_id)
    state.heads["dry"], state.refs_after_dry = env.hub.head(repo_id), set(env.hub.refs(repo_id))
    run("first")
    shutil.copytree(out, state.snapshot)
    state.heads["rerun"] = env.hub.head(repo_id)
    run("rerun")
    return state


def test_push_opens_a_pr_with_the_artifacts(env: HubEnv, published: Published) -> None:
    first = published.runs["first"]
    assert first.returncode == 0, first.stderr[-3000:]
    assert "publish: created" in first.stderr
    assert f"{env.url}/alice/tiny/discussions/1" in first.stdout
    [pr] = published.discussions["first"]
    assert pr["isPullRequest"] and pr["status"] == "open" and pr["author"] == BOT_USER
    assert "dynamo" in pr["title"] and published.heads["first"][:7] in pr["title"]
    files = env.hub.files("alice/tiny", "refs/pr/1")
    for path in ("exports/dynamo/prefill.pt2", "exports/dynamo/decode.pt2", "exports/dynamo/export.json",
                 "exports/report.json", "exports/report.md", "README.md"):
        assert path in files, sorted(files)
    assert not any(p.startswith("exports/logs") for p in files)
    assert env.hub.is_lfs("alice/tiny", "exports/dynamo/prefill.pt2", "refs/pr/1")
    assert json.loads(files["exports/report.json"])["status"] == "passed"
    assert "exports/dynamo/prefill.pt2" not in env.hub.files("alice/tiny", "main")  # main untouched


def test_published_artifacts_load_and_run_from_the_pr(env: HubEnv, published: Published) -> None:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.exporters import ExportedModel

    exported = ExportedModel.from_pretrained("alice/tiny", revision="refs/pr/1", subfolder="exports/dynamo",
                                             trust_remote_code=True)
    assert set(exported.runners) == {"prefill", "decode"}
    eager = AutoModelForCausalLM.from_pretrained("alice/tiny", revision=published.heads["first"]).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])  # not the traced length
    positions = torch.arange(ids.shape[1])[None]
    out = exported.runners["prefill"](input_ids=ids, position_ids=positions, cache=DynamicCache(config=eager.config))
    with torch.no_grad():
        reference = eager(input_ids=ids, position_ids=positions).logits
    torch.testing.assert_close(out["logits"], reference, atol=1e-5, rtol=1e-4)


def test_pr_description_carries_report_marker_and_snippet(published: Published) -> None:
    text = published.description["first"]
    assert "## Export report" in text
    files_commit = _pinned(text)  # a pickled .pt2: the snippet pins the PR's commit that holds the files
    assert f'revision="{files_commit}", subfolder="exports/dynamo", trust_remote_code=True' in text
    marker = parse_marker(text)
    report = json.loads((published.snapshot / "report.json").read_text())
    assert marker["kind"] == "exports" and marker["recipe"] == "repo" and marker["base"] == "main"
    assert marker["source_sha"] == report["source"]["revision"] == published.heads["first"]
    assert marker["recipe_sha256"] == report["recipe"]["sha256"]
    assert marker["versions"] == report["versions"]
    assert marker["cache_keys"] == {"dynamo": report["targets"][0]["cache_key"]}


def test_model_card_section_keeps_front_matter_and_is_replaced(env: HubEnv, published: Published) -> None:
    card = env.hub.file("alice/tiny", "README.md", "refs/pr/1").decode()
    assert card.startswith(CARD)  # front matter and the owner's text untouched
    assert card.count(CARD_START) == 1 and card.count(CARD_END) == 1
    commit = _pinned(card)
    assert (f'ExportedModel.from_pretrained("alice/tiny", revision="{commit}", subfolder="exports/dynamo", '
            "trust_remote_code=True)") in card
    assert published.heads["first"][:7] in card


def _pinned(text: str) -> str:
    """The one commit every snippet in `text` pins (`revision="<sha>"`)."""
    [commit] = set(re.findall(r'revision="([0-9a-f]{40})"', text))
    return commit


def test_the_cards_snippets_pin_the_commit_that_holds_the_files(env: HubEnv, published: Published) -> None:
    """#45 §7: a snippet that loads a pickle (`trust_remote_code=True` on a `.pt2`) downloads the files at the PR's
    commit that holds them, never at a moving ref, and says why; the PR's description pins the same commit."""
    repo = "alice/tiny"
    card = env.hub.file(repo, "README.md", "refs/pr/1").decode()
    commit = _pinned(card)
    commits = [c["id"] for c in env.hub.commits(repo, "refs/pr/1")]
    assert commit in commits and commit != env.hub.head(repo, "refs/pr/1")  # the files' commit, then the card's
    at_commit, at_head = env.hub.files(repo, commit), env.hub.files(repo, "refs/pr/1")
    exported = [path for path in at_head if path.startswith("exports/dynamo/")]
    assert exported and all(at_commit[path] == at_head[path] for path in exported)  # the files the card loads
    for line in card.splitlines():
        assert "trust_remote_code=True)" not in line or f'revision="{commit}"' in line, line
    assert "# revision: the commit that holds the validated files (a .pt2 is a pickle" in card
    assert _pinned(published.description["first"]) == commit
    # the commit that holds the files carries no unpinned snippet either: its card says the pinned one follows
    first_card = at_commit["README.md"].decode()
    assert "trust_remote_code=True)" not in first_card.split("## Exports")[1].split("`trust_remote_code=True` is")[0]
    assert "it is written in the next commit" in first_card


def test_the_cards_snippets_run_as_written(env: HubEnv, published: Published, tmp_path: Path) -> None:
    """#45 §10: every snippet of the published card, run as written (nothing replaced) by the venv's Python against
    the Hub, loads the PR's files at the pinned commit and runs them."""
    from tests.card_snippets import card_snippets, run_snippet

    card = env.hub.file("alice/tiny", "README.md", "refs/pr/1").decode()
    snippets = card_snippets(card)
    assert [runtime for runtime, _, _ in snippets] == ["transformers.exporters"]
    for i, (runtime, language, code) in enumerate(snippets):
        done = run_snippet(code, env.hub, tmp_path / f"home-{i}")
        assert done.returncode == 0, (code, done.stderr[-3000:])


def test_rerun_with_same_inputs_changes_nothing(env: HubEnv, published: Published) -> None:
    rerun = published.runs["rerun"]
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "publish: unchanged" in rerun.stderr and "#1" in rerun.stderr
    assert published.pr_commits["rerun"] == published.pr_commits["first"]
    assert published.discussions["rerun"] == published.discussions["first"]
    assert published.description["rerun"] == published.description["first"]


def test_dry_run_prints_the_plan_and_pushes_nothing(env: HubEnv, published: Published) -> None:
    """The dry run before the first push (`published`): the plan and the PR text, nothing on the Hub; the push that
    followed reused its export."""
    result = published.runs["dry"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Publish plan for alice/tiny" in result.stdout
    assert "action: open a new pull request" in result.stdout
    assert "exports/dynamo/prefill.pt2" in result.stdout and "README.md" in result.stdout
    assert "## Export report" in result.stdout and "export-action:publish" in result.stdout
    assert "publish: none" in result.stderr
    assert published.discussions["dry"] == []
    assert published.heads["dry"] == published.heads["first"] and published.refs_after_dry == {"refs/heads/main"}
    [target] = json.loads((published.snapshot / "report.json").read_text())["targets"]
    assert target["cached"] is True and target["status"] == "passed"  # the push exported nothing again


def test_auto_exporter_reads_the_recipe_from_the_hub(env: HubEnv, published: Published) -> None:
    from exporters.auto import AutoHfExporter

    exporter = AutoHfExporter.from_pretrained("alice/tiny", endpoint=env.url)
    assert exporter.export_format == "dynamo" and exporter.target.name == "dynamo"
    assert exporter.recipe.sha256() == pr_marker(env.hub, "alice/tiny", 1)["recipe_sha256"]


def test_push_checks_access_before_exporting(env: HubEnv, published: Published, tmp_path: Path) -> None:
    bad = env.cli("run", NO_BENCH, "alice/tiny", "--push", "--out", str(tmp_path / "out"),
                  token="hf_not_a_valid_token")
    assert bad.returncode == 3  # publishing cannot happen: exit 3, before anything is exported
    assert "HF_TOKEN" in bad.stderr and "hf_not_a_valid_token" not in bad.stderr + bad.stdout
    assert "--token" not in bad.stderr  # hints never suggest a token on the command line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["publish.json"]  # nothing was exported
    outcome = json.loads((tmp_path / "out" / "publish.json").read_text())
    assert outcome["operation"] == "failed" and outcome["retryable"] is False
    local = env.cli("run", NO_BENCH, str(tmp_path), "--push", "--out", str(tmp_path / "out"))
    assert local.returncode == 2 and "--repo-id" in local.stderr


def test_publish_error_never_shows_the_token(env: HubEnv, published: Published) -> None:
    secret = "hf_secret_value_123"
    with pytest.raises(PublishError) as raised:
        publish_report("alice/tiny", published.snapshot, token=secret, endpoint=env.url)
    assert secret not in str(raised.value) and "`token`" in str(raised.value) and raised.value.option == "token"
    assert not raised.value.retryable  # a 401 will not fix itself
    with pytest.raises(PublishError, match="`repo_id`"):
        publish_report("not a repo", published.snapshot, token=BOT_TOKEN, endpoint=env.url)


# ── Scenario: a failing target ────────────────────────────────────────────────


@dataclass
class Failing:
    repo_id: str
    runs: dict[str, Any]
    discussions: dict[str, list[dict[str, Any]]]
    heads: dict[str, str]
    out: Path
    pr_commits: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def failing(env: HubEnv, published: Published, tmp_path_factory: pytest.TempPathFactory) -> Failing:
    from tests.models import tiny_llama

    repo_id = "alice/tiny-fail"
    folder = tiny_llama(tmp_path_factory.mktemp("tiny-fail"), recipe=recipe(ONE_GRAPH, BROKEN), layers=LAYERS)
    out = tmp_path_factory.mktemp("out-fail") / "out"
    # Each new revision (first, second, fixed) exports `dynamo` again (the cache key holds the revision);
    # `--publish-failed` at the second's reuses it.
    state = Failing(repo_id, {}, {}, {}, out)
    state.heads["first"] = env.upload_model(repo_id, folder)
    state.runs["first"] = env.cli("run", NO_BENCH, repo_id, "--push", "--out", str(out))
    state.discussions["first"] = env.hub.discussions(repo_id)
    state.heads["second"] = env.push_recipe(repo_id, recipe(ONE_GRAPH, {**BROKEN,
                                                                    "dynamic_shapes": {"nope2": ["auto"]}}))
    state.runs["second"] = env.cli("run", NO_BENCH, repo_id, "--push", "--out", str(out))
    state.discussions["second"] = env.hub.discussions(repo_id)
    state.runs["again"] = publish_report(repo_id, out, token=BOT_TOKEN, endpoint=env.url)  # no re-export
    state.discussions["again"] = env.hub.discussions(repo_id)
    state.runs["publish_failed"] = env.cli("run", NO_BENCH, repo_id, "--push", "--publish-failed", "--out", str(out))
    state.discussions["publish_failed"] = env.hub.discussions(repo_id)
    state.pr_commits["publish_failed"] = len(env.hub.commits(repo_id, "refs/pr/2"))
    # A recipe change on main (the broken target removed): the same PR is updated.
    state.heads["fixed"] = env.push_recipe(repo_id, recipe(ONE_GRAPH))
    state.runs["fixed"] = env.cli("run", NO_BENCH, repo_id, "--push", "--out", str(out))
    state.discussions["fixed"] = env.hub.discussions(repo_id)
    state.pr_commits["fixed"] = len(env.hub.commits(repo_id, "refs/pr/2"))
    return state


def test_failing_run_posts_a_discussion_not_a_pr(env: HubEnv, failing: Failing) -> None:
    first = failing.runs["first"]
    assert first.returncode == 1, first.stderr[-3000:]
    assert "publish: discussion" in first.stderr
    [discussion] = failing.discussions["first"]
    assert not discussion["isPullRequest"] and discussion["author"] == BOT_USER
    assert "broken" in discussion["title"] and failing.heads["first"][:7] in discussion["title"]
    text = discussion["events"][0]["data"]["latest"]["raw"]
    assert "no artifact was published" in text and "match no input" in text
    assert parse_marker(text)["kind"] == "failure" and parse_marker(text)["failed"] == ["broken"]
    assert not any(p.startswith("exports/") for p in env.hub.files(failing.repo_id, "main"))


def test_second_failing_run_updates_the_discussion(env: HubEnv, failing: Failing) -> None:
    second = failing.runs["second"]
    assert second.returncode == 1 and "publish: discussion" in second.stderr, second.stderr[-3000:]
    [discussion] = failing.discussions["second"]
    assert discussion["num"] == 1 and discussion["status"] == "open"
    description_text = discussion["events"][0]["data"]["latest"]["raw"]
    assert parse_marker(description_text)["source_sha"] == failing.heads["second"]
    assert failing.heads["second"][:7] in discussion["title"]
    comments = [e for e in discussion["events"] if e["type"] == "comment"]
    assert len(comments) == 2 and "Still failing" in comments[1]["data"]["latest"]["raw"]
    again = failing.runs["again"]
    assert again.operation == "unchanged" and again.discussion_url.endswith("/discussions/1")
    assert failing.discussions["again"] == failing.discussions["second"]


def test_publish_failed_publishes_passing_targets_and_names_the_failed(env: HubEnv, failing: Failing) -> None:
    run = failing.runs["publish_failed"]
    assert run.returncode == 1, run.stderr[-3000:]  # a target failed: the exit code says so
    assert "publish: created" in run.stderr
    pr = next(d for d in failing.discussions["publish_failed"] if d["isPullRequest"])
    assert "failed: broken" in pr["title"]
    text = pr["events"][0]["data"]["latest"]["raw"]
    assert "`broken` did not pass and are **not** included" in text
    files = env.hub.files(failing.repo_id, f"refs/pr/{pr['num']}")
    assert "exports/dynamo/model.pt2" in files and not any(p.startswith("exports/broken") for p in files)
    [discussion] = [d for d in failing.discussions["publish_failed"] if not d["isPullRequest"]]
    assert discussion["status"] == "open"  # the failure is still real


def test_recipe_change_adds_a_commit_to_the_same_pr(env: HubEnv, failing: Failing) -> None:
    fixed = failing.runs["fixed"]
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "publish: updated" in fixed.stderr and "#2" in fixed.stderr
    # the files, then the card with its snippets pinned to that commit (a .pt2 loads a pickle)
    assert failing.pr_commits["fixed"] == failing.pr_commits["publish_failed"] + 2
    discussion, pr = failing.discussions["fixed"]  # never two PRs for one recipe
    assert pr["num"] == 2 and pr["isPullRequest"] and pr["status"] == "open"
    assert "failed" not in pr["title"] and failing.heads["fixed"][:7] in pr["title"]
    assert [e["type"] for e in pr["events"]].count("comment") == 1  # the description was edited, not re-posted
    text = pr["events"][0]["data"]["latest"]["raw"]
    assert "not** included" not in text and f'revision="{_pinned(text)}"' in text
    assert _pinned(text) == env.hub.commits(failing.repo_id, "refs/pr/2")[1]["id"]
    marker = parse_marker(text)
    assert marker["source_sha"] == failing.heads["fixed"] and marker["failed"] == []
    before = parse_marker(next(d for d in failing.discussions["publish_failed"] if d["isPullRequest"])
                          ["events"][0]["data"]["latest"]["raw"])
    assert marker["recipe_sha256"] != before["recipe_sha256"]
    files = env.hub.files(failing.repo_id, "refs/pr/2")
    report = json.loads(files["exports/report.json"])
    assert report["status"] == "passed" and report["source"]["revision"] == failing.heads["fixed"]
    card = files["README.md"].decode()
    assert card.count(CARD_START) == 1 and failing.heads["fixed"][:7] in card  # replaced, not duplicated


def test_passing_run_closes_the_failure_discussion(failing: Failing) -> None:
    discussion = failing.discussions["fixed"][0]
    assert not discussion["isPullRequest"] and discussion["status"] == "closed"
    assert "Resolved" in discussion["events"][-2]["data"]["latest"]["raw"]
    assert "#2" in discussion["events"][-2]["data"]["latest"]["raw"]


def test_token_never_appears(env: HubEnv, published: Published, failing: Failing) -> None:
    for output in env.outputs:
        assert BOT_TOKEN not in output and TEST_TOKEN not in output
    for repo_id in ("alice/tiny", "alice/tiny-fail"):
        assert BOT_TOKEN not in all_text(env.hub, repo_id)


# ── Pure functions ────────────────────────────────────────────────────────────


def test_model_card_update_is_idempotent_and_keeps_the_rest() -> None:
    section = f"{CARD_START}\n## Exports\nv1\n{CARD_END}"
    once = update_model_card(CARD, section)
    assert once.startswith(CARD) and once.count(CARD_START) == 1
    twice = update_model_card(once.replace("v1", "v1") + "\nAfter.\n", section.replace("v1", "v2"))
    assert "v2" in twice and "v1" not in twice and twice.endswith("\nAfter.\n") and twice.count(CARD_START) == 1
    assert update_model_card(None, section, "tiny") == f"# tiny\n\n{section}\n"


def test_marker_round_trips_and_cannot_close_the_comment() -> None:
    data = {"kind": "exports", "versions": {"x": "1 --> 2"}}
    text = "report\n" + render_marker(data) + "\ntrailing"
    assert parse_marker(text) == data
    assert text.count("-->") == 1

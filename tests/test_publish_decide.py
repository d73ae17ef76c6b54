"""Publishing's decision table, merge and texts as plain functions: no emulator, no network (the wire is tested in
test_publish.py and test_publish_races.py). One case per test, in the style of huggingface_hub's error tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from exporters.errors import PublishError
from exporters.publish import (
    Held,
    HubView,
    PlannedFile,
    PublishOptions,
    PublishPlan,
    ThreadState,
    decide,
    merge_plan,
    parse_marker,
    plan_publish,
    publish_destination,
    publish_report,
    same_fingerprint,
)
from exporters.publish.decide import duplicates_of
from exporters.publish.texts import card_section, fit_markdown, pr_description, what_was_checked
from exporters.report.markdown import close_fences

OLD, MID, NEW = "1" * 40, "2" * 40, "3" * 40
SLOT = {"kind": "exports", "recipe": "repo", "base": "main"}


def marker(**values: Any) -> dict[str, Any]:
    return {**SLOT, "source_sha": MID, "recipe_sha256": "r", "versions": {"torch": "2"}, "cache_keys": {"a": "k"},
            "published": ["a"], "failed": [], **values}


def thread(num: int, status: str = "open", pr: bool = True, **values: Any) -> ThreadState:
    return ThreadState(num, pr, status, marker(**values))


# ── decide: pull requests ─────────────────────────────────────────────────────


def test_no_thread_creates() -> None:
    assert decide(marker(), HubView(())).operation == "create"
    assert decide(_plan(["a"], ["a"]), HubView(())).operation == "create"  # a plan, or its marker


def test_open_pr_with_other_inputs_is_updated() -> None:
    decision = decide(marker(), HubView((thread(4, cache_keys={"a": "old"}),)))
    assert decision.operation == "update" and decision.thread.num == 4


def test_open_pr_with_the_same_inputs_is_unchanged() -> None:
    decision = decide(marker(), HubView((thread(4),)))
    assert decision.operation == "unchanged" and decision.thread.num == 4


def test_a_closed_pr_with_the_same_inputs_is_not_reopened() -> None:
    decision = decide(marker(), HubView((thread(4, status="closed"),)))
    assert decision.operation == "unchanged" and "not reopened" in decision.reason


def test_a_closed_pr_with_other_inputs_gives_a_new_pr() -> None:
    assert decide(marker(), HubView((thread(4, status="merged", recipe_sha256="x"),))).operation == "create"


def test_threads_of_other_slots_do_not_count() -> None:
    others = (thread(1, recipe="edge.json"), thread(2, base="dev"), thread(3, pr=False, kind="failure"))
    assert decide(marker(), HubView(others)).operation == "create"


def test_an_older_marker_without_the_unverified_key_is_the_same_fingerprint() -> None:
    older = {k: v for k, v in marker().items()}
    assert same_fingerprint(older, marker(unverified=[]))
    assert not same_fingerprint(older, marker(unverified=["a"]))


# ── decide: superseded ────────────────────────────────────────────────────────


def test_an_open_pr_holding_a_newer_commit_supersedes_the_run() -> None:
    view = HubView((thread(4, source_sha=NEW),), history=(NEW, MID, OLD))
    decision = decide(marker(), view)
    assert decision.operation == "superseded" and "#4" in decision.reason and NEW[:7] in decision.reason


def test_an_open_pr_holding_an_older_commit_is_updated() -> None:
    view = HubView((thread(4, source_sha=OLD),), history=(MID, OLD))
    assert decide(marker(), view).operation == "update"


def test_a_failure_discussion_of_a_newer_commit_supersedes_a_passing_older_run() -> None:
    view = HubView((thread(2, pr=False, kind="failure", source_sha=NEW),), history=(NEW, MID))
    assert decide(marker(), view).operation == "superseded"


def test_base_moved_to_other_model_files_supersedes_the_run() -> None:
    decision = decide(marker(), HubView((), history=(NEW, MID), inputs_changed=True))
    assert decision.operation == "superseded" and "main has moved to" in decision.reason


def test_base_moved_without_changing_the_inputs_still_publishes() -> None:
    assert decide(marker(), HubView((), history=(NEW, MID), inputs_changed=False)).operation == "create"


def test_a_commit_not_on_the_base_branch_is_never_called_older() -> None:
    view = HubView((thread(4, source_sha=NEW),), history=(NEW, OLD), inputs_changed=True)
    assert decide(marker(), view).operation == "update"  # MID is not on main: no order to judge by
    assert decide(marker(source_sha=None), HubView((), history=(NEW,))).operation == "create"  # a local run


def test_a_superseded_failure_posts_nothing() -> None:
    failure = marker(kind="failure", published=[], failed=["a"])
    assert decide(failure, HubView((), history=(NEW, MID), inputs_changed=True)).operation == "superseded"


# ── decide: discussions and duplicates ────────────────────────────────────────


def test_failure_opens_updates_or_leaves_its_discussion() -> None:
    failure = marker(kind="failure", published=[], failed=["a"])
    assert decide(failure, HubView(())).operation == "discussion"
    open_one = ThreadState(2, False, "open", {**failure, "source_sha": OLD})
    decision = decide(failure, HubView((open_one,)))
    assert decision.operation == "discussion" and decision.thread.num == 2
    same = ThreadState(2, False, "open", failure)
    assert decide(failure, HubView((same,))).operation == "unchanged"


def test_the_lower_numbered_duplicate_wins() -> None:
    view = HubView((thread(5), thread(3), thread(2, status="closed")))
    assert duplicates_of(5, marker(), view).num == 3  # 5 was opened last: it closes itself
    assert duplicates_of(3, marker(), view) is None  # 3 stays


# ── merge keyed by target ─────────────────────────────────────────────────────


def _plan(targets: list[str], recipe_targets: list[str], recipe: str = "repo") -> PublishPlan:
    report = {"targets": [{"name": n, "status": "passed"} for n in targets], "recipe": {"targets": recipe_targets},
              "source": {"revision": MID}}
    files = [PlannedFile(f"exports/{n}/model.onnx", 10, target=n, data=b"x" * 10) for n in targets]
    return PublishPlan("o/m", "exports", "main", report, "", list(targets), [], files,
                       {"recipe": recipe, "cache_keys": {n: n for n in targets}, "published": list(targets)})


def _held(*targets: str, extra: tuple[str, ...] = ()) -> Held:
    report = {"targets": [{"name": n, "status": "passed", "cache_key": n, "files": [{"path": f"{n}/model.onnx"}]}
                          for n in targets], "source": {"revision": OLD}}
    return Held(tuple(f"exports/{n}/model.onnx" for n in targets) + extra, report)


def test_a_partial_run_keeps_the_other_targets() -> None:
    merged = merge_plan(_plan(["a"], ["a", "b"]), _held("a", "b"), render=lambda report: "merged")
    assert merged.carried == ["b"] and merged.published == ["a", "b"] and merged.deletions == []
    report = json.loads(next(f.data for f in merged.files if f.path_in_repo == "exports/report.json"))
    assert [t["name"] for t in report["targets"]] == ["a", "b"] and report["targets"][1]["carried_from"] == OLD
    assert merged.marker["published"] == ["a", "b"]
    assert merged.target_bytes() == {"a": 10}  # b is already on the Hub: nothing of it is uploaded


def test_a_target_dropped_from_the_recipe_is_deleted_and_a_replaced_one_loses_stale_files() -> None:
    held = _held("a", "gone", extra=("exports/a/stale.bin",))
    merged = merge_plan(_plan(["a"], ["a"]), held)
    assert merged.carried == [] and merged.deletions == ["exports/a/stale.bin", "exports/gone/model.onnx"]


def test_another_recipes_artifacts_are_never_touched() -> None:
    held = Held(("exports/theirs/model.onnx", "exports/report.json", "exports/report.md"), None)
    merged = merge_plan(_plan(["a"], ["a"], recipe="edge.json"), held)
    assert merged.deletions == []


# ── texts ─────────────────────────────────────────────────────────────────────


def _report_target(name: str, status: str = "passed", unverified: list[str] | None = None) -> dict[str, Any]:
    checks = [{"probe": "traced", "verdict": "passed"}, {"probe": "seq=9", "verdict": "passed"},
              {"probe": "seq=64", "verdict": "skipped" if unverified else "passed"}]
    return {"name": name, "status": status, "export_format": "onnx", "mode": "model", "unverified": unverified or [],
            "components": [{"name": "model", "checks": checks}], "files": [{"path": f"{name}/m.onnx", "size": 4}]}


def _text_plan(markdown: str = "## Export report", unverified: bool = False) -> PublishPlan:
    target = _report_target("onnx", "unverified" if unverified else "passed",
                            ["model: probe seq=64 did not run (too large)"] if unverified else None)
    report = {"targets": [target], "recipe": {"file": "export_config.json", "sha256": "ab" * 32},
              "source": {"model": "o/m", "revision": MID}, "tool": {"version": "0.1.0"}, "versions": {}}
    return PublishPlan("o/m", "exports", "main", report, markdown, ["onnx"], [],
                       [PlannedFile("exports/onnx/m.onnx", 4, data=b"abcd", target="onnx")],
                       {**marker(), "recipe": "repo"}, unverified=["onnx"] if unverified else [])


def test_the_checking_sentence_counts_what_ran() -> None:
    text = what_was_checked(_report_target("onnx"))
    assert "at 3 probes (2 at shapes it was not traced with)" in text
    text = what_was_checked({"name": "x", "components": [{"name": "m", "checks": [{"probe": "traced",
                                                                                  "verdict": "skipped"}]}]})
    assert "no probe compared it with the eager model" in text


def test_unverified_targets_published_by_choice_are_named_with_the_checks_that_did_not_run() -> None:
    card = card_section(_text_plan(unverified=True))
    assert "`onnx` is published unverified" in card and "probe seq=64 did not run (too large)" in card
    assert "Every artifact was checked" not in card
    assert "Every artifact was checked" not in pr_description(_text_plan())


def test_a_cut_report_cannot_swallow_the_marker() -> None:
    log = "x\n" * 40_000
    markdown = f"## Export report\n\n````\n{log}```\nstill the log\n````\n"
    text = pr_description(_text_plan(markdown))
    before, _, after = text.rpartition("<!-- export-action:publish")
    assert close_fences(before) == before  # every fence opened before the marker is closed
    assert parse_marker(text)["kind"] == "exports"
    assert fit_markdown("a\n```\nb\nc", 8).startswith("a\n```\nb\n```\n\n_Cut to fit")


# ── where to publish, how much ────────────────────────────────────────────────


def test_destination_from_the_library(tmp_path: Path) -> None:
    assert publish_destination("org/m", revision="dev").base == "dev"
    assert publish_destination("org/m", revision=NEW).base == "main"
    with pytest.raises(PublishError) as raised:
        publish_destination(str(tmp_path))
    assert raised.value.option == "repo_id" and "--" not in str(raised.value)


def _out(tmp_path: Path, size: int) -> Path:
    out = tmp_path / "out"
    (out / "onnx").mkdir(parents=True)
    data = b"\0" * size
    (out / "onnx" / "model.onnx").write_bytes(data)
    target = {"name": "onnx", "status": "passed", "export_format": "onnx", "mode": "model",
              "files": [{"path": "onnx/model.onnx", "size": size, "sha256": hashlib.sha256(data).hexdigest()}]}
    report = {"status": "passed", "targets": [target], "versions": {}, "tool": {"version": "0"},
              "recipe": {"file": "export_config.json", "sha256": "r", "targets": ["onnx"]},
              "source": {"model": "o/m", "revision": MID, "weights_sha256": "w"}}
    (out / "report.json").write_text(json.dumps(report))
    (out / "report.md").write_text("## Export report\n")
    return out


def test_a_pr_over_the_size_limit_is_refused_before_any_network_call(tmp_path: Path) -> None:
    out = _out(tmp_path, 1000)
    plan = plan_publish("o/m", out)
    assert plan.target_bytes() == {"onnx": 1000} and plan.upload_bytes > 1000
    with pytest.raises(PublishError) as raised:  # the endpoint does not exist: the refusal comes first
        publish_report("o/m", out, token="x", endpoint="http://127.0.0.1:9",
                       options=PublishOptions(max_upload_bytes=500))
    assert "more than the limit of 500 B" in str(raised.value) and "onnx 1000 B" in str(raised.value)
    assert raised.value.option == "max_upload_size" and not raised.value.retryable
    outcome = json.loads((out / "publish.json").read_text())
    assert outcome["operation"] == "failed" and outcome["retryable"] is False

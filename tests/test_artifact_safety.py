"""Nothing from an artifact folder runs, nothing the tool did not validate is reused or published, no planted link is
followed (#13 §1). The real CLI on a tiny BERT exported once to ONNX (a format whose upstream loader would read the
folder's config with its code), then the output folder tampered with as an attacker would."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
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
    root = tmp_path_factory.mktemp("artifact-safety")
    state = root / "state"  # the signing key of results this tool validated: outside every output folder
    model = tiny_bert(root / "model", RECIPE)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet",
                     env={"EXPORT_ACTION_STATE_DIR": str(state)})
    assert result.returncode == 0, result.stderr[-3000:]
    return {"root": root, "model": model, "out": out, "state": state}


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


def test_a_planted_report_is_never_reused_or_published(exported: dict[str, Path], hf_env) -> None:
    hub = hf_env
    out = copy_out(exported, "out-forged")
    junk = _forge(out)
    files = {p.name: p.read_bytes() for p in exported["model"].iterdir() if p.is_file()}
    hub.create_model_repo("alice/forged", files)
    result = cli(exported, "run", "--no-bench", "alice/forged", "--out", str(out), "--push", "--quiet",
                 HF_ENDPOINT=hub.url,
                 HF_HUB_DISABLE_XET="1", HF_HOME=str(out.parent / "hf-home"))
    assert result.returncode == 0, result.stderr[-3000:]
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

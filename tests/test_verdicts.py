"""Verdicts are earned: a check that did not run is never a pass (#12 §1), declared dynamic ranges are traced at sizes
torch.export keeps dynamic (§3), and what the user asked for is what runs (§5). Real exports of tiny models, through
the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.models import tiny_bert, tiny_llama


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# ── A check that did not run is not a pass ────────────────────────────────────


def test_a_component_whose_unseen_shapes_were_skipped_is_unverified_and_opens_no_pr(tmp_path, hf_env):
    """Every probe at an unseen shape larger than the traced one is over max_probe_elements: those ranges are not
    compared. The traced probe still runs (its inputs are the capture's own). Published with --push to the Hub
    emulator."""
    hub = hf_env
    recipe = {"schema_version": 1, "exports": [{"export_format": "dynamo", "dynamic": True}],
              "validation": {"max_probe_elements": 1}}
    model_dir = tiny_bert(tmp_path / "model", recipe)
    repo = "alice/skipped"
    hub.create_model_repo(repo, {p.name: p.read_bytes() for p in model_dir.iterdir()})
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", repo, "--out", str(out), "--quiet", "--push")
    assert result.returncode == 1, result.stderr[-3000:]
    report = _report(out)
    target = report["targets"][0]
    assert target["status"] == "unverified" and report["status"] == "unverified"
    assert target["unverified"] and all("max_probe_elements" in line for line in target["unverified"])
    checks = {c["probe"]: c["verdict"] for c in target["components"][0]["checks"]}
    assert checks.pop("traced") == "passed", checks
    assert "skipped" in checks.values() and set(checks.values()) <= {"skipped", "passed"}, checks
    markdown = (out / "report.md").read_text()
    assert "unverified" in markdown and "Not verified" in markdown and "max_probe_elements" in markdown
    discussions = hub.discussions(repo)
    assert discussions and not any(d["isPullRequest"] for d in discussions), discussions
    assert not any(f.startswith("exports/") for f in hub.files(repo, "main"))
    assert not [ref for ref in hub.refs(repo) if ref.startswith("refs/pr/")]


@pytest.fixture(scope="module")
def eos_first(tmp_path_factory):
    """A Llama whose first greedy token for the recipe's prompt is its EOS: generation stops before the decode graph
    ever runs."""
    from transformers import AutoModelForCausalLM

    from examples.build_demo_model import build_tokenizer

    root = tmp_path_factory.mktemp("eos-first")
    recipe = {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation", "dynamic": True}],
              "inputs": {"prompt": "hello world export the model"}}
    model_dir = tiny_llama(root / "model", recipe)
    tokenizer = build_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        first = int(model(**tokenizer("hello world export the model", return_tensors="pt")).logits[0, -1].argmax())
    model.generation_config.eos_token_id = first
    model.config.eos_token_id = first
    model.save_pretrained(model_dir)
    out = root / "out"
    return out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_generation_parity_that_compared_no_decode_step_is_unverified(eos_first):
    out, result = eos_first
    target = _report(out)["targets"][0]
    assert target["generation"]["status"] == "skipped", target["generation"]
    assert result.returncode == 1 and target["status"] == "unverified", result.stderr[-3000:]
    assert any("decode graph was never run" in line for line in target["unverified"])
    assert all(c["verdict"] == "passed" for c in target["components"]), "every component's probes ran and passed"


# ── Declared dynamic ranges are honoured ──────────────────────────────────────


def tiny_vit(folder: Path, recipe) -> Path:
    from transformers import ViTConfig, ViTForImageClassification

    from tests.models import write_recipe

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=16, patch_size=8, num_labels=5)
    ViTForImageClassification(config).eval().save_pretrained(folder)
    write_recipe(folder, recipe)
    return folder


BATCH = {"0": {"name": "batch", "min": 1, "max": 8}}


@pytest.fixture(scope="module")
def vit_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit")
    recipe = [{"name": "dynamo", "export_format": "dynamo", "dynamic_shapes": {"pixel_values": BATCH}},
              {"name": "onnx", "export_format": "onnx", "dynamic_shapes": {"pixel_values": BATCH}},
              # the image is fixed at 16 by ViT's position embeddings: a contract the model cannot keep
              {"name": "image-size", "export_format": "dynamo",
               "dynamic_shapes": {"pixel_values": {"2": {"name": "side", "min": 16, "max": 64}}}}]
    model_dir = tiny_vit(root / "model", recipe)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_a_declared_batch_range_is_traced_dynamic_and_runs_at_min_mid_max(vit_batch):
    _, out, result = vit_batch
    report = _report(out)
    status = {t["name"]: t for t in report["targets"]}
    for name in ("dynamo", "onnx"):
        target = status[name]
        assert target["status"] == "passed", target.get("error")
        assert any("'batch' is traced at size 2" in f for f in target["findings"]), target["findings"]
        checks = {c["probe"]: c for c in target["components"][0]["checks"]}
        assert set(checks) == {"traced", "batch=1", "batch=4", "batch=8"}
        assert checks["traced"]["shapes"]["pixel_values"][0] == 2
        assert all(c["verdict"] == "passed" for c in checks.values())


@pytest.mark.parametrize("name", ["dynamo", "onnx"])
def test_the_artifact_runs_from_disk_at_batch_1_4_and_8(vit_batch, name):
    from transformers import ViTForImageClassification
    from transformers.exporters import ExportedModel

    model_dir, out, _ = vit_batch
    eager = ViTForImageClassification.from_pretrained(model_dir).eval()
    exported = ExportedModel.from_pretrained(out / name, trust_remote_code=True)  # our own artifact
    for batch in (1, 4, 8):
        pixels = torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            want = eager(pixel_values=pixels).logits
        got = exported(pixel_values=pixels).logits
        assert tuple(got.shape) == (batch, 5)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


def test_a_declared_range_the_model_cannot_keep_fails_with_the_reason(vit_batch):
    _, out, result = vit_batch
    assert result.returncode == 1
    target = next(t for t in _report(out)["targets"] if t["name"] == "image-size")
    assert target["status"] == "failed"
    message = target["error"]["message"]
    assert "side" in message and ("Constraints violated" in message or "specialized" in message), message


def test_outputs_are_compared_a_slice_at_a_time_with_the_whole_tensors_verdict(monkeypatch):
    """Large outputs (a long prompt's logits) are compared slice by slice to keep validation's memory small: one bad
    element in the last slice, a NaN anywhere, or a non-contiguous output give the verdict and the numbers the
    whole-tensor comparison gives."""
    from exporters.validate import checks as validate

    monkeypatch.setattr(validate, "COMPARE_CHUNK_ELEMENTS", 1000)
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(3, 2501, generator=generator)
    close = reference + 1e-6 * torch.randn(3, 2501, generator=generator)

    def whole(want: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
        diff = (got - want).abs()
        return float(diff.max()), float((diff / want.abs().clamp_min(1e-12)).max())

    [ok] = validate.compare_outputs({"logits": reference}, {"logits": close}, 1e-4, 1e-3)
    assert ok.passed and (ok.max_abs_diff, ok.max_rel_diff) == whole(reference, close)

    off = close.clone()
    off[2, 2500] += 0.5  # the last element of the last slice
    [bad] = validate.compare_outputs({"logits": reference}, {"logits": off}, 1e-4, 1e-3)
    assert not bad.passed and (bad.max_abs_diff, bad.max_rel_diff) == whole(reference, off)

    [transposed] = validate.compare_outputs({"logits": reference.t()}, {"logits": off.t()}, 1e-4, 1e-3)
    assert not transposed.passed and transposed.max_abs_diff == bad.max_abs_diff

    nan = close.clone()
    nan[0, 7] = float("nan")
    [broken] = validate.compare_outputs({"logits": reference}, {"logits": nan}, 1e-4, 1e-3)
    assert not broken.passed and broken.note == "non-finite values (NaN or inf)"


def test_a_target_failed_only_by_its_runtime_says_which_runtime_and_its_message() -> None:
    """Every numeric check passed, but the runtime the layout is for could not run the folder: the target is failed
    and its error names the runtime and repeats the runtime's own message (it was empty)."""
    from exporters.report.results import Check, ComponentReport, OutputDiff, TargetResult, ValidationResult

    check = Check("traced", {"input_ids": [1, 4]}, [OutputDiff("logits", 0.0, 0.0, 1e-4, 1e-4, True)])
    validation = ValidationResult([ComponentReport("model", [check])], None, [], [],
                                  runtimes=[{"runtime": "ONNX Runtime GenAI", "status": "failed",
                                             "detail": "Load model from missing.onnx failed"},
                                            {"runtime": "optimum", "status": "passed", "detail": "batch 2"}])
    result = TargetResult("onnx", "onnx", "generation", "pending")
    result.record_validation(validation)
    assert result.status == "failed"
    assert result.error == {"type": "ValidationError",
                            "message": "ONNX Runtime GenAI cannot run it: Load model from missing.onnx failed"}


def test_a_matrix_legs_pass_over_one_token_is_judged_as_ours_not_taken_as_a_pass() -> None:
    """A leg's report is data: its runtime proof that passed over 1 of 8 tokens is `unverified` once merged, flagged
    as our own proofs are (`exporters.status.judge_token_count`); a count that is not a pair of ints is dropped, the
    proof then kept as `{runtime, status, detail}`; a full count is kept as it was."""
    from exporters.report.aggregate import back_runtime_claims

    short = {"runtime": "ExecuTorch LLM runner", "status": "passed", "detail": "2/2 tokens", "compared": 1, "asked": 8,
             "ended": "eager and the runner stopped at eos"}
    target = {"name": "executorch", "runtimes": [short]}
    assert back_runtime_claims(target, ["ExecuTorch LLM runner"]) is None
    assert target["runtimes"] == [{**short, "status": "unverified", "detail": "⚠ only 1 of 8 tokens compared, too few "
                                   "to prove generation (eager and the runner stopped at eos): 2/2 tokens"}]
    flagged = {"name": "executorch", "runtimes": [{**short, "detail": "⚠ seen"}]}  # already flagged: demoted, not twice
    back_runtime_claims(flagged, ["ExecuTorch LLM runner"])
    assert flagged["runtimes"][0]["status"] == "unverified" and flagged["runtimes"][0]["detail"] == "⚠ seen"
    forged = {"name": "onnx", "runtimes": [{"runtime": "optimum", "status": "passed", "detail": "16/16 tokens",
                                            "compared": True, "asked": "16"}]}
    back_runtime_claims(forged, ["optimum"])
    assert forged["runtimes"] == [{"runtime": "optimum", "status": "passed", "detail": "16/16 tokens"}]
    full = {"name": "onnx", "runtimes": [{"runtime": "optimum", "status": "passed", "detail": "16/16 tokens",
                                          "compared": 16, "asked": 16}]}
    back_runtime_claims(full, ["optimum"])
    assert full["runtimes"] == [{"runtime": "optimum", "status": "passed", "detail": "16/16 tokens", "compared": 16,
                                 "asked": 16}]

"""What a recipe cannot ask for (#27 §12–§16): a quality budget judged as documented and never switched off, probe
sizes checked before anything is allocated, a static cache no longer than the model's context, and documented limits
on targets and prompt sizes. Every attack goes through the real CLI (`hf-export` as a subprocess).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.models import tiny_bert, tiny_llama

pytestmark = pytest.mark.slow


def _check(tmp_path: Path, recipe: object, config: dict | None = None) -> subprocess.CompletedProcess:
    folder = tmp_path / "recipe"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "export_config.json"
    path.write_text(json.dumps(recipe, indent=2) + "\n")
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return run_cli("check", str(path))


# ── §12: the hidden-state cosine is the lowest of any vector ──────────────────


def _reverse_first_vector(graph_file: Path, sequence: int) -> None:
    """Rewrite the ONNX graph so its `last_hidden_state` output has position 0 exactly reversed (times -1); every
    other position, and the pooler (which reads the untouched value), stays as exported."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph_file), load_external_data=False)
    raw = "last_hidden_state_untampered"
    for node in model.graph.node:
        node.input[:] = [raw if name == "last_hidden_state" else name for name in node.input]
        node.output[:] = [raw if name == "last_hidden_state" else name for name in node.output]
    sign = np.ones((1, sequence, 1), dtype=np.float32)
    sign[0, 0, 0] = -1.0
    model.graph.initializer.append(numpy_helper.from_array(sign, "reverse_first_vector"))
    model.graph.node.append(helper.make_node("Mul", [raw, "reverse_first_vector"], ["last_hidden_state"]))
    onnx.save_model(model, str(graph_file))


def test_one_reversed_hidden_state_vector_fails_the_cosine_budget(tmp_path):
    """An int8 variant whose first hidden-state vector is exactly reversed (cosine -1) among 128: the mean is ~0.98,
    above the budget, but the budget is on the lowest vector, so `hf-export validate` fails it and says why."""
    recipe = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "model", "variants": ["int8-dynamic"],
                           "validation": {"min_cosine": 0.9}}],
              "inputs": {"sequence_length": 128}}
    model = tiny_bert(tmp_path / "model", recipe)
    out = tmp_path / "out"
    run = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    honest = {t["name"]: t for t in json.loads((out / "report.json").read_text())["targets"]}["onnx-int8"]
    assert honest["status"] == "passed" and honest["quality"]["metrics"]["cosine"] >= 0.9, honest["quality"]
    manifest = json.loads((out / "onnx-int8" / "export.json").read_text())
    _reverse_first_vector(out / "onnx-int8" / manifest["components"]["model"]["file"], 128)
    again = run_cli("validate", str(model), str(out), "--target", "onnx-int8")
    assert again.returncode == 1, again.stderr[-3000:]
    tampered = {t["name"]: t for t in json.loads((out / "report.json").read_text())["targets"]}["onnx-int8"]
    assert tampered["status"] == "failed" and tampered["quality"]["passed"] is False
    assert tampered["quality"]["metrics"]["cosine"] == pytest.approx(-1.0, abs=0.05)
    assert tampered["quality"]["decided_by"].startswith("hidden-state cosine -1 < 0.9 (min_cosine)"), \
        tampered["quality"]["decided_by"]


# ── §13: a budget can be loosened, not switched off ───────────────────────────


def test_quality_budgets_that_switch_the_check_off_are_refused(tmp_path):
    recipe = {"exports": [{"export_format": "onnx", "mode": "model", "quantize": {"method": "onnxruntime-dynamic"},
                           "validation": {"min_top1_agreement": 0, "max_kl": 1e300, "min_cosine": -1,
                                          "min_greedy_match": 0}}]}
    result = _check(tmp_path, recipe)
    assert result.returncode == 2, result.stdout + result.stderr
    for key, line in (("min_top1_agreement", 10), ("max_kl", 11), ("min_cosine", 12), ("min_greedy_match", 13)):
        assert f"line {line}, $.exports[0].validation.{key}: {key} " in result.stderr, result.stderr
    assert result.stderr.count("a recipe can loosen a quality budget, not switch the check off") == 4
    loosened = {"exports": [{"export_format": "onnx", "mode": "model", "quantize": {"method": "onnxruntime-dynamic"},
                             "validation": {"min_top1_agreement": 0.6, "max_kl": 0.5, "min_cosine": 0.8,
                                            "min_greedy_match": 1}}]}
    assert _check(tmp_path, loosened).returncode == 0, "loosening inside the ranges is a valid recipe"


# ── §14: the size check comes before any tensor is built ──────────────────────

PEAK_RSS = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "exporters.cli", *sys.argv[1:]], capture_output=True, text=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(done.stderr[-3000:])
"""


def _peak_kb(model: Path, out: Path) -> tuple[int, int]:
    """The CLI's run: its exit code, and the largest resident set of it and every process it started (KiB)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, "run", "--no-bench", str(model), "--out", str(out),
                           "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    code, peak = done.stdout.split()
    assert (out / "report.json").is_file(), done.stderr
    return int(code), int(peak)


def test_a_huge_declared_bound_allocates_nothing_before_the_size_check(tmp_path):
    """A ViT (no max_position_embeddings) whose batch is declared up to 30000: the probes at 15000 and 30000 exceed
    max_probe_elements and are skipped, and building them first would take ~700 MB more (30000 x 3 x 32 x 32
    floats, twice while growing). The run's peak memory is the same as with the batch declared up to 8."""
    from matrix.families import FAMILIES, build

    def recipe(high: int) -> dict:
        batch = {"0": {"name": "batch", "min": 1, "max": high}}
        return {"exports": [{"name": "dynamo", "export_format": "dynamo", "mode": "model",
                             "dynamic_shapes": {"pixel_values": batch}}]}

    small = build(FAMILIES["vit"], tmp_path / "small", recipe=recipe(8))
    huge = build(FAMILIES["vit"], tmp_path / "huge", recipe=recipe(30000))
    code, baseline = _peak_kb(small, tmp_path / "out-small")
    assert code == 0
    _, peak = _peak_kb(huge, tmp_path / "out-huge")
    report = json.loads((tmp_path / "out-huge" / "report.json").read_text())
    checks = {c["probe"]: c for c in report["targets"][0]["components"][0]["checks"]}
    for probe in ("batch=15000", "batch=30000"):
        assert checks[probe]["skipped"] and "exceed max_probe_elements" in checks[probe]["error"], checks[probe]
    assert peak - baseline < 150 * 1024, f"peak {peak // 1024} MiB against {baseline // 1024} MiB with max 8"


# ── §15: a static cache no longer than the model's context ────────────────────

CACHE_RECIPE = {"exports": [{"export_format": "executorch", "mode": "generation"}],
                "generation": {"cache_implementation": "static", "max_cache_len": 1000000}}


def test_a_static_cache_past_the_models_context_is_refused_by_check_and_run(tmp_path):
    result = _check(tmp_path, CACHE_RECIPE, config={"model_type": "llama", "max_position_embeddings": 128})
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("line 10, $.generation.max_cache_len: max_cache_len 1000000 is longer than the 128 positions the model "
            "attends to") in result.stderr, result.stderr
    model = tiny_llama(tmp_path / "model", CACHE_RECIPE, max_position_embeddings=128)
    run = run_cli("run", "--no-bench", str(model), "--out", str(tmp_path / "out"), "--quiet")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "line 10, $.generation.max_cache_len: max_cache_len 1000000 is longer than the 128 positions" in \
        run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "out" / "report.json").exists(), "refused before anything was loaded or exported"
    problem = json.loads((tmp_path / "out" / "problem.json").read_text())
    assert problem["problems"][0]["path"] == "$.generation.max_cache_len"
    bounded = dict(CACHE_RECIPE, generation={"cache_implementation": "static", "max_cache_len": 1 << 30})
    assert "less than or equal to 1048576" in _check(tmp_path / "any", bounded).stderr


# ── §16: documented limits on targets and prompts ─────────────────────────────


def test_thousands_of_targets_and_huge_prompts_are_refused_with_their_path(tmp_path):
    many = {"exports": [{"export_format": "onnx", "name": f"t{i}"} for i in range(5000)]}
    result = _check(tmp_path, many)
    assert result.returncode == 2 and "$.exports: List should have at most 64 items" in result.stderr, result.stderr
    variants = {"exports": [{"export_format": "onnx", "name": f"t{i}", "variants": ["fp32", "int8-dynamic"]}
                            for i in range(40)]}
    assert "the recipe makes 80 targets (with its variants); a recipe makes at most 64" in \
        _check(tmp_path, variants).stderr
    calibration = {"exports": [{"export_format": "onnx", "quantize": {"method": "onnxruntime-static"}}],
                   "inputs": {"prompt": "x" * 70_000, "calibration": {"prompts": ["a" * 50_000_000]}}}
    result = _check(tmp_path, calibration)
    assert result.returncode == 2 and "the recipe file is" in result.stderr and "at most 8388608" in result.stderr
    smaller = dict(calibration, inputs={"prompt": "x" * 70_000, "calibration": {"prompts": ["a" * 70_000, "b"]}})
    result = _check(tmp_path, smaller)
    assert "$.inputs.prompt: String should have at most 65536 characters" in result.stderr, result.stderr
    assert "$.inputs.calibration.prompts[0]: String should have at most 65536 characters" in result.stderr
    total = dict(calibration, inputs={"calibration": {"prompts": ["a" * 60_000] * 20}})
    assert "$.inputs.calibration.prompts: the calibration prompts hold 1200000 characters; at most 1048576" in \
        _check(tmp_path, total).stderr

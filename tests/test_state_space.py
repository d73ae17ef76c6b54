"""State-space models (#30): defaults that fit what the capture shows. Mamba's cache holds conv and recurrent
states, no key-value tensors, so the merged ONNX default (a graph that runs the prompt on an empty key-value cache)
does not apply: the target keeps separate `prefill` and `decode` with no error, and says so; a recipe that asks for
`merged: true` keeps its clear error."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.models import tiny_mamba

RECIPE = {"schema_version": 1, "generation": {"max_new_tokens": 8}, "exports": [
    {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},
    {"name": "onnx-merged", "export_format": "onnx", "mode": "generation", "dynamic": True, "merged": True},
]}


@pytest.fixture(scope="module")
def mamba_onnx(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba-onnx")
    model_dir = tiny_mamba(root / "model", RECIPE, initializer_range=1.0)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {t["name"]: t for t in report["targets"]}, out, result


def test_the_merged_default_falls_back_to_separate_graphs_for_a_model_without_a_key_value_cache(mamba_onnx):
    targets, out, _ = mamba_onnx
    target = targets["onnx"]
    message = (target["error"] or {}).get("message", "")
    assert "merged" not in message, message
    assert target["expected_components"] == ["prefill", "decode"]
    assert [c["name"] for c in target["components"]] == ["prefill", "decode"]
    assert sorted(p.name for p in (out / "onnx").glob("*.onnx")) == ["decode.onnx", "prefill.onnx"]
    said = [f for f in target["findings"] if "exported as separate graphs" in f]
    assert said, target["findings"]
    assert "needs a key-value cache" in said[0] and "conv_states" in said[0] and "recurrent_states" in said[0]
    assert "exported as separate graphs" in (out / "report.md").read_text()


def test_the_decode_carries_the_models_own_cache_and_parity_runs_through_the_exported_graphs(mamba_onnx):
    targets, _, _ = mamba_onnx
    generation = targets["onnx"]["generation"]
    assert generation["status"] == "passed", generation
    tokens = generation["eager_tokens"][0]
    assert tokens == generation["exported_tokens"][0][: len(tokens)]
    assert len(set(tokens)) > 1, tokens  # greedy decoding varies: the check can fail


def test_the_prefill_whose_sequence_axis_cannot_stay_dynamic_fails_the_target_saying_so(mamba_onnx):
    # Mamba's scan is a Python loop over the sequence (transformers 5.24): the traced prefill holds 8 tokens only.
    targets, _, result = mamba_onnx
    target = targets["onnx"]
    assert target["status"] == "failed"
    assert target["error"]["message"].startswith("prefill: the artifact does not run at sequence"), target["error"]
    assert result.returncode == 1


def test_an_explicit_merged_true_keeps_its_clear_error(mamba_onnx):
    targets, _, _ = mamba_onnx
    target = targets["onnx-merged"]
    assert target["status"] == "failed"
    message = target["error"]["message"]
    assert "the merged graph needs a decode step that takes a key-value cache" in message, message
    assert "set `merged` to false" in message

"""The support matrix (`make coverage`): every family's shrunk config is consistent, the script runs end to end on
one family through the real CLI, and failures are classified and rendered with their reasons."""

from __future__ import annotations

import subprocess
import sys

import pytest

from matrix.families import FAMILIES, KINDS, VOCAB, shrink
from matrix.render import render
from matrix.run import Cell, Row, classify, plainest_recipe
from tests.conftest import ROOT


def test_at_least_forty_families_across_every_kind():
    assert len(FAMILIES) >= 40
    assert {spec.kind for spec in FAMILIES.values()} == set(KINDS)
    for needed in ("idefics3", "smolvlm", "paligemma", "gemma3", "qwen2_vl", "clip", "gemma2", "gemma3_text"):
        assert needed in FAMILIES


def _token_ids(config):
    for name in dir(config):
        if name.endswith(("_token_id", "_token_index")):
            try:
                value = getattr(config, name)
            except Exception:  # noqa: S112 - deprecated aliases
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                yield name, value


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_shrunk_configs_are_consistent(name):
    import transformers

    spec = FAMILIES[name]
    config = shrink(getattr(transformers, spec.model_class).config_class(), spec.overrides)
    nodes = [config] + [getattr(config, key) for key in (getattr(config, "sub_configs", None) or {})
                        if getattr(config, key, None) is not None]
    for node in nodes:
        vocab = getattr(node, "vocab_size", None)
        if isinstance(vocab, int):
            assert vocab == VOCAB
        for attribute, value in _token_ids(node):
            assert value < VOCAB, f"{name}: {type(node).__name__}.{attribute} = {value} is outside the vocabulary"
        layers, types = getattr(node, "num_hidden_layers", None), getattr(node, "layer_types", None)
        if isinstance(types, list) and isinstance(layers, int):
            assert len(types) == layers, f"{name}: {len(types)} layer_types for {layers} layers"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_saves_and_loads_back(name, tmp_path):
    from exporters.capture.source import ModelSource, load_model
    from matrix.families import build

    folder = build(FAMILIES[name], tmp_path / name)
    model = load_model(ModelSource(name, folder))
    assert type(model).__name__ == FAMILIES[name].model_class


def test_plainest_recipe():
    recipe = plainest_recipe(["dynamo", "onnx", "executorch"])
    assert [t["export_format"] for t in recipe["exports"]] == ["dynamo", "onnx", "executorch"]
    assert recipe["exports"][0] == {"name": "dynamo", "export_format": "dynamo", "dynamic": True}
    assert "dynamic" not in recipe["exports"][2] and "mode" not in recipe["exports"][2]


def test_failures_are_classified_with_their_root_cause():
    capture = {"status": "failed", "error": {"type": "RuntimeError", "message": "decompose_prefill_decode failed",
                                             "root_cause": {"type": "ValueError", "message": "no bos"}}}
    cell = classify(capture)
    assert cell.cause == "upstream" and "root cause: ValueError: no bos" in cell.reason
    assert classify({"status": "failed", "error": {"type": "UnsupportedModelError",
                                                   "message": "sample inputs could not be made: x"}}).cause == "ours"
    assert classify({"status": "failed", "error": {"message": "generation parity failed: first divergence {}"}}
                    ).cause == "mismatch"
    assert classify({"status": "timed_out", "error": {"message": "ran past"}}).cause == "timeout"
    unverified = classify({"status": "unverified", "unverified": ["generation: EOS after 1 token"]})
    assert unverified.cause == "unverified" and "EOS after 1 token" in unverified.reason
    assert classify({"status": "passed", "generation": {"status": "passed"}}) == Cell("passed", generation="passed")


def test_render_lists_every_failure_reason():
    rows = [Row("llama", "decoder-only", "LlamaForCausalLM", "generation", 1.0,
                {"dynamo": Cell("passed", generation="passed"), "onnx": Cell("failed", "upstream", "boom | <x>")})]
    meta = {"date": "d", "machine": "m", "jobs": 2, "elapsed_s": 60, "versions": {"torch": "2"},
            "formats": ["dynamo", "onnx"], "recipe": plainest_recipe(["dynamo", "onnx"])}
    text = render(rows, meta)
    assert "| llama | decoder-only | `LlamaForCausalLM` | generation | ✅ passed (gen ✓) | ❌ failed upstream [1] |" in text
    assert "1. boom \\| &lt;x&gt;" in text
    assert "Passed: dynamo 1/1, onnx 0/1." in text


def test_make_coverage_script_runs_one_family_end_to_end(tmp_path):
    out = tmp_path / "coverage.md"
    done = subprocess.run([sys.executable, "-m", "matrix", "--families", "bert", "--formats", "onnx", "--jobs", "1",
                           "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = out.read_text()
    assert "| bert | encoder | `BertModel` | model | ✅ passed |" in text, text
    assert (tmp_path / "coverage.json").is_file()
    # a rerun of another family with --update keeps bert's row, in the families' order, and says nothing is partial
    done = subprocess.run([sys.executable, "-m", "matrix", "--families", "vit", "--formats", "onnx", "--jobs", "1",
                           "--work", str(tmp_path / "work"), "--out", str(out), "--update"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    updated = out.read_text()
    rows = [line for line in updated.splitlines() if line.startswith(("| bert ", "| vit "))]
    assert rows == ["| bert | encoder | `BertModel` | model | ✅ passed |", "| vit | vision | `ViTModel` | model | ✅ passed |"]
    assert "Passed: onnx 2/2." in updated and "Partial" not in updated

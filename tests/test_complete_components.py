"""Complete component sets (issue #9): vision-language and encoder-decoder models export every stage inference
needs, in dynamo and ONNX, and generation parity runs from raw inputs through the exported graphs only."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli
from tests.models import tiny_llava, tiny_t5, tiny_whisper

BOTH = [{"name": "dynamo", "export_format": "dynamo", "mode": "generation", "dynamic": True},
        {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True}]
RECIPE = {"schema_version": 1, "exports": BOTH, "generation": {"max_new_tokens": 6}}

CASES = {
    "llava": (tiny_llava, "vision-language",
              ["image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head", "decode"]),
    "t5": (tiny_t5, "seq2seq", ["encoder", "prefill", "decode"]),
    "whisper": (tiny_whisper, "speech-seq2seq", ["encoder", "prefill", "decode"]),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def family_run(request, tmp_path_factory):
    build, family, components = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    model_dir = build(root / "model", RECIPE)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    return request.param, family, components, model_dir, out, result


def test_complete_set_exported_and_parity_from_raw_inputs(family_run):
    from transformers.exporters import ExportedModel

    name, family, components, _, out, result = family_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["family"] == family
    for target in report["targets"]:
        assert target["status"] == "passed", (name, target["name"], target["error"])
        assert target["expected_components"] == components
        assert [c["name"] for c in target["components"]] == components
        exported = ExportedModel.from_pretrained(out / target["name"], trust_remote_code=True)
        assert sorted(exported.components) == sorted(components)
        generation = target["generation"]
        assert generation["status"] == "passed", (name, target["name"], generation)
        tokens = generation["eager_tokens"][0]
        assert tokens == generation["exported_tokens"][0][: len(tokens)]
        # the tiny models are initialized so that greedy decoding varies: the check can fail
        assert len(set(generation["exported_tokens"][0])) > 1, generation


def test_decode_runs_past_its_traced_cache_length(family_run):
    name, _, _, _, out, _ = family_run
    report = json.loads((out / "report.json").read_text())
    for target in report["targets"]:
        produced = target["generation"]["exported_tokens"][0]
        assert len(produced) >= 5, f"{name}/{target['name']}: the prefill token plus at least 4 decode steps"


def test_removing_a_component_fails_validation_naming_it(family_run, tmp_path):
    name, _, components, model_dir, out, _ = family_run
    removed = components[0]
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    manifest = json.loads((copy / "onnx" / "export.json").read_text())
    del manifest["components"][removed]
    (copy / "onnx" / "export.json").write_text(json.dumps(manifest))
    result = run_cli("validate", str(model_dir), str(copy), "--target", "onnx")
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((copy / "report.json").read_text())
    message = report["targets"][0]["error"]["message"]
    assert f"missing component(s) ['{removed}']" in message
    assert removed in result.stderr

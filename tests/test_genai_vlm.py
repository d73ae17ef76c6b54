"""Vision-language ONNX folders and ONNX Runtime GenAI (#52 §3): GenAI 0.18 runs its own vision-language model types
(Gemma 3, Phi-3-vision, Qwen2.5-VL, ...) from its builder's graphs, which this product does not write yet, and has
no LLaVA: the plainest ONNX generation recipe of a tiny LLaVA passes on its own checks, and its "runs in" column
says ONNX Runtime GenAI ✗ with the reason (no genai_config.json is written).
"""

from __future__ import annotations

import json

from tests.export_store import stored_run
from tests.models import LLAVA_ONNX_RECIPE, tiny_llava_with_processor


def test_genai_declines_a_llava_onnx_folder_with_the_reason_and_the_verdict_stands(tmp_path):
    # the run tests/test_transformers_js_vlm.py reads too: its plainest ONNX target here (the shared store, #48)
    out, report, log = stored_run(tiny_llava_with_processor(tmp_path / "model", LLAVA_ONNX_RECIPE))
    target = {target["name"]: target for target in report["targets"]}["onnx"]
    assert {key: value for key, value in LLAVA_ONNX_RECIPE["exports"][0].items() if key != "name"} == {
        "export_format": "onnx", "mode": "generation"}, "the plainest ONNX generation target"
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert "embed_tokens" in [component["name"] for component in target["components"]]
    [proof] = [proof for proof in target["runtimes"] if proof["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "declined", proof
    assert "GenAI 0.18 has no vision-language model type 'llava': it runs fara, gemma3," in proof["detail"], proof
    assert not (out / target["name"] / "genai_config.json").exists()
    assert "ONNX Runtime GenAI ✗ cannot take this model: GenAI 0.18 has no vision-language model type 'llava'" \
        in (out / "report.md").read_text()


def test_a_vision_language_type_genai_runs_is_declined_as_a_layout_not_written_yet():
    from exporters.layouts.genai import vision_language_declined

    # Gemma 3, the example here before, is declined for its bidirectional image attention now
    # (tests/test_gemma3_runtimes.py::test_onnx_runtime_genai_declines_gemma3_for_its_bidirectional_image_attention)
    why = vision_language_declined({"model_type": "qwen2_5_vl"})
    assert why.startswith("GenAI runs 'qwen2_5_vl' as a vision-language model from its own builder's graphs"), why
    assert "a layout this product does not write yet" in why

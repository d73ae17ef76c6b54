"""Gemma 3 (vision) in the multimodal runtimes (#52 items 1 and 5). Gemma 3's prefill attends bidirectionally among
one image's tokens (transformers' mask from the processor's `token_type_ids`); ExecuTorch's `MultimodalRunner` runs
`text_decoder` causally on every chunk of the prompt, as optimum-executorch's Gemma 3 program does, so it cannot
generate transformers' tokens. The plainest ExecuTorch generation recipe of a tiny Gemma 3 (with its own processor)
therefore keeps the methods layout, passes on its own checks, and its "runs in" column says ExecuTorch
MultimodalRunner ✗ with that reason; asking for the runner's layout is refused naming it. ONNX Runtime GenAI 0.18
runs its `gemma3` type's text model causally too (#52 item 3): the ONNX target says GenAI ✗ with the same fact.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, run_and_read, run_cli
from tests.models import tiny_gemma3_with_processor

RUNTIME = "ExecuTorch MultimodalRunner"
BIDIRECTIONAL = "its prefill attends bidirectionally among one image's tokens"
# Two text layers, not one: with one, the image positions' keys and values are their embeddings whatever the mask,
# and the bidirectional attention never reaches the text's logits (test_the_decline_holds_on_this_model)
TEXT_LAYERS = 2


@pytest.fixture(scope="module")
def gemma3_run(tmp_path_factory):
    """The tiny Gemma 3 with its processor through the real CLI: the plainest ExecuTorch generation target and the
    plainest ONNX one (GenAI's), one run."""
    root = tmp_path_factory.mktemp("gemma3")
    recipe = {"exports": [PLAINEST_EXECUTORCH, {"export_format": "onnx", "mode": "generation"}]}
    model_dir = tiny_gemma3_with_processor(root / "model", recipe, text_layers=TEXT_LAYERS)
    out, report, log = run_and_read(root, model_dir)
    return model_dir, out, report, log


def _target(report, name):
    return next(target for target in report["targets"] if target["name"] == name)


def test_the_plainest_gemma3_recipe_passes_and_the_multimodal_runner_declines_it_with_the_reason(gemma3_run):
    _, out, report, log = gemma3_run
    target = _target(report, "executorch")
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert [proof["runtime"] for proof in target["runtimes"]] == [RUNTIME], target["runtimes"]
    [proof] = target["runtimes"]
    assert proof["status"] == "declined" and BIDIRECTIONAL in proof["detail"], proof
    assert "runs text_decoder causally on every chunk" in proof["detail"], proof
    assert f"{RUNTIME} ✗ cannot take this model: {BIDIRECTIONAL}" in (out / "report.md").read_text()
    assert "ExecuTorch LLM runner" not in str(target["runtimes"])
    assert any("not ExecuTorch MultimodalRunner's layout: " + BIDIRECTIONAL in f for f in report["findings"]), report
    manifest = json.loads((out / "executorch" / "export.json").read_text())
    assert manifest.get("layout") != "multimodal_runner"
    assert {"embed_tokens", "language_model", "decode"} <= set(manifest["components"])


def test_onnx_runtime_genai_declines_gemma3_for_its_bidirectional_image_attention(gemma3_run):
    _, out, report, log = gemma3_run
    target = _target(report, "onnx")
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    [proof] = [proof for proof in target["runtimes"] if proof["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "declined" and BIDIRECTIONAL in proof["detail"], proof
    assert "GenAI 0.18 runs its 'gemma3' text model causally over the whole prompt" in proof["detail"], proof
    assert not (out / "onnx" / "genai_config.json").exists()


def test_the_decline_holds_on_this_model(gemma3_run):
    """The reason is this model's fact: its last prompt position's logits with the processor's token_type_ids
    (bidirectional among the image's tokens) differ from the causal prompt's (what the runner's text_decoder
    computes) by more than the target's tolerance; with one text layer they would not."""
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    model_dir = gemma3_run[0]
    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray((np.random.default_rng(0).random((40, 48, 3)) * 255).astype("uint8"))
    inputs = processor(images=image, text=f"{processor.boi_token} Describe the image.", return_tensors="pt")
    assert inputs["token_type_ids"].sum() == 4  # the image's tokens
    causal = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    model = Gemma3ForConditionalGeneration.from_pretrained(model_dir).eval()
    with torch.no_grad():
        gap = (model(**inputs).logits[0, -1] - model(**causal).logits[0, -1]).abs().max().item()
        model.model.language_model.layers = model.model.language_model.layers[:1]
        one_layer = (model(**inputs).logits[0, -1] - model(**causal).logits[0, -1]).abs().max().item()
    assert gap > 1e-3, gap
    assert one_layer < 1e-5, one_layer


def test_asking_for_the_multimodal_runner_layout_is_refused_naming_the_reason(tmp_path):
    model_dir = tiny_gemma3_with_processor(tmp_path / "model", {"export_format": "executorch", "mode": "generation",
                                                                "layout": "multimodal_runner"}, text_layers=1)
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(tmp_path / "out"), "--quiet")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [target] = report["targets"]
    assert target["status"] == "failed", (done.stderr[-3000:], json.dumps(target, indent=1)[:4000])
    text = json.dumps(target)
    assert "layout 'multimodal_runner' cannot be exported: " + BIDIRECTIONAL in text, text[:4000]
    assert "use layout 'methods'" in text

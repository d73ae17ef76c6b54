"""transformers.js's vision-language layout for Qwen2-VL and Qwen2.5-VL (#52 items 4-5): the plainest ONNX generation
recipe with `layout: "transformers.js"` is the folder transformers.js's `Qwen2VLForConditionalGeneration` (or its
Qwen2.5-VL class) and `AutoProcessor` load: `onnx/vision_encoder.onnx` taking the processor's patches and their grid
(`grid_thw`, Qwen2.5-VL's `image_grid_thw`), `onnx/embed_tokens.onnx`, `onnx/decoder_model_merged.onnx` taking 3-D
(M-RoPE) `position_ids`; proven in the product by transformers.js on Node token for token against eager `generate()`
(its own `get_rope_index` positions, its processor's pixels, grid and image tokens), and the card's script runs as
written. A decoder fed other positions fails the proof. A Qwen3-VL (transformers.js's Qwen2.5-VL class) carries its
DeepStack features in the same rows as the image features and embeddings, proven the same way.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.card_snippets import run_js_card
from tests.export_store import stored_run
from tests.models import TJS_TARGET, tiny_qwen_vl_with_image_processor

RECIPE = {"exports": [TJS_TARGET], "generation": {"max_new_tokens": 8}}
GRID = {"qwen2_vl": "grid_thw", "qwen2_5_vl": "image_grid_thw", "qwen3_vl": "image_grid_thw"}  # transformers.js's name per class


@pytest.fixture(scope="module")
def qwen2_vl_tjs(tmp_path_factory):
    """A tiny Qwen2-VL with its image processor, `RECIPE` run once through the shared store."""
    return stored_run(tiny_qwen_vl_with_image_processor(tmp_path_factory.mktemp("tjs-qwen2-vl") / "model", RECIPE))


def _target(report: dict) -> dict:
    return {target["name"]: target for target in report["targets"]}["tjs"]


def _assert_proven(out, report: dict, log: str) -> dict:
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed"
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "transformers.js ✓ 8/8 tokens" in (out / "report.md").read_text()
    return target


def _graph_io(folder, model_type: str, width: int = 32) -> None:
    import onnx

    io = {}
    for name in ("vision_encoder", "embed_tokens", "decoder_model_merged"):
        graph = onnx.load(str(folder / "onnx" / f"{name}.onnx"), load_external_data=False).graph
        io[name] = ([(v.name, [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]) for v in graph.input],
                    [v.name for v in graph.output])
    assert io["vision_encoder"] == ([("pixel_values", [16, 3 * 2 * 8 * 8]), (GRID[model_type], [1, 3])],
                                    ["image_features"]), io["vision_encoder"]
    assert [name for name, _ in io["embed_tokens"][0]] == ["input_ids"] and io["embed_tokens"][1] == ["inputs_embeds"]
    graph = onnx.load(str(folder / "onnx" / "vision_encoder.onnx"), load_external_data=False).graph
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [4, width]  # Qwen3-VL's: 2 x hidden
    inputs, outputs = io["decoder_model_merged"]
    assert [name for name, _ in inputs[:3]] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert inputs[2][1] == [3, "batch_size", "sequence_length"], inputs[2]  # M-RoPE's temporal, height, width rows
    assert {"past_key_values.0.key", "past_key_values.0.value"} <= {name for name, _ in inputs}
    assert outputs[0] == "logits" and {"present.0.key", "present.0.value"} <= set(outputs)


def test_a_qwen2_vl_folder_in_the_transformers_js_layout_generates_in_transformers_js(qwen2_vl_tjs, tmp_path):
    """The product's proof (transformers.js 4.3.2 on Node: its processor's pixels, grid and image tokens are the
    sample's, then `generate` from the sample gives eager's 8 tokens), the graphs under the names and shapes
    transformers.js binds, the files it reads, and the card's script as written."""
    from exporters.publish.snippets import target_snippets

    out, report, log = qwen2_vl_tjs
    target = _assert_proven(out, report, log)
    folder = out / "tjs"
    _graph_io(folder, "qwen2_vl")
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    assert (preprocessor["processor_class"], preprocessor["image_processor_type"]) == ("Qwen2VLProcessor",
                                                                                        "Qwen2VLImageProcessor")
    assert preprocessor["min_pixels"] == preprocessor["max_pixels"] == 32 * 32  # the traced 4x4 grid of 8-pixel patches
    import numpy as np
    import onnxruntime as ort

    vision = ort.InferenceSession(str(folder / "onnx" / "vision_encoder.onnx"))
    pixels = np.random.default_rng(0).random((16, 384), dtype=np.float32)
    [traced] = vision.run(None, {"pixel_values": pixels, "grid_thw": np.array([[1, 4, 4]], dtype=np.int64)})
    [other] = vision.run(None, {"pixel_values": pixels, "grid_thw": np.array([[1, 2, 8]], dtype=np.int64)})
    assert traced.shape == (4, 32) and np.isfinite(traced).all() and np.isnan(other).all()  # 16 patches, another grid
    config = json.loads((folder / "config.json").read_text())
    assert config["num_key_value_heads"] == config["text_config"]["num_key_value_heads"]  # where transformers.js reads
    code = {runtime: code for runtime, _, code in target_snippets("org/qwen2-vl", target)}["transformers.js"]
    assert "AutoModelForImageTextToText" in code and "<|vision_start|>" in code, code
    run_js_card(code, folder, tmp_path)  # the tiny vocabulary may decode to nothing: it runs


def test_a_decoder_fed_other_positions_fails_the_transformers_js_proof(qwen2_vl_tjs, tmp_path):
    """The proof can fail: `hf-export validate` of a copy of the folder whose config.json names another
    `vision_start_token_id` (transformers.js's `get_rope_index` then finds no image block and gives the image's
    tokens 1-D text positions, where eager's are by height and width): our own checks still pass (they feed the
    graphs eager's positions), transformers.js's tokens differ from eager's and the target fails, saying so."""
    from tests.conftest import run_cli

    out, _, _ = qwen2_vl_tjs
    copy = tmp_path / "out"
    shutil.copytree(out / "tjs", copy / "tjs")
    config = json.loads((copy / "tjs" / "config.json").read_text())
    config["vision_start_token_id"] = config["text_config"]["pad_token_id"]  # in no prompt
    (copy / "tjs" / "config.json").write_text(json.dumps(config))
    model = tiny_qwen_vl_with_image_processor(tmp_path / "model", RECIPE)
    done = run_cli("validate", str(model), str(copy), "--target", "tjs")
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    assert done.returncode == 1 and target["status"] == "failed", done.stderr[-2000:]
    assert target["generation"]["status"] == "passed"  # the graphs on eager's positions
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "failed" and "tokens equal eager greedy: transformers.js " in proof["detail"], proof


def test_a_qwen2_5_vl_folder_in_the_transformers_js_layout_generates_in_transformers_js(tmp_path):
    """Qwen2.5-VL (transformers.js's `Qwen2_5_VLForConditionalGeneration`, the same class path with the grid named
    `image_grid_thw`; its tower's window attention traced at the grid): proven the same way."""
    out, report, log = stored_run(tiny_qwen_vl_with_image_processor(tmp_path / "model", RECIPE, family="qwen2_5_vl"))
    _assert_proven(out, report, log)
    _graph_io(out / "tjs", "qwen2_5_vl")
    preprocessor = json.loads((out / "tjs" / "preprocessor_config.json").read_text())
    assert preprocessor["processor_class"] == "Qwen2_5_VLProcessor"


def test_a_qwen3_vl_folder_carries_its_deepstack_features_in_the_rows_and_generates_in_transformers_js(tmp_path):
    """Qwen3-VL (transformers.js's `Qwen3VLForConditionalGeneration`, its Qwen2.5-VL class, which feeds the decoder
    `inputs_embeds` only): its DeepStack features ride in the rows (`exporters.capture.qwen_vl.widened`: the vision
    encoder's features and `embed_tokens`' rows hidden x 2 wide, the decoder adding the second half after its first
    layer), proven by transformers.js 8/8. Seed 7: eager's greedy tokens without the DeepStack features differ from the
    first token on (checked here), so a folder that dropped them could not pass."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec

    model_dir = tiny_qwen_vl_with_image_processor(tmp_path / "model", RECIPE, family="qwen3_vl", seed=7, text_layers=2)
    out, report, log = stored_run(model_dir)
    target = _assert_proven(out, report, log)
    _graph_io(out / "tjs", "qwen3_vl", width=64)
    eager = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    sample = make_sample_inputs(eager, InputsSpec(), AutoTokenizer.from_pretrained(model_dir), model_dir).generate
    greedy = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False}
    with torch.no_grad():
        kept = eager.generate(**sample, **greedy)[0, sample["input_ids"].shape[1]:].tolist()
        eager.model.language_model._deepstack_process = lambda states, mask, features: states  # DeepStack dropped
        dropped = eager.generate(**sample, **greedy)[0, sample["input_ids"].shape[1]:].tolist()
    assert kept == target["generation"]["eager_tokens"][0], (kept, target["generation"])  # the run's sample
    assert dropped[0] != kept[0], (dropped, kept)

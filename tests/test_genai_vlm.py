"""Vision-language ONNX folders and ONNX Runtime GenAI (#52 §3): GenAI 0.18 runs its own vision-language model types
(Gemma 3, Phi-3-vision, Qwen2.5-VL, ...) from its builder's graphs. For Qwen2.5-VL this product writes them (GenAI's
vision, embedding and decoder graphs, genai_config.json, processor_config.json) and GenAI generates from the folder
alone token for token against eager, its processor making the sample's pixels and image tokens, and the card's
snippet runs as written; two images in one prompt generate eager's tokens too; a Qwen2-VL gets the same folder,
typed `qwen2_5_vl`, proven the same way; a Qwen3-VL gets GenAI's `qwen3_vl` folder, its DeepStack features carried
beside the image features, proven the same way; a Mistral 3 (Pixtral tower) gets GenAI's `mistral3` folder, proven
the same way; the other types GenAI runs are declined as a layout not written yet. GenAI has no LLaVA: the plainest
ONNX generation recipe of a tiny LLaVA passes on its own checks, and its "runs in" column says ONNX Runtime
GenAI ✗ with the reason (no genai_config.json is written).
"""

from __future__ import annotations

import json

import pytest

from tests.export_store import stored_run
from tests.models import (LLAVA_ONNX_RECIPE, tiny_llava_onnx_model, tiny_mistral3_with_tokenizer,
                          tiny_qwen2_5_vl_with_tokenizer)

RUNTIME = "ONNX Runtime GenAI"
# the plainest ONNX generation target, and a float16 one GenAI's graphs are not written for
QWEN_VL_RECIPE = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "generation"},
                              {"name": "onnx-fp16", "export_format": "onnx", "mode": "generation", "dtype": "float16"}],
                  "generation": {"max_new_tokens": 8}}


@pytest.fixture(scope="module")
def qwen_vl_genai(tmp_path_factory):
    """A tiny Qwen2.5-VL (one text layer) with its tokenizer, its `QWEN_VL_RECIPE` run once."""
    pytest.importorskip("onnxruntime_genai")
    root = tmp_path_factory.mktemp("qwen2-5-vl-genai")
    return stored_run(tiny_qwen2_5_vl_with_tokenizer(root / "model", QWEN_VL_RECIPE))


def _assert_genai_generated_from_an_image(out, report: dict, log: str) -> None:
    """The run's `onnx` target passed, GenAI generated eager's 8 tokens from the sample's image and prompt with its
    processor's pixels and image tokens checked (for one image and for two), and eager's 8 from the same prompt with a
    second image (GenAI running the vision graph once per image), and report.md's runs-in column says so."""
    target = {target["name"]: target for target in report["targets"]}["onnx"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    [proof] = [proof for proof in target["runtimes"] if proof["runtime"] == RUNTIME]
    assert proof["status"] == "passed", proof
    assert proof["detail"].startswith("8/8 tokens from an image and a prompt (its processor's pixels and image "
                                      "tokens as the sample's"), proof
    assert proof["detail"].endswith("; 8/8 from two images in one prompt"), proof
    assert "ONNX Runtime GenAI ✓ 8/8 tokens from an image and a prompt" in (out / "report.md").read_text()


def test_genai_generates_from_a_qwen2_5_vl_onnx_folder_in_the_product(qwen_vl_genai):
    out, report, log = qwen_vl_genai
    _assert_genai_generated_from_an_image(out, report, log)
    folder = out / "onnx"
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    config = json.loads((folder / "config.json").read_text())
    assert genai["type"] == "qwen2_5_vl"
    assert {name: genai[name] for name in ("image_token_id", "video_token_id", "vision_start_token_id")} == {
        name: config[name] for name in ("image_token_id", "video_token_id", "vision_start_token_id")}
    assert (genai["vision"]["filename"], genai["embedding"]["filename"], genai["decoder"]["filename"]) == (
        "genai_vision.onnx", "genai_embedding.onnx", "genai_decoder.onnx")
    assert genai["vision"]["config_filename"] == "processor_config.json"
    assert (genai["vision"]["patch_size"], genai["vision"]["spatial_merge_size"]) == (8, 2)
    assert list(genai["decoder"]["inputs"])[0] == "inputs_embeds" and "input_ids" not in genai["decoder"]["inputs"]
    [resize] = [step["operation"] for step in json.loads((folder / "processor_config.json").read_text())[
        "processor"]["transforms"] if step["operation"]["type"] == "Resize"]
    assert (resize["attrs"]["width"], resize["attrs"]["height"]) == (32, 32), "the traced image: 4 x 4 patches of 8"


def test_a_float16_qwen2_5_vl_target_gets_no_genai_graphs_and_says_why(qwen_vl_genai):
    out, report, log = qwen_vl_genai
    target = {target["name"]: target for target in report["targets"]}["onnx-fp16"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    [proof] = [proof for proof in target["runtimes"] if proof["runtime"] == RUNTIME]
    assert proof["status"] == "declined" and "were not written beside this export's components" in proof["detail"]
    assert not (out / "onnx-fp16" / "genai_config.json").exists()
    assert not list((out / "onnx-fp16").glob("genai_*.onnx"))
    assert "onnx-fp16: ONNX Runtime GenAI: no Qwen2.5-VL folder written: GenAI's Qwen2.5-VL graphs are written for a " \
           "float32 target without quantize (this target: dtype float16" in (out / "report.md").read_text()


def signature(path) -> tuple[list, list]:
    """A graph's inputs and outputs, each `(name, dims)` (a named dim by its name)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dims = lambda value: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    return [(v.name, dims(v)) for v in graph.input], [(v.name, dims(v)) for v in graph.output]


def test_genais_qwen2_5_vl_graphs_have_its_names_and_share_the_exports_weights(qwen_vl_genai):
    out, _, _ = qwen_vl_genai
    folder = out / "onnx"

    assert signature(folder / "genai_vision.onnx") == (
        [("pixel_values", [16, 3 * 2 * 8 * 8]), ("image_grid_thw", [1, 3])], [("image_features", [4, 32])]), \
        "one image per run: GenAI loops images"
    assert signature(folder / "genai_embedding.onnx") == (
        [("input_ids", ["batch_size", "sequence_length"]), ("image_features", ["num_image_tokens", 32])],
        [("inputs_embeds", ["batch_size", "sequence_length", 32])])
    inputs, outputs = signature(folder / "genai_decoder.onnx")
    assert [name for name, _ in inputs] == ["inputs_embeds", "attention_mask", "position_ids",
                                            "past_key_values.0.key", "past_key_values.0.value"]
    assert dict(inputs)["position_ids"] == [3, 1, "sequence_length"], "GenAI's 3-D M-RoPE positions"
    assert dict(inputs)["past_key_values.0.key"][2] == "past_sequence_length"
    assert [name for name, _ in outputs] == ["logits", "present.0.key", "present.0.value"]
    for name in ("genai_vision.onnx", "genai_embedding.onnx", "genai_decoder.onnx"):
        assert (folder / f"{name}.data").stat().st_size == 0, f"{name}'s weights point into the components' sidecar"
    private = [path.name for path in folder.iterdir() if path.stat().st_mode & 0o777 != 0o644]
    assert not private, f"published files readable by their owner only: {private}"


def test_the_cards_genai_qwen2_5_vl_snippet_runs_as_written(qwen_vl_genai, hub, tmp_path):
    """The card's snippet, run as written by the venv's Python against the Hub emulator: GenAI's own processor on
    an image and a prompt, then its generator."""
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    out, _, _ = qwen_vl_genai
    commit = upload_exports(hub, "alice/qwen-vl", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/qwen-vl", out, commit))
                             if s[0] == RUNTIME and '"exports/onnx/*"' in s[2]]
    assert language == "python" and "create_multimodal_processor()" in code and 'og.Images.open("image.jpg")' in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip(), "the decoded prompt and the new tokens"


QWEN2_VL_RECIPE = {"exports": [QWEN_VL_RECIPE["exports"][0]], "generation": {"max_new_tokens": 8}}  # the plainest


def test_genai_generates_from_a_qwen2_vl_onnx_folder_typed_qwen2_5_vl_and_its_card_snippet_runs(hub, tmp_path):
    """Qwen2-VL: GenAI 0.18 has no `qwen2_vl` type, but its `qwen2_5_vl` model is Qwen2-VL's language side (M-RoPE
    positions, image tokens, image processor) and the tower (no window attention) is inside the vision graph: the
    folder is written as that type, GenAI generates eager's tokens from it and the card's snippet runs as written."""
    pytest.importorskip("onnxruntime_genai")
    import onnx

    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    out, report, log = stored_run(tiny_qwen2_5_vl_with_tokenizer(tmp_path / "model", QWEN2_VL_RECIPE,
                                                                 family="qwen2_vl"))
    _assert_genai_generated_from_an_image(out, report, log)
    folder = out / "onnx"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2_vl"
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    assert genai["type"] == "qwen2_5_vl" and "window_size" not in genai["vision"], genai["vision"]
    vision = onnx.load(str(folder / "genai_vision.onnx"), load_external_data=False).graph
    assert [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in vision.input] == [
        ("pixel_values", [16, 3 * 2 * 8 * 8]), ("image_grid_thw", [1, 3])], "Qwen2-VL's tower at the traced 4x4 grid"
    commit = upload_exports(hub, "alice/qwen2-vl", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/qwen2-vl", out, commit))
                             if s[0] == RUNTIME and '"exports/onnx/*"' in s[2]]
    assert language == "python" and "create_multimodal_processor()" in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip(), "the decoded prompt and the new tokens"


def test_genai_declines_a_llava_onnx_folder_with_the_reason_and_the_verdict_stands(tmp_path):
    # the run tests/test_transformers_js_vlm.py reads too: its plainest ONNX target here (the shared store, #48)
    out, report, log = stored_run(tiny_llava_onnx_model(tmp_path / "model"))
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


def test_a_qwen2_5_vl_genai_folder_without_a_tokenizer_gets_no_card_snippet():
    """GenAI's processor tokenizes the prompt: a folder without tokenizer.json (the proof then feeds the sample's ids)
    gets no snippet rather than one that fails as written."""
    from exporters.layouts.genai import Genai

    files = [{"path": f"onnx/{name}"} for name in ("genai_config.json", "genai_vision.onnx", "genai_decoder.onnx")]
    assert Genai().snippet("alice/qwen-vl", {"name": "onnx", "files": files}, None) is None
    _, code = Genai().snippet("alice/qwen-vl", {"name": "onnx", "files": [*files, {"path": "onnx/tokenizer.json"}]},
                              None)
    assert "create_multimodal_processor()" in code


def test_a_vision_language_type_genai_runs_is_declined_as_a_layout_not_written_yet():
    from exporters.layouts.genai import vision_language_declined

    # Gemma 3, the example here before, is declined for its bidirectional image attention now
    # (tests/test_gemma3_runtimes.py::test_onnx_runtime_genai_declines_gemma3_for_its_bidirectional_image_attention);
    # Qwen2.5-VL, the next, is written and proven now
    # (test_genai_generates_from_a_qwen2_5_vl_onnx_folder_in_the_product), and Mistral 3, the example here after it
    # (test_genai_generates_from_a_mistral3_onnx_folder_and_its_card_snippet_runs): Phi-4-multimodal is the example
    why = vision_language_declined({"model_type": "phi4mm", "vision_config": {}})
    assert why.startswith("GenAI runs 'phi4mm' as a vision-language model from its own builder's graphs"), why
    assert "a layout this product does not write yet" in why
    assert vision_language_declined({"model_type": "mistral3", "vision_config": {}}) is None
    assert vision_language_declined({"model_type": "qwen2_5_vl", "vision_config": {}}) is None
    # Qwen2-VL, declined before as a type GenAI 0.18 does not have, is written as its `qwen2_5_vl` now
    # (test_genai_generates_from_a_qwen2_vl_onnx_folder_typed_qwen2_5_vl_and_its_card_snippet_runs)
    assert vision_language_declined({"model_type": "qwen2_vl", "vision_config": {}}) is None
    # Qwen3-VL, declined before as a layout not written yet, is written now
    # (test_genai_generates_from_a_qwen3_vl_onnx_folder_with_its_deepstack_features_and_its_card_snippet_runs)
    assert vision_language_declined({"model_type": "qwen3_vl", "vision_config": {}}) is None
    from exporters.layouts.genai import WRITTEN_VLM_TYPES
    from exporters.layouts.genai.mistral3 import MODEL_TYPE
    from exporters.layouts.genai.qwen_vl import FAMILY, QWEN_VL_TYPES

    assert set(QWEN_VL_TYPES) == set(FAMILY), "every Qwen-VL type written is named"
    assert set(WRITTEN_VLM_TYPES) == {*QWEN_VL_TYPES, MODEL_TYPE}, "every type declined as written is written"


QWEN3_VL_RECIPE = {"exports": [QWEN_VL_RECIPE["exports"][0]], "generation": {"max_new_tokens": 8}}  # the plainest


def test_genai_generates_from_a_qwen3_vl_onnx_folder_with_its_deepstack_features_and_its_card_snippet_runs(hub,
                                                                                                          tmp_path):
    """Qwen3-VL (#52 §3): GenAI 0.18's `qwen3_vl` folder (its vision graph at the traced 4x4 grid, the embedding and
    decoder graphs, genai_config.json, processor_config.json) beside the components; the tower's DeepStack features
    (one, added after the first of two text layers) ride beside the merged features in rows of twice the hidden size
    (GenAI names no DeepStack input: qwen_vl.widened); GenAI generates eager's 8 tokens from the folder alone, from
    one image and from two (its processor's pixels and image tokens checked); the card's snippet runs as written."""
    pytest.importorskip("onnxruntime_genai")
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    # seed 5: eager's greedy tokens from the sample without the DeepStack features differ from the second on (measured:
    # [41, 33, 66, ...] with them, [41, 70, 49, ...] without), so a folder that drops them fails the proof
    out, report, log = stored_run(tiny_qwen2_5_vl_with_tokenizer(tmp_path / "model", QWEN3_VL_RECIPE, seed=5,
                                                                 text_layers=2, family="qwen3_vl"))
    _assert_genai_generated_from_an_image(out, report, log)
    folder = out / "onnx"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl" and config["vision_config"]["deepstack_visual_indexes"] == [0]
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    assert genai["type"] == "qwen3_vl" and "window_size" not in genai["vision"], genai["vision"]
    assert genai["decoder"]["hidden_size"] == 2 * 32, "the merged features and the one DeepStack feature"
    assert (genai["vision"]["patch_size"], genai["vision"]["spatial_merge_size"]) == (8, 2)
    processor = json.loads((folder / "processor_config.json").read_text())["processor"]
    assert processor["name"] == "qwen3_vl_image_processor"
    [normalize] = [step["operation"] for step in processor["transforms"] if step["operation"]["type"] == "Normalize"]
    assert normalize["attrs"]["qwen3_vl"] == 1

    assert signature(folder / "genai_vision.onnx") == (
        [("pixel_values", [16, 3 * 2 * 8 * 8]), ("image_grid_thw", [1, 3])], [("image_features", [4, 64])]), \
        "merged and DeepStack features"
    assert signature(folder / "genai_embedding.onnx") == (
        [("input_ids", ["batch_size", "sequence_length"]), ("image_features", ["num_image_tokens", 64])],
        [("inputs_embeds", ["batch_size", "sequence_length", 64])])
    inputs, outputs = signature(folder / "genai_decoder.onnx")
    assert [name for name, _ in inputs] == ["inputs_embeds", "attention_mask", "position_ids"] + [
        f"past_key_values.{layer}.{part}" for layer in range(2) for part in ("key", "value")]
    assert dict(inputs)["inputs_embeds"][2] == 64 and dict(inputs)["position_ids"] == [3, 1, "sequence_length"]
    assert [name for name, _ in outputs] == ["logits"] + [f"present.{layer}.{part}" for layer in range(2)
                                                          for part in ("key", "value")]
    commit = upload_exports(hub, "alice/qwen3-vl", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/qwen3-vl", out, commit))
                             if s[0] == RUNTIME and '"exports/onnx/*"' in s[2]]
    assert language == "python" and "create_multimodal_processor()" in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip(), "the decoded prompt and the new tokens"


MISTRAL3_RECIPE = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "generation"}],
                   "generation": {"max_new_tokens": 8}}  # the plainest ONNX generation target


@pytest.fixture(scope="module")
def mistral3_genai(tmp_path_factory):
    """A tiny Mistral 3 (Pixtral tower, one text layer) with its tokenizer, its `MISTRAL3_RECIPE` run once."""
    pytest.importorskip("onnxruntime_genai")
    root = tmp_path_factory.mktemp("mistral3-genai")
    return stored_run(tiny_mistral3_with_tokenizer(root / "model", MISTRAL3_RECIPE))


def test_genai_generates_from_a_mistral3_onnx_folder_and_its_card_snippet_runs(mistral3_genai, hub, tmp_path):
    """Mistral 3 (#52 §3): GenAI's `mistral3` folder (its vision graph on one [1, 3, 32, 32] image, the embedding and
    decoder graphs, genai_config.json, its Pixtral processor config) beside the components; GenAI generates eager's 8
    tokens from the folder alone, from one image and from two (its processor's pixels and `[IMG]` tokens checked);
    the card's snippet (`[IMG]` in the prompt) runs as written."""
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    out, report, log = mistral3_genai
    _assert_genai_generated_from_an_image(out, report, log)
    folder = out / "onnx"
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    config = json.loads((folder / "config.json").read_text())
    assert (genai["type"], genai["image_token_id"]) == ("mistral3", config["image_token_index"])
    assert (genai["vision"]["filename"], genai["embedding"]["filename"], genai["decoder"]["filename"]) == (
        "genai_vision.onnx", "genai_embedding.onnx", "genai_decoder.onnx")
    assert (genai["vision"]["config_filename"], genai["vision"]["patch_size"],
            genai["vision"]["spatial_merge_size"]) == ("pixtral_processor_config.json", 8, 2)
    assert list(genai["decoder"]["inputs"])[0] == "inputs_embeds" and "input_ids" not in genai["decoder"]["inputs"]
    steps = [step["operation"] for step in json.loads((folder / "pixtral_processor_config.json").read_text())[
        "processor"]["transforms"]]
    assert [step["type"] for step in steps[-2:]] == ["Permute3D", "PixtralImageSizes"], "as GenAI requires"
    [resize] = [step for step in steps if step["type"] == "Resize"]
    assert (resize["attrs"]["height"], resize["attrs"]["width"]) == (32, 32), "the traced image"
    assert not (folder / "processor_config.json").exists(), "transformers' processor file name left alone"

    assert signature(folder / "genai_vision.onnx") == (
        [("pixel_values", [1, 3, 32, 32])], [("image_features", [4, 32])])
    inputs, outputs = signature(folder / "genai_decoder.onnx")
    assert [name for name, _ in inputs] == ["inputs_embeds", "attention_mask", "position_ids",
                                            "past_key_values.0.key", "past_key_values.0.value"]
    assert dict(inputs)["position_ids"] == [1, "sequence_length"], "plain RoPE positions"
    assert [name for name, _ in outputs] == ["logits", "present.0.key", "present.0.value"]
    for name in ("genai_vision.onnx", "genai_embedding.onnx", "genai_decoder.onnx"):
        assert (folder / f"{name}.data").stat().st_size == 0, f"{name}'s weights point into the components' sidecar"
    commit = upload_exports(hub, "alice/mistral3", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/mistral3", out, commit))
                             if s[0] == RUNTIME and '"exports/onnx/*"' in s[2]]
    assert language == "python" and 'prompt = "[IMG]describe the image"' in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip(), "the decoded prompt and the new tokens"

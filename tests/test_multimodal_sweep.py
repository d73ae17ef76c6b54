"""What the fifteenth round's sweep of vision-language and speech families through their runtimes (#52,
benchmarks/RESULTS.md) found, on the matrix's tiny LLaVA as the sweep built it (a byte-level tokenizer, no image
processor; checkpoint saved in bfloat16), one run through the shared export store:

- a transformers.js-layout target of a repo that ships no image processor: transformers.js's `AutoProcessor` has
  nothing to load, so the runtime declines with the reason (before: the proof crashed on `ModelFileNotFoundError`
  for `preprocessor_config.json` and failed the target, whose graphs validation had passed);
- the `8da4w` variant on a vision-language model's ExecuTorch target: it failed before any export, naming the variant
  and the layout (torchao quantized the LLM runner's program only). Since the sixteenth round it is MultimodalRunner's
  program (tests/test_trained_vlm.py); a target that asks for the methods layout is refused when the recipe is read.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import targets_by_name
from tests.export_store import stored_run

RECIPE = {"exports": [
    {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"},
], "generation": {"max_new_tokens": 8}}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    import torch
    from transformers import LlavaForConditionalGeneration

    from matrix.families import FAMILIES, build

    folder = build(FAMILIES["llava"], tmp_path_factory.mktemp("sweep-llava") / "model", recipe=RECIPE)
    LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(folder)
    assert not (folder / "preprocessor_config.json").exists() and not (folder / "processor_config.json").exists()
    out, report, log = stored_run(folder)
    return out, targets_by_name(report), log


def test_a_transformers_js_folder_without_an_image_processor_is_declined_with_the_reason(swept):
    out, targets, log = swept
    target = targets["tjs"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["transformers.js"]["status"] == "declined", proofs
    assert "preprocessor_config.json" in proofs["transformers.js"]["detail"], proofs
    assert "'llava' repo ships none" in proofs["transformers.js"]["detail"], proofs
    assert (out / "tjs" / "onnx" / "vision_encoder.onnx").is_file()  # the layout is written all the same
    assert "transformers.js ✗" in (out / "report.md").read_text()


def test_the_8da4w_variant_of_a_methods_target_is_refused_naming_the_layouts_torchao_quantizes():
    """torchao quantizes a runner's program: the LLM runner's, the ASR runner's ('runner') and, since the sixteenth
    round, MultimodalRunner's ('multimodal_runner', tests/test_trained_vlm.py); a target that asks for the methods
    layout is refused when the recipe is read, naming both layouts and what quantizes the methods layout instead."""
    from exporters.errors import RecipeError
    from exporters.recipe.load import parse_recipe

    methods = {"name": "et", "export_format": "executorch", "mode": "generation", "layout": "methods"}
    with pytest.raises(RecipeError) as caught:
        parse_recipe(json.dumps({"exports": [{**methods, "variants": ["8da4w"]}]}))
    message = str(caught.value)
    assert "variants[0]" in message and "layout 'runner' or 'multimodal_runner'" in message, message
    assert "'pt2e-xnnpack', 'scheme': '8da4w'" in message, message
    asked = parse_recipe(json.dumps({"exports": [{**methods, "layout": "multimodal_runner", "variants": ["8da4w"]}]}))
    assert [(t.name, t.quantize.method) for t in asked.exports] == [("et-8da4w", "torchao-xnnpack")]


def test_a_variant_an_encoder_decoders_transformers_js_folder_cannot_hold_fails_before_export(tmp_path):
    """Whisper's transformers.js folder with `variants: ["fp32", "fp16"]`: its merged decoder takes the q4 file only,
    so the target fails when planned, naming the variant and the layout, with no graph exported (before: after the
    whole export, from the float16 converter, with advice to list int8-dynamic, which is refused too)."""
    from tests.models import tiny_whisper

    recipe = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js",
                           "variants": ["fp32", "fp16"]}], "generation": {"max_new_tokens": 8}}
    out, report, log = stored_run(tiny_whisper(tmp_path / "model", recipe, feature_extractor=True))
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "failed" and target["error"]["type"] == "TargetPlanError", (log[-3000:], target)
    message = target["error"]["message"]
    assert "variant 'fp16' cannot take layout 'transformers.js'" in message and '"int4"' in message, message
    assert not list(out.glob("**/*.onnx")), sorted(str(p) for p in out.glob("**/*.onnx"))


def test_variants_of_a_transformers_js_target_the_layout_declines_fail_before_export(tmp_path):
    """The matrix's tiny Voxtral (its encoder gives 16 audio tokens a chunk, where transformers.js's processor lays
    out 375) keeps its components instead of transformers.js's layout: its `variants` (dtype files of that layout)
    fail the target when planned, naming them and the layout's reason (before: the fp32 components passed, the
    int4 and fp16 files the recipe asked for silently not written)."""
    from matrix.families import FAMILIES, build

    recipe = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js",
                           "variants": ["fp32", "int4"]}], "generation": {"max_new_tokens": 8}}
    out, report, log = stored_run(build(FAMILIES["voxtral"], tmp_path / "model", recipe=recipe))
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "failed" and target["error"]["type"] == "TargetPlanError", (log[-3000:], target)
    message = target["error"]["message"]
    assert "variants ['fp32', 'int4'] are dtype files of layout 'transformers.js'" in message, message
    assert "375 audio tokens per chunk" in message, message
    assert not list(out.glob("**/*.onnx")), sorted(str(p) for p in out.glob("**/*.onnx"))


def test_a_vlm_program_kept_in_the_methods_layout_is_declined_by_the_multimodal_runner_with_the_reason(tmp_path):
    """Qwen2-VL's plainest ExecuTorch target and a VLM target with the methods layout's settings keep the methods
    layout: the report's "runs in" cell was empty (only the matrix said why, from the findings); the runner now
    declines it, the findings say why, and a target's own settings are said too (`settings_refused`). A quantized
    target (8da8w, 8da4w) is MultimodalRunner's program since the sixteenth round: no settings refuse it."""
    from exporters.capture.multimodal_runner import NOT_MULTIMODAL, settings_refused
    from exporters.layouts.executorch_multimodal import METHODS_KEPT, ExecutorchMultimodal
    from exporters.recipe.load import parse_recipe

    def target(**settings):
        return parse_recipe(json.dumps({"export_format": "executorch", "mode": "generation", **settings})).exports[0]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    layout = ExecutorchMultimodal()
    assert layout.may_decline(target(), ["image_encoder", "embed_tokens", "language_model", "lm_head", "decode"])
    assert layout.declines(target(), tmp_path) == METHODS_KEPT
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    assert layout.declines(target(), tmp_path).endswith("it would generate other tokens than transformers")
    assert not layout.may_decline(target(layout="methods"), ["embed_tokens", "language_model"])  # asked for
    quantized = target(quantize={"method": "pt2e-xnnpack", "scheme": "8da8w"})
    assert settings_refused(quantized, "vision-language", "static") is None
    assert settings_refused(target(quantize={"method": "torchao-xnnpack"}), "vision-language", "static") is None
    shaped = target(components={"text_decoder": {"strict": True}})
    assert settings_refused(shaped, "vision-language", "static") == NOT_MULTIMODAL.format(
        why="the target sets per-component settings or dynamic_shapes of the methods layout")
    assert settings_refused(target(), "vision-language", "static") is None
    assert settings_refused(shaped, "text", "static") is None


@pytest.mark.parametrize("runtime", ["ExecuTorch MultimodalRunner", "ExecuTorch ASR runner layout"])
def test_a_runner_snippet_that_runs_the_folders_processor_is_shown_only_where_the_folder_has_one(runtime):
    """The sweep's LLaVA and Whisper (their repos ship no processor nor feature extractor) passed their runner's proof,
    but the card's snippet, run as written (tests/card_snippets.py), failed on `AutoProcessor` /
    `AutoFeatureExtractor`: "Can't load image processor ... a directory containing a preprocessor_config.json file".
    The snippet is now left out there (as for a runtime that did not pass), and shown where the folder has one."""
    from exporters.publish.snippets import target_snippets

    components = ["encoder", "text_decoder"] if "ASR" in runtime else ["token_embedding", "vision_encoder",
                                                                          "text_decoder"]
    target = {"name": "executorch", "export_format": "executorch", "mode": "generation",
              "expected_components": components, "components": [{"name": c} for c in components],
              "files": [{"path": f"executorch/{name}"} for name in ("model.pte", "config.json", "tokenizer.json")],
              "runtimes": [{"runtime": runtime, "status": "passed", "detail": "8/8 tokens"}]}
    assert runtime not in [name for name, _, _ in target_snippets("org/model", target)]
    target["files"].append({"path": "executorch/preprocessor_config.json"})
    [code] = [code for name, _, code in target_snippets("org/model", target) if name == runtime]
    assert "from_pretrained(folder)" in code


@pytest.mark.parametrize("export_format", ["onnx", "dynamo"])
@pytest.mark.parametrize("stages", [["image_encoder", "multi_modal_projector"], ["audio_encoder", "multi_modal_projector"]])
def test_a_multimodal_generation_target_gets_no_upstream_snippet_written_for_a_text_decoder(export_format, stages):
    """The sixteenth round's sweep (LLaVA-NeXT, Idefics2, ..., with their processors; benchmarks/RESULTS.md) ran every
    card snippet as written: upstream's `ExportedModel` snippet of a vision-language ONNX target was the text
    decoder's, and failed on its fourth statement (`AttributeError: 'LlavaNextConfig' object has no attribute
    'hidden_size'`; then `model.runners["model"]`, a component such a target does not have). A target of a
    vision- or audio-language model's stages gets no upstream snippet (none written yet); a text decoder's keeps it."""
    from exporters.publish.snippets import UPSTREAM, target_snippets

    components = [*stages, "embed_tokens", "language_model", "lm_head", "decode"]
    suffix = {"onnx": ".onnx", "dynamo": ".pt2"}[export_format]
    target = {"name": export_format, "export_format": export_format, "mode": "generation",
              "expected_components": components, "components": [{"name": c} for c in components],
              "files": [{"path": f"{export_format}/{name}{suffix}"} for name in components],
              "runtimes": [{"runtime": "ONNX Runtime GenAI", "status": "declined", "detail": "no such type"}]}
    assert UPSTREAM not in [runtime for runtime, _, _ in target_snippets("org/model", target)]
    text = {**target, "expected_components": ["prefill", "decode"],
            "files": [{"path": f"{export_format}/{name}{suffix}"} for name in ("prefill", "decode")]}
    assert [runtime for runtime, _, _ in target_snippets("org/model", text)] == [UPSTREAM]


def test_a_speecht5_folder_in_the_transformers_js_layout_is_declined_by_transformers_js_with_the_reason(tmp_path):
    """The sixteenth round's sweep: SpeechT5 (speech-to-text on the waveform, its feature extractor in the folder) in
    transformers.js's layout. transformers.js 4.3.2 maps `speecht5` to SpeechT5ForSpeechToText, whose `generate()`
    feeds the encoder `input_ids` (its class names no main input, where Moonshine's names `input_values`): the proof
    ran and failed the target ("Missing the following inputs: input_values"). Now the runtime declines, saying why,
    and the target's verdict is its own checks' (its files still transformers.js's layout)."""
    from tests.models import tiny_speecht5

    recipe = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}],
              "generation": {"max_new_tokens": 8}}
    out, report, log = stored_run(tiny_speecht5(tmp_path / "model", recipe))
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["transformers.js"]["status"] == "declined", proofs
    assert "SpeechT5ForSpeechToText" in proofs["transformers.js"]["detail"], proofs
    assert "input_values" in proofs["transformers.js"]["detail"], proofs
    assert {"onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx"} <= {
        str(p.relative_to(out / "tjs")) for p in (out / "tjs").rglob("*.onnx")}


def test_a_qwen2_vl_asking_for_the_multimodal_runner_is_refused_for_its_3d_positions(tmp_path):
    """Qwen2-VL's text model places its tokens by M-RoPE (3-D positions: each image token at its grid index, the
    text after the image shifted), where ExecuTorch's MultimodalRunner calls `text_decoder(embeddings, cache
    positions)` (extension/llm/runner/multimodal_prefiller.cpp) and `vision_encoder(pixels)`: a recipe that asks for
    the runner's layout fails before any export, saying so (before: only that `image_grid_thw` is an input the
    runner's image cannot carry, which a fixed grid could bake in, as LLaVA-NeXT's image sizes are)."""
    from exporters.capture.multimodal_runner import MROPE_REFUSED
    from tests.models import tiny_qwen_vl_with_image_processor

    recipe = {"exports": [{"name": "et", "export_format": "executorch", "mode": "generation",
                           "layout": "multimodal_runner"}], "generation": {"max_new_tokens": 8}}
    out, report, log = stored_run(tiny_qwen_vl_with_image_processor(tmp_path / "model", recipe, family="qwen2_vl"))
    target = targets_by_name(report)["et"]
    assert target["status"] == "failed" and target["error"]["type"] == "TargetPlanError", (log[-3000:], target)
    assert MROPE_REFUSED in target["error"]["message"] and "use layout 'methods'" in target["error"]["message"]
    assert not list(out.glob("**/*.pte")), sorted(str(p) for p in out.glob("**/*.pte"))

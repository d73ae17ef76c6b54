"""The families people ship (issue #16), one representative per kind, through the real CLI:

- vision-language beyond LLaVA: an Idefics3 whose folder ships its own processor (5-D pixels, pixel mask, the
  processor's token layout), exported as its complete stage set and generating from image + prompt through the
  graphs only (PaliGemma, Gemma 3, Qwen2-VL and the rest are rows of docs/coverage.md, `make coverage`);
- a dual encoder (CLIP): each tower and projection head its own component in model mode, no traceback;
- a vision backbone through its own image processor;
- SigLIP2 (NaFlex): its variable-resolution inputs (patches, `pixel_attention_mask`, `spatial_shapes`) made by its
  own image processor and exported with them (issue #50);
- a decoder-only model with a sliding-window cache (Gemma 2) whose `.pt2` decode runs past the window;
- models that cannot be prepared or captured: failed targets whose reason carries the root cause, exit 1.
"""

from __future__ import annotations

import json

import pytest

from matrix.families import FAMILIES
from tests.conftest import run_cli
from tests.export_store import MODEL, OUT, exported
from tests.models import (
    VIT_TJS_RECIPE,
    tiny_idefics3_with_processor,
    tiny_siglip2_with_image_processor,
    tiny_vit_with_image_processor,
)

BOTH = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
        {"name": "onnx", "export_format": "onnx", "dynamic": True}]


def _report(out):
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def idefics3_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("idefics3")
    # a one-layer language model: the checks read the processor's inputs and the stage set (#48: cheaper graphs)
    model_dir = tiny_idefics3_with_processor(root / "model", {"schema_version": 1, "exports": BOTH,
                                                              "generation": {"max_new_tokens": 6}}, text_layers=1)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_idefics3_complete_stages_and_parity_from_its_own_processor(idefics3_run):
    _, out, result = idefics3_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = _report(out)
    assert report["family"] == "vision-language"
    assert any("through the folder's own Idefics3Processor" in f for f in report["findings"]), report["findings"]
    stages = ["image_encoder", "connector", "embed_tokens", "language_model", "lm_head", "decode"]
    for target in report["targets"]:
        assert target["status"] == "passed", (target["name"], target["error"])
        assert target["mode"] == "generation"
        assert target["expected_components"] == stages
        assert [c["name"] for c in target["components"]] == stages
        generation = target["generation"]
        assert generation["status"] == "passed", generation
        assert generation["exported_tokens"][0][: len(generation["eager_tokens"][0])] == generation["eager_tokens"][0]
        assert len(set(generation["exported_tokens"][0])) > 1, "greedy tokens vary: the check can fail"
    encoder = report["targets"][0]["components"][0]["checks"][0]["shapes"]
    assert encoder["pixel_values"] == [1, 3, 32, 32] and encoder["patch_attention_mask"] == [1, 4, 4]


def test_parity_refuses_a_forward_that_uses_eager_weights(idefics3_run):
    """The driver runs the model's own forward with its stages replaced by graphs; a stage left eager is caught."""
    import torch

    from exporters.capture.cache_settings import CacheSetting
    from exporters.capture.components import decompose
    from exporters.capture.inputs import make_sample_inputs
    from exporters.capture.loading import load_model
    from exporters.capture.source import ModelSource, load_tokenizer
    from exporters.errors import EagerStageError
    from exporters.recipe.load import parse_recipe
    from exporters.upstream import load_exported
    from exporters.validate.vision_language import vision_language_prefill

    model_dir, out, _ = idefics3_run
    model = load_model(ModelSource(str(model_dir), model_dir))
    sample = make_sample_inputs(model, parse_recipe(json.dumps(BOTH)).inputs, load_tokenizer(model_dir),
                                folder=model_dir)
    components = decompose(model, "generation", sample.forward, sample.generate,
                                  setting=CacheSetting("dynamic"), multi_token_decode=False, family=sample.family)
    exported = load_exported(out / "onnx", config=model.config)
    logits, _ = vision_language_prefill(model, components, exported.runners, sample.generate)
    with torch.no_grad():
        eager = model(**sample.generate).logits
    assert torch.allclose(logits, eager, atol=1e-4, rtol=1e-3)
    partial = {name: pair for name, pair in components.items() if name != "connector"}
    with pytest.raises(EagerStageError, match="connector"):
        vision_language_prefill(model, partial, exported.runners, sample.generate)
    assert "forward" not in vars(model.model.vision_model), "the stages are restored after the check"


def test_clip_exports_each_tower_in_model_mode(tmp_path):
    import dataclasses

    from matrix.families import FAMILIES, build

    # one layer a tower: the checks read the towers, the heads and the probes, not the depth (#48)
    spec = dataclasses.replace(FAMILIES["clip"], overrides={**FAMILIES["clip"].overrides,
                                                            "text_config.num_hidden_layers": 1,
                                                            "vision_config.num_hidden_layers": 1})
    model_dir = build(spec, tmp_path / "model", recipe=BOTH)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = _report(out)
    assert report["family"] == "dual-encoder"
    towers = ["text_model", "vision_model", "visual_projection", "text_projection"]
    for target in report["targets"]:
        assert target["status"] == "passed", target["error"]
        assert target["mode"] == "model" and target["generation"] is None
        assert target["expected_components"] == towers
        checks = {c["name"]: c["checks"] for c in target["components"]}
        assert sorted(checks) == sorted(towers)
        assert len(checks["text_model"]) > 1, "the text tower is probed at sequence lengths it was not traced with"


def test_vision_backbone_through_its_own_image_processor(tmp_path):
    """Its ONNX target in transformers.js's layout: the run tests/test_folder_files.py reads too (the shared store
    exports it once, #48)."""
    done = exported(tiny_vit_with_image_processor(tmp_path / "model", VIT_TJS_RECIPE), "run", "--no-bench", MODEL,
                    "--out", OUT, "--quiet")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.report
    assert report["family"] == "vision" and report["targets"][0]["status"] == "passed"
    assert any("ViTImageProcessorPil" in f for f in report["findings"]), report["findings"]


def test_siglip2_naflex_exports_with_the_inputs_its_image_processor_makes(tmp_path):
    """The plainest ONNX and ExecuTorch targets of a SigLIP2 whose folder ships its NaFlex image processor: the vision
    tower is traced and checked with the processor's patches, pixel mask and spatial shapes, and every tower passes."""
    exports = [{"name": "onnx", "export_format": "onnx", "dynamic": True},
               {"name": "executorch", "export_format": "executorch"}]
    model_dir = tiny_siglip2_with_image_processor(tmp_path / "model", {"schema_version": 1, "exports": exports},
                                                  layers=1)  # one layer a tower: the checks read inputs and towers
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = _report(out)
    assert report["family"] == "dual-encoder"
    assert any("Siglip2ImageProcessor" in f for f in report["findings"]), report["findings"]
    for target in report["targets"]:
        assert target["status"] == "passed", (target["name"], target["error"])
        vision = next(c for c in target["components"] if c["name"] == "vision_model")
        shapes = vision["checks"][0]["shapes"]
        batch = shapes["pixel_values"][0]
        assert shapes == {"pixel_values": [batch, 16, 3 * 8 * 8], "pixel_attention_mask": [batch, 16],
                          "spatial_shapes": [batch, 2]}, shapes


def test_gemma2_sliding_window_pt2_decodes_past_the_window(tmp_path):
    from matrix.families import FAMILIES, build

    spec = FAMILIES["gemma2"]
    assert spec.overrides["sliding_window"] == 12
    recipe = {"schema_version": 1, "exports": [BOTH[0]], "generation": {"max_new_tokens": 8}}
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    target = _report(out)["targets"][0]
    generation = target["generation"]
    assert target["status"] == "passed" and generation["status"] == "passed", (target["error"], generation)
    assert generation["prompt_length"] + len(generation["exported_tokens"][0]) > 12, "decoding crossed the window"
    assert len(set(generation["exported_tokens"][0])) > 1
    assert any("sliding-window cache" in f for f in target["findings"]), target["findings"]


def test_mllama_without_its_processor_gets_the_inputs_its_processor_makes(tmp_path):
    """Mllama has no `get_image_features` to count image tokens with (its text layers cross-attend to the image):
    without its processor every target failed, asking for it (#50). Its inputs are now made as its processor makes
    them, from the config (tiles, aspect ratios, the image token, the dense cross-attention mask), and its dynamo
    target passes with generation parity; tests/test_vlm_processor.py runs it from its own processor."""
    from matrix.families import FAMILIES, build

    model_dir = build(FAMILIES["mllama"], tmp_path / "model", recipe=BOTH[:1])
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = _report(out)
    assert report["family"] == "vision-language"
    [target] = report["targets"]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", target
    assert any("through a Mllama image processor built from the vision config" in f for f in report["findings"])
    encoder = target["components"][0]["checks"][0]["shapes"]
    assert set(encoder) == {"pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"}, encoder
    checks = {c["name"]: c["checks"] for c in target["components"]}["language_model"]
    assert any("cross_attention_mask" in c["shapes"] for c in checks), checks


def test_capture_failure_reports_its_root_cause(tmp_path):
    """T5's default config names no decoder start token: upstream's capture wraps generate()'s error in "Make sure
    the inputs are compatible with model.generate()"; the report, report.md and the CLI name the real cause."""
    import dataclasses

    from matrix.families import FAMILIES, build

    spec = dataclasses.replace(FAMILIES["t5"], overrides={})
    model_dir = build(spec, tmp_path / "model", recipe=[BOTH[1]])
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out))
    assert result.returncode == 1
    error = _report(out)["targets"][0]["error"]
    assert "Make sure the inputs are compatible with model.generate()" in error["message"]
    assert error["root_cause"]["type"] == "ValueError"
    assert "decoder_start_token_id" in error["root_cause"]["message"]
    assert "root cause: ValueError" in (out / "report.md").read_text()
    assert "root cause: ValueError" in result.stdout + result.stderr


def test_export_child_failure_keeps_the_root_cause_in_report_and_log(tmp_path):
    from exporters.run.isolation import log_excerpt, run_isolated

    def work():
        try:
            raise KeyError("cu_seqlens")
        except KeyError as inner:
            raise RuntimeError("exporting component 'image_encoder' failed: " + "x" * 5000) from inner

    log = tmp_path / "child.log"
    outcome = run_isolated(work, log_path=log, timeout=60)
    assert outcome["ok"] is False and outcome["type"] == "RuntimeError"
    assert outcome["root_cause"] == {"type": "KeyError", "message": "'cu_seqlens'"}
    assert log_excerpt(log, 300).rstrip().endswith("root cause: KeyError: 'cu_seqlens'")


def test_a_model_that_hears_and_sees_is_refused_never_passed_on_its_language_model(tmp_path):
    """Phi-4-multimodal is sorted as a text generator (no `text_config`): its text path alone would export and
    validate. Every target fails instead, naming the audio and image inputs no component reads (issue #50). Granite
    Speech, refused this way until its speech stages were exported, is tests/test_granite_speech.py's now; Voxtral
    and Qwen2-Audio are tests/test_audio_language.py's."""
    import transformers

    from matrix.families import shrink

    cls = transformers.Phi4MultimodalForCausalLM
    model_dir = tmp_path / "model"
    cls(shrink(cls.config_class())).save_pretrained(model_dir)
    (model_dir / "export_config.json").write_text(json.dumps(BOTH))
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    report = _report(out)
    assert [t["status"] for t in report["targets"]] == ["failed", "failed"]
    for target in report["targets"]:
        message = target["error"]["message"]
        assert "reads audio (its forward takes `audio_input_features`)" in message, message
        assert "image (its forward takes `image_pixel_values`)" in message and "nothing is exported" in message
        assert target["components"] == []
    markdown = (out / "report.md").read_text()
    assert "passed" not in markdown.lower().replace("0 passed", "")
    assert "Phi4MultimodalForCausalLM reads audio" in markdown, markdown


@pytest.mark.parametrize("model_class", ["GraniteSpeechForConditionalGeneration", "Phi4MultimodalForCausalLM"])
def test_models_that_take_a_modality_no_component_reads_get_no_sample_inputs(model_class):
    """The guard reads the modalities from the model (its forward's inputs, its config's modality sub-configs),
    not from the family it was sorted into: an audio-language model, and a vision-language one that also hears."""
    import transformers

    from exporters.capture.inputs import make_sample_inputs
    from exporters.errors import UnsupportedModelError
    from exporters.recipe.model import InputsSpec
    from matrix.families import shrink

    cls = getattr(transformers, model_class)
    model = cls(shrink(cls.config_class(), {"has_lora_adapter": False} if "Granite" in model_class else {})).eval()
    if "Granite" in model_class:  # a Granite Speech whose code does not count its audio tokens: its stages not exported
        model.get_audio_features = model.model.get_audio_features = None
    with pytest.raises(UnsupportedModelError, match="reads audio") as caught:
        make_sample_inputs(model, InputsSpec(sequence_length=8))
    if model_class == "Phi4MultimodalForCausalLM":
        assert "image (its forward takes `image_pixel_values`)" in str(caught.value)
    else:
        assert "encoder and its projector" in str(caught.value)


@pytest.mark.parametrize("name", sorted(n for n, s in FAMILIES.items()
                                        if s.kind not in ("decoder-only", "state-space", "hybrid", "encoder")))
def test_no_family_passes_without_a_component_for_every_modality_it_takes(name):
    """For every multimodal family of the matrix: either each modality the model takes is read by a component of
    its family's exports, or its sample inputs are refused (so no target of it can pass)."""
    from exporters.capture.families import detect_family
    from exporters.capture.inputs import make_sample_inputs
    from exporters.capture.modalities import covered, input_modalities
    from exporters.errors import UnsupportedModelError
    from exporters.recipe.model import InputsSpec
    from matrix.families import tiny_model

    model = tiny_model(FAMILIES[name])
    taken, have = set(input_modalities(model)), covered(model, detect_family(model))
    if taken <= have:
        return
    with pytest.raises(UnsupportedModelError):
        make_sample_inputs(model, InputsSpec(sequence_length=8))
    assert FAMILIES[name].kind == "audio-language", f"{name} takes {taken - have} that no component reads"

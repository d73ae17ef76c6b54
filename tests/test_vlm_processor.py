"""Vision-language models beyond the built-in layouts, from the processor a real repo ships (issue #30).

- LLaVA-NeXT (any-resolution tiles: 5-D pixels and `image_sizes`, an `image_newline` weight its forward appends in
  Python between rows of image features), exported in every format from its own processor, every stage passing and
  generation parity through the exported graphs, the glue weight read from the target folder;
- Aya Vision (SigLIP + pixel shuffle, a Cohere2 language model with a sliding window, the processor's
  start/patch/end image tokens), dynamo and ONNX from its own processor;
- Mllama (tiles with `aspect_ratio_ids` / `aspect_ratio_mask`, a language model that cross-attends to the image
  through 4-D `cross_attention_mask` and `full_text_row_masked_out_mask`, whose sequence axis the probes resize);
- LLaVA-OneVision, whose processor builds a video processor that needs torchvision (not in the stack): the folder's
  processor cannot load, which the report says, and its image processor (read from `processor_config.json`, where
  transformers 5 nests it) makes the pixels, with as many image tokens as the model's `get_image_features` returns
  features for them; every format, parity through the exported graphs;
- Idefics2's processor, whose `load_image` refuses arrays: the sample image goes in as a PIL image.

What each processor output feeds: LLaVA-NeXT's `pixel_values` (base image + tiles) go to the image encoder
flattened (`[tiles, 3, 32, 32]`); `image_sizes` stays in the model's Python glue (unpadding, newline packing),
which is why its graphs take none of it.

LLaVA-NeXT, LLaVA-OneVision, Aya Vision (its one layer a sliding-window one, as both of the tiny family's are) and
InternVL without a processor run with a one-layer language model (#48): what their tests check (tiles, glue weights,
image tokens, parity) is no text layer's; the vision tower keeps its two (LLaVA reads the second-to-last).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.export_store import MODEL, OUT, exported
from tests.models import (
    tiny_aya_vision_with_processor,
    tiny_idefics2_with_processor,
    tiny_llava_next_with_processor,
    tiny_llava_onevision_with_processor,
    tiny_mllama_with_processor,
)

EVERY_FORMAT = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
                {"name": "onnx", "export_format": "onnx", "dynamic": True},
                # the methods layout (its stages and glue weights are these tests' point): LLaVA-NeXT's and
                # LLaVA-OneVision's default ExecuTorch layout is MultimodalRunner's at one image size
                # (tests/test_executorch_multimodal_image_sizes.py)
                {"name": "executorch", "export_format": "executorch", "layout": "methods"}]
STAGES = ["image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head", "decode"]


def _run(root, build, exports, **options):
    """One export of the model `build(folder, recipe, **options)` makes (the shared store, tests/export_store.py: the
    tests only read)."""
    model_dir = build(root / "model", {"schema_version": 1, "exports": exports, "generation": {"max_new_tokens": 6}},
                      **options)
    done = exported(model_dir, "run", "--no-bench", MODEL, "--out", OUT, "--quiet")
    return done.model_dir, done.out, done.result, done.report


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("llava-next"), tiny_llava_next_with_processor, EVERY_FORMAT, text_layers=1)


@pytest.fixture(scope="module")
def aya_vision(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("aya-vision"), tiny_aya_vision_with_processor, EVERY_FORMAT[:2],
                text_layers=1)


def _assert_passed_with_parity(report, formats):
    assert report["family"] == "vision-language"
    assert [t["export_format"] for t in report["targets"]] == formats
    for target in report["targets"]:
        assert target["status"] == "passed", (target["name"], target["error"])
        assert target["expected_components"] == STAGES
        assert [c["name"] for c in target["components"]] == STAGES
        generation = target["generation"]
        assert generation["status"] == "passed", (target["name"], generation)
        assert generation["exported_tokens"][0] == generation["eager_tokens"][0]
        assert len(generation["eager_tokens"][0]) == 6
        assert len(set(generation["eager_tokens"][0])) > 1, "greedy tokens vary: the check can fail"


def test_llava_next_every_format_from_its_own_processor(llava_next):
    _, out, result, report = llava_next
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any("through the folder's own LlavaNextProcessor" in f for f in report["findings"]), report["findings"]
    _assert_passed_with_parity(report, ["dynamo", "onnx", "executorch"])
    for target in report["targets"]:
        encoder = target["components"][0]["checks"][0]["shapes"]
        assert encoder == {"pixel_values": [2, 3, 32, 32]}, encoder  # the base image and one tile, flattened
        assert (out / target["name"] / "glue_parameters.safetensors").is_file()
        assert any("['model.image_newline']" in f for f in target["findings"]), target["findings"]


def test_llava_next_parity_reads_the_glue_weight_from_the_folder(llava_next):
    """Without the folder's glue file the forward would use an eager weight: refused; with it, the graphs and the
    folder's `image_newline` give eager's logits."""
    import torch

    from exporters.capture.cache_settings import CacheSetting
    from exporters.capture.components import decompose, read_glue
    from exporters.capture.inputs import make_sample_inputs
    from exporters.capture.loading import load_model
    from exporters.capture.source import ModelSource, load_tokenizer
    from exporters.errors import EagerStageError
    from exporters.recipe.load import parse_recipe
    from exporters.upstream import load_exported
    from exporters.validate.vision_language import vision_language_prefill

    model_dir, out, _, _ = llava_next
    model = load_model(ModelSource(str(model_dir), model_dir))
    sample = make_sample_inputs(model, parse_recipe(json.dumps(EVERY_FORMAT)).inputs, load_tokenizer(model_dir),
                                folder=model_dir)
    assert sample.generate["image_sizes"].tolist() == [[32, 32]]
    components = decompose(model, "generation", sample.forward, sample.generate, setting=CacheSetting("dynamic"),
                           multi_token_decode=False, family=sample.family)
    exported = load_exported(out / "onnx", config=model.config)
    glue = read_glue(out / "onnx")
    assert list(glue) == ["model.image_newline"]
    with torch.no_grad():
        eager = model(**sample.generate).logits
    logits, _ = vision_language_prefill(model, components, exported.runners, sample.generate, glue)
    assert torch.allclose(logits, eager, atol=1e-4, rtol=1e-3)
    with pytest.raises(EagerStageError, match="'model' \\(LlavaNextModel\\)"):
        vision_language_prefill(model, components, exported.runners, sample.generate, {})
    changed = {"model.image_newline": glue["model.image_newline"] + 1.0}
    shifted, _ = vision_language_prefill(model, components, exported.runners, sample.generate, changed)
    assert not torch.allclose(shifted, eager, atol=1e-3), "the folder's value is the one used"
    assert torch.equal(model.model.image_newline, glue["model.image_newline"]), "the model is restored"


def test_aya_vision_from_its_own_processor(aya_vision):
    _, out, result, report = aya_vision
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any("through the folder's own AyaVisionProcessor" in f for f in report["findings"]), report["findings"]
    _assert_passed_with_parity(report, ["dynamo", "onnx"])
    for target in report["targets"]:
        assert not (out / target["name"] / "glue_parameters.safetensors").exists(), "no glue weights: no file"


@pytest.fixture(scope="module")
def mllama(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("mllama"), tiny_mllama_with_processor, EVERY_FORMAT[:1])


def test_mllama_from_its_own_processor_probes_its_cross_attention_masks(mllama):
    _, _, result, report = mllama
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any("through the folder's own MllamaProcessor" in f for f in report["findings"]), report["findings"]
    _assert_passed_with_parity(report, ["dynamo"])
    target = report["targets"][0]
    encoder = target["components"][0]["checks"][0]["shapes"]
    assert set(encoder) == {"pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"}, encoder
    checks = {c["name"]: c["checks"] for c in target["components"]}["language_model"]
    probed = [c for c in checks if c["probe"] != "traced"]
    assert len(probed) == 3 and all(c["passed"] and not c["skipped"] for c in probed), probed
    for check in probed:
        length = check["shapes"]["input_ids"][1]
        assert check["shapes"]["cross_attention_mask"][2] == length
        assert check["shapes"]["full_text_row_masked_out_mask"][2] == length


@pytest.fixture(scope="module")
def llava_onevision(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("llava-onevision"), tiny_llava_onevision_with_processor, EVERY_FORMAT,
                text_layers=1)


def test_llava_onevision_every_format_from_its_image_processor(llava_onevision):
    """Its processor cannot load (torchvision): the report says so, and the pixels are its image processor's (the
    base image and one tile, `image_sizes`), the image tokens counted on them; every stage passes, parity holds."""
    _, out, result, report = llava_onevision
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    findings = report["findings"]
    assert any("the folder's processor could not be loaded" in f and "Torchvision" in f for f in findings), findings
    assert any("through the folder's own LlavaOnevisionImageProcessorPil" in f for f in findings), findings
    _assert_passed_with_parity(report, ["dynamo", "onnx", "executorch"])
    for target in report["targets"]:
        encoder = target["components"][0]["checks"][0]["shapes"]
        assert encoder == {"pixel_values": [2, 3, 32, 32]}, encoder  # the base image and one tile, flattened
        assert (out / target["name"] / "glue_parameters.safetensors").is_file()


def test_idefics2_sample_inputs_through_its_own_processor(tmp_path):
    """Idefics2's processor reads PIL images only (arrays raise "Incorrect format used for image"): the sample
    image reaches it as one, its tokens and pixel mask are the processor's, and the model's forward takes them."""
    import torch

    from exporters.capture.inputs import make_sample_inputs
    from exporters.capture.loading import load_model
    from exporters.capture.source import ModelSource, load_tokenizer
    from exporters.recipe.model import InputsSpec

    folder = tiny_idefics2_with_processor(tmp_path / "model")
    model = load_model(ModelSource(str(folder), folder))
    sample = make_sample_inputs(model, InputsSpec(), load_tokenizer(folder), folder=folder)
    assert sample.source == "processor (Idefics2Processor)"
    inputs = sample.forward
    assert inputs["pixel_values"].shape == (1, 1, 3, 32, 32) and inputs["pixel_attention_mask"].shape == (1, 1, 32, 32)
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 4  # the resampler's 4 latents
    with torch.no_grad():
        assert model(**inputs).logits.shape[1] == inputs["input_ids"].shape[1]


# ── Without a processor: one rule from the config and the model's own get_image_features ──────────────────────

NO_PROCESSOR = {  # model_type: (model class, config settings beside the vision tower's image 32 / patch 8)
    "llava_next": ("LlavaNextForConditionalGeneration", {"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32]]}),
    "llava_onevision": ("LlavaOnevisionForConditionalGeneration",
                        {"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32]]}),
    "internvl": ("InternVLForConditionalGeneration", {"vision_config.image_size": [32, 32],
                                                      "vision_config.patch_size": [8, 8]}),
    "mistral3": ("Mistral3ForConditionalGeneration", {"spatial_merge_size": 2}),
    "aya_vision": ("AyaVisionForConditionalGeneration", {"downsample_factor": 2}),
    "idefics2": ("Idefics2ForConditionalGeneration", {"perceiver_config.resampler_n_latents": 4,
                                                      "perceiver_config.resampler_depth": 1}),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", {"vision_config.out_hidden_size": 32,
                                                     "vision_config.deepstack_visual_indexes": []}),
}


def _no_processor_spec(name: str):
    import dataclasses

    from matrix.families import FAMILIES

    model_class, overrides = NO_PROCESSOR[name]
    if name == "qwen3_vl":  # flattened patches: Qwen2-VL's tiny settings
        base = FAMILIES["qwen2_vl"]
        return dataclasses.replace(base, name=name, model_class=model_class, overrides={**base.overrides, **overrides})
    return dataclasses.replace(FAMILIES["llava"], name=name, model_class=model_class, overrides={
        "vision_config.image_size": 32, "vision_config.patch_size": 8, **overrides})


@pytest.mark.parametrize("name", sorted(NO_PROCESSOR))
def test_synthesized_inputs_are_the_layout_the_model_counts(name):
    """No processor: the image tokens are as many as the model's own get_image_features returns features, so its
    forward accepts them (it raises "Image features and image tokens do not match" otherwise), and one token fewer
    is refused: the count is the model's, not a guess."""
    import torch

    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec
    from matrix.families import tiny_model

    model = tiny_model(_no_processor_spec(name))
    sample = make_sample_inputs(model, InputsSpec(sequence_length=4))
    assert sample.family == "vision-language" and sample.source == "synthesized"
    inputs = sample.forward
    image_token = model.config.image_token_id
    count = int((inputs["input_ids"] == image_token).sum())
    ids = inputs["input_ids"]
    assert count > 0 and count + 4 <= ids.shape[1] <= count + 6, "image tokens (and begin/end) before the prompt"
    with torch.no_grad():
        assert model(**inputs).logits.shape[1] == ids.shape[1]
        keep = torch.ones(ids.shape[1], dtype=torch.bool)
        keep[int((ids[0] == image_token).nonzero()[0])] = False  # one image token fewer
        short = {**inputs, "input_ids": ids[:, keep], "attention_mask": inputs["attention_mask"][:, keep]}
        short.update({k: v[:, keep] for k, v in inputs.items() if k.endswith("token_type_ids")})
        with pytest.raises(ValueError, match="[Ii]mage features and image tokens do not match"):
            model(**short)
    if name in ("llava_next", "llava_onevision"):  # the base image and the one tile the model reads at 32
        assert inputs["pixel_values"].shape == (1, 2, 3, 32, 32) and inputs["image_sizes"].tolist() == [[32, 32]]


def test_internvl_without_a_processor_exports_and_generates(tmp_path):
    """A family with no layout of its own here, from the rule alone: every stage passes and parity holds."""
    import dataclasses

    from matrix.families import build

    recipe = {"schema_version": 1, "exports": EVERY_FORMAT[:1], "generation": {"max_new_tokens": 6}}
    spec = _no_processor_spec("internvl")  # one text layer (#48): the rule is the vision side's
    spec = dataclasses.replace(spec, overrides={**spec.overrides, "text_config.num_hidden_layers": 1,
                                                "text_config.layer_types": ["full_attention"]})
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    target = report["targets"][0]
    assert target["status"] == "passed", target["error"]
    assert target["expected_components"] == STAGES
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert len(set(generation["eager_tokens"][0])) > 1

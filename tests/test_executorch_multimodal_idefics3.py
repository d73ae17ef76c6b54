"""ExecuTorch MultimodalRunner's layout for Idefics3 and SmolVLM (#52 item 5): the plainest ExecuTorch generation
recipe of a tiny Idefics3 with its processor, which splits the image as real SmolVLM repos do (2 x 2 tiles and the
whole image: pixel_values [1, 5, 3, H, W], a pixel_attention_mask of ones, five runs of image tokens), is one
model.pte whose `vision_encoder` takes one image [1, 3, H, W], which the runner calls once per tile in the prompt's
order; proven by executorch's own `MultimodalRunner` token for token with eager `generate()`, its card snippet run as
written. A sample the runner cannot carry (a mask that leaves pixels out, runs that do not match the images) keeps
the methods layout, saying why. The matrix's idefics3 and smolvlm rows run one image (no processor: synthesized);
LLaVA's tests (tests/test_executorch_multimodal.py) hold the layout's files and metadata methods."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, image_proof_context, image_proven
from tests.export_store import stored_run
from tests.models import tiny_idefics3_with_processor

RUNTIME = "ExecuTorch MultimodalRunner"


@pytest.fixture(scope="module")
def idefics3_runner(tmp_path_factory):
    """The tiny Idefics3 (one text layer) with its splitting processor and a byte-level BPE tokenizer, the plainest
    ExecuTorch recipe, through the real CLI (the shared export store)."""
    model_dir = tiny_idefics3_with_processor(tmp_path_factory.mktemp("mm-idefics3") / "model", PLAINEST_EXECUTORCH,
                                             text_layers=1, byte_level=True, split=True)
    out, report, log = stored_run(model_dir)
    return model_dir, out, report, log


def test_the_plainest_idefics3_recipe_passes_in_the_multimodal_runner(idefics3_runner):
    _, out, report, log = idefics3_runner
    target = report["targets"][0]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert json.loads((out / "executorch" / "export.json").read_text())["layout"] == "multimodal_runner"
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    # the prompt: 5 images of 4 tokens each, their row/column and wrapper tokens, the text
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from an image and a prompt (52 positions)"), proofs
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert generation["cache"]["implementation"] == "static"  # the program's; eager's reference: dynamic (upstream)


def test_the_one_image_encoder_is_the_models_image_features(idefics3_runner):
    """The program's `vision_encoder` (no bucketize: its position ids a constant) gives the model's own
    `get_image_features` of each of the processor's images (tiles and the whole image) with its mask of ones."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.upstream.idefics_image import OneImageEncoder

    model_dir = idefics3_runner[0]
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(torch.randint(0, 255, (40, 60, 3), dtype=torch.uint8).numpy())
    inputs = processor(images=[[image]], text=[f"{processor.image_token} describe the image"], return_tensors="pt")
    assert tuple(inputs["pixel_values"].shape[:2]) == (1, 5) and bool(inputs["pixel_attention_mask"].all())
    encoder = OneImageEncoder(model).eval()
    tokens = 0
    for i in range(5):
        with torch.no_grad():
            want = model.get_image_features(pixel_values=inputs["pixel_values"][:, i:i + 1],
                                            pixel_attention_mask=inputs["pixel_attention_mask"][:, i:i + 1])
            got = encoder(inputs["pixel_values"][:, i])
        want = torch.cat(list(want.pooler_output))
        assert torch.equal(got[0], want), (i, (got[0] - want).abs().max())
        tokens += got.shape[1]
    assert tokens == int((inputs["input_ids"] == model.config.image_token_id).sum())


def test_a_sample_the_runners_one_image_cannot_carry_says_why(idefics3_runner):
    """A mask that leaves pixels out, or fewer runs of image tokens than images: the default layout falls back to
    the methods layout with the reason; one full image fits, and so do tiles each in its own run."""
    from transformers import AutoModelForImageTextToText

    from exporters.capture.multimodal_runner import refused
    from exporters.recipe.load import parse_recipe

    model = AutoModelForImageTextToText.from_pretrained(idefics3_runner[0]).eval()
    target = parse_recipe(json.dumps(PLAINEST_EXECUTORCH)).exports[0]
    token = model.config.image_token_id
    ids = torch.tensor([[1, token, token, token, token, 5]])
    one = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": torch.randn(1, 1, 3, 32, 32),
           "pixel_attention_mask": torch.ones(1, 1, 32, 32, dtype=torch.bool)}
    assert refused(target, model, one, 64) is None
    tiles = {**one, "pixel_values": torch.randn(1, 5, 3, 32, 32),
             "pixel_attention_mask": torch.ones(1, 5, 32, 32, dtype=torch.bool)}
    assert "one run of image tokens per image (5" in refused(target, model, tiles, 64)
    runs = torch.tensor([[1, *([7, token, token, token, token] * 5), 5]])
    assert refused(target, model, {**tiles, "input_ids": runs, "attention_mask": torch.ones_like(runs)}, 64) is None
    padded = {**one, "pixel_attention_mask": one["pixel_attention_mask"].clone()}
    padded["pixel_attention_mask"][..., 24:] = False
    assert "leaves pixels out" in refused(target, model, padded, 64)


def test_two_images_in_one_prompt_are_proven_for_idefics3(idefics3_runner):
    """#52: two different images in one prompt, each split by the processor into 2 x 2 tiles and the whole image
    (pixel_values [1, 10, 3, H, W], ten runs of image tokens, two `<global-img>`s), through the product's own proof:
    MultimodalRunner gives eager `generate()`'s 8 tokens with the ten image inputs in the prompt's order, the detail
    saying two images; the same folder given the two images' tiles swapped in the runner's input list fails, where
    eager's tokens on the swapped pixels differ."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.layouts.executorch_multimodal.proof import prove, reference

    model_dir, out, _, _ = idefics3_runner
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    noise = torch.randint(0, 255, (40, 60, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    images = [Image.fromarray(noise.numpy()), Image.new("RGB", (60, 40), (10, 90, 220))]
    prompt = f"{processor.image_token} describe this image and {processor.image_token} that one"
    inputs = dict(processor(images=[images], text=[prompt], return_tensors="pt"))
    assert tuple(inputs["pixel_values"].shape[:2]) == (1, 10) and bool(inputs["pixel_attention_mask"].all())
    layout, made, proof, context = image_proven(model, model_dir, out, inputs)
    assert made["images"] == 2 and len(made["tokens"]) == 8, made
    assert proof.status == "passed", proof
    positions = inputs["input_ids"].shape[1]
    assert proof.detail == f"8/8 tokens from two images and a prompt ({positions} positions)", proof
    swapped = inputs["pixel_values"][:, [*range(5, 10), *range(5)]]  # the second image's tiles first
    eager = reference(layout, model, image_proof_context(model_dir, {**inputs, "pixel_values": swapped}))
    assert eager["tokens"] != made["tokens"]  # the images' order reaches the tokens
    failed = prove(layout, out / "executorch", {**made, "pixel_values": swapped}, context)
    assert failed.status == "failed" and "tokens equal" in failed.detail, failed


def test_the_cards_multimodal_snippet_runs_as_written_for_idefics3(idefics3_runner, hub, tmp_path):
    """The card's `MultimodalRunner` snippet, run as written against the Hub emulator (an image.jpg where it reads
    one): the processor's [1, 1, 3, H, W] pixels go in as the runner's image inputs (IMAGE_INPUTS, the proof's lines
    too)."""
    from exporters.layouts.executorch_multimodal import IMAGE_INPUTS
    from exporters.layouts.executorch_multimodal.proof import CHILD
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    _, out, _, _ = idefics3_runner
    commit = upload_exports(hub, "alice/idefics3", out, ["executorch"])
    [(runtime, language, code)] = card_snippets(exports_card("alice/idefics3", out, commit))
    assert runtime == RUNTIME and language == "python"
    assert IMAGE_INPUTS in code and IMAGE_INPUTS in CHILD
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()


def test_only_idefics3_shaped_models_take_the_one_image_encoder(tmp_path):
    """Idefics2 has a pixel mask and a vision_model too, and its connector (a perceiver resampler) reads the patch
    mask, all ones for a full image: it takes the one image encoder, which equals its `get_image_features` with the
    mask of ones (its runner proof: tests/test_executorch_multimodal_image_sizes.py); LLaVA (no pixel mask) does
    not."""
    from transformers import AutoModelForImageTextToText

    from exporters.upstream.idefics_image import OneImageEncoder, takes_pixel_mask
    from matrix.families import FAMILIES, build

    idefics2 = AutoModelForImageTextToText.from_pretrained(build(FAMILIES["idefics2"], tmp_path / "idefics2")).eval()
    assert takes_pixel_mask(idefics2)
    pixels = torch.randn(1, 1, 3, 32, 32)
    with torch.no_grad():
        want = idefics2.get_image_features(pixel_values=pixels,
                                           pixel_attention_mask=torch.ones(1, 1, 32, 32, dtype=torch.bool))
        got = OneImageEncoder(idefics2).eval()(pixels[:, 0])
    assert torch.allclose(got[0], torch.cat(list(want.pooler_output)), atol=1e-5)
    smolvlm = AutoModelForImageTextToText.from_pretrained(build(FAMILIES["smolvlm"], tmp_path / "smolvlm"))
    assert takes_pixel_mask(smolvlm)
    llava = AutoModelForImageTextToText.from_pretrained(build(FAMILIES["llava"], tmp_path / "llava"))
    assert not takes_pixel_mask(llava)

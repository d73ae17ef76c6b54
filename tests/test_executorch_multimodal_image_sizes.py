"""ExecuTorch MultimodalRunner's layout for models whose image comes with its `image_sizes` (#52 items 1 and 5):
LLaVA-NeXT (any-resolution tiles, the unpadding and `image_newline` rows) at one fixed image size. The plainest
ExecuTorch generation recipe of a tiny LLaVA-NeXT with its own processor is one model.pte whose `vision_encoder`
takes one image of 32x32 (the processor's base image and tile stacked down the height, `[1, 3, 64, 32]`), its
`image_sizes` baked in (`exporters.upstream.fixed_image`), and whose constant method `image_size` says the size;
proven by executorch's own `MultimodalRunner` token for token with eager `generate()` on the processor's inputs, its
card snippet run as written (the 40x48 image.jpg resized to the program's size). Another size is refused, by the
snippet's check and by the program itself; an encoder baked with another `image_sizes` gives other features (the
mutant the proof would catch)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, image_proven
from tests.export_store import stored_run
from tests.models import tiny_llava_next_with_processor

RUNTIME = "ExecuTorch MultimodalRunner"


def _runner_target(out, report, log):
    """The run's one target, asserted passed in MultimodalRunner's layout and proven there: (target, proofs by runtime)."""
    target = report["targets"][0]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert json.loads((out / "executorch" / "export.json").read_text())["layout"] == "multimodal_runner"
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    return target, proofs


def _proven_folder(model, model_dir, out, inputs):
    """The proof's reference for `inputs` on the eager `model`, and the stored folder proven 8/8 with it at one image
    of 32x32: (target, recipe, layout, reference, context), for a mutant of the folder proven the same way."""
    layout, made, good, context = image_proven(model, model_dir, out, inputs)
    recipe, target = context.recipe, context.target
    assert made["tokens"], made
    assert good.status == "passed" and good.detail.startswith("8/8 tokens from one image of 32x32"), good
    return target, recipe, layout, made, context


@pytest.fixture(scope="module")
def llava_next_runner(tmp_path_factory):
    """The tiny LLaVA-NeXT (one text layer) with its processor and a byte-level BPE tokenizer, the plainest ExecuTorch recipe, through the real CLI
    (the shared export store)."""
    model_dir = tiny_llava_next_with_processor(tmp_path_factory.mktemp("mm-llava-next") / "model",
                                               PLAINEST_EXECUTORCH, text_layers=1, byte_level=True)
    out, report, log = stored_run(model_dir)
    return model_dir, out, report, log


def test_the_plainest_llava_next_recipe_passes_in_the_multimodal_runner(llava_next_runner):
    _, out, report, log = llava_next_runner
    target, proofs = _runner_target(out, report, log)
    # the prompt: the base image's 16 features, the tile's 4 x 4 and its 4 newline rows, then the text
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from one image of 32x32 and a prompt"), proofs
    assert f"{RUNTIME} ✓ 8/8 tokens from one image of 32x32" in (out / "report.md").read_text()
    assert any("one image of 32x32, its image_sizes baked in" in f for f in target["findings"]), target["findings"]
    encoder = next(c for c in target["components"] if c["name"] == "vision_encoder")
    assert encoder["checks"][0]["shapes"] == {"pixel_values": [1, 3, 64, 32]}  # base image and tile, stacked
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]


def test_the_program_bakes_one_image_size_and_refuses_another(llava_next_runner):
    """The program's `image_size` is the traced one; its `vision_encoder` is the model's own features of the
    processor's tiles; an image of another size does not run; an encoder baked with other `image_sizes` (a
    wrong grid: other unpadding and newline rows) gives other features."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.upstream.fixed_image import FixedSizeImageEncoder, stacked_tiles

    model_dir, out, _, _ = llava_next_runner
    program = Runtime.get().load_program(out / "executorch" / "model.pte")
    assert program.load_method("image_size").execute([]) == [32, 32]
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(torch.randint(0, 255, (32, 32, 3), dtype=torch.uint8).numpy())
    inputs = processor(images=image, text=f"{processor.image_token} describe", return_tensors="pt")
    assert inputs["image_sizes"].tolist() == [[32, 32]] and tuple(inputs["pixel_values"].shape) == (1, 2, 3, 32, 32)
    with torch.no_grad():
        want = model.get_image_features(pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"])
    want = torch.cat(list(want.pooler_output))
    got = program.load_method("vision_encoder").execute([stacked_tiles(inputs["pixel_values"])])[0]
    assert got.shape[1] == want.shape[0] == int((inputs["input_ids"] == model.config.image_token_index).sum())
    assert torch.allclose(got[0], want, atol=1e-3, rtol=1e-3), (got[0] - want).abs().max()  # the checks' tolerance
    with pytest.raises(Exception):  # a 2-tile image of 32x64's pixels: not the traced shape
        program.load_method("vision_encoder").execute([torch.randn(1, 3, 96, 32)])
    wrong = FixedSizeImageEncoder(model, [[16, 32]], 2).eval()  # another original size: other rows kept
    with torch.no_grad():
        mutant = wrong(stacked_tiles(inputs["pixel_values"]))
    assert mutant.shape != got.shape or not torch.allclose(mutant[0], want, atol=1e-3)


def test_the_cards_snippet_resizes_to_the_programs_size_and_refuses_another(llava_next_runner, hub, tmp_path):
    """The card's `MultimodalRunner` snippet, run as written against the Hub emulator: its 40x48 image.jpg resized
    to the program's 32x32 before the processor; with the resize line taken out, the processor makes another size's
    tiles and the snippet stops, saying the program's size."""
    from exporters.layouts.executorch_multimodal import IMAGE_INPUTS, RESIZE, SIZE_CHECK
    from exporters.layouts.executorch_multimodal.proof import CHILD
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    _, out, _, _ = llava_next_runner
    commit = upload_exports(hub, "alice/llava-next", out, ["executorch"])
    card = exports_card("alice/llava-next", out, commit)
    assert f"{RUNTIME} ✓ 8/8 tokens from one image of 32x32" in card  # the card says the one size
    [(runtime, language, code)] = card_snippets(card)
    assert runtime == RUNTIME and language == "python"
    assert SIZE_CHECK + IMAGE_INPUTS in code and SIZE_CHECK + IMAGE_INPUTS in CHILD and RESIZE in code
    home = image_home(tmp_path)
    done = run_snippet(code, hub, home)
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()
    refused = run_snippet(code.replace(RESIZE, ""), hub, home)
    assert refused.returncode != 0
    assert "this program takes one image of 32x32, not [[40, 48]]" in refused.stderr, refused.stderr[-2000:]


def test_a_program_baked_with_another_image_sizes_fails_the_runners_proof(llava_next_runner, tmp_path):
    """The proof on the processor's inputs of another 32x32 image: the folder passes; the same folder with a program
    whose `vision_encoder` bakes another image's `image_sizes` (16x32: the unpadding keeps other rows of the tile
    grid, so the image is another number of features) but says 32x32 fails on the prompt's positions."""
    import shutil

    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.capture.components import cache_setting_for
    from exporters.capture.multimodal_runner import capture
    from exporters.export.multimodal_runner import export_multimodal_runner
    from exporters.layouts.executorch_multimodal.proof import prove

    model_dir, out, _, _ = llava_next_runner
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(torch.randint(0, 255, (32, 32, 3), dtype=torch.uint8,
                                          generator=torch.Generator().manual_seed(1)).numpy())
    inputs = dict(processor(images=image, text=f"{processor.image_token} describe the image", return_tensors="pt"))
    target, recipe, layout, made, context = _proven_folder(model, model_dir, out, inputs)
    mutant = tmp_path / "mutant"
    shutil.copytree(out / "executorch", mutant)
    max_cache_len = cache_setting_for(model, target, recipe).max_cache_len
    components = capture(model, {**inputs, "image_sizes": torch.tensor([[16, 32]])}, max_cache_len)
    components["vision_encoder"][0].size = [32, 32]  # it says the right size: the snippet's check lets it run
    export_multimodal_runner(model, target, components, recipe, mutant, [])
    failed = prove(layout, mutant, made, context)
    assert failed.status == "failed" and "positions, eager as" in failed.detail, failed


def test_llava_onevision_passes_in_the_multimodal_runner_at_one_image_size(tmp_path_factory):
    """LLaVA-OneVision (SigLIP tower, anyres, a Qwen2 text model; a byte-level BPE) saved with the files its processor
    writes, as a real repo ships them (`processor_config.json`; the processor class needs torchvision, so the folder's
    image processor makes the pixels: the base image and one tile with `image_sizes` [[32, 32]] and
    `batch_num_images` [1], its image tokens counted from the model's features): one program at one image of 32x32,
    proven by MultimodalRunner token for token with eager `generate()`. Before (the sixteenth round's sweep,
    benchmarks/RESULTS.md) the processor's `batch_num_images`, which one image's features do not depend on, kept
    the methods layout ("its image inputs include ['batch_num_images']"), where a folder without a processor got the
    runner's. Its card snippet reads the folder's processor, which cannot load here (torchvision): not run."""
    from tests.models import tiny_llava_onevision_with_processor

    model_dir = tiny_llava_onevision_with_processor(tmp_path_factory.mktemp("mm-onevision") / "model",
                                                    PLAINEST_EXECUTORCH, byte_level=True)
    out, report, log = stored_run(model_dir)
    target, proofs = _runner_target(out, report, log)
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from one image of 32x32 and a prompt"), proofs
    encoder = next(c for c in target["components"] if c["name"] == "vision_encoder")
    assert encoder["checks"][0]["shapes"] == {"pixel_values": [1, 3, 64, 32]}  # base image and tile, stacked
    assert any("LlavaOnevisionImageProcessorPil" in f for f in report["findings"]), report["findings"]


def test_mistral3_keeps_the_methods_layout_saying_why():
    """Mistral 3's processor lays its image's tokens out in rows broken by [IMG_BREAK]; a sample with one run of
    image tokens (synthesized where the tokenizer has no [IMG_BREAK] and [IMG_END]: not its processor's prompt)
    falls back to the methods layout with that reason (the program would emit the processor's span, never proven
    on this prompt)."""
    from tests.models import tiny_mistral3_model

    from exporters.capture.multimodal_runner import PIXTRAL_ROWS, refused
    from exporters.recipe.load import parse_recipe

    model = tiny_mistral3_model()
    target = parse_recipe(json.dumps(PLAINEST_EXECUTORCH)).exports[0]
    ids = torch.tensor([[1, 10, 10, 10, 10, 5]])
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": torch.randn(1, 3, 32, 32),
              "image_sizes": torch.tensor([[32, 32]])}
    why = refused(target, model, sample, 64)
    assert why is not None and PIXTRAL_ROWS in why and "[IMG_BREAK]" in why


@pytest.fixture(scope="module")
def idefics2_runner(tmp_path_factory):
    """Idefics2 with its own processor (the matrix family's settings, a byte-level BPE), the plainest ExecuTorch
    recipe, through the real CLI (the shared export store): the one Idefics2 export both Idefics2 tests read."""
    from tests.models import tiny_idefics2_with_processor

    model_dir = tiny_idefics2_with_processor(tmp_path_factory.mktemp("mm-idefics2-processor") / "model",
                                             PLAINEST_EXECUTORCH, byte_level=True)
    out, report, log = stored_run(model_dir)
    return model_dir, out, report, log


def test_idefics2_from_its_processor_runs_in_the_multimodal_runner_and_its_snippet_runs(idefics2_runner, hub,
                                                                                        tmp_path):
    """Idefics2 with its own processor (its prompt: the image's run of tokens between <fake_token_around_image>
    tokens, the processor's mask of ones) and a byte-level BPE: MultimodalRunner 8/8 against eager `generate()`
    on the processor's inputs; the card's snippet runs as written."""
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    _, out, report, log = idefics2_runner
    target = report["targets"][0]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert any("through the folder's own Idefics2Processor" in f for f in report["findings"]), report["findings"]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from an image and a prompt"), proofs
    commit = upload_exports(hub, "alice/idefics2", out, ["executorch"])
    [(runtime, _, code)] = card_snippets(exports_card("alice/idefics2", out, commit))
    assert runtime == RUNTIME
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()


def test_idefics2_passes_in_the_multimodal_runner(idefics2_runner):
    """Idefics2 (the matrix family's settings: its perceiver resampler reads the patch mask, all ones for the full
    image its sample holds): `vision_encoder` is Idefics3's one image encoder with the mask of ones given to the
    connector, in MultimodalRunner's layout, proven by MultimodalRunner token for token with eager `generate()`.
    Read from the processor test's export (#48: the family's model without a processor was a second export of the
    same architecture; the sample synthesized without a processor is checked against the model's own count by
    tests/test_vlm_processor.py::test_synthesized_inputs_are_the_layout_the_model_counts[idefics2])."""
    _, out, report, log = idefics2_runner
    target, proofs = _runner_target(out, report, log)
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from an image and a prompt"), proofs


@pytest.fixture(scope="module")
def mistral3_runner(tmp_path_factory):
    """The matrix's tiny Mistral 3 (Pixtral tower, one image of 32x32: 2 x 2 image features; its byte-level BPE
    holds [IMG], [IMG_BREAK] and [IMG_END], so the synthesized sample is in its processor's rows), the plainest
    ExecuTorch recipe, through the real CLI (the shared export store)."""
    from tests.models import family_model

    model_dir = family_model("mistral3", tmp_path_factory.mktemp("mm-mistral3") / "model", PLAINEST_EXECUTORCH,
                             never_eos=True)  # 8 tokens to compare, not an early eos
    out, report, log = stored_run(model_dir)
    return model_dir, out, report, log


def _mistral3_prompt(model_dir, seed: int):
    """One image of 32x32 and a prompt in PixtralProcessor's layout, built here (its processor needs torchvision):
    BOS, `[IMG] [IMG] [IMG_BREAK] [IMG] [IMG] [IMG_END]` (2 rows of 2), then the text."""
    from transformers import AutoTokenizer

    from exporters.upstream.fixed_image import pixtral_rows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    image, row_break, end = tokenizer.convert_tokens_to_ids(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    ids = [tokenizer.bos_token_id, *pixtral_rows(image, 2, 2, row_break, end),
           *tokenizer.encode("describe the image", add_special_tokens=False)]
    ids = torch.tensor([ids])
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
            "image_sizes": torch.tensor([[32, 32]])}, (image, row_break, end)


def test_mistral3_passes_in_the_multimodal_runner_at_one_image_size(mistral3_runner):
    """Mistral 3 at one image of 32x32: its `vision_encoder` emits the processor's whole span, the features' rows
    each followed by [IMG_BREAK]'s embedding, the last by [IMG_END]'s (the model's own table's rows), the program's
    `image_span_tokens` naming the two ids; proven by MultimodalRunner token for token with eager `generate()` on the
    prompt in the processor's rows."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime
    from transformers import Mistral3ForConditionalGeneration

    model_dir, out, report, log = mistral3_runner
    target, proofs = _runner_target(out, report, log)
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from one image of 32x32 and a prompt"), proofs
    encoder = next(c for c in target["components"] if c["name"] == "vision_encoder")
    assert encoder["checks"][0]["shapes"] == {"pixel_values": [1, 3, 32, 32]}
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    model = Mistral3ForConditionalGeneration.from_pretrained(model_dir).eval()
    inputs, (image, row_break, end) = _mistral3_prompt(model_dir, seed=2)
    folder = out / "executorch"
    data = {"data_path": folder / "model.ptd"} if (folder / "model.ptd").is_file() else {}  # its weights there
    program = Runtime.get().load_program(folder / "model.pte", **data)
    assert program.load_method("image_span_tokens").execute([]) == [row_break, end]
    got = program.load_method("vision_encoder").execute([inputs["pixel_values"]])[0][0]
    with torch.no_grad():  # eager's embeddings of the span: the features at [IMG], the table's rows elsewhere
        want = model.get_input_embeddings()(inputs["input_ids"])[0, 1:7]
        features = model.get_image_features(pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"])
    features = torch.cat(list(getattr(features, "pooler_output", features))).reshape(-1, want.shape[-1])
    want[inputs["input_ids"][0, 1:7] == image] = features
    assert got.shape == want.shape == (6, model.config.text_config.hidden_size)
    assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), (got - want).abs().max()  # the checks' tolerance


@pytest.fixture(scope="module")
def mistral3_proven(mistral3_runner):
    """The proof's reference on another image (seed 1) in the processor's rows, and the stored folder proven 8/8 with
    it: once for both mutants (the same inputs, the same folder: the same proof)."""
    from transformers import Mistral3ForConditionalGeneration

    model_dir, out, _, _ = mistral3_runner
    model = Mistral3ForConditionalGeneration.from_pretrained(model_dir).eval()
    inputs, _ = _mistral3_prompt(model_dir, seed=1)
    return model_dir, out, inputs, _proven_folder(model, model_dir, out, inputs)


def _zero_span_rows(folder, span_rows: torch.Tensor) -> None:
    """Zero, in `folder`'s model.ptd, the named tensor `span_rows` (the [IMG_BREAK] and [IMG_END] rows
    `vision_encoder` emits, its only user): asserted to hold the model's two rows before, so the program is the
    stored one but for those rows (what `FixedSizeImageEncoder.span_rows.zero_()` and a new export make, without
    lowering the whole program again)."""
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorHeader, _deserialize_to_flat_tensor

    path = folder / "model.ptd"
    data = bytearray(path.read_bytes())
    header = FlatTensorHeader.from_bytes(bytes(data[8:]))
    flat = _deserialize_to_flat_tensor(bytes(data[:header.flatbuffer_offset + header.flatbuffer_size]))
    [entry] = [entry for entry in flat.named_data if entry.key == "span_rows"]
    segment = flat.segments[entry.segment_index]
    start = header.segment_base_offset + segment.offset
    assert bytes(data[start:start + segment.size]) == span_rows.numpy().tobytes(), "span_rows are the two rows"
    assert sum(e.segment_index == entry.segment_index for e in flat.named_data) == 1, "no other tensor shares them"
    data[start:start + segment.size] = bytes(segment.size)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mutant", ["breaks dropped", "break rows zeroed"])
def test_a_mistral3_program_without_its_break_rows_fails_the_runners_proof(mistral3_proven, tmp_path, mutant):
    """The proof on another image and the processor-layout prompt: the folder passes; a program whose
    `vision_encoder` drops the [IMG_BREAK] and [IMG_END] rows (4 features for the span of 6; its
    `image_span_tokens` kept, so the runner places the span as one image) fails on the prompt's positions, and one
    that keeps their places but zeroes their embeddings (the stored program with its `span_rows` zeroed in
    model.ptd: its `vision_encoder` checked to give zeros there and the same features elsewhere) fails on the
    tokens."""
    import shutil

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime
    from transformers import Mistral3ForConditionalGeneration

    from exporters.capture.components import cache_setting_for
    from exporters.capture.multimodal_runner import capture
    from exporters.export.multimodal_runner import export_multimodal_runner
    from exporters.layouts.executorch_multimodal.proof import prove

    model_dir, out, inputs, (target, recipe, layout, made, context) = mistral3_proven
    assert len(made["tokens"]) == 8, made
    model = Mistral3ForConditionalGeneration.from_pretrained(model_dir).eval()  # its own: the mutant changes modules
    broken = tmp_path / "mutant"
    shutil.copytree(out / "executorch", broken)
    components = capture(model, inputs, cache_setting_for(model, target, recipe).max_cache_len)
    encoder = components["vision_encoder"][0]
    assert encoder.span is not None and encoder.span[2:] == (2, 2)
    if mutant == "breaks dropped":

        class Dropped(type(encoder)):
            def forward(self, pixel_values):  # the span's features alone: rows of 2, no break or end rows
                laid = super().forward(pixel_values)
                return laid[:, [i for i in range(laid.shape[1]) if (i + 1) % 3]]

        encoder.__class__ = Dropped
        export_multimodal_runner(model, target, components, recipe, broken, [])
    else:
        _zero_span_rows(broken, encoder.span_rows)
        runtime = Runtime.get()
        kept, zeroed = (runtime.load_program(folder / "model.pte", data_path=folder / "model.ptd").load_method(
            "vision_encoder").execute([inputs["pixel_values"]])[0][0] for folder in (out / "executorch", broken))
        rows = torch.tensor([(i + 1) % 3 == 0 for i in range(6)])  # [IMG_BREAK], [IMG_END]: the 3rd and 6th
        assert zeroed[rows].eq(0).all() and not kept[rows].eq(0).all(), (kept, zeroed)
        assert torch.equal(zeroed[~rows], kept[~rows]), "the image's features as the stored program's"
    failed = prove(layout, broken, made, context)
    assert failed.status == "failed", failed
    assert ("positions, eager as" if mutant == "breaks dropped" else "tokens equal") in failed.detail, failed

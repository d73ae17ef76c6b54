"""transformers.js's vision-language layout (#52 item 4): the plainest ONNX generation recipe of a tiny LLaVA with
`layout: "transformers.js"` is the folder `AutoModelForImageTextToText` + `AutoProcessor` load
(`onnx/vision_encoder.onnx`, `onnx/embed_tokens.onnx`, `onnx/decoder_model_merged.onnx` with the processor and
tokenizer files), proven in the product by transformers.js on Node token for token against eager `generate()`, and
its card's script runs as written. A vision-language family the layout does not take keeps its components, the
"runs in" cell saying why.

One run of the tiny LLaVA (module fixture) through the real CLI.
"""

from __future__ import annotations

import json
import shutil

import numpy
import pytest

from exporters.layouts.transformers_js import IMAGE_TEXT_COMPONENTS, IMAGE_TEXT_TYPES
from tests.card_snippets import run_js_card
from tests.conftest import run_and_read
from tests.export_store import stored_run
from tests.models import (
    LLAVA_ONNX_RECIPE,
    TJS_FP16_TARGET,
    TJS_TARGET as TARGET,
    TJS_VLM_VARIANTS,
    tiny_gemma3_with_processor,
    tiny_idefics2_with_processor,
    tiny_idefics3_with_processor,
    tiny_llava_onnx_model,
    tiny_mistral3_with_processor,
    tiny_paligemma_with_processor,
)

RECIPE = {"exports": [TARGET], "generation": {"max_new_tokens": 8}}
GRAPHS = ("onnx/vision_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx")


@pytest.fixture(scope="module")
def llava_tjs(tmp_path_factory):
    """The LLaVA run tests/test_genai_vlm.py reads too (its plainest ONNX target beside `tjs`): exported once through
    the shared store (#48); the tests here read the `tjs` target and folder only."""
    root = tmp_path_factory.mktemp("tjs-llava")
    assert {**TARGET, "variants": TJS_VLM_VARIANTS} in LLAVA_ONNX_RECIPE["exports"]
    assert LLAVA_ONNX_RECIPE["generation"] == RECIPE["generation"]
    return stored_run(tiny_llava_onnx_model(root / "model"))


def _target(report: dict) -> dict:
    return {target["name"]: target for target in report["targets"]}["tjs"]


def test_a_llava_folder_in_the_transformers_js_layout_generates_in_transformers_js(llava_tjs):
    out, report, log = llava_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed"
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    proof = proofs["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "AutoModelForImageTextToText" in proof["detail"]
    assert "transformers.js ✓ 8/8 tokens" in (out / "report.md").read_text()


def test_a_float16_llava_folder_generates_in_transformers_js_from_its_processors_float32_pixels(llava_tjs, tmp_path):
    """`dtype: "float16"`: the three `_fp16` graphs, the vision encoder taking float32 pixels (cast inside, as
    transformers.js's own fp16 files: its processor makes float32), proven by transformers.js token for token. It
    failed before: "Unexpected input data type. Actual: (tensor(float)), expected: (tensor(float16))"."""
    assert_float16_folder_generates(llava_tjs, "pixel_values", "AutoModelForImageTextToText", tmp_path)


def assert_float16_folder_generates(run, pixels: str, model_class: str, scratch) -> None:
    """The fp16 target of `run` passed, transformers.js's proof too; its encoder takes float32 `pixels` (or features)
    and gives float16, its files are the `_fp16` ones, and the card's script (`model_class`'s, which the `_fp16` names
    once turned into a text decoder's) runs as written in `scratch` (tests/test_transformers_js_audio.py shares it)."""
    import onnx

    from exporters.publish.snippets import target_snippets

    out, report, log = run
    target = {t["name"]: t for t in report["targets"]}[TJS_FP16_TARGET["name"]]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens") and model_class in proof["detail"]
    folder = out / TJS_FP16_TARGET["name"]
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["dtype"] == "fp16"
    encoder = next(folder.glob("onnx/*_encoder_fp16.onnx"))
    graph = onnx.load(str(encoder), load_external_data=False).graph
    assert (graph.input[0].name, graph.input[0].type.tensor_type.elem_type) == (pixels, onnx.TensorProto.FLOAT)
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert graph.node[0].op_type == "Cast"
    code = {runtime: code for runtime, _, code in target_snippets("org/model", target)}["transformers.js"]
    assert model_class in code and "AutoProcessor" in code, code
    run_js_card(code, folder, scratch)  # the tiny vocabulary may decode to nothing: it runs


def test_the_folder_holds_the_three_graphs_under_transformers_js_names(llava_tjs):
    import onnx

    out, _, _ = llava_tjs
    folder = out / "tjs"
    for name in (*GRAPHS, "config.json", "generation_config.json", "tokenizer.json", "preprocessor_config.json",
                 "processor_config.json"):
        assert (folder / name).is_file(), name
    assert not list(folder.glob("*.onnx")), "every graph moved under onnx/"
    io = {}
    for name in GRAPHS:
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        io[name] = ([v.name for v in graph.input], [v.name for v in graph.output])
    assert io[GRAPHS[0]] == (["pixel_values"], ["image_features"])
    assert io[GRAPHS[1]] == (["input_ids"], ["inputs_embeds"])
    inputs, outputs = io[GRAPHS[2]]
    assert inputs[:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert {"past_key_values.0.key", "past_key_values.1.value"} <= set(inputs)
    assert outputs[0] == "logits" and {"present.0.key", "present.1.value"} <= set(outputs)
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["dtype"] == "fp32"
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    assert preprocessor["processor_class"] == "LlavaProcessor"  # transformers.js's AutoProcessor picks by it
    # the image-token count transformers.js and transformers both read: 16 patches, CLIP's class token dropped
    processor = json.loads((folder / "processor_config.json").read_text())
    assert (processor["num_additional_image_tokens"], processor["vision_feature_select_strategy"]) == (0, "full")
    from transformers import AutoProcessor
    from PIL import Image

    made = AutoProcessor.from_pretrained(folder)(images=Image.new("RGB", (32, 32)), text="<image>describe", return_tensors="pt")
    assert int((made["input_ids"][0] == config["image_token_index"]).sum()) == 16


DTYPE_SUFFIXES = {"q4": "_q4", "q4f16": "_q4f16"}  # TJS_VLM_VARIANTS' dtype files (transformers.js's names)


def test_each_graph_has_its_q4_and_q4f16_files_judged_with_the_int4_budget_and_loaded_by_transformers_js(llava_tjs):
    """`variants: ["fp32", "int4", "q4f16"]` (#52 item 4, #51 item 2): each of the three graphs gets its `_q4` and
    `_q4f16` file in the one folder (4-bit MatMulNBits; q4f16 float16 inside, float32 at the edges), each dtype judged
    against eager with the int4 budget (all three files of the dtype at once), and transformers.js generating with
    each `dtype`, the encoder's and decoder's quantized sessions included, within the budget."""
    import onnx

    out, report, log = llava_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    folder = out / "tjs"
    config = json.loads((folder / "config.json").read_text())["transformers.js_config"]
    graphs = [name.removeprefix("onnx/").removesuffix(".onnx") for name in GRAPHS]
    files = {dtype: [f"{graph}{suffix}.onnx" for graph in graphs] for dtype, suffix in DTYPE_SUFFIXES.items()}
    assert config["dtype"] == "fp32"
    assert set(config["use_external_data_format"]) == {f"{g}.onnx" for g in graphs} | {f for names in files.values()
                                                                                        for f in names}
    for dtype, names in files.items():
        for name in names:
            graph = onnx.load(str(folder / "onnx" / name), load_external_data=False).graph
            ops = {node.op_type for node in graph.node}
            assert ("MatMulNBits" in ops) == (not name.startswith("embed_tokens")), (name, ops)  # a Gather alone
            assert {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)} <= {
                onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL}, name  # float32 at the edges
            if dtype == "q4f16" and not name.startswith("embed_tokens"):
                assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer), name
    rows = {row["dtype"]: row for row in target["dtype_files"]}
    assert list(rows) == ["fp32", "q4", "q4f16"] and [row["default"] for row in rows.values()] == [True, False, False]
    assert rows["fp32"]["file"] == "onnx/decoder_model_merged.onnx"
    for dtype, names in files.items():
        row = rows[dtype]
        assert row["status"] == "passed" and row["files"] == {
            f"onnx/{g}.onnx": f"onnx/{n}" for g, n in zip(graphs, names)}, row
        quality = row["quality"]
        assert quality["kind"] == "int4" and quality["judged_by"] == "metrics" and quality["passed"], quality
        assert quality["budget"]["min_top1_agreement"] == 0.75 and quality["metrics"]["top1_agreement"] >= 0.75
        assert row["bytes"] == sum((folder / "onnx" / f"{n}{tail}").stat().st_size for n in names
                                   for tail in ("", "_data") if (folder / "onnx" / f"{n}{tail}").is_file())
    assert rows["q4"]["bytes"] < 0.7 * rows["fp32"]["bytes"], rows  # the tiny vision tower's convolution stays float
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "; dtype q4 8/8 tokens (≥2 asked), q4f16 8/8 tokens (≥2 asked)" in proof["detail"], proof


def test_a_vlm_dtype_file_outside_its_budget_fails_the_target_naming_it(llava_tjs, tmp_path):
    """`hf-export validate` of the folder with `decoder_model_merged_q4.onnx`'s weights zeroed: the q4 dtype (its
    three files together) is judged with the int4 budget and fails the target, naming the decoder's file; q4f16 and
    the fp32 graphs still pass, and export.json is restored."""
    from tests.conftest import run_cli

    out, _, _ = llava_tjs
    copy = tmp_path / "out"
    shutil.copytree(out / "tjs", copy / "tjs")
    data = copy / "tjs" / "onnx" / "decoder_model_merged_q4.onnx_data"
    data.write_bytes(bytes(data.stat().st_size))
    model = tiny_llava_onnx_model(tmp_path / "model")
    done = run_cli("validate", str(model), str(copy), "--target", "tjs")
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    assert done.returncode == 1 and target["status"] == "failed", done.stderr[-2000:]
    assert "dtype file(s) outside their budget: onnx/decoder_model_merged_q4.onnx (q4)" in target["error"]["message"]
    rows = {row["dtype"]: row["status"] for row in target["dtype_files"]}
    assert rows == {"fp32": "passed", "q4": "failed", "q4f16": "passed"}, rows
    assert (copy / "tjs" / "export.json").read_text() == (out / "tjs" / "export.json").read_text()


def test_the_cards_transformers_js_image_text_script_runs_as_written(llava_tjs, tmp_path):
    """The card's script, as written, from a folder laid out as its download line puts it (`model/exports/tjs`):
    the folder's processor on an image of its size and the prompt, then `AutoModelForImageTextToText.generate`."""
    out, report, _ = llava_tjs
    assert _run_card(out, report, tmp_path), "the script prints the generated text"


def _run_card(out, report: dict, tmp_path) -> str:
    """Run the target's transformers.js card script as written; returns what it printed."""
    from exporters.publish.snippets import target_snippets

    snippets = {runtime: (language, code) for runtime, language, code in target_snippets("org/vlm", _target(report))}
    language, code = snippets["transformers.js"]
    assert language == "js" and "AutoModelForImageTextToText" in code and "AutoProcessor" in code
    if _target(report).get("dtype_files"):  # the LLaVA's variants: the card lists each dtype and loads the default
        assert "{ device: 'cpu', dtype: \"fp32\" }" in code, code
        for dtype in ("fp32", *DTYPE_SUFFIXES):
            assert any(line.startswith(f'//   dtype "{dtype}": ') and " MB, " in line for line in code.splitlines()), code
        assert "top-1 1.000" in next(line for line in code.splitlines() if line.startswith('//   dtype "q4"'))
    return run_js_card(code, out / "tjs", tmp_path)


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_an_idefics3_folder_in_the_transformers_js_layout_generates_in_transformers_js(tmp_path, family):
    """Idefics3 and SmolVLM (its architecture; with Idefics3's processor, as SmolVLM's needs torchvision): the vision
    encoder takes the processor's tiles and their bool pixel mask (as transformers.js's processor makes it), its
    processor takes the text first; proven in the product, and the card's script runs as written."""
    # one text layer: the proof, the graphs' inputs and the card read the tiles and the cache's names, not the depth
    model = tiny_idefics3_with_processor(tmp_path / "run" / "model", RECIPE, family=family, text_layers=1)
    out, report, log = run_and_read(tmp_path / "run", model)
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    import onnx

    graph = onnx.load(str(out / "tjs" / GRAPHS[0]), load_external_data=False).graph
    assert [v.name for v in graph.input] == ["pixel_values", "pixel_attention_mask"]
    assert graph.input[1].type.tensor_type.elem_type == onnx.TensorProto.BOOL
    preprocessor = json.loads((out / "tjs" / "preprocessor_config.json").read_text())
    assert preprocessor["processor_class"] == "Idefics3Processor"
    _run_card(out, report, tmp_path / "card")  # the tiny word-level vocabulary may decode to nothing: it runs


def test_the_layouts_light_names_are_the_captures():
    from exporters.capture.image_text import COMPONENTS
    from exporters.capture.image_text_models import MODEL_TYPES

    assert list(IMAGE_TEXT_COMPONENTS) == COMPONENTS and IMAGE_TEXT_TYPES == MODEL_TYPES


def test_a_vision_language_family_the_layout_does_not_take_is_declined_with_the_reason(tmp_path):
    """Idefics2 (a perceiver resampler; transformers.js has no Idefics2 model): the target keeps its vision-language
    components and passes on its own checks; transformers.js's cell is ✗ with the reason, and the findings say it."""
    out, report, log = run_and_read(tmp_path, tiny_idefics2_with_processor(tmp_path / "model", RECIPE))
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "declined" and "'idefics2'" in proof["detail"], proof
    assert not (out / "tjs" / "onnx" / "decoder_model_merged.onnx").exists()
    markdown = (out / "report.md").read_text()
    assert "transformers.js ✗ cannot take this model" in markdown
    assert ("written for model types ['llava', 'idefics3', 'smolvlm', 'qwen2_vl', 'qwen2_5_vl', 'qwen3_vl', 'gemma3', "
            "'paligemma', 'mistral3']"
            in markdown) and "this is 'idefics2'" in markdown


@pytest.fixture(scope="module")
def gemma3_tjs(tmp_path_factory):
    """A tiny Gemma 3 (two full-attention text layers, so the image block's attention reaches the logits; 4 image
    tokens; its chat template, which transformers.js's Gemma3Processor loads) in the transformers.js layout, exported
    once through the shared store."""
    root = tmp_path_factory.mktemp("tjs-gemma3")
    return stored_run(tiny_gemma3_with_processor(root / "model", RECIPE, text_layers=2, chat_template=True))


def test_a_gemma3_folder_generates_in_transformers_js_with_its_image_attending_both_ways(gemma3_tjs):
    """Gemma 3 (#52 item 4): transformers.js's Gemma3ForConditionalGeneration (its LLaVA class: embeddings, mask and
    positions into the decoder, no token types) generates eager's tokens, eager run as transformers runs Gemma 3
    (the processor's token_type_ids: the image block attends both ways). The image's rows are marked in one channel
    more than the hidden size (text 0, image 1), which the decoder reads as the token types."""
    import onnx

    out, report, log = gemma3_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed"
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    folder = out / "tjs"
    config = json.loads((folder / "config.json").read_text())
    hidden = config["text_config"]["hidden_size"]
    widths = {}
    for name in GRAPHS:
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        values = graph.input if name.endswith("merged.onnx") else graph.output
        widths[name] = values[0].type.tensor_type.shape.dim[-1].dim_value
    assert set(widths.values()) == {hidden + 1}, widths  # the features, the embeddings and what the decoder takes
    assert json.loads((folder / "preprocessor_config.json").read_text())["processor_class"] == "Gemma3Processor"
    assert (folder / "chat_template.jinja").is_file()


def test_a_gemma3_folder_whose_image_rows_are_marked_text_fails_transformers_js_s_proof(gemma3_tjs, tmp_path):
    """The mutant: the vision encoder's mark zeroed (the image read as text: a causal prefill, what transformers.js
    runs from a Gemma 3 exported as a LLaVA) generates other tokens than eager's, and the product's transformers.js
    proof fails it with the tokens, where the same proof, from the same eager reference (the sample the processor
    makes, with its token_type_ids), passes the folder as exported: the proof judges the image block's attention."""
    import onnx
    from onnx import numpy_helper

    out, _, _ = gemma3_tjs
    mutant = tmp_path / "out" / "tjs"
    shutil.copytree(out / "tjs", mutant)
    path = mutant / "onnx" / "vision_encoder.onnx"
    graph = onnx.load(str(path), load_external_data=False)
    [last] = [node for node in graph.graph.node if node.output[0] == "image_features"]
    assert last.op_type == "Concat"
    [mark] = [init for init in graph.graph.initializer if init.name == last.input[1]]
    assert set(numpy_helper.to_array(mark).flatten().tolist()) == {1.0}  # every image row marked
    mark.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(mark) * 0, mark.name))
    onnx.save_model(graph, str(path))

    model_dir = tiny_gemma3_with_processor(tmp_path / "model", RECIPE, text_layers=2, chat_template=True)
    inputs, _, passed = _prefill_proof(model_dir, out / "tjs")
    assert int(inputs["token_type_ids"].sum()) == 4  # the image's tokens, which eager's prefill reads both ways
    assert passed.status == "passed" and passed.detail.startswith("8/8 tokens"), passed
    _, _, failed = _prefill_proof(model_dir, mutant)
    assert failed.status == "failed" and "/8 tokens equal eager greedy: transformers.js " in failed.detail, failed


def _prefill_proof(model_dir, folder, window: int | None = None, prompt: str = "<start_of_image>describe the image",
                  causal: bool = False):
    """The product's transformers.js proof of `folder` against eager on the processor's sample (an image and a prompt,
    its token_type_ids), eager's text model given sliding window `window` where set (None: the model's own); `causal`:
    eager's prefill read causally (its token types dropped, its attention causal: the mutant reference)."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.layouts.child import RuntimeContext
    from exporters.layouts.transformers_js import TransformersJs, proof
    from exporters.recipe.load import parse_recipe

    recipe = parse_recipe(json.dumps(RECIPE))
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    if window is not None:
        model.config.get_text_config().sliding_window = window
    inputs = AutoProcessor.from_pretrained(model_dir)(text=prompt, images=Image.new("RGB", (32, 32), (128, 64, 32)),
                                                      return_tensors="pt")
    sample = {name: value for name, value in inputs.items() if name != "labels"}  # PaliGemma's training labels
    if causal:
        sample.pop("token_type_ids")
        for layer in model.model.language_model.layers:
            layer.self_attn.is_causal = True
    context = RuntimeContext(recipe.exports[0], recipe, "vision-language", sample, model.generation_config,
                             model_dir)
    with torch.no_grad():
        reference = proof.reference(TransformersJs(), model, context)
    return inputs, reference, proof.prove(TransformersJs(), folder, reference, context)


def test_a_gemma3_with_sliding_window_layers_keeps_every_position_and_its_window_in_the_mask(tmp_path):
    """Gemma 3's text layers alternate a sliding window and full attention (here a window of 6 and a full layer): the
    traced cache keeps every position in every layer (transformers.js feeds back each present and one attention_mask),
    the window held by transformers' sliding mask. It failed before ('past_key_values.layers.0._sliding_window_tensor'
    has no name). Proven 8/8 with the prompt and its tokens past the window; eager with the window lifted generates
    other tokens, which the same folder fails: the graph applies the window."""
    model_dir = tiny_gemma3_with_processor(tmp_path / "model", RECIPE, text_layers=2, sliding_window=6,
                                           chat_template=True)
    out, report, log = stored_run(model_dir)
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed" and target["generation"]["prompt_length"] + 8 > 6
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    inputs, _, windowed = _prefill_proof(model_dir, out / "tjs")
    assert inputs["input_ids"].shape[1] + 8 > 6 and windowed.status == "passed", windowed
    _, reference, unwindowed = _prefill_proof(model_dir, out / "tjs", window=1000)
    assert unwindowed.status == "failed" and "/8 tokens equal eager greedy" in unwindowed.detail, (reference,
                                                                                                   unwindowed)


def test_a_paligemma_folder_generates_in_transformers_js_with_its_prompt_attending_both_ways(tmp_path):
    """PaliGemma (#52 item 4): transformers.js's PaliGemmaForConditionalGeneration is its LLaVA class (positions from
    1, as transformers' PaliGemma); transformers reads the prompt (image and text: its prefix) both ways. The decoder
    graph makes each call's rows one bidirectional block (transformers.js runs the prompt as one call; each new token
    is a call of one row). Proven 8/8 in the product; eager with the prefill read causally generates other tokens,
    which the same folder fails: the graph holds the prefix's attention. The card's script runs as written
    (PaliGemmaProcessor takes the image first and adds the BOS after the image's tokens)."""
    model_dir = tiny_paligemma_with_processor(tmp_path / "model", RECIPE, text_layers=2)
    out, report, log = stored_run(model_dir)
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed"
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert json.loads((out / "tjs" / "preprocessor_config.json").read_text())["processor_class"] == "PaliGemmaProcessor"
    _, _, passed = _prefill_proof(model_dir, out / "tjs", prompt="<image>describe the image")
    assert passed.status == "passed", passed
    _, _, failed = _prefill_proof(model_dir, out / "tjs", prompt="<image>describe the image", causal=True)
    assert failed.status == "failed" and "/8 tokens equal eager greedy" in failed.detail, failed
    _run_card(out, report, tmp_path / "card")


def test_the_cards_transformers_js_script_runs_a_gemma3_folder_as_written(gemma3_tjs, tmp_path):
    """The card's script as written: Gemma3Processor expands its begin-of-image token to the image's tokens."""
    out, report, _ = gemma3_tjs
    _run_card(out, report, tmp_path)  # the tiny vocabulary may decode to nothing: it runs


@pytest.fixture(scope="module")
def mistral3_tjs(tmp_path_factory):
    """The matrix's tiny Mistral 3 (Pixtral tower, one image of 32x32: 2 x 2 image features; its byte-level BPE holds
    [IMG], [IMG_BREAK] and [IMG_END]) with its processor's files as a Mistral 3 repo ships them, in the
    transformers.js layout, exported once through the shared store."""
    root = tmp_path_factory.mktemp("tjs-mistral3")
    model_dir = tiny_mistral3_with_processor(root / "model", RECIPE)
    return (model_dir, *stored_run(model_dir))


def test_a_mistral3_folder_generates_in_transformers_js_with_its_break_rows_from_the_prompt(mistral3_tjs):
    """Mistral 3 (#52 item 4): transformers.js's Mistral3ForConditionalGeneration is its LLaVA class; its
    PixtralProcessor lays the image's tokens out in rows (`[IMG]` x cols then `[IMG_BREAK]`, the last row ending
    `[IMG_END]`), and the features go at the `[IMG]` tokens alone, the break rows being the prompt's own embeddings.
    The vision encoder takes one image's pixels (its image_sizes baked in at the traced 32x32) and gives the 4
    features; the folder's processor files name PixtralProcessor with the patch and merge sizes and the traced
    image's longest edge. Proven 8/8 in the product on the prompt in the processor's rows."""
    import onnx

    _, out, report, log = mistral3_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert target["generation"]["status"] == "passed"
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "its processor's image tokens in PixtralProcessor's rows)" in proof["detail"], proof
    folder = out / "tjs"
    graph = onnx.load(str(folder / GRAPHS[0]), load_external_data=False).graph
    assert [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in graph.input] == [
        ("pixel_values", [1, 3, 32, 32])]
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim][-2] == 4  # the [IMG] tokens' features
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    assert {key: preprocessor[key] for key in ("processor_class", "image_processor_type", "patch_size",
                                               "spatial_merge_size", "size")} == {
        "processor_class": "PixtralProcessor", "image_processor_type": "PixtralImageProcessor", "patch_size": 8,
        "spatial_merge_size": 2, "size": {"longest_edge": 32}}
    processor = json.loads((folder / "processor_config.json").read_text())
    assert (processor["image_break_token"], processor["image_end_token"]) == ("[IMG_BREAK]", "[IMG_END]")
    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    ids = {row["content"]: row["id"] for row in tokenizer["added_tokens"]}
    assert config["image_token_index"] == ids["[IMG]"]


def test_the_cards_transformers_js_script_runs_a_mistral3_folder_as_written(mistral3_tjs, tmp_path):
    """The card's script as written: PixtralProcessor takes the image first and lays its tokens out in rows."""
    _, out, report, _ = mistral3_tjs
    _run_card(out, report, tmp_path)  # the tiny vocabulary may decode to nothing: it runs


@pytest.mark.parametrize("mutant", ["features reversed", "break rows zeroed", "breaks laid as ends"])
def test_a_mistral3_folder_with_its_features_or_break_rows_misplaced_fails_transformers_js_s_proof(
        mistral3_tjs, tmp_path, mutant):
    """The product's proof on another image and the prompt in PixtralProcessor's rows passes the folder as exported;
    a copy whose vision encoder gives the features in reverse order (each at another [IMG] token), one whose
    embed_tokens zeroes the [IMG_BREAK] and [IMG_END] rows (the break rows dropped from the prompt), and one whose
    processor lays [IMG_END] where [IMG_BREAK] goes (as many image tokens, in other rows) each fail it."""
    import onnx
    from onnx import helper, numpy_helper

    model_dir, out, _, _ = mistral3_tjs
    broken = tmp_path / "out" / "tjs"
    shutil.copytree(out / "tjs", broken)
    ids = {row["content"]: row["id"] for row in json.loads((broken / "tokenizer.json").read_text())["added_tokens"]}
    if mutant == "features reversed":
        path = broken / GRAPHS[0]
        graph = onnx.load(str(path), load_external_data=False)
        [last] = [node for node in graph.graph.node if "image_features" in node.output]
        last.output[list(last.output).index("image_features")] = "image_features_in_order"
        graph.graph.initializer.extend([numpy_helper.from_array(numpy.array([value]), name) for value, name in (
            (-1, "reverse_start"), (-(2 ** 63), "reverse_end"), (1, "reverse_axis"), (-1, "reverse_step"))])
        graph.graph.node.append(helper.make_node("Slice", ["image_features_in_order", "reverse_start", "reverse_end",
                                                           "reverse_axis", "reverse_step"], ["image_features"]))
        onnx.save_model(graph, str(path))
    elif mutant == "break rows zeroed":
        path = broken / GRAPHS[1]
        graph = onnx.load(str(path))  # its table from onnx/embed_tokens.onnx_data
        [table] = [init for init in graph.graph.initializer if len(init.dims) == 2]
        rows = numpy_helper.to_array(table).copy()
        rows[[ids["[IMG_BREAK]"], ids["[IMG_END]"]]] = 0.0
        table.CopyFrom(numpy_helper.from_array(rows, table.name))
        (broken / "onnx" / "embed_tokens.onnx_data").unlink()
        onnx.save_model(graph, str(path), save_as_external_data=True, location="embed_tokens.onnx_data")
    else:
        processor = json.loads((broken / "processor_config.json").read_text())
        (broken / "processor_config.json").write_text(json.dumps({**processor, "image_break_token": "[IMG_END]"}))
    reference, passed = _mistral3_proof(model_dir, out / "tjs")
    assert reference["sample"]["span"] == [ids[name] for name in ("[IMG]", "[IMG]", "[IMG_BREAK]", "[IMG]", "[IMG]",
                                                                   "[IMG_END]")], reference["sample"]
    assert passed.status == "passed" and passed.detail.startswith("8/8 tokens"), passed
    _, failed = _mistral3_proof(model_dir, broken)
    assert failed.status == "failed", failed
    if mutant == "breaks laid as ends":
        assert "transformers.js's processor laid the image's tokens out as " in failed.detail, failed
    else:
        assert "/8 tokens equal eager greedy: transformers.js " in failed.detail, failed


def _mistral3_proof(model_dir, folder):
    """The product's transformers.js proof of `folder` against eager on one image of 32x32 (seeded pixels, not the
    export's sample) and a prompt in PixtralProcessor's rows built here (transformers' processor needs torchvision):
    BOS, `[IMG] [IMG] [IMG_BREAK] [IMG] [IMG] [IMG_END]`, the text."""
    import torch
    from transformers import AutoTokenizer, Mistral3ForConditionalGeneration

    from exporters.layouts.child import RuntimeContext
    from exporters.layouts.transformers_js import TransformersJs, proof
    from exporters.recipe.load import parse_recipe
    from exporters.upstream.fixed_image import pixtral_rows

    recipe = parse_recipe(json.dumps(RECIPE))
    model = Mistral3ForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    image, row_break, end = tokenizer.convert_tokens_to_ids(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    ids = torch.tensor([[tokenizer.bos_token_id, *pixtral_rows(image, 2, 2, row_break, end),
                         *tokenizer.encode("describe the image", add_special_tokens=False)]])
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "image_sizes": torch.tensor([[32, 32]]),
              "pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))}
    context = RuntimeContext(recipe.exports[0], recipe, "vision-language", sample, model.generation_config,
                             model_dir)
    with torch.no_grad():
        reference = proof.reference(TransformersJs(), model, context)
    return reference, proof.prove(TransformersJs(), folder, reference, context)


def test_a_mistral3_sample_outside_the_layout_is_declined_with_the_reason():
    """The rules a Mistral 3 sample meets (exporters.capture.image_text_models): one square image whose sides are
    multiples of patch x merge, with its image_sizes, and a prompt in PixtralProcessor's rows. A prompt with one run of
    image tokens (what is synthesized where the tokenizer has no [IMG_BREAK]: not what transformers.js's processor
    lays out), a non-square image, and image_sizes other than the pixels' are each declined with the reason; the
    processor's rows pass."""
    import torch
    from tests.models import tiny_mistral3_model

    from exporters.capture.image_text_models import refused
    from exporters.recipe.load import parse_recipe

    model = tiny_mistral3_model()
    target = parse_recipe(json.dumps(RECIPE)).exports[0]

    def sample(ids, height=32, width=32, sizes=None):
        ids = torch.tensor([ids])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "pixel_values": torch.randn(1, 3, height, width),
                "image_sizes": torch.tensor([sizes or [height, width]])}

    rows = [1, 10, 10, 11, 10, 10, 12, 5, 6]  # [IMG] [IMG] [IMG_BREAK] [IMG] [IMG] [IMG_END] (11, 12)
    assert refused(target, model, sample(rows), "dynamic") is None
    why = refused(target, model, sample([1, 10, 10, 10, 10, 5, 6, 7]), "dynamic")
    assert why is not None and "not one image in PixtralProcessor's rows (2 rows of 2 [IMG]" in why, why
    why = refused(target, model, sample([1, 10, 10, 11, 10, 10, 11, 10, 10, 12, 5], height=48), "dynamic")
    assert why is not None and "not one square image whose sides are multiples of 16" in why, why
    why = refused(target, model, sample(rows, sizes=[16, 32]), "dynamic")
    assert why is not None and "image_sizes [16, 32]" in why, why

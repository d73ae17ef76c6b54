"""Whisper's ONNX folders in the runtimes people deploy them with (#52 §3, §4).

- transformers.js's speech layout: a Whisper ONNX target with `layout: "transformers.js"` is
  `onnx/encoder_model.onnx` + `onnx/decoder_model_merged.onnx` with the feature extractor and generation config
  beside them, proven in the product by transformers.js's `AutoModelForSpeechSeq2Seq` on Node (the card's script,
  fed the spectrogram eager ran on); the card's script, run as written on the folder, transcribes audio.
- ONNX Runtime GenAI cannot take this Whisper (GenAI's Whisper runs 30 s windows of 3000 frames only; this tiny one
  takes 64): the "runs in" column says ✗ with the reason, and the artifact's verdict stands (a Whisper in GenAI's
  window is transcribed by GenAI: tests/test_genai_whisper.py).

One run of a tiny Whisper (module fixture) through the real CLI holds both targets (the shared store's, which
tests/test_seq2seq_onnx.py reads too).
"""

from __future__ import annotations

import json

import pytest

from tests.card_snippets import run_js_card
from tests.conftest import targets_by_name
from tests.export_store import stored_run
from tests.models import TJS_FP16_TARGET, WHISPER_ONNX_RECIPE, WHISPER_ONNX_TARGET, snap_to_int4_grid, tiny_whisper


@pytest.fixture(scope="module")
def whisper_tjs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tjs-speech")
    # the run tests/test_seq2seq_onnx.py reads too: the shared store exports it once
    return stored_run(tiny_whisper(root / "model", WHISPER_ONNX_RECIPE, decoder_layers=2, feature_extractor=True))


def test_a_whisper_folder_in_the_transformers_js_layout_is_transcribed_by_transformers_js(whisper_tjs):
    out, report, log = whisper_tjs
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    proof = proofs["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "AutoModelForSpeechSeq2Seq" in proof["detail"]
    assert "transformers.js ✓ 8/8 tokens" in (out / "report.md").read_text()
    folder = out / "tjs"
    for name in ("onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx", "preprocessor_config.json",
                 "generation_config.json", "config.json"):
        assert (folder / name).is_file(), name


def test_the_cards_transformers_js_speech_script_runs_as_written(whisper_tjs, tmp_path):
    """The card's script, as written, from a folder laid out as its download line puts it (`model/exports/tjs`):
    the folder's feature extractor on a tone, then `AutoModelForSpeechSeq2Seq.generate`."""
    from exporters.publish.snippets import target_snippets

    out, report, _ = whisper_tjs
    target = targets_by_name(report)["tjs"]
    snippets = {runtime: (language, code) for runtime, language, code in target_snippets("org/whisper", target)}
    language, code = snippets["transformers.js"]
    assert language == "js" and "AutoModelForSpeechSeq2Seq" in code and "AutoFeatureExtractor" in code
    tokens = json.loads(run_js_card(code, out / "tjs", tmp_path).splitlines()[-1])
    assert len(tokens) > 1 and all(isinstance(t, int) for t in tokens)


# the float16 run's second transformers.js target: fp32 graphs and their dtype files (#52 item 4)
DTYPES_TARGET = {**WHISPER_ONNX_TARGET, "name": "tjsq", "layout": "transformers.js",
                 "variants": ["fp32", "int4"]}


@pytest.fixture(scope="module")
def whisper_tjs16(tmp_path_factory):
    """The plainest float16 recipe of a 1+1-layer Whisper: a transformers.js target, `dtype: "float16"` (the model
    is loaded in float16, its sample spectrogram made float32 by the extractor), beside one with dtype files
    (`DTYPES_TARGET`); its weights snapped to the 4-bit grid (as the LLaVA's, tests/models.py's TJS_VLM_VARIANTS)."""
    root = tmp_path_factory.mktemp("tjs-speech-fp16")
    recipe = {"exports": [{**WHISPER_ONNX_TARGET, **TJS_FP16_TARGET}, DTYPES_TARGET],
              "generation": {"max_new_tokens": 8}}
    model = tiny_whisper(root / "model", recipe, feature_extractor=True)
    snap_to_int4_grid(model, "WhisperForConditionalGeneration")
    return stored_run(model)


def test_a_whisper_folders_dtype_files_are_judged_with_their_budgets_and_transcribed_by_transformers_js(
        whisper_tjs16, tmp_path):
    """`variants` on the speech layout: `encoder_model` and `decoder_model_merged` each get their `_q4` file in the
    one folder (4-bit MatMulNBits, the If branches' weights too), judged against eager with the int4 budget and
    transcribing in transformers.js with `dtype: "q4"` within it; the card lists them, and its script runs as
    written. The merged decoder's q8 and q4f16 files are refused with the reason (ONNX Runtime's dynamic quantizer
    leaves the branches' outer-scope weights float; its float16 converter cannot take the branches' shared
    initializer names), never written mislabelled."""
    import onnx

    from exporters.errors import TargetPlanError
    from exporters.layouts.transformers_js.dtypes import _derive
    from exporters.publish.snippets import target_snippets

    out, report, log = whisper_tjs16
    target = targets_by_name(report)["tjsq"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    rows = {row["dtype"]: row for row in target["dtype_files"]}
    assert list(rows) == ["fp32", "q4"]
    graphs = ("onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx")
    row = rows["q4"]
    assert row["status"] == "passed" and row["files"] == {
        name: name.removesuffix(".onnx") + "_q4.onnx" for name in graphs}, row
    assert row["quality"]["kind"] == "int4" and row["quality"]["passed"], row["quality"]
    folder = out / "tjsq" / "onnx"
    for name in ("encoder_model_q4.onnx", "decoder_model_merged_q4.onnx"):
        nodes = onnx.load(str(folder / name), load_external_data=False).graph.node
        branches = [n for node in nodes for a in node.attribute if a.type == onnx.AttributeProto.GRAPH
                    for n in a.g.node]
        assert any(n.op_type == "MatMulNBits" for n in (*nodes, *branches)), name
    for variant, words in (("int8-dynamic", "quantized no MatMul of decoder_model_merged.onnx"),
                           ("q4f16", "decoder_model_merged.onnx's If branches share initializer names")):
        with pytest.raises(TargetPlanError, match=words):
            _derive(folder / "decoder_model_merged.onnx", tmp_path / f"refused_{variant}.onnx", variant)
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and "AutoModelForSpeechSeq2Seq" in proof["detail"], proof
    assert proof["detail"].endswith("; dtype q4 8/8 tokens (≥2 asked)"), proof
    code = {runtime: code for runtime, _, code in target_snippets("org/whisper", target)}["transformers.js"]
    assert "{ device: 'cpu', dtype: \"fp32\" }" in code and '//   dtype "q4": ' in code, code
    tokens = json.loads(run_js_card(code, out / "tjsq", tmp_path).splitlines()[-1])
    assert len(tokens) > 1 and all(isinstance(t, int) for t in tokens)


def test_a_float16_whisper_folder_is_transcribed_by_transformers_js_from_float32_features(whisper_tjs16, tmp_path):
    """`dtype: "float16"` alone: the spectrogram is fed to the half model in its dtype (it failed before with 'Input
    type (float) and bias type (c10::Half) should be the same', in the prefill/decode split), `encoder_model_fp16`
    takes float32 features as transformers.js's extractor makes them and casts them inside; proven by
    transformers.js, and the card's script (the folder's extractor on a tone) runs as written."""
    import onnx

    from exporters.publish.snippets import target_snippets

    out, report, log = whisper_tjs16
    target = targets_by_name(report)[TJS_FP16_TARGET["name"]]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    folder = out / TJS_FP16_TARGET["name"]
    assert json.loads((folder / "config.json").read_text())["transformers.js_config"]["dtype"] == "fp16"
    graph = onnx.load(str(folder / "onnx/encoder_model_fp16.onnx"), load_external_data=False).graph
    assert (graph.input[0].name, graph.input[0].type.tensor_type.elem_type) == ("input_features",
                                                                                onnx.TensorProto.FLOAT)
    assert graph.node[0].op_type == "Cast" and graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert (folder / "onnx/decoder_model_merged_fp16.onnx").is_file()
    snippets = {runtime: code for runtime, _, code in target_snippets("org/whisper", target)}
    tokens = json.loads(run_js_card(snippets["transformers.js"], folder, tmp_path).splitlines()[-1])
    assert len(tokens) > 1 and all(isinstance(t, int) for t in tokens)


def test_onnx_runtime_genai_declines_a_whisper_outside_its_window_with_the_reason(whisper_tjs):
    out, report, log = whisper_tjs
    target = targets_by_name(report)["onnx"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    genai = proofs["ONNX Runtime GenAI"]
    assert genai["status"] == "declined", genai
    assert "GenAI's Whisper model runs 30-second windows only (3000 mel frames" in genai["detail"], genai
    assert "this model's encoder takes 64 frames (max_source_positions 32)" in genai["detail"], genai
    for name in ("genai_config.json", "genai_encoder.onnx", "genai_decoder.onnx"):
        assert not (out / "onnx" / name).exists() and not (out / "tjs" / "onnx" / name).exists(), name
    assert "ONNX Runtime GenAI ✗" in (out / "report.md").read_text()

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
from tests.models import TJS_FP16_TARGET, WHISPER_ONNX_RECIPE, WHISPER_ONNX_TARGET, tiny_whisper


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


@pytest.fixture(scope="module")
def whisper_tjs16(tmp_path_factory):
    """The plainest float16 recipe of a 1+1-layer Whisper: one transformers.js target, `dtype: "float16"` (the model
    is loaded in float16, its sample spectrogram made float32 by the extractor)."""
    root = tmp_path_factory.mktemp("tjs-speech-fp16")
    recipe = {"exports": [{**WHISPER_ONNX_TARGET, **TJS_FP16_TARGET}], "generation": {"max_new_tokens": 8}}
    return stored_run(tiny_whisper(root / "model", recipe, feature_extractor=True))


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

"""transformers.js's audio-language layout (#52): the plainest ONNX generation recipe of a tiny Voxtral with
`layout: "transformers.js"` is the folder `AutoModelForAudioTextToText` + `AutoProcessor` load
(`onnx/audio_encoder.onnx`, `onnx/embed_tokens.onnx`, `onnx/decoder_model_merged.onnx` with the feature extractor
naming `VoxtralProcessor` and the tokenizer), proven in the product by transformers.js on Node (its processor's
features and audio tokens from a synthesized tone, then generation token for token against eager `generate()`), and
its card's script runs as written. The audio encoder takes any number of 30 s chunks (#52 item 2): validated at 1,
2, 4 and 7 chunks against eager, and transformers.js generates eager's tokens from two chunks (750 audio tokens). Qwen2-Audio, which transformers.js has no class for, is declined with the reason
(tests/test_audio_language.py's Qwen2-Audio run).

The tiny Voxtral here has Voxtral's chunk (1500 source positions: 3000 frames of 30 s, stacked by 4 into 375 audio
tokens, the count transformers.js's processor lays out per chunk) on a width-32 one-layer tower and a one-layer
text model. One run of the real CLI through the shared store (#48).

Moonshine (#52 item 4), a speech encoder-decoder on the raw waveform: `onnx/encoder_model.onnx` + merged decoder as
transformers.js's MoonshineForConditionalGeneration loads them, from the plainest recipe (no `dynamic`: the layout keeps
the waveform axis dynamic by default), proven in the product 8/8, at a longer waveform, its mutant (another decoder
start token) failing the proof, its card's script run as written, and `hf-export validate` probing the encoder as its
export.json records it.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.card_snippets import run_js_card
from tests.export_store import stored_run
from tests.models import TJS_FP16_TARGET, TJS_TARGET, tiny_moonshine, tiny_voxtral_with_tokenizer
from tests.test_transformers_js_vlm import assert_float16_folder_generates

RECIPE = {"exports": [TJS_TARGET, TJS_FP16_TARGET], "generation": {"max_new_tokens": 8}}
GRAPHS = ("onnx/audio_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx")
CHUNK = {"max_source_positions": 1500, "intermediate_size": 128}  # Voxtral's 30 s chunk, 375 audio tokens


@pytest.fixture(scope="module")
def voxtral_tjs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tjs-voxtral")
    return stored_run(tiny_voxtral_with_tokenizer(root / "model", RECIPE, **CHUNK))


def _target(report: dict) -> dict:
    return {target["name"]: target for target in report["targets"]}["tjs"]


def test_a_voxtral_folder_in_the_transformers_js_layout_generates_in_transformers_js(voxtral_tjs):
    out, report, log = voxtral_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert [c["name"] for c in target["components"]] == ["audio_encoder", "embed_tokens", "decoder_model_merged"]
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert generation["prompt_length"] == 1 + 375 + 8  # BOS, one chunk's audio tokens, the prompt
    encoder = target["components"][0]
    assert [check["shapes"]["input_features"][0] for check in encoder["checks"]] == [2, 1, 4, 7], encoder["checks"]
    assert all(check["passed"] for check in encoder["checks"])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    # the audio encoder takes any number of chunks: proven from one and from two (750 audio tokens)
    assert "AutoModelForAudioTextToText, its processor's audio tokens: 375 from 1 chunk of audio, 750 from 2 chunks " \
           "of audio" in proof["detail"], proof
    assert "transformers.js ✓ 8/8 tokens" in (out / "report.md").read_text()


def test_a_float16_voxtral_folder_generates_in_transformers_js_from_its_processors_float32_features(voxtral_tjs,
                                                                                                   tmp_path):
    """`dtype: "float16"`: the `_fp16` graphs, the audio encoder taking float32 features (cast inside); proven by
    transformers.js from one and two chunks. It failed before with "Unexpected input data type"."""
    assert_float16_folder_generates(voxtral_tjs, "audio_values", "AutoModelForAudioTextToText", tmp_path)


def test_the_folder_holds_the_three_graphs_under_transformers_js_names(voxtral_tjs):
    import onnx

    out, _, _ = voxtral_tjs
    folder = out / "tjs"
    for name in (*GRAPHS, "config.json", "generation_config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (folder / name).is_file(), name
    assert not list(folder.glob("*.onnx")), "every graph moved under onnx/"
    io = {}
    for name in GRAPHS:
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        io[name] = ([v.name for v in graph.input], [v.name for v in graph.output])
    assert io[GRAPHS[0]] == (["audio_values"], ["audio_features"])  # VoxtralProcessor's name for the features
    chunks = onnx.load(str(folder / GRAPHS[0]), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert chunks[0].dim_param and [d.dim_value for d in chunks[1:]] == [16, 3000]  # any number of 30 s chunks
    assert io[GRAPHS[1]] == (["input_ids"], ["inputs_embeds"])
    inputs, outputs = io[GRAPHS[2]]
    assert inputs[:3] == ["inputs_embeds", "attention_mask", "position_ids"] and "past_key_values.0.key" in inputs
    assert outputs[0] == "logits" and "present.0.value" in outputs
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["dtype"] == "fp32"
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    # transformers.js's AutoProcessor picks the processor by it; the model folder's own file names none
    assert preprocessor["processor_class"] == "VoxtralProcessor"
    assert (preprocessor["feature_size"], preprocessor["nb_max_frames"]) == (16, 3000)


def test_the_cards_transformers_js_audio_text_script_runs_as_written(voxtral_tjs, tmp_path):
    """The card's script, as written, from a folder laid out as its download line puts it (`model/exports/tjs`):
    the folder's processor on a tone of one chunk and the prompt, then `AutoModelForAudioTextToText.generate`."""
    from exporters.publish.snippets import target_snippets

    out, report, _ = voxtral_tjs
    snippets = {runtime: (language, code) for runtime, language, code in target_snippets("org/voxtral", _target(report))}
    language, code = snippets["transformers.js"]
    assert language == "js" and "AutoModelForAudioTextToText" in code and "AutoProcessor" in code
    run_js_card(code, out / "tjs", tmp_path)  # the tiny vocabulary may decode to nothing: it runs


def test_a_voxtral_whose_chunk_is_not_375_audio_tokens_is_refused_with_the_reason(tmp_path):
    """transformers.js's VoxtralProcessor lays out 375 audio tokens per chunk (a constant of its code): the tiny
    Voxtral of tests/test_audio_language.py (25 audio tokens for its chunk of 100 frames) could not take its
    processor's prompt, and the layout refuses it saying so (the target keeps its components, as Qwen2-Audio's)."""
    from transformers import VoxtralForConditionalGeneration

    from exporters.capture.image_text_models import refused
    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec

    model = VoxtralForConditionalGeneration.from_pretrained(tiny_voxtral_with_tokenizer(tmp_path / "model")).eval()
    sample = make_sample_inputs(model, InputsSpec(sequence_length=8)).generate
    assert refused(None, model, sample, "dynamic") == (
        "transformers.js's processor lays out 375 audio tokens per chunk; this model's audio encoder gives 25 for a "
        "chunk of 100 frames")
    assert "static" in refused(None, model, sample, "static")


MOONSHINE_RECIPE = {"exports": [TJS_TARGET], "generation": {"max_new_tokens": 8}}  # no `dynamic`: any length anyway


@pytest.fixture(scope="module")
def moonshine_tjs(tmp_path_factory):
    """A tiny Moonshine (1+1 layers, hidden 32; its Wav2Vec2 feature extractor) in the transformers.js layout from
    the plainest recipe (no `dynamic`: the layout keeps the waveform axis dynamic), exported once through the shared
    store."""
    root = tmp_path_factory.mktemp("tjs-moonshine")
    model = tiny_moonshine(root / "model", MOONSHINE_RECIPE)
    return model, stored_run(model)


def test_a_moonshine_folder_transcribes_in_transformers_js_from_the_raw_waveform(moonshine_tjs):
    """Moonshine (#52 item 4): `onnx/encoder_model.onnx` takes the waveform `input_values [1, samples]` (any length)
    and `onnx/decoder_model_merged.onnx` the tokens, the encoder's states and the cache, as transformers.js's
    MoonshineForConditionalGeneration feeds them; proven in the product by `AutoModelForSpeechSeq2Seq.generate` on the
    sample's waveform, 8/8 tokens against eager `generate()`. The recipe sets no `dynamic`: the layout exports the
    waveform axis (and the decoder's encoder-states axis that follows from it) dynamic by default, says so in the
    findings, and validation probes the encoder at waveforms of other lengths against eager."""
    import onnx

    from exporters.layouts.transformers_js.speech import WAVEFORM_KEPT

    _, (out, report, log) = moonshine_tjs
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert WAVEFORM_KEPT in target["findings"], target["findings"]
    encoder_checks = {c["name"]: c for c in target["components"]}["encoder"]["checks"]
    lengths = {check["shapes"]["input_values"][1] for check in encoder_checks}
    assert len(lengths) > 1 and all(check["passed"] for check in encoder_checks), encoder_checks
    assert target["generation"]["status"] == "passed"
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "AutoModelForSpeechSeq2Seq" in proof["detail"]
    folder = out / "tjs"
    assert sorted(p.name for p in folder.glob("onnx/*.onnx")) == ["decoder_model_merged.onnx", "encoder_model.onnx"]
    encoder = onnx.load(str(folder / "onnx" / "encoder_model.onnx"), load_external_data=False).graph
    [waveform] = encoder.input
    assert waveform.name == "input_values" and waveform.type.tensor_type.shape.dim[1].dim_param, waveform
    decoder = onnx.load(str(folder / "onnx" / "decoder_model_merged.onnx"), load_external_data=False).graph
    names = [value.name for value in decoder.input]
    assert names[:2] == ["input_ids", "encoder_hidden_states"] and "past_key_values.0.encoder.key" in names, names
    states = decoder.input[1].type.tensor_type.shape.dim  # [batch, encoder positions, hidden]: from the waveform's
    assert states[1].dim_param, states


def test_a_moonshine_folder_transcribes_a_longer_waveform_and_a_wrong_start_token_fails_the_proof(moonshine_tjs,
                                                                                                   tmp_path):
    """The product's proof, on a waveform half again as long as the traced one (24000 samples: the encoder's axis is
    dynamic), gives eager's 8 tokens; the same proof on a copy whose generation_config.json names another decoder
    start token (transformers.js starts from it, eager from the model's) fails with the tokens."""
    import torch
    from transformers import AutoModelForSpeechSeq2Seq

    from exporters.layouts.child import RuntimeContext
    from exporters.layouts.transformers_js import TransformersJs, proof
    from exporters.recipe.load import parse_recipe

    model_dir, (out, _, _) = moonshine_tjs
    recipe = parse_recipe(json.dumps(MOONSHINE_RECIPE))
    model = AutoModelForSpeechSeq2Seq.from_pretrained(model_dir).eval()
    waveform = torch.sin(torch.arange(24000) * 2 * torch.pi * 440 / 16000).unsqueeze(0) * 0.5
    context = RuntimeContext(recipe.exports[0], recipe, "speech-seq2seq", {"input_values": waveform},
                             model.generation_config, model_dir)
    layout = TransformersJs()
    reference = proof.reference(layout, model, context)
    assert len(set(reference["tokens"])) > 1, reference["tokens"]  # greedy varies: the comparison can fail
    passed = proof.prove(layout, out / "tjs", reference, context)
    assert passed.status == "passed" and passed.detail.startswith("8/8 tokens"), passed
    mutant = tmp_path / "out" / "tjs"
    shutil.copytree(out / "tjs", mutant)
    generation = json.loads((mutant / "generation_config.json").read_text())
    generation["decoder_start_token_id"] = reference["tokens"][0] + 1
    (mutant / "generation_config.json").write_text(json.dumps(generation))
    failed = proof.prove(layout, mutant, reference, context)
    assert failed.status == "failed" and "/8 tokens equal eager greedy: transformers.js " in failed.detail, failed


def test_the_cards_transformers_js_script_transcribes_a_moonshine_folder_as_written(moonshine_tjs, tmp_path):
    """The card's script as written: the folder's feature extractor on a second of a tone (its `input_values`), then
    `AutoModelForSpeechSeq2Seq.generate`; it prints the ids."""
    from exporters.publish.snippets import target_snippets

    _, (out, report, _) = moonshine_tjs
    code = {runtime: code for runtime, _, code in target_snippets("org/moonshine", _target(report))}["transformers.js"]
    assert "AutoModelForSpeechSeq2Seq" in code and "input_values" in code, code
    printed = run_js_card(code, out / "tjs", tmp_path)
    assert len(json.loads(printed.strip().splitlines()[-1])) >= 32, printed  # 32 new tokens and the start


def test_a_moonshine_folder_is_revalidated_with_the_waveform_axis_its_export_json_records(moonshine_tjs, tmp_path):
    """`hf-export validate` on a saved Moonshine folder probes the encoder as it was exported, not as today's default
    would export it: the stored folder whose export.json records a fixed waveform (what a recipe without `dynamic`
    wrote before the default) is validated at its traced length alone (the run itself probed other lengths: the
    first Moonshine test)."""
    from tests.conftest import run_cli

    model_dir, (out, _, _) = moonshine_tjs
    copy = tmp_path / "out"
    shutil.copytree(out / "tjs", copy / "tjs")
    manifest_path = copy / "tjs" / "export.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["components"]["encoder"]["metadata"]["export_config"]["dynamic"] is True
    manifest["components"]["encoder"]["metadata"]["export_config"]["dynamic"] = False
    manifest_path.write_text(json.dumps(manifest))
    done = run_cli("validate", str(model_dir), str(copy), "--target", "tjs")
    assert done.returncode == 0, done.stderr[-3000:]
    target = _target(json.loads((copy / "report.json").read_text()))
    assert target["status"] == "passed", json.dumps(target, indent=1)[:6000]
    checks = {c["name"]: c for c in target["components"]}["encoder"]["checks"]
    assert [check["shapes"]["input_values"][1] for check in checks] == [16000], checks

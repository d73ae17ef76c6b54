"""Granite Speech through the audio-language kind (#50, round 5): its Conformer speech encoder (`model.encoder`),
Q-Former projector (`model.projector`) and language model on embeddings, exported for dynamo, ONNX, as ExecuTorch
MultimodalRunner's program and in transformers.js's audio-language layout (#52), each validated end to end from stacked log-mel features of a synthetic waveform to
generated tokens against eager `generate()`, token for token; the runner's own binding generates the same tokens
from the folder alone. Before, every target was refused (its speech stages were not found, the model sorted as a
text generator)."""

from __future__ import annotations

import json

import pytest

from tests.card_snippets import run_js_card
from tests.conftest import run_and_read, targets_by_name
from tests.models import TJS_TARGET, tiny_granite_speech_with_tokenizer

RUNTIME = "ExecuTorch MultimodalRunner"
RECIPE = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
          {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},
          {"name": "executorch", "export_format": "executorch", "mode": "generation"},
          TJS_TARGET]  # transformers.js's audio-language layout (#52)
STAGES = ["audio_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head", "decode"]
AUDIO_TOKENS = 12  # 50 stacked frames: 4 projector windows of 15, 3 queries each


@pytest.fixture(scope="module")
def granite_run(tmp_path_factory):
    """The tiny Granite Speech with its tokenizer, the three targets in one run of the real CLI."""
    root = tmp_path_factory.mktemp("granite_speech")
    model_dir = tiny_granite_speech_with_tokenizer(root / "model", RECIPE)
    out, report, log = run_and_read(root, model_dir)
    return model_dir, out, report, log


def test_every_target_passes_with_its_speech_encoder_and_projector_token_for_token(granite_run):
    """Each target holds the speech encoder and the projector (dynamo, ONNX: as stages; ExecuTorch: the runner's
    audio_encoder method) and generates eager's tokens from the audio and the prompt; GenAI declines the ONNX folder
    as an audio-language one."""
    _, out, report, log = granite_run
    assert report.get("family") == "audio-language", log[-3000:]
    targets = targets_by_name(report)
    assert sorted(targets) == ["dynamo", "executorch", "onnx", "tjs"]
    for name, target in targets.items():
        assert target["status"] == "passed", (name, log[-3000:], json.dumps(target, indent=1)[:5000])
        generation = target["generation"]
        assert generation["status"] == "passed", (name, generation)
        assert generation["exported_tokens"] == generation["eager_tokens"] and len(generation["eager_tokens"][0]) == 8
        assert generation["prompt_length"] == 1 + AUDIO_TOKENS + 8  # BOS, the audio's tokens, the prompt
    for name in ("dynamo", "onnx"):
        assert [c["name"] for c in targets[name]["components"]] == STAGES, targets[name]["components"]
    assert [c["name"] for c in targets["executorch"]["components"]] == ["token_embedding", "audio_encoder",
                                                                         "text_decoder"]
    probe = targets["dynamo"]["components"][0]["checks"][0]
    assert [1, 50, 160] in probe["shapes"].values(), probe  # 100 mel frames of 80 bins, stacked in pairs
    assert any("made by the audio config" in f for f in report["findings"]), report["findings"]
    [genai] = [proof for proof in targets["onnx"]["runtimes"] if proof["runtime"] == "ONNX Runtime GenAI"]
    assert genai["status"] == "declined" and "no audio-language model type 'granite_speech'" in genai["detail"]
    assert "reads audio" not in (out / "report.md").read_text()


def test_the_runners_program_keeps_each_methods_constants_apart_in_its_data_file(granite_run):
    """The tied model's weights go to model.ptd, keyed by name across the three methods: the decoder's and the
    speech encoder's propagated constants got one name each before (the audio_encoder method did not load: "Scalar
    type mismatch"); the runner's binding now generates eager's tokens from the folder alone."""
    _, out, report, _ = granite_run
    target = targets_by_name(report)["executorch"]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from an audio and a prompt"), proofs
    folder = out / "executorch"
    assert json.loads((folder / "export.json").read_text())["layout"] == "multimodal_runner"
    assert {"model.pte", "model.ptd", "tokenizer.json"} <= {p.name for p in folder.iterdir()}


def test_the_tokens_compared_depend_on_the_audio(granite_run):
    """Eager's tokens from the prompt with its speech features differ from those with silence's features in their
    place, so a folder whose speech stages were wrong could not match."""
    import torch
    from transformers import GraniteSpeechForConditionalGeneration

    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec

    model_dir, _, _, _ = granite_run
    model = GraniteSpeechForConditionalGeneration.from_pretrained(model_dir).eval()
    inputs = make_sample_inputs(model, InputsSpec(sequence_length=8)).generate
    assert int((inputs["input_ids"] == model.config.audio_token_id).sum()) == AUDIO_TOKENS
    assert inputs["input_features"].std() > 0.1
    with torch.no_grad():
        heard = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
        silent = {**inputs, "input_features": torch.zeros_like(inputs["input_features"])}
        unheard = model.generate(**silent, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
    assert heard != unheard


def test_a_transformers_js_folder_takes_audio_of_any_length_and_generates_in_transformers_js(granite_run):
    """transformers.js's audio-language layout (#52): `onnx/audio_encoder.onnx` takes `input_features [1, frames,
    160]` with the frames dynamic (the Conformer's blocks and the projector's windows counted in symbolic sizes:
    `exporters.upstream.granite_speech_frames_dynamic`), validated against eager at the traced 75 frames and at 1, 77
    and 153 (one part-filled block; several, the last part-filled); transformers.js's own processor (its
    `GraniteSpeechFeatureExtractor` config written from the model's config: the Python one needs torchaudio) makes
    features of the sample's shape and its audio-token count from tones of 1 s and 1.5 s, and
    `AutoModelForAudioTextToText.generate` gives eager's tokens from both lengths' features. Declined before ("its
    processor reads a GraniteSpeechFeatureExtractor config ... this layout does not write yet")."""
    import onnx

    _, out, report, log = granite_run
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert [c["name"] for c in target["components"]] == ["audio_encoder", "embed_tokens", "decoder_model_merged"]
    encoder = target["components"][0]
    assert [check["shapes"]["input_features"] for check in encoder["checks"]] == [
        [1, 75, 160], [1, 1, 160], [1, 77, 160], [1, 153, 160]], encoder["checks"]
    assert all(check["passed"] for check in encoder["checks"])
    proof = {proof["runtime"]: proof for proof in target["runtimes"]}["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), proof
    assert "its processor's audio tokens: 12 from audio of 50 feature frames, 15 from audio of 75 feature frames" \
        in proof["detail"], proof
    folder = out / "tjs"
    graph = onnx.load(str(folder / "onnx" / "audio_encoder.onnx"), load_external_data=False).graph
    assert ([v.name for v in graph.input], [v.name for v in graph.output]) == (["input_features"], ["audio_features"])
    dims = graph.input[0].type.tensor_type.shape.dim
    assert dims[1].dim_param and [dims[0].dim_value, dims[2].dim_value] == [1, 160]  # any number of frames
    extractor = json.loads((folder / "preprocessor_config.json").read_text())
    assert extractor["feature_extractor_type"] == "GraniteSpeechFeatureExtractor"
    assert extractor["melspec_kwargs"] == {"sample_rate": 16000, "n_fft": 512, "win_length": 400, "hop_length": 160,
                                           "n_mels": 80}
    assert (extractor["projector_window_size"], extractor["projector_downsample_rate"]) == (15, 5)
    assert json.loads((folder / "processor_config.json").read_text()) == {
        "audio_token": "<|audio|>", "processor_class": "GraniteSpeechProcessor"}


def test_the_cards_transformers_js_granite_speech_script_runs_as_written(granite_run, tmp_path):
    """The card's script, as written, from a folder laid out as its download line puts it: the folder's processor
    on a one-second tone and the prompt after its `<|audio|>` (the processor config's audio token), then
    `AutoModelForAudioTextToText.generate`."""
    from exporters.publish.snippets import target_snippets

    _, out, report, _ = granite_run
    snippets = {runtime: (language, code) for runtime, language, code in
                target_snippets("org/granite-speech", targets_by_name(report)["tjs"])}
    language, code = snippets["transformers.js"]
    assert language == "js" and "AutoModelForAudioTextToText" in code and "processor.config.audio_token" in code
    run_js_card(code, out / "tjs", tmp_path)  # the tiny vocabulary may decode to nothing: it runs

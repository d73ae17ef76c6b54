"""Granite Speech through the audio-language kind (#50, round 5): its Conformer speech encoder (`model.encoder`),
Q-Former projector (`model.projector`) and language model on embeddings, exported for dynamo, ONNX and as ExecuTorch
MultimodalRunner's program, each validated end to end from stacked log-mel features of a synthetic waveform to
generated tokens against eager `generate()`, token for token; the runner's own binding generates the same tokens
from the folder alone. Before, every target was refused (its speech stages were not found, the model sorted as a
text generator)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_and_read, targets_by_name
from tests.models import tiny_granite_speech_with_tokenizer

RUNTIME = "ExecuTorch MultimodalRunner"
RECIPE = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
          {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},
          {"name": "executorch", "export_format": "executorch", "mode": "generation"}]
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
    assert sorted(targets) == ["dynamo", "executorch", "onnx"]
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

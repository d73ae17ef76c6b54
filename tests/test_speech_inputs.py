"""A speech encoder-decoder's synthesized source follows its own layout when the folder has no feature extractor."""

from __future__ import annotations

import torch
from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration

from exporters.capture.inputs import FILTER_BANK_FRAMES, make_sample_inputs
from exporters.recipe.model import InputsSpec


def tiny_speech_to_text(max_source_positions: int = 64) -> Speech2TextForConditionalGeneration:
    config = Speech2TextConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                               decoder_ffn_dim=32, conv_channels=16, input_feat_per_channel=12, input_channels=1,
                               max_source_positions=max_source_positions, max_target_positions=32)
    torch.manual_seed(0)
    return Speech2TextForConditionalGeneration(config).eval()


def test_filter_banks_are_frames_by_features_and_run_through_the_model():
    model = tiny_speech_to_text()
    sample = make_sample_inputs(model, InputsSpec())
    assert sample.family == "speech-seq2seq" and sample.source == "synthesized"
    assert tuple(sample.generate["input_features"].shape) == (1, 128, 12)  # batch x frames x features, not mel-first
    with torch.no_grad():
        logits = model(**sample.forward).logits
    assert logits.shape == (1, sample.forward["decoder_input_ids"].shape[1], 64)


def test_filter_bank_frames_are_capped_and_follow_the_recipe():
    model = tiny_speech_to_text(max_source_positions=6000)  # the released checkpoints' positions: 12000 frames
    assert make_sample_inputs(model, InputsSpec()).generate["input_features"].shape[1] == FILTER_BANK_FRAMES
    assert make_sample_inputs(model, InputsSpec(audio_length=40)).generate["input_features"].shape[1] == 40



def test_stacked_features_are_as_wide_as_the_model_reads_them(tmp_path):
    """Wav2Vec2-BERT reads 160-wide frames (its feature extractor's 80 mel bins, two frames stacked): the width comes
    from its config (`feature_projection_input_dim`), never a constant 80 (#50 item 5); exported and validated."""
    import dataclasses
    import json

    from matrix.families import FAMILIES, build
    from tests.conftest import run_cli

    recipe = {"schema_version": 1, "exports": [{"name": "onnx", "export_format": "onnx", "dynamic": True}]}
    # one layer: the width is read where the features enter, before any layer (#48)
    spec = dataclasses.replace(FAMILIES["wav2vec2_bert"], overrides={**FAMILIES["wav2vec2_bert"].overrides,
                                                                     "num_hidden_layers": 1})
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed", target["error"]
    assert result.returncode == 0
    assert target["components"][0]["checks"][0]["shapes"]["input_features"][2] == 160

"""Audio encoder-decoders beyond Whisper (#30): Moonshine reads a raw waveform (`input_values`), not text and not a
spectrogram. Its sample inputs come from the folder's feature extractor (else from the config), its generation
export is the encoder / prefill / decode set in every format (ExecuTorch's with `layout: "methods"`: its default is
the ASR runner's `encoder` + `text_decoder`, tests/test_executorch_speech.py), and parity runs from the waveform
through the exported graphs only."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.models import tiny_moonshine

FORMATS = ["dynamo", "onnx", "executorch"]
RECIPE = {"schema_version": 1, "generation": {"max_new_tokens": 6}, "exports": [
    {"name": "dynamo", "export_format": "dynamo", "mode": "generation", "dynamic": True},
    {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},
    {"name": "executorch", "export_format": "executorch", "mode": "generation", "layout": "methods"},
]}
COMPONENTS = ["encoder", "prefill", "decode"]


@pytest.fixture(scope="module")
def moonshine_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("moonshine")
    model_dir = tiny_moonshine(root / "model", RECIPE)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    return json.loads((out / "report.json").read_text()), out, result


def test_every_format_exports_the_encoder_decoder_set_and_passes(moonshine_run):
    from transformers.exporters import ExportedModel

    report, out, result = moonshine_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["family"] == "speech-seq2seq"
    assert [t["name"] for t in report["targets"]] == FORMATS
    for target in report["targets"]:
        assert target["status"] == "passed", (target["name"], target["error"])
        assert target["expected_components"] == COMPONENTS
        assert [c["name"] for c in target["components"]] == COMPONENTS
        if target["name"] != "executorch":  # the .pte loads in the ExecuTorch runtime the checks ran in
            exported = ExportedModel.from_pretrained(out / target["name"], trust_remote_code=True)
            assert sorted(exported.components) == sorted(COMPONENTS)


def test_the_encoder_takes_the_waveform_its_feature_extractor_makes(moonshine_run):
    report, _, _ = moonshine_run
    assert "sample inputs: a synthetic waveform through the folder's own Wav2Vec2FeatureExtractor" in report["findings"]
    assert not [f for f in report["findings"] if "image processor" in f], report["findings"]
    for target in report["targets"]:
        encoder = target["components"][0]
        traced = encoder["checks"][0]["shapes"]
        # one second at the extractor's 16 kHz; dynamo and ONNX `dynamic: true` trace a batch of 2 (a batch of 1 is
        # fixed); the ExecuTorch target (no `dynamic: true`, a static cache) keeps the sample's 1
        assert traced["input_values"] == [2 if target["name"] in ("dynamo", "onnx") else 1, 16000], traced
        assert "input_ids" not in traced and "input_features" not in traced
        if target["name"] != "executorch":  # dynamic: true keeps the waveform axis dynamic, probed at other lengths
            unseen = [c for c in encoder["checks"][1:] if c["probe"].startswith("samples")]
            assert [c["shapes"]["input_values"][1] for c in unseen] == [8000, 20001, 32003], encoder["checks"]
            assert all(c["verdict"] == "passed" for c in unseen), unseen
    assert any("attention_mask is left out of the encoder's inputs" in f for f in report["findings"])


def test_parity_from_the_waveform_through_the_exported_graphs(moonshine_run):
    report, _, _ = moonshine_run
    for target in report["targets"]:
        generation = target["generation"]
        assert generation["status"] == "passed", (target["name"], generation)
        tokens = generation["eager_tokens"][0]
        assert tokens == generation["exported_tokens"][0][: len(tokens)]
        assert len(tokens) >= 5 and len(set(tokens)) > 1, tokens  # greedy decoding varies: the check can fail


def test_without_a_feature_extractor_the_waveform_is_made_from_the_config(tmp_path):
    from transformers import AutoModelForSpeechSeq2Seq

    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec

    folder = tiny_moonshine(tmp_path / "model", feature_extractor=False)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(folder)
    sample = make_sample_inputs(model, InputsSpec(), folder=folder)
    assert sample.family == "speech-seq2seq" and sample.source == "synthesized"
    assert {k: tuple(v.shape) for k, v in sample.generate.items()} == {"input_values": (1, 16000)}
    assert sample.forward["decoder_input_ids"][0, 0].item() == model.config.decoder_start_token_id


def test_a_float16_recipe_alone_takes_the_waveform_in_the_models_dtype(tmp_path):
    """The plainest float16 recipe (one ONNX generation target, `dtype: "float16"`): the model is loaded in float16
    and its extractor's float32 waveform is fed in the model's dtype; it failed before in the prefill/decode split
    ('expected scalar type Float but found Half'), as Whisper's did (tests/test_speech_onnx_runtimes.py)."""
    from tests.export_store import stored_run

    recipe = {"generation": {"max_new_tokens": 6}, "exports": [
        {"name": "onnx16", "export_format": "onnx", "mode": "generation", "dtype": "float16"}]}
    _, report, log = stored_run(tiny_moonshine(tmp_path / "model", recipe))
    assert report["model_dtype"] == "float16", log[-3000:]
    [target] = report["targets"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    assert target["generation"]["status"] == "passed" and target["dtype"] == "float16", target["generation"]

"""End to end through the real CLI on the other model families: an encoder (BERT) across the three formats, an
encoder-decoder (T5) and a speech model (Whisper), in single-graph mode. Generation mode for these families and for
a vision-language model is in test_complete_components.py."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_cli
from tests.models import tiny_bert, tiny_t5, tiny_whisper

SEQ = {"1": {"name": "seq", "min": 2, "max": 32}}
BERT_RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "dynamo", "export_format": "dynamo",
         "dynamic_shapes": {"input_ids": SEQ, "attention_mask": SEQ, "token_type_ids": SEQ}},
        {"name": "onnx", "export_format": "onnx",
         "dynamic_shapes": {"input_ids": SEQ, "attention_mask": SEQ, "token_type_ids": SEQ},
         "output_path": "standalone/bert.onnx", "keep_initializers_as_inputs": True},
        {"name": "onnx-embedded", "export_format": "onnx", "external_data": False,
         "device": "cuda"},  # the run's --device cpu overrides it, in the export itself
        {"name": "onnx-no-weights", "export_format": "onnx", "export_params": False,
         "output_path": "single/model.onnx"},
        {"name": "et", "export_format": "executorch",
         "dynamic_shapes": {"input_ids": SEQ, "attention_mask": SEQ, "token_type_ids": SEQ}},
    ],
}


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    model_dir = tiny_bert(root / "model", BERT_RECIPE)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet", "--device", "cpu")


def test_bert_all_formats_pass_in_model_mode(bert_run):
    from transformers.exporters import ExportedModel

    _, out, result = bert_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["family"] == "text"
    for target in report["targets"]:
        assert target["status"] == "passed", target["error"]
        assert target["mode"] == "model" and target["generation"] is None
        exported = ExportedModel.from_pretrained(out / target["name"], trust_remote_code=True)
        assert list(exported.components) == ["model"]
    onnx = next(t for t in report["targets"] if t["name"] == "onnx")
    probes = {c["probe"] for c in onnx["components"][0]["checks"]}
    assert probes == {"traced", "seq=2", "seq=17", "seq=32"}


def test_bert_onnx_seed_file_options_are_applied(bert_run):
    import onnx
    import onnxruntime

    _, out, _ = bert_run
    standalone = out / "onnx" / "standalone" / "bert.onnx"
    assert standalone.is_file(), "output_path writes the single graph where the recipe asked"
    model = onnx.load(str(standalone))
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    assert initializers and initializers <= inputs, "keep_initializers_as_inputs lists every weight as an input"
    session = onnxruntime.InferenceSession(str(standalone), providers=["CPUExecutionProvider"])
    assert {"input_ids", "attention_mask", "token_type_ids"} <= {i.name for i in session.get_inputs()}
    assert not list(standalone.parent.glob("*.data")), "the standalone copy embeds its weights"


def test_bert_onnx_embedded_weights_and_stripped_weights(bert_run):
    import onnx

    _, out, _ = bert_run
    report = json.loads((out / "report.json").read_text())
    status = {t["name"]: t["status"] for t in report["targets"]}
    assert status["onnx-embedded"] == "passed" and status["onnx-no-weights"] == "passed"
    embedded = onnx.load(str(out / "onnx-embedded" / "model.onnx"))
    assert embedded.graph.initializer and all(not t.external_data for t in embedded.graph.initializer)
    assert (out / "onnx-embedded" / "model.onnx.data").stat().st_size == 0
    stripped = onnx.load(str(out / "onnx-no-weights" / "model.onnx"))
    assert not stripped.graph.initializer
    assert "embeddings.word_embeddings.weight" in {i.name for i in stripped.graph.input}
    assert any("export_params: false" in f for f in report["findings"])
    # the output_path copy is an artifact like the rest: validated with its weights, then stripped as well
    copy = onnx.load(str(out / "onnx-no-weights" / "single" / "model.onnx"))
    assert not copy.graph.initializer and "embeddings.word_embeddings.weight" in {i.name for i in copy.graph.input}
    target = next(t for t in report["targets"] if t["name"] == "onnx-no-weights")
    checked = {c["name"]: c["verdict"] for c in target["components"]}
    assert checked == {"model": "passed", "model (single/model.onnx)": "passed"}


def test_the_device_option_overrides_the_recipe_in_the_export(bert_run):
    _, out, _ = bert_run
    target = next(t for t in json.loads((out / "report.json").read_text())["targets"] if t["name"] == "onnx-embedded")
    assert target["status"] == "passed" and target["device"] == "cpu", target.get("error")


def test_the_plainest_encoder_decoder_generation_recipe_generates(tmp_path):
    """`{"export_format": "dynamo", "mode": "generation"}` on Whisper declares no dynamic shape: the decode still
    gets the cache axis generation grows (else it could run one step only), the report says so, the exported
    encoder / prefill / decode generate eager's tokens, and the model card's `ExportedModel` snippet, run as written
    against the target folder (with its feature extractor), generates them too."""
    from exporters.publish.snippets import exported_model_snippet

    model_dir = tiny_whisper(tmp_path / "model", [{"export_format": "dynamo", "mode": "generation"}],
                             feature_extractor=True)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed", target["error"]
    assert target["expected_components"] == ["encoder", "prefill", "decode"]
    assert target["generation"]["status"] == "passed"
    assert target["generation"]["exported_tokens"] == target["generation"]["eager_tokens"]
    assert any("self-attention cache length axis is dynamic" in finding for finding in target["findings"])

    snippet = exported_model_snippet("org/model", target)
    where = f'"org/model", subfolder="exports/{target["name"]}"'
    assert snippet.count(where) == 2 and "EncoderDecoderCache(DynamicCache(config=config)" in snippet, snippet
    namespace: dict = {}
    exec(snippet.replace(where, repr(str(out / target["name"]))), namespace)  # noqa: S102 - our snippet, our export
    inputs = namespace["inputs"]
    from transformers import AutoModelForSpeechSeq2Seq
    eager = AutoModelForSpeechSeq2Seq.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = eager.generate(input_features=inputs["input_features"], max_new_tokens=16, do_sample=False,
                                  min_new_tokens=16)[0].tolist()
    assert namespace["tokens"] == expected[-16:], (namespace["tokens"], expected)


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    recipe = [{"name": "dynamo", "export_format": "dynamo", "mode": "model", "dynamic": True},
              {"name": "onnx", "export_format": "onnx", "mode": "model", "dynamic": True}]
    model_dir = tiny_t5(root / "model", recipe)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_t5_encoder_decoder_single_graph(t5_run):
    _, out, result = t5_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["family"] == "seq2seq"
    for target in report["targets"]:
        assert target["status"] == "passed", target["error"]
        checks = target["components"][0]["checks"]
        assert checks[0]["probe"] == "traced"
        assert set(checks[0]["shapes"]) >= {"input_ids", "attention_mask", "decoder_input_ids"}
        assert len(checks) > 1, "dynamic: true probes sequence lengths it was not traced with"


@pytest.fixture(scope="module")
def whisper_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    model_dir = tiny_whisper(root / "model", {"export_format": "dynamo", "mode": "model"})
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_whisper_speech_model(whisper_run):
    _, out, result = whisper_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["family"] == "speech-seq2seq"
    shapes = report["targets"][0]["components"][0]["checks"][0]["shapes"]
    assert shapes["input_features"] == [1, 16, 64]


def test_a_feature_extractor_with_a_fractional_chunk_length_makes_sample_inputs(tmp_path):
    """`chunk_length` 0.64 s saves `n_samples` and `nb_max_frames` as floats in preprocessor_config.json; the
    extractor used them as slice bounds ("slice indices must be integers"), so every target failed."""
    from transformers import WhisperFeatureExtractor

    model_dir = tiny_whisper(tmp_path / "model", {"export_format": "dynamo", "mode": "model"})
    WhisperFeatureExtractor(feature_size=16, chunk_length=0.64).save_pretrained(model_dir)
    saved = json.loads((model_dir / "preprocessor_config.json").read_text())
    assert isinstance(saved["n_samples"], float) and isinstance(saved["nb_max_frames"], float)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    assert result.returncode == 0, (report["targets"][0].get("error"), result.stderr[-2000:])
    assert "slice indices" not in json.dumps(report)
    target = report["targets"][0]
    assert target["status"] == "passed"
    shapes = target["components"][0]["checks"][0]["shapes"]
    assert shapes["input_features"] == [1, 16, 64]  # the extractor's 64 frames: 0.64 s at hop 160

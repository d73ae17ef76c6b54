"""#26: an ONNX encoder-decoder generation target (Whisper, T5) in the files and names optimum loads
(`exporters/export/seq2seq_names.py`): `encoder_model.onnx`, `decoder_model.onnx`, `decoder_with_past_model.onnx`,
exported once per model through the real CLI, validated by our own loop on the renamed graphs, and loaded from the
target folder alone by optimum's `ORTModelForSpeechSeq2Seq` / `ORTModelForSeq2SeqLM` (the optimum test venv,
transformers 4.57), whose greedy tokens must be eager's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from exporters.publish.snippets import target_snippets
from tests.conftest import ROOT, run_cli
from tests.models import tiny_t5, tiny_whisper

RECIPE = {"export_format": "onnx", "mode": "generation", "dynamic": True}
NEW_TOKENS = 8
LAYERS = 2  # two decoder layers: optimum feeds the past by position, layer by layer
FILES = {"encoder": "encoder_model.onnx", "prefill": "decoder_model.onnx", "decode": "decoder_with_past_model.onnx"}
OPTIMUM_SCRIPT = Path(__file__).with_name("optimum") / "seq2seq.py"


def _past(prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{side}.{kind}" for i in range(LAYERS) for side in ("decoder", "encoder")
            for kind in ("key", "value")]


def _export(root: Path, build, **options) -> dict:
    model_dir = build(root / "model", RECIPE, decoder_layers=LAYERS, **options)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    return {"model_dir": model_dir, "folder": out / "onnx", "report": json.loads((out / "report.json").read_text())}


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("whisper-optimum"), tiny_whisper, feature_extractor=True)


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("t5-optimum"), tiny_t5)


def _graph(path: Path) -> tuple[list[str], list[str]]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return [v.name for v in proto.graph.input], [v.name for v in proto.graph.output]


@pytest.mark.parametrize("name", ["whisper", "t5"])
def test_the_folder_has_optimums_files_and_names_and_our_checks_ran_on_them(name, request):
    exported = request.getfixturevalue(name)
    folder, report = exported["folder"], exported["report"]
    target = report["targets"][0]
    assert target["status"] == "passed" and target["unverified"] == []
    assert [c["name"] for c in target["components"]] == ["encoder", "prefill", "decode"]
    assert all(c["verdict"] == "passed" for c in target["components"])
    assert target["generation"]["status"] == "passed"  # our greedy parity ran through the renamed graphs
    onnx_files = sorted(p.name for p in folder.glob("*.onnx"))
    assert onnx_files == sorted(FILES.values())
    assert {Path(f["path"]).name for f in target["files"]} >= set(FILES.values())
    manifest = json.loads((folder / "export.json").read_text())
    assert {c: e["file"] for c, e in manifest["components"].items()} == FILES
    # the weights are stored once, beside the encoder; the decoders' graphs point there
    assert (folder / "encoder_model.onnx.data").stat().st_size > 0
    assert all((folder / f"{FILES[c]}.data").stat().st_size == 0 for c in ("prefill", "decode"))

    encoder_in, encoder_out = _graph(folder / FILES["encoder"])
    assert encoder_out == ["last_hidden_state"]
    assert encoder_in == (["input_features"] if name == "whisper" else ["input_ids", "attention_mask"])
    mask = [] if name == "whisper" else ["encoder_attention_mask"]
    presents = _past("present")
    prefill_in, prefill_out = _graph(folder / FILES["prefill"])
    assert sorted(prefill_in) == sorted(["input_ids", "encoder_hidden_states", *mask])
    assert prefill_out[0] == "logits"
    assert sorted(n for n in prefill_out if n.startswith("present.")) == sorted(presents)
    decode_in, decode_out = _graph(folder / FILES["decode"])
    assert decode_in[-4 * LAYERS:] == _past("past_key_values")  # optimum's order: per layer, self then cross
    assert sorted(decode_in[:-4 * LAYERS]) == sorted(["input_ids", "encoder_hidden_states", *mask])
    assert sorted(n for n in decode_out if n.startswith("present.")) == sorted(presents)
    assert not [n for n in (*prefill_in, *decode_in, *prefill_out, *decode_out)
                if n.startswith(("input.", "output.", "cache.", "decoder_input_ids", "encoder_outputs"))]
    # export.json maps every renamed input back to upstream's leaf, for our own loader
    decode_map = manifest["components"]["decode"]["inputs"]
    assert decode_map["input_ids"] == "decoder_input_ids"
    assert decode_map["encoder_hidden_states"] == "encoder_outputs.last_hidden_state"
    assert decode_map["past_key_values.1.encoder.value"] == "cache.cross_attention_cache.layers.1.values"
    assert decode_map["past_key_values.0.decoder.key"] == "cache.self_attention_cache.layers.0.keys"
    # upstream's ExportedModel binds its own leaf names: the model card offers no snippet that could not run
    assert [runtime for runtime, _, _ in target_snippets("org/model", target)] == []


def test_our_loader_runs_the_renamed_decoder_as_eager_does(t5):
    """`load_exported` binds the renamed graph by upstream's leaf names (`RenamedRunner`): one prefill step of the
    renamed `decoder_model.onnx` gives eager's logits."""
    from transformers import AutoModelForSeq2SeqLM, DynamicCache, EncoderDecoderCache

    from exporters.upstream import load_exported, run_component

    model = AutoModelForSeq2SeqLM.from_pretrained(t5["model_dir"]).eval()
    exported = load_exported(t5["folder"], config=model.config)
    ids = torch.tensor([[5, 17, 9, 33, 41, 8]])
    mask = torch.ones_like(ids)
    start = torch.tensor([[model.config.decoder_start_token_id]])
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
        want = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=start).logits
    got = run_component(exported.runners["prefill"], {
        "decoder_input_ids": start, "encoder_outputs": encoded, "attention_mask": mask,
        "cache": EncoderDecoderCache(DynamicCache(), DynamicCache())})
    np.testing.assert_allclose(got.logits.numpy(), want.numpy(), atol=1e-4, rtol=1e-3)


def _optimum(folder: Path, kind: str, data, tmp_path: Path) -> dict:
    """optimum's greedy tokens for `data`, from `folder` alone, in the optimum test venv (`make test-deps`;
    HF_EXPORT_OPTIMUM_PYTHON names another interpreter that has optimum-onnx). Never skipped."""
    python = os.environ.get("HF_EXPORT_OPTIMUM_PYTHON") or str(ROOT / ".cache" / "optimum-venv" / "bin" / "python")
    if not Path(python).is_file():
        pytest.fail("optimum is not installed: run `make test-deps` (.cache/optimum-venv, pinned by "
                    "tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python with optimum-onnx")
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps(data))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([python, str(OPTIMUM_SCRIPT), str(folder), kind, str(inputs), str(NEW_TOKENS)],
                            capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _new(tokens: list[list[int]]) -> list[list[int]]:
    return [row[-NEW_TOKENS:] for row in tokens]


def test_optimum_speech_seq2seq_generates_what_eager_generates(whisper, tmp_path):
    from transformers import AutoFeatureExtractor, WhisperForConditionalGeneration

    audio = (np.random.default_rng(0).standard_normal(8000) * 0.1).astype(np.float32).tolist()
    got = _optimum(whisper["folder"], "speech", audio, tmp_path)
    assert got["files"] == {"encoder": FILES["encoder"], "decoder": FILES["prefill"],
                            "decoder_with_past": FILES["decode"]}
    assert got["inputs"]["decoder_with_past"][-4 * LAYERS:] == _past("past_key_values")
    extractor = AutoFeatureExtractor.from_pretrained(whisper["model_dir"])
    features = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
    model = WhisperForConditionalGeneration.from_pretrained(whisper["model_dir"]).eval()
    with torch.no_grad():
        want = model.generate(input_features=features, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              do_sample=False, num_beams=1)
    want = _new(want.tolist())
    assert len(set(want[0])) > 2  # the model does not repeat one token: a wrong past would show
    assert _new(got["tokens"]) == want


def test_optimum_seq2seq_lm_generates_what_eager_generates(t5, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    ids = [[70, 12, 5]]
    got = _optimum(t5["folder"], "text", ids, tmp_path)
    assert got["files"]["decoder_with_past"] == FILES["decode"]
    assert "encoder_attention_mask" in got["inputs"]["decoder_with_past"]
    model = AutoModelForSeq2SeqLM.from_pretrained(t5["model_dir"]).eval()
    tensor = torch.tensor(ids)
    with torch.no_grad():
        want = model.generate(input_ids=tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1)
    want = _new(want.tolist())
    assert len(set(want[0])) > 2
    assert _new(got["tokens"]) == want


def test_a_decode_graph_with_a_fixed_past_keeps_upstreams_names_and_says_why(tmp_path):
    """A static cache fixes the decode graph's past length, which optimum cannot feed: the files and names stay
    upstream's, and the report says why."""
    recipe = {"exports": [{"export_format": "onnx", "mode": "generation"}],
              "generation": {"cache_implementation": "static", "max_cache_len": 16}}
    model_dir = tiny_t5(tmp_path / "model", recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed"
    assert sorted(p.name for p in (out / "onnx").glob("*.onnx")) == ["decode.onnx", "encoder.onnx", "prefill.onnx"]
    assert any("has a fixed length" in f and "optimum" in f for f in target["findings"]), target["findings"]

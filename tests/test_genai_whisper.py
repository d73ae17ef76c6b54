"""Whisper in ONNX Runtime GenAI (#52 §3): a Whisper ONNX generation target in GenAI's 30-second window gets GenAI's
own two graphs (`genai_encoder.onnx` with the cross-attention cache, `genai_decoder.onnx`), derived from the
export's and holding no weights of their own, and their `genai_config.json` (type `whisper`); the product proves the
folder by GenAI transcribing the sample's spectrogram from the folder alone, token for token against eager
`generate()`, and the card's GenAI snippet runs as written. A Whisper outside that window is declined with the
reason (tests/test_speech_onnx_runtimes.py).

One run of a tiny Whisper with a real Whisper's 1500 source positions (3000 frames) through the real CLI (the shared
store's), in the default layout and in transformers.js's (whose `onnx/` graphs GenAI's sit beside).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import targets_by_name
from tests.export_store import stored_run
from tests.models import tiny_whisper

og = pytest.importorskip("onnxruntime_genai")

TARGET = {"export_format": "onnx", "mode": "generation", "dynamic": True}
# "fixed": the plainest target without `dynamic` (each graph at its traced sizes: the prompt's step at the prompt's
# length), whose GenAI decoder once declared the prompt step's outputs, which the next step's one token broke
RECIPE = {"exports": [{"name": "onnx", **TARGET}, {"name": "tjs", **TARGET, "layout": "transformers.js"},
                      {"name": "fixed", "export_format": "onnx", "mode": "generation"}],
          "generation": {"max_new_tokens": 8}}
RUNTIME = "ONNX Runtime GenAI"


@pytest.fixture(scope="module")
def whisper_genai(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai-whisper")
    return stored_run(tiny_whisper(root / "model", RECIPE, decoder_layers=2, feature_extractor=True,
                                   source_positions=1500))


@pytest.mark.parametrize("name, graphs", [("onnx", ""), ("tjs", "onnx/"), ("fixed", "")])
def test_a_whisper_in_genais_window_is_transcribed_by_genai_in_the_product(whisper_genai, name, graphs):
    """Every layout, and a decoder whose prompt step was traced at a fixed length: GenAI's decoder declares the
    merged decoder's outputs (an axis the steps fill differently a symbol), not the prompt step's (before: `Got
    invalid dimensions for output: present.0.decoder.key` at the second step, the target failed)."""
    import onnx

    out, report, log = whisper_genai
    target = targets_by_name(report)[name]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    proof = proofs[RUNTIME]
    assert proof["status"] == "passed", proof
    assert proof["detail"] == "8/8 tokens (a spectrogram of 3000 frames, og.Generator)", proof
    [row] = [line for line in (out / "report.md").read_text().splitlines() if line.startswith(f"| `{name}`")]
    assert f"{RUNTIME} ✓ 8/8 tokens" in row, row
    folder = out / name
    genai = json.loads((folder / "genai_config.json").read_text())
    assert genai["model"]["type"] == "whisper"
    assert genai["model"]["encoder"]["filename"] == f"{graphs}genai_encoder.onnx"
    assert genai["model"]["decoder"]["filename"] == f"{graphs}genai_decoder.onnx"
    assert genai["model"]["decoder"]["num_hidden_layers"] == 2 and genai["model"]["eos_token_id"] == 99
    decoder = onnx.load(str(folder / graphs / "genai_decoder.onnx"), load_external_data=False).graph
    # the self-attention presents grow with every step: their sequence axis is a symbol (this model's prompt is its
    # start token alone, so the logits' token axis is 1 at every step)
    presents = [o for o in decoder.output if o.name.startswith("present.")]
    assert presents and all(o.type.tensor_type.shape.dim[2].dim_param for o in presents), presents


def test_genais_whisper_graphs_have_its_names_and_share_the_exports_weights(whisper_genai):
    """The graphs' inputs and outputs are the names genai_config.json gives GenAI; every weight they hold outside the
    graph is read, at its offset, from the data file the export wrote (stored once); what sits in the graphs is
    only the few bytes of biases and shapes."""
    import onnx

    out, report, _ = whisper_genai
    target = targets_by_name(report)["onnx"]
    folder = out / target["name"]
    encoder = onnx.load(str(folder / "genai_encoder.onnx"), load_external_data=False).graph
    decoder = onnx.load(str(folder / "genai_decoder.onnx"), load_external_data=False).graph
    assert [i.name for i in encoder.input] == ["audio_features"]
    assert [o.name for o in encoder.output] == ["last_hidden_state"] + [
        f"present.{i}.encoder.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [i.name for i in decoder.input] == ["input_ids"] + [
        f"past_key_values.{i}.{part}.{kv}" for i in range(2) for part in ("decoder", "encoder")
        for kv in ("key", "value")]
    assert [o.name for o in decoder.output] == ["logits"] + [
        f"present.{i}.decoder.{kv}" for i in range(2) for kv in ("key", "value")]
    exported = {f["path"] for f in target["files"]}
    for graph in (encoder, decoder):
        external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert external, graph.name
        for tensor in external:
            location = {e.key: e.value for e in tensor.external_data}["location"]
            assert f"{target['name']}/{location}" in exported, location
        assert sum(len(t.raw_data) for t in graph.initializer) < 4096, graph.name


def test_genai_tokens_that_differ_from_eager_fail_the_whisper_proof(whisper_genai, tmp_path):
    from exporters.layouts import Genai

    out, report, _ = whisper_genai
    folder = out / "onnx"
    features = {"shape": [1, 16, 3000], "data": [0.0] * (16 * 3000)}
    wrong = {"speech": True, "prompt": [1], "steps": 3, "tokens": [127, 127, 127], "features": features}
    proof = Genai().prove(folder, wrong, None)  # GenAI runs in a child: its tokens come back as the proof's
    assert proof.status == "failed" and "tokens equal eager greedy: GenAI [" in proof.detail, proof
    short = {**wrong, "features": {"shape": [1, 16, 64], "data": [0.0] * (16 * 64)}}
    proof = Genai().prove(folder, short, None)
    assert proof.status == "failed" and "Whisper uses num_frames = 3000" in proof.detail, proof


def test_the_cards_genai_whisper_snippet_runs_as_written(whisper_genai, hub, tmp_path):
    """The card's snippet, run as written by the venv's Python against the Hub emulator: the folder's feature
    extractor on a tone (the folder has no tokenizer for GenAI's processor), then GenAI's generator from the decoder
    prompt read from generation_config.json (this model's: its start token alone)."""
    from tests.card_snippets import card_snippets, exports_card, run_snippet, upload_exports

    out, _, _ = whisper_genai
    commit = upload_exports(hub, "alice/whisper", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/whisper", out, commit))
                             if s[0] == RUNTIME and '"exports/onnx/*"' in s[2]]
    assert language == "python" and "og.NamedTensors()" in code and "AutoFeatureExtractor" in code
    done = run_snippet(code, hub, tmp_path / "home")
    assert done.returncode == 0, (code, done.stderr[-3000:])
    tokens = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(tokens) > 1 and tokens[0] == 1 and all(isinstance(t, int) for t in tokens)

"""#46 §5: a checkpoint shaped like openai/whisper-tiny (its full depth of 4 + 4 layers, its 51865-token vocabulary
with the output projection tied to the token embedding, 80 mel bins, 1500 source and 448 target positions, the
repo's own `generation_config.json` with `lang_to_id`, `task_to_id`, `forced_decoder_ids`, suppressed tokens and
alignment heads) through the plainest recipe in every format. Before, every format failed with
`KeyError: 'encoder_outputs'`: a multilingual config with no language makes `generate()` detect it first with a
forward pass of its own, which was captured as the prefill. One export (module fixture) through the real CLI.
"""

from __future__ import annotations

import json

import pytest

from exporters.export.footprint import weights_stored_bytes
from tests.conftest import run_and_read
from tests.models import whisper_tiny_shaped

PLAINEST = [{"export_format": "dynamo", "mode": "generation", "dynamic": True},
            {"export_format": "onnx", "mode": "generation", "dynamic": True},
            {"export_format": "executorch", "mode": "generation"},
            # #52 §4: transformers.js's layout, its graphs copied from the `onnx` target's export (no trace of its own)
            {"name": "tjs", "export_format": "onnx", "mode": "generation", "dynamic": True,
             "layout": "transformers.js"}]


@pytest.fixture(scope="module")
def whisper_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper-tiny-shaped")
    return run_and_read(root, whisper_tiny_shaped(root / "model", PLAINEST))


def test_a_whisper_tiny_shaped_checkpoint_passes_every_format(whisper_run):
    out, report, log = whisper_run
    targets = {t["name"]: t for t in report["targets"]}
    assert sorted(targets) == ["dynamo", "executorch", "onnx", "tjs"], log[-3000:]
    for name, target in targets.items():
        assert target["status"] == "passed", (name, log[-3000:], json.dumps(target, indent=1)[:5000])
        generation = target["generation"]
        assert generation["status"] == "passed", (name, generation)
        assert generation["exported_tokens"] == generation["eager_tokens"] and len(generation["eager_tokens"][0]) == 8
    # #52 §2: ExecuTorch's default for Whisper is the ASR runner's program, proven in ExecuTorch's runtime
    executorch = targets["executorch"]
    assert executorch["expected_components"] == ["encoder", "text_decoder"], executorch["expected_components"]
    proofs = {proof["runtime"]: proof for proof in executorch["runtimes"]}
    assert proofs["ExecuTorch ASR runner layout"]["status"] == "passed", proofs
    assert proofs["ExecuTorch ASR runner layout"]["detail"].startswith("8/8 tokens"), proofs
    # the repo's config kept in every folder; validation pinned the language and the report says so
    shipped = json.loads((out.parent / "model" / "generation_config.json").read_text())
    for name in targets:
        written = json.loads((out / name / "generation_config.json").read_text())
        assert "language" not in written and written["lang_to_id"] == shipped["lang_to_id"], name
    assert any("language <|en|> pinned" in f for f in report["findings"]), report["findings"]


def test_the_whisper_shaped_targets_report_the_weights_their_files_store(whisper_run):
    """The stored-weights ratio is the one read from the files: the ExecuTorch program (its tied table in model.ptd)
    and the ONNX graphs store the weights once; the dynamo target's three .pt2 files a copy each, said so."""
    out, report, _ = whisper_run
    targets = {t["name"]: t for t in report["targets"]}
    for name, target in targets.items():
        assert target["weights_stored_bytes"] == weights_stored_bytes(out / name, target["export_format"]), name
    executorch = targets["executorch"]
    assert executorch["weights_stored_bytes"] / executorch["parameter_bytes"] < 1.05, executorch
    assert (out / "executorch" / "model.ptd").is_file()
    assert targets["onnx"]["weights_stored_bytes"] / targets["onnx"]["parameter_bytes"] < 1.05
    dynamo = targets["dynamo"]
    assert dynamo["weights_stored_bytes"] / dynamo["parameter_bytes"] > 1.9
    assert any("separate .pt2" in f for f in dynamo["findings"]), dynamo["findings"]


def test_genai_transcribes_the_multilingual_whisper_from_generates_own_decoder_prompt(whisper_run):
    """#52: ONNX Runtime GenAI runs the multilingual checkpoint from the decoder prompt `generate()` builds from the
    repo's generation config (`<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`): GenAI's first step feeds
    those four tokens with an empty past, which the derived decoder graph computes with the merged decoder's no-past
    branch (the with-past branch holds one token); GenAI's own processor, from the `audio_processor_config.json` the
    layout writes (the repo ships none), tokenizes the prompt's text into the same ids and makes features of eager's
    shape; 8/8 tokens against eager `generate()`."""
    import onnx

    out, report, log = whisper_run
    target = {t["name"]: t for t in report["targets"]}["onnx"]
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    proof = proofs["ONNX Runtime GenAI"]
    assert proof["status"] == "passed", (proof, log[-3000:])
    assert proof["detail"] == ("8/8 tokens (a spectrogram of 3000 frames, decoder prompt [50258, 50259, 50359, 50363], "
                               "og.Generator); GenAI's processor made the prompt's ids from its text; eager's "
                               "suppressed-token lists off (GenAI has none)"), proof
    folder = out / "onnx"
    assert not (out.parent / "model" / "audio_processor_config.json").exists()  # the repo ships none
    steps = json.loads((folder / "audio_processor_config.json").read_text())["feature_extraction"]["sequence"]
    assert [step["operation"]["type"] for step in steps] == ["AudioDecoder", "STFTNorm", "LogMelSpectrum"]
    assert steps[2]["operation"]["attrs"] == {"chunk_size": 30, "hop_length": 160, "n_fft": 400, "n_mel": 80}
    assert "onnx/audio_processor_config.json" in {f["path"] for f in target["files"]}
    decoder = onnx.load(str(folder / "genai_decoder.onnx"), load_external_data=False).graph
    [branch] = [node for node in decoder.node if node.op_type == "If"]
    presents = [f"present.{i}.decoder.{kv}" for i in range(4) for kv in ("key", "value")]
    assert list(branch.output) == ["logits"] + presents


def test_the_cards_genai_whisper_snippet_transcribes_an_audio_file_with_genais_processor(whisper_run, hub, tmp_path):
    """The card's GenAI snippet for a folder with a tokenizer, run as written against the Hub emulator: GenAI's own
    processor decodes `audio.wav` and tokenizes the multilingual prompt (read from generation_config.json), GenAI
    generates and the processor decodes the transcription (special tokens skipped): words of the tokenizer's."""
    from tests.card_snippets import audio_home, card_snippets, exports_card, run_snippet, upload_exports

    out, _, _ = whisper_run
    commit = upload_exports(hub, "alice/whisper-tiny", out, ["onnx"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/whisper-tiny", out, commit))
                             if s[0] == "ONNX Runtime GenAI" and '"exports/onnx/*"' in s[2]]
    assert language == "python" and "create_multimodal_processor()" in code and 'og.Audios.open("audio.wav")' in code
    done = run_snippet(code, hub, audio_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    printed = done.stdout.strip().splitlines()[-1].split()
    assert printed and "<|startoftranscript|>" not in printed, done.stdout[-2000:]


def test_genais_whisper_proof_fails_where_its_processor_cannot_load(whisper_run, tmp_path):
    """The proof runs GenAI's own processor where the folder has a tokenizer: a copy of the folder without the
    `audio_processor_config.json` the layout wrote fails, saying it was the processor (GenAI's message)."""
    import shutil

    from exporters.layouts import Genai

    out, _, _ = whisper_run
    folder = tmp_path / "onnx"
    shutil.copytree(out / "onnx", folder)
    (folder / "audio_processor_config.json").unlink()
    reference = {"speech": True, "prompt": [50258, 50259, 50359, 50363], "steps": 2, "tokens": [0, 0],
                 "features": {"shape": [1, 80, 3000], "data": [0.0] * (80 * 3000)}}
    proof = Genai().prove(folder, reference, None)
    assert proof.status == "failed", proof
    assert "GenAI's processor (audio_processor_config.json, the tokenizer) failed" in proof.detail, proof


def test_transformers_js_transcribes_the_multilingual_whisper_and_its_card_script_runs(whisper_run, tmp_path):
    """#52 §4: transformers.js's `generate()` gives a multilingual Whisper that names no language English
    (`<|en|>`), the language validation pins: its proof compares with eager greedy from the repo's config with that
    pin, as validation's (unpinned, eager first detected a language of its own and the correct folder failed, 0/8).
    The card's script, as written, runs on the folder (laid out as its download line puts it) and prints the
    transcription (before: the ids): eager greedy `generate()`'s 32 tokens on the card's one-second tone (as the
    proof's reference makes them), decoded by the folder's tokenizer, special tokens skipped."""
    from types import SimpleNamespace

    import numpy
    from transformers import AutoFeatureExtractor, AutoTokenizer, WhisperForConditionalGeneration

    from exporters.layouts.transformers_js.speech_proof import reference
    from exporters.publish.snippets import target_snippets
    from tests.card_snippets import run_js_card

    out, report, log = whisper_run
    target = {t["name"]: t for t in report["targets"]}["tjs"]
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    proof = proofs["transformers.js"]
    assert proof["status"] == "passed" and proof["detail"].startswith("8/8 tokens (transformers.js "), (proof,
                                                                                                      log[-3000:])
    assert target["generation"]["eager_tokens"][0] == target["generation"]["exported_tokens"][0]
    snippets = {runtime: code for runtime, _, code in target_snippets("org/whisper-tiny", target)}
    printed = run_js_card(snippets["transformers.js"], out / "tjs", tmp_path)
    model = WhisperForConditionalGeneration.from_pretrained(out.parent / "model").eval()
    extractor = AutoFeatureExtractor.from_pretrained(out / "tjs")
    seconds = numpy.arange(extractor.sampling_rate) / extractor.sampling_rate
    features = extractor(0.5 * numpy.sin(2 * numpy.pi * 440 * seconds), sampling_rate=extractor.sampling_rate,
                         return_tensors="pt").input_features
    eager = reference(model, SimpleNamespace(generate_inputs={"input_features": features}, generation_config=None),
                      32)["tokens"]
    text = AutoTokenizer.from_pretrained(out / "tjs").decode(eager, skip_special_tokens=True)
    assert text.strip() and printed == text.strip(), (printed, eager, text)


def test_the_cards_executorch_snippet_transcribes_from_generates_own_decoder_prompt(whisper_run, hub, tmp_path):
    """The card's ExecuTorch ASR snippet, run as written against the Hub emulator: its decoder prompt is the one
    `generate()` builds from the folder's generation_config.json (`<|startoftranscript|><|en|><|transcribe|>
    <|notimestamps|>` for this multilingual Whisper; before, the start token alone, a prompt the proof never ran), so
    its tokens on the card's one-second tone are eager greedy `generate()`'s on the same features (its argmax alone:
    no suppressed-token lists, as the runner)."""
    import numpy
    from transformers import AutoFeatureExtractor, AutoTokenizer, WhisperForConditionalGeneration

    from exporters.capture.generation_settings import greedy
    from tests.card_snippets import card_snippets, exports_card, run_snippet, upload_exports

    out, _, _ = whisper_run
    commit = upload_exports(hub, "alice/whisper-tiny", out, ["executorch"])
    [(_, language, code)] = [s for s in card_snippets(exports_card("alice/whisper-tiny", out, commit))
                             if s[0] == "ExecuTorch ASR runner layout"]
    done = run_snippet(code, hub, tmp_path / "home")
    assert done.returncode == 0, (code, done.stderr[-3000:])
    model = WhisperForConditionalGeneration.from_pretrained(out.parent / "model").eval()
    extractor = AutoFeatureExtractor.from_pretrained(out.parent / "model")
    seconds = numpy.arange(extractor.sampling_rate) / extractor.sampling_rate
    features = extractor(0.5 * numpy.sin(2 * numpy.pi * 440 * seconds), sampling_rate=extractor.sampling_rate,
                         return_tensors="pt").input_features
    config = greedy(model.generation_config, max_new_tokens=32)  # the card's 32, up to eos
    config.suppress_tokens, config.begin_suppress_tokens = None, None
    generated = model.generate(input_features=features, generation_config=config, return_dict_in_generate=True,
                               output_scores=True)
    eager = generated.sequences[0, -len(generated.scores):].tolist()  # the new tokens (generate() drops its prompt)
    # it prints the transcription: the new tokens decoded by the folder's tokenizer, special tokens skipped (before:
    # the ids)
    text = AutoTokenizer.from_pretrained(out / "executorch").decode(eager, skip_special_tokens=True)
    assert text.strip() and done.stdout == text + "\n", (done.stdout, eager, text)

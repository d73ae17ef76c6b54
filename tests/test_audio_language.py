"""Audio-language models (#50 item 1, #52 item 1 for audio): a tiny Voxtral (and Qwen2-Audio) is exported with its audio components
(audio encoder, projector, token embedding, language model on embeddings) for dynamo and ONNX, and as ExecuTorch
MultimodalRunner's program (token_embedding, audio_encoder, text_decoder) by default, each validated end to end from
log-mel features of a synthetic waveform to generated tokens against eager `generate()`, token for token; the
runner's own Python binding generates the same tokens from the folder alone."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_and_read, run_cli, targets_by_name
from tests.models import tiny_qwen2_audio_with_tokenizer, tiny_voxtral_with_tokenizer

RUNTIME = "ExecuTorch MultimodalRunner"
# The plainest recipes: dynamo, ONNX generation with a dynamic prompt, ExecuTorch's default (the runner's program)
RECIPE = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
          {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},
          {"name": "executorch", "export_format": "executorch", "mode": "generation"}]
STAGES = ["audio_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head", "decode"]
# One text layer: no check here reads the language model's depth (#48)
TEXT_LAYERS = 1


@pytest.fixture(scope="module")
def voxtral_run(tmp_path_factory):
    """The tiny Voxtral with its tokenizer and feature extractor, the three targets in one run of the real CLI."""
    root = tmp_path_factory.mktemp("voxtral")
    model_dir = tiny_voxtral_with_tokenizer(root / "model", RECIPE, text_layers=TEXT_LAYERS)
    out, report, log = run_and_read(root, model_dir)
    return model_dir, out, report, log


def test_every_target_passes_with_its_audio_components_token_for_token(voxtral_run):
    """No target passes on the language model alone: each holds the audio encoder and projector (dynamo, ONNX) or
    the runner's audio_encoder method, and generates eager's tokens from the audio and the prompt."""
    _, out, report, log = voxtral_run
    targets = targets_by_name(report)
    assert report["family"] == "audio-language", report.get("family")
    for name, target in targets.items():
        assert target["status"] == "passed", (name, log[-3000:], json.dumps(target, indent=1)[:5000])
        generation = target["generation"]
        assert generation["status"] == "passed", (name, generation)
        assert generation["exported_tokens"] == generation["eager_tokens"] and len(generation["eager_tokens"][0]) == 8
    for name in ("dynamo", "onnx"):
        assert [c["name"] for c in targets[name]["components"]] == STAGES, targets[name]["components"]
        assert targets[name]["expected_components"] == STAGES
    assert [c["name"] for c in targets["executorch"]["components"]] == ["token_embedding", "audio_encoder",
                                                                         "text_decoder"]
    onnx_files = {p.name for p in (out / "onnx").iterdir()}
    assert {"audio_encoder.onnx", "multi_modal_projector.onnx", "language_model.onnx"} <= onnx_files
    assert "VoxtralForConditionalGeneration reads audio" not in (out / "report.md").read_text()
    [genai] = [proof for proof in targets["onnx"]["runtimes"] if proof["runtime"] == "ONNX Runtime GenAI"]
    assert genai["status"] == "declined" and "no audio-language model type 'voxtral'" in genai["detail"], genai
    assert not (out / "onnx" / "genai_config.json").exists()


def test_the_tokens_compared_depend_on_the_audio(voxtral_run):
    """The parity is sensitive to the audio path: eager's tokens from the prompt with its audio features differ from
    eager's tokens from the same ids without them, so a folder that dropped its audio could not match."""
    import torch
    from transformers import VoxtralForConditionalGeneration

    from exporters.capture.inputs import make_sample_inputs
    from exporters.recipe.model import InputsSpec

    model_dir, _, report, _ = voxtral_run
    assert targets_by_name(report)["dynamo"]["generation"]["prompt_length"] == 1 + 25 + 8  # BOS, 25 audio tokens, prompt
    model = VoxtralForConditionalGeneration.from_pretrained(model_dir).eval()
    inputs = make_sample_inputs(model, InputsSpec(sequence_length=8)).generate
    assert int((inputs["input_ids"] == model.config.audio_token_id).sum()) == 25  # 50 positions, stacked by 2
    with torch.no_grad():
        heard = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
        unheard = model.generate(input_ids=inputs["input_ids"], max_new_tokens=8, do_sample=False)[0, -8:].tolist()
    assert heard != unheard


def test_features_are_made_by_the_models_extractor_from_a_waveform(voxtral_run):
    """The features are the folder's extractor's log-mel spectrogram of a synthetic waveform (frames and bins from
    the model, never a constant), and with no extractor, one built from the audio config makes the same."""
    import torch
    from transformers import VoxtralForConditionalGeneration

    from exporters.capture.audio_text import encoder_frames, extractor_from_config
    from exporters.capture.inputs import make_sample_inputs
    from exporters.capture.multimodal import synthetic_waveform
    from exporters.recipe.model import InputsSpec

    model_dir, out, report, _ = voxtral_run
    assert any("made by the folder's WhisperFeatureExtractor" in f for f in report["findings"]), report["findings"]
    probe = targets_by_name(report)["dynamo"]["components"][0]["checks"][0]
    assert probe["shapes"]["input_features"] == [1, 16, 100]
    model = VoxtralForConditionalGeneration.from_pretrained(model_dir).eval()
    assert encoder_frames(model) == 100
    sample = make_sample_inputs(model, InputsSpec(sequence_length=8))  # no folder: the audio config's extractor
    extractor = extractor_from_config(model.config.audio_config, 100)
    expected = extractor(synthetic_waveform(16000, 1.0, 0), sampling_rate=16000, return_tensors="pt")["input_features"]
    assert torch.equal(sample.generate["input_features"], expected)
    assert sample.generate["input_features"].std() > 0.1
    with pytest.raises(Exception, match="inputs.audio_length is 64"):
        make_sample_inputs(model, InputsSpec(sequence_length=8, audio_length=64))


def test_the_executorch_folder_is_the_multimodal_runners_program(voxtral_run):
    """One model.pte with token_embedding, audio_encoder, text_decoder and the runner's metadata (audio_token_id as
    optimum-executorch writes it), proven by the runner's binding generating from an audio and a prompt."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    _, out, report, _ = voxtral_run
    target = targets_by_name(report)["executorch"]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    # its audio_encoder takes any number of chunks (#52 item 2): the runner generates from two too, 25 audio tokens more
    assert proofs[RUNTIME]["detail"] == ("8/8 tokens from an audio and a prompt (34 positions); 8/8 tokens from two "
                                         "chunks of audio and a prompt (59 positions)"), proofs
    audio_encoder = {c["name"]: c for c in target["components"]}["audio_encoder"]
    assert audio_encoder["checks"][0]["shapes"]["input_features"] == [2, 16, 100], audio_encoder  # traced on two
    folder = out / "executorch"
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "multimodal_runner"
    assert {e["file"] for e in manifest["components"].values()} == {"model.pte"}
    program = Runtime.get().load_program(folder / "model.pte")
    assert {"token_embedding", "audio_encoder", "text_decoder", "get_max_seq_len", "get_eos_ids",
            "audio_token_id"} <= set(program.method_names)
    config = json.loads((folder / "config.json").read_text())
    assert program.load_method("audio_token_id").execute([]) == [config["audio_token_id"]]
    assert {"tokenizer.json", "preprocessor_config.json"} <= {p.name for p in folder.iterdir()}


def test_the_cards_audio_snippet_runs_as_written(voxtral_run, hub, tmp_path):
    """The card's MultimodalRunner snippet for an audio-language program, run as written against the Hub emulator:
    the proof's input list and call, every line of them."""
    from exporters.layouts.executorch_multimodal import AUDIO_INPUTS, GENERATE, RUNNER_IMPORTS
    from tests.card_snippets import card_snippets, exports_card, run_snippet, upload_exports

    _, out, _, _ = voxtral_run
    commit = upload_exports(hub, "alice/voxtral", out, ["executorch"])
    snippets = card_snippets(exports_card("alice/voxtral", out, commit))
    [(language, code)] = [(language, code) for runtime, language, code in snippets if runtime == RUNTIME]
    assert language == "python" and f'revision="{commit}"' in code
    assert RUNNER_IMPORTS in code and AUDIO_INPUTS in code and GENERATE.split("(")[0] in code
    done = run_snippet(code, hub, tmp_path / "home")
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()


def test_qwen2_audio_exports_its_audio_stages_and_runs_in_the_multimodal_runner(tmp_path):
    """Qwen2-Audio counts its audio tokens with its audio tower's output lengths and takes a feature mask: its ONNX
    generation target holds the audio stages and generates eager's tokens; its ExecuTorch target is
    MultimodalRunner's program (#52 item 1: `audio_encoder` its audio tower then its projector, on features whose
    every frame counts, as the sample's mask says; it kept the methods layout before, having no
    `get_audio_features`), and the runner's own Python binding generates eager's tokens from the folder alone.
    Its transformers.js target (transformers.js has no Qwen2-Audio class) keeps the audio components and passes on
    its own checks, transformers.js's cell ✗ with the reason."""
    tjs = {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}
    model_dir = tiny_qwen2_audio_with_tokenizer(tmp_path / "model", [*RECIPE[1:], tjs], text_layers=TEXT_LAYERS)
    out = tmp_path / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    targets = targets_by_name(report)
    for name, target in targets.items():
        assert target["status"] == "passed", (name, done.stderr[-3000:], json.dumps(target, indent=1)[:4000])
        generation = target["generation"]
        assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
        assert len(set(generation["eager_tokens"][0])) > 1, "greedy tokens vary: the check can fail"
    assert [c["name"] for c in targets["onnx"]["components"]] == STAGES, targets["onnx"]["components"]
    executorch = targets["executorch"]
    assert [c["name"] for c in executorch["components"]] == ["token_embedding", "audio_encoder", "text_decoder"]
    assert json.loads((out / "executorch" / "export.json").read_text()).get("layout") == "multimodal_runner"
    proofs = {p["runtime"]: p for p in executorch["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    assert not any("get_audio_features" in f for f in report["findings"]), report["findings"]
    assert [c["name"] for c in targets["tjs"]["components"]] == STAGES, targets["tjs"]["components"]
    proof = {p["runtime"]: p for p in targets["tjs"]["runtimes"]}["transformers.js"]
    assert proof["status"] == "declined" and "'qwen2_audio'" in proof["detail"], proof
    assert "transformers.js 4.3.2 has no audio-language model class for 'qwen2_audio'" in (out / "report.md").read_text()
    assert not (out / "tjs" / "onnx").exists()


def test_an_audio_language_model_whose_code_counts_no_audio_tokens_is_refused():
    """Where neither `get_audio_features` nor the audio tower's output lengths say how many audio tokens the features
    take, the audio cannot be laid out in a prompt: refused, naming the audio encoder and projector."""
    from transformers import Qwen2AudioForConditionalGeneration

    from exporters.capture.inputs import make_sample_inputs
    from exporters.errors import UnsupportedModelError
    from exporters.recipe.model import InputsSpec
    from matrix.families import FAMILIES, tiny_model

    model = tiny_model(FAMILIES["qwen2_audio"])
    assert isinstance(model, Qwen2AudioForConditionalGeneration)
    model.model.audio_tower._get_feat_extract_output_lengths = None  # a tower that does not say its output length
    with pytest.raises(UnsupportedModelError, match="in an 'audio-language' model .*this model has neither") as caught:
        make_sample_inputs(model, InputsSpec(sequence_length=8))
    assert "`model.audio_tower`, `model.multi_modal_projector`" in str(caught.value)


def test_hf_export_validate_judges_the_folders_again(voxtral_run):
    """`hf-export validate` of the written folders (last here: it writes the report again) plans the same layouts
    from their export.json and passes them, the ExecuTorch one with the runner's proof (the dynamo programs are
    pickles a later run does not load without `--trust-remote-code`: left out)."""
    model_dir, out, _, _ = voxtral_run
    done = run_cli("validate", str(model_dir), str(out), "--target", "onnx", "--target", "executorch")
    assert done.returncode == 0, done.stderr[-3000:]
    targets = targets_by_name(json.loads((out / "report.json").read_text()))
    assert {targets[name]["status"] for name in ("onnx", "executorch")} == {"passed"}, targets
    assert targets["executorch"]["expected_components"] == ["token_embedding", "audio_encoder", "text_decoder"]
    assert {p["runtime"]: p["status"] for p in targets["executorch"]["runtimes"]} == {RUNTIME: "passed"}

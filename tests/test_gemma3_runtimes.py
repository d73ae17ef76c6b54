"""Gemma 3 (vision) in the multimodal runtimes (#52 items 1, 3 and 5). Gemma 3's prefill attends bidirectionally
among one image's tokens (transformers' mask from the processor's `token_type_ids`). ExecuTorch's `MultimodalRunner`
prefills the image in a call of its own, so the program marks the image's rows (one embedding channel more) and its
`text_decoder` attends both ways among them (optimum-executorch's Gemma 3 program is causal there): the plainest
ExecuTorch generation recipe of a tiny Gemma 3 (with its own processor) is the runner's program, proven by the
runner's Python binding token for token against eager `generate()`, tokens a causal prefill does not generate; its
card snippet runs as written. ONNX Runtime GenAI 0.18 runs its `gemma3` type's text model causally: the ONNX target
says GenAI ✗ with that fact. PaliGemma's bidirectional prefix spans the image and the text, which the runner
prefills apart: its layout is declined with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, run_and_read, run_cli, targets_by_name
from tests.models import family_model, tiny_gemma3_with_processor

RUNTIME = "ExecuTorch MultimodalRunner"
BIDIRECTIONAL = "its prefill attends bidirectionally among one image's tokens"
# Two text layers, not one: with one, the image positions' keys and values are their embeddings whatever the mask,
# and the bidirectional attention never reaches the text's logits
TEXT_LAYERS = 2


@pytest.fixture(scope="module")
def gemma3_run(tmp_path_factory):
    """The tiny Gemma 3 with its processor through the real CLI: the plainest ExecuTorch generation target and the
    plainest ONNX one (GenAI's), one run."""
    root = tmp_path_factory.mktemp("gemma3")
    recipe = {"exports": [PLAINEST_EXECUTORCH, {"export_format": "onnx", "mode": "generation"}]}
    model_dir = tiny_gemma3_with_processor(root / "model", recipe, text_layers=TEXT_LAYERS)
    out, report, log = run_and_read(root, model_dir)
    return model_dir, out, report, log


def test_the_plainest_gemma3_recipe_passes_and_runs_in_the_multimodal_runner(gemma3_run):
    _, out, report, log = gemma3_run
    target = targets_by_name(report)["executorch"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert {p["runtime"]: p["status"] for p in target["runtimes"]} == {RUNTIME: "passed"}, target["runtimes"]
    [proof] = target["runtimes"]
    assert proof["detail"].startswith("8/8 tokens from an image and a prompt"), proof
    assert f"{RUNTIME} ✓ 8/8 tokens" in (out / "report.md").read_text()
    manifest = json.loads((out / "executorch" / "export.json").read_text())
    assert manifest["layout"] == "multimodal_runner"
    assert sorted(manifest["components"]) == ["text_decoder", "token_embedding", "vision_encoder"]


def test_the_program_holds_the_bidirectional_image_attention_a_causal_prefill_does_not(gemma3_run):
    """The runner's tokens are eager's with the processor's token_type_ids; a causal prefill of the same sample
    (what optimum-executorch's program and a plain `text_decoder` compute) generates others, so the proof tells the
    two apart. The program marks rows: `token_embedding`'s last channel 0, `vision_encoder`'s 1."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime
    from PIL import Image
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    from exporters.capture.multimodal import DEFAULT_PROMPT, synthetic_image

    model_dir, out, report, _ = gemma3_run
    runner_tokens = targets_by_name(report)["executorch"]["generation"]["eager_tokens"][0]
    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(synthetic_image(32, 0))  # the sample's image (seed 0)
    inputs = processor(text=[f"{processor.image_token}{DEFAULT_PROMPT}"], images=[[image]], return_tensors="pt")
    assert inputs["token_type_ids"].sum() == 4  # the image's tokens
    model = Gemma3ForConditionalGeneration.from_pretrained(model_dir).eval()
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, length:].tolist()
        causal = model.generate(**{k: v for k, v in inputs.items() if k != "token_type_ids"}, max_new_tokens=8,
                                do_sample=False)[0, length:].tolist()
    assert eager == runner_tokens, (eager, runner_tokens)
    assert causal != eager, causal
    folder = out / "executorch"
    data = folder / "model.ptd"  # tied embeddings: the weights beside the program, the table once
    program = Runtime.get().load_program(folder / "model.pte", data_path=data if data.is_file() else None)
    text = program.load_method("token_embedding").execute([inputs["input_ids"]])[0]
    rows = program.load_method("vision_encoder").execute([inputs["pixel_values"]])[0]
    hidden = model.config.text_config.hidden_size
    assert text.shape[-1] == rows.shape[-1] == hidden + 1
    assert text[..., -1].eq(0).all() and rows[..., -1].eq(1).all()


def test_the_cards_gemma3_snippet_runs_as_written(gemma3_run, hub, tmp_path):
    """The card's `MultimodalRunner` snippet, run as written against the Hub emulator (an image.jpg put where it
    reads one): the folder's Gemma 3 processor, its image token, the runner."""
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    _, out, _, _ = gemma3_run
    commit = upload_exports(hub, "alice/gemma3", out, ["executorch"])
    [(language, code)] = [(language, code) for runtime, language, code
                          in card_snippets(exports_card("alice/gemma3", out, commit)) if runtime == RUNTIME]
    assert language == "python" and f'revision="{commit}"' in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()


def test_onnx_runtime_genai_declines_gemma3_for_its_bidirectional_image_attention(gemma3_run):
    _, out, report, log = gemma3_run
    target = targets_by_name(report)["onnx"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    [proof] = [proof for proof in target["runtimes"] if proof["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "declined" and BIDIRECTIONAL in proof["detail"], proof
    assert "GenAI 0.18 runs its 'gemma3' text model causally over the whole prompt" in proof["detail"], proof
    assert not (out / "onnx" / "genai_config.json").exists()


def test_asking_for_the_multimodal_runner_layout_on_paligemma_is_refused_naming_its_prefix(tmp_path):
    """PaliGemma attends both ways over the image and the prompt, which the runner prefills in calls of their own:
    a recipe that asks for the runner's layout fails at planning (no export), naming the reason."""
    recipe = {"export_format": "executorch", "mode": "generation", "layout": "multimodal_runner"}
    model_dir = family_model("paligemma", tmp_path / "model", recipe, **{"text_config.num_hidden_layers": 1})
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(tmp_path / "out"), "--quiet")
    [target] = json.loads((tmp_path / "out" / "report.json").read_text())["targets"]
    assert target["status"] == "failed", (done.stderr[-3000:], json.dumps(target, indent=1)[:4000])
    message = target["error"]["message"]
    assert message.startswith("layout 'multimodal_runner' cannot be exported: its prefill attends bidirectionally "
                              "over the image's tokens and the prompt, its prefix"), message
    assert "prefills the image and the text in calls of their own" in message and "use layout 'methods'" in message

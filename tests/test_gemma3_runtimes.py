"""Gemma 3 (vision) in the multimodal runtimes (#52 items 1, 3 and 5). Gemma 3's prefill attends bidirectionally
among one image's tokens (transformers' mask from the processor's `token_type_ids`). ExecuTorch's `MultimodalRunner`
prefills the image in a call of its own, so the program marks the image's rows (one embedding channel more) and its
`text_decoder` attends both ways among them (optimum-executorch's Gemma 3 program is causal there): the plainest
ExecuTorch generation recipe of a tiny Gemma 3 (with its own processor) is the runner's program, proven by the
runner's Python binding token for token against eager `generate()`, tokens a causal prefill does not generate; its
card snippet runs as written. ONNX Runtime GenAI 0.18 runs its `gemma3` type's text model causally: the ONNX target
says GenAI ✗ with that fact. PaliGemma's bidirectional prefix spans the image and the text, which the runner
prefills apart: its layout is declined with the reason. A Gemma 3 whose sliding window is shorter than the cache runs
there too, its sliding layer a ring buffer (the runner given the prompt's text in pieces of the window), its tokens
eager's, and two wrong ring masks generate others.
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


# #52 item 5: Gemma 3's sliding-window layers shorter than the cache. The tiny model's text layers are a sliding layer
# of this window then a full one; the processor's prompt is 11 positions (an image's run of 4), so with 8 new tokens
# the generation crosses the window three times over and the ring of 2 x WINDOW slots wraps
WINDOW = 5


@pytest.fixture(scope="module")
def windowed_gemma3(tmp_path_factory):
    """The tiny Gemma 3 with a sliding-window layer of WINDOW, the plainest ExecuTorch generation recipe, through the
    shared export store."""
    from tests.export_store import stored_run

    root = tmp_path_factory.mktemp("gemma3-windowed")
    model_dir = tiny_gemma3_with_processor(root / "model", {"exports": [PLAINEST_EXECUTORCH]},
                                           text_layers=TEXT_LAYERS, sliding_window=WINDOW)
    return (model_dir, *stored_run(model_dir))


def _windowed_inputs(model_dir):
    from PIL import Image
    from transformers import AutoProcessor

    from exporters.capture.multimodal import DEFAULT_PROMPT, synthetic_image

    processor = AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(synthetic_image(32, 0))  # the sample's image (seed 0)
    return processor(text=[f"{processor.image_token}{DEFAULT_PROMPT}"], images=[[image]], return_tensors="pt")


def test_a_windowed_gemma3_runs_in_the_multimodal_runner_with_ring_buffers(windowed_gemma3):
    """The plainest recipe of a Gemma 3 whose sliding window (5) is shorter than the cache is the runner's program:
    its sliding layer a ring buffer of 10 slots (`llama::update_cache_with_indices`), one `text_decoder` call at most
    the window (`get_max_seq_len` 5), the prompt's text given to the runner in pieces of it. Validation's 8 tokens
    and the runner's equal eager `generate()`'s, and eager's own differ with a window of 4, 6 or none: the proof
    sees the window."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime
    from transformers import Gemma3ForConditionalGeneration

    model_dir, out, report, log = windowed_gemma3
    target = targets_by_name(report)["executorch"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert generation["prompt_length"] == 11 and len(generation["exported_tokens"][0]) == 8  # 19 > 2 * WINDOW
    [proof] = target["runtimes"]
    assert proof["runtime"] == RUNTIME and proof["status"] == "passed", proof
    assert proof["detail"].startswith("8/8 tokens from an image and a prompt (11 positions)"), proof
    assert f"{RUNTIME} ✓ 8/8 tokens" in (out / "report.md").read_text()
    folder = out / "executorch"
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "multimodal_runner" and manifest["custom_ops"] is True
    program = Runtime.get().load_program(folder / "model.pte")
    assert program.load_method("get_max_seq_len").execute([]) == [WINDOW]
    assert "update_cache_with_indices" in (folder / "model.pte").read_bytes().decode("latin-1")
    assert any(f"ring buffers of {2 * WINDOW} slots, not 2048" in f and "each image fits one call" in f
               for f in target["findings"]), target["findings"]
    assert not any("keeps its sliding-window layers whole" in f for f in target["findings"]), target["findings"]
    inputs, model = _windowed_inputs(model_dir), Gemma3ForConditionalGeneration.from_pretrained(model_dir).eval()
    length = inputs["input_ids"].shape[1]
    others = []
    with torch.no_grad():
        for window in (WINDOW - 1, WINDOW + 1, 4096):
            model.config.text_config.sliding_window = window
            others.append(model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, length:].tolist())
    assert all(tokens != generation["eager_tokens"][0] for tokens in others), (others, generation)


def _ring_tokens(model, inputs, steps: int = 8) -> list[int]:
    """The runner program's methods as eager modules, its custom ops and ring buffers swapped in, fed as the runner
    feeds them (each image one call, the text in calls of at most the window), greedy: the program before lowering."""
    from exporters.upstream.llm_runner import custom_ops_installed
    from exporters.upstream.multimodal_runner import multimodal_modules, text_attention_as_custom_sdpa
    from exporters.validate.multimodal_runner import runner_calls

    modules = multimodal_modules(model, 64, marked=True)
    decoder, ids = modules["text_decoder"], inputs["input_ids"]
    where = ids[0] == model.config.image_token_id
    with torch.no_grad():
        embeds = modules["token_embedding"](ids)
        embeds[0, where] = modules["vision_encoder"](inputs["pixel_values"])[0]
        with custom_ops_installed(decoder, model, explicit_mask=True), text_attention_as_custom_sdpa(model):
            for start, end in runner_calls(where.tolist(), decoder.max_seq_len):
                logits = decoder(embeds[:, start:end], torch.arange(start, end))["logits"]  # the runner program returns {"logits"}
            tokens = [int(logits[0, -1].argmax())]
            for position in range(ids.shape[1], ids.shape[1] + steps - 1):
                step = modules["token_embedding"](torch.tensor([[tokens[-1]]]))
                tokens.append(int(decoder(step, torch.tensor([position]))["logits"][0, -1].argmax()))
    return tokens


@pytest.mark.parametrize("mutant", [None, "window", "image"])
def test_the_ring_buffers_mask_is_the_one_eager_applies(windowed_gemma3, mutant, monkeypatch):
    """The ring's mask (`llm_runner.ring_mask`) is what makes the program's tokens eager's: unchanged, the program
    before lowering generates the export's tokens; a mask one position too wide (`delta <= window`) or one that
    drops the decoder's marked mask (the image's rows causal in the sliding layer) generates others."""
    from transformers import Gemma3ForConditionalGeneration

    from exporters.upstream import llm_runner

    model_dir, _, report, _ = windowed_gemma3
    eager = targets_by_name(report)["executorch"]["generation"]["eager_tokens"][0]
    original = llm_runner.ring_mask

    def wrong(positions, window, start, seq, allowed=None):
        if mutant == "window":  # the key one position past the window seen too
            behind = (start + torch.arange(seq))[:, None] - torch.arange(allowed.shape[1])[None, :]
            return original(positions, window + 1, start, seq, torch.where(behind == window, 0.0, allowed))
        return original(positions, window, start, seq, None)

    if mutant:
        monkeypatch.setattr(llm_runner, "ring_mask", wrong)
    tokens = _ring_tokens(Gemma3ForConditionalGeneration.from_pretrained(model_dir).eval(), _windowed_inputs(model_dir))
    assert (tokens == eager) is (mutant is None), (mutant, tokens, eager)


def test_the_cards_windowed_gemma3_snippet_runs_as_written(windowed_gemma3, hub, tmp_path):
    """The card's snippet of the windowed program, run as written: it reads the program's get_max_seq_len and gives
    the runner the prompt's text in pieces no longer (the runner runs each text input in one call)."""
    from tests.card_snippets import card_snippets, exports_card, image_home, run_snippet, upload_exports

    _, out, _, _ = windowed_gemma3
    commit = upload_exports(hub, "alice/gemma3-windowed", out, ["executorch"])
    [code] = [code for runtime, _, code in card_snippets(exports_card("alice/gemma3-windowed", out, commit))
              if runtime == RUNTIME]
    assert 'load_method("get_max_seq_len")' in code and "text[j:j + step]" in code
    done = run_snippet(code, hub, image_home(tmp_path))
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip()


def test_a_window_the_runner_cannot_hold_is_declined_with_the_reason(windowed_gemma3):
    """The rings are ExecuTorch's custom ops, and the runner prefills an image in one call: a target that turns the
    ops off, or a window shorter than the image's 4 tokens, keeps the methods layout, the report saying which; a
    recipe that asks for the runner's layout there fails at planning."""
    from transformers import Gemma3ForConditionalGeneration

    from exporters.capture import multimodal_runner
    from exporters.errors import TargetPlanError
    from exporters.recipe.load import parse_recipe

    model_dir = windowed_gemma3[0]
    model = Gemma3ForConditionalGeneration.from_pretrained(model_dir).eval()
    inputs = dict(_windowed_inputs(model_dir))
    plain = parse_recipe(json.dumps(PLAINEST_EXECUTORCH)).exports[0]
    assert multimodal_runner.refused(plain, model, inputs, 2048) is None
    off = parse_recipe(json.dumps({**PLAINEST_EXECUTORCH, "custom_ops": False})).exports[0]
    why = multimodal_runner.refused(off, model, inputs, 2048)
    assert why is not None and f"sliding-window layers (window {WINDOW}" in why and "custom ops" in why, why
    model.config.text_config.sliding_window = 3
    why = multimodal_runner.refused(plain, model, inputs, 2048)
    assert why is not None and "its image's 4 tokens do not fit one text_decoder call of its sliding window (3)" in why
    asked = parse_recipe(json.dumps({**PLAINEST_EXECUTORCH, "layout": "multimodal_runner"})).exports[0]
    with pytest.raises(TargetPlanError, match="sliding window"):
        multimodal_runner.refused(asked, model, inputs, 2048)

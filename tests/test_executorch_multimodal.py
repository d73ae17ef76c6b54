"""ExecuTorch MultimodalRunner's layout (#52 item 1): the plainest ExecuTorch generation recipe of a LLaVA-style model
is one model.pte with the runner's methods and metadata, proven by executorch's own `MultimodalRunner` generating
from an image and a prompt, token for token with eager `generate()`, and its card snippet runs as written."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import image_proof_context, image_proven, run_plainest_executorch
from tests.models import tiny_llava_with_processor

RUNTIME = "ExecuTorch MultimodalRunner"
# One text layer: the layout's methods and the runner's loop are no layer's (#48: half the text decoder to lower)
TEXT_LAYERS = 1


# LLaVA 1.5's turns (llava-hf's chat_template.jinja, its image as the `<image>` token)
LLAVA_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}"
                       "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %} "
                       "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def _llava_with_chat_template(folder, recipe, **options):
    """The tiny LLaVA with its processor and LLaVA's chat template, as a LLaVA repository holds one."""
    model_dir = tiny_llava_with_processor(folder, recipe, **options)
    (model_dir / "chat_template.jinja").write_text(LLAVA_CHAT_TEMPLATE, encoding="utf-8")
    return model_dir


@pytest.fixture(scope="module")
def llava_runner(tmp_path_factory):
    """The tiny LLaVA with its processor and chat template (the sample's prompt and the card's are one user turn
    in it), the plainest ExecuTorch recipe, through the real CLI."""
    root = tmp_path_factory.mktemp("mm-llava")
    model_dir, out, done = run_plainest_executorch(root, _llava_with_chat_template, text_layers=TEXT_LAYERS)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return model_dir, out, report, done.stdout + done.stderr


def test_the_plainest_llava_recipe_passes_and_runs_in_the_multimodal_runner(llava_runner):
    _, out, report, log = llava_runner
    target = report["targets"][0]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[RUNTIME]["status"] == "passed", proofs
    assert proofs[RUNTIME]["detail"].startswith("8/8 tokens from an image and a prompt"), proofs
    assert "ExecuTorch LLM runner" not in proofs  # the text runner does not claim this folder
    assert f"{RUNTIME} ✓ 8/8 tokens" in (out / "report.md").read_text()
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]


def test_the_folder_holds_the_runners_methods_and_metadata(llava_runner):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    _, out, report, _ = llava_runner
    folder = out / "executorch"
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "multimodal_runner"
    assert sorted(manifest["components"]) == ["text_decoder", "token_embedding", "vision_encoder"]
    assert {e["file"] for e in manifest["components"].values()} == {"model.pte"}  # one program
    program = Runtime.get().load_program(folder / "model.pte")
    methods = set(program.method_names)
    assert {"token_embedding", "vision_encoder", "text_decoder", "get_max_seq_len", "get_max_context_len",
            "get_eos_ids", "use_kv_cache", "enable_dynamic_shape", "vision_token_id"} <= methods
    assert program.load_method("get_eos_ids").execute([]) == [2]
    assert program.load_method("use_sdpa_with_kv_cache").execute([]) == [True]
    config = json.loads((folder / "config.json").read_text())
    assert program.load_method("vision_token_id").execute([]) == [config.get("image_token_id", config.get("image_token_index"))]
    assert {"tokenizer.json", "processor_config.json"} <= {p.name for p in folder.iterdir()}
    # the weights once: the program is not much more than the float32 weights
    weights = sum(p.stat().st_size for p in (llava_runner[0]).glob("*.safetensors"))
    assert (folder / "model.pte").stat().st_size < 1.5 * weights


def test_a_tied_llava_stores_its_table_once_and_runs_from_its_two_files(tmp_path):
    """Tied embeddings (the table is both `token_embedding`'s and `text_decoder`'s output projection): the weights go
    to model.ptd, the table once, and the runner, given both files as the card says, still generates eager's tokens."""
    model_dir, out, done = run_plainest_executorch(tmp_path, tiny_llava_with_processor, tied=True,
                                                   text_layers=TEXT_LAYERS)
    report = json.loads((out / "report.json").read_text())
    target = report["targets"][0]
    assert target["status"] == "passed", (done.stderr[-3000:], json.dumps(target, indent=1)[:4000])
    assert {p["runtime"]: p["status"] for p in target["runtimes"]} == {RUNTIME: "passed"}
    folder = out / "executorch"
    assert (folder / "model.ptd").is_file()
    entries = json.loads((folder / "export.json").read_text())["components"].values()
    assert all(entry["data_file"] == "model.ptd" for entry in entries)
    assert target["weights_stored_bytes"] <= target["parameter_bytes"], target  # not the table twice


def test_the_cards_multimodal_snippet_runs_as_written(llava_runner, hub, tmp_path):
    """The card's `MultimodalRunner` snippet, run as written against the Hub emulator (an image.jpg put where it
    reads one): the proof's runner and call, every line of them; its prompt the one the repo's chat template renders
    for one user turn of the image and the text, with the generation prompt (before: `<image> Describe the image.`),
    the sample's own lines (`exporters.capture.chat_prompt`). What it prints is eager greedy `generate()`'s text on
    that turn as transformers' processor builds it (`apply_chat_template(..., tokenize=True)`)."""
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from exporters.capture.chat_prompt import IMAGE_PROMPT, IMAGE_TEXT
    from exporters.capture.generation_settings import greedy
    from exporters.layouts.executorch_llm import runner_child_imports
    from exporters.layouts.executorch_multimodal import GENERATE, RUNNER_IMPORTS
    from exporters.layouts.executorch_multimodal.proof import CHILD
    from tests.card_snippets import (card_snippets, executorch_libraries, exports_card, image_home, run_snippet,
                                     upload_exports)

    _, out, report, _ = llava_runner
    commit = upload_exports(hub, "alice/llava", out, ["executorch"])
    [(runtime, language, code)] = card_snippets(exports_card("alice/llava", out, commit))
    assert runtime == RUNTIME and language == "python" and f'revision="{commit}"' in code
    assert RUNNER_IMPORTS in code and GENERATE.split("(")[0] in code
    # the proof's child loads the kernels without the exporting Python (`runner_child_imports`): every native
    # library it loads, the card's imports load too, and its runner import is the card's
    child_imports = runner_child_imports("MultimodalRunner")  # a quantized table's kernels too (8da4w)
    assert child_imports.splitlines()[-1] in CHILD and child_imports.splitlines()[-1] in code
    assert child_imports in CHILD
    child = executorch_libraries(child_imports)
    assert any("custom_ops_aot_lib" in name for name in child), child
    assert child <= executorch_libraries(RUNNER_IMPORTS), child
    assert IMAGE_PROMPT in code and "add_special_tokens=specials" in code
    home = image_home(tmp_path)
    done = run_snippet(code, hub, home)
    assert done.returncode == 0, (code, done.stderr[-3000:])
    model_dir = llava_runner[0]
    processor = AutoProcessor.from_pretrained(out / "executorch")
    assert processor.chat_template == LLAVA_CHAT_TEMPLATE  # the repo's, in the folder the card downloads
    turn = [{"role": "user", "content": [{"type": "image", "image": Image.open(home / "image.jpg").convert("RGB")},
                                         {"type": "text", "text": IMAGE_TEXT}]}]
    inputs = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    model = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()
    config = greedy(model.generation_config, max_new_tokens=32)  # the card's 32
    with torch.no_grad():
        new = model.generate(**inputs, generation_config=config)[0, inputs["input_ids"].shape[1]:].tolist()
    new = new[:next((i for i, token in enumerate(new) if token == config.eos_token_id), len(new))]
    # the runner prints each piece itself, then its stats line (before: the card's callback printed every piece a
    # second time)
    expected = processor.decode(new)
    printed, observer = done.stdout[:len(expected)], done.stdout[len(expected):].strip()
    assert len(new) > 1 and printed == expected, (done.stdout, new, expected)
    assert observer.startswith("PyTorchObserver {") and "\n" not in observer, done.stdout


def _images_of(token: int, ids) -> int:
    """The prompt's runs of image tokens."""
    ids = ids.tolist()
    return sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))


def test_two_images_in_one_prompt_are_proven_in_the_multimodal_runner(llava_runner):
    """#52: a prompt with two different images (two runs of image tokens, text between and after them), made by the
    folder's processor, through the product's own proof (`reference`, `prove`): MultimodalRunner gives eager
    `generate()`'s 8 tokens on the same inputs, each image placed where its run stands (IMAGE_INPUTS), and the detail
    says two images. Eager's tokens change when the images are swapped or the first repeated, and the same folder
    given either in the runner's input list (the reference's pixels: the child places them as the card does) fails."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from exporters.layouts.executorch_multimodal.proof import prove, reference

    model_dir, out, _, _ = llava_runner
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    noise = torch.randint(0, 255, (32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    first, second = Image.fromarray(noise.numpy()), Image.new("RGB", (32, 32), (10, 90, 220))
    prompt = f"{processor.image_token} describe this image and {processor.image_token} that one"
    inputs = dict(processor(images=[first, second], text=prompt, return_tensors="pt"))
    token, ids = model.config.image_token_id, inputs["input_ids"][0]
    assert tuple(inputs["pixel_values"].shape) == (2, 3, 32, 32) and _images_of(token, ids) == 2
    assert ids[-1] != token and int((ids == token).sum()) == 32  # 16 features each, text between and after
    layout, made, proof, context = image_proven(model, model_dir, out, inputs)
    assert made["images"] == 2 and len(made["tokens"]) == 8, made
    assert proof.status == "passed", proof
    assert proof.detail == f"8/8 tokens from two images and a prompt ({ids.shape[0]} positions)", proof
    pixels = inputs["pixel_values"]
    for mutant in (pixels.flip(0), pixels[[0, 0]]):  # the two images swapped; the first one twice
        eager = reference(layout, model, image_proof_context(model_dir, {**inputs, "pixel_values": mutant}))
        assert eager["tokens"] != made["tokens"]  # the images' order and content reach the tokens
        failed = prove(layout, out / "executorch", {**made, "pixel_values": mutant}, context)
        assert failed.status == "failed" and "tokens equal" in failed.detail, failed


def test_hf_export_validate_judges_the_folder_again(llava_runner):
    """`hf-export validate` of the written folder (last here: it writes the report again) plans the same layout from
    the folder's export.json and passes it, with the runner's proof."""
    from tests.conftest import run_cli

    model_dir, out, _, _ = llava_runner
    done = run_cli("validate", str(model_dir), str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed" and target["expected_components"] == ["token_embedding", "vision_encoder",
                                                                              "text_decoder"], target
    assert {p["runtime"]: p["status"] for p in target["runtimes"]} == {RUNTIME: "passed"}

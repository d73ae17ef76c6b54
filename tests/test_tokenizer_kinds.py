"""#46 §5, the tokenizer kinds repos ship, each through every runtime proof that reads a tokenizer.

- A checkpoint shaped like google/gemma-3-1b-it: bfloat16, tied embeddings, Gemma 3's 262144-token config
  vocabulary, its special ids (pad 0, eos 1, bos 2, `<end_of_turn>` 106) and its instruct `generation_config.json`
  (sampling, eos [1, 106]), and a SentencePiece-style BPE with byte fallback built as Gemma ships it (`<0x00>` ..
  `<0xFF>` byte tokens, spaces normalized to `▁`, a `ByteFallback` + `Fuse` decoder), saved by transformers'
  `GemmaTokenizer`. The plainest recipe in every format; the ExecuTorch LLM runner (its C++ HF tokenizer reads the
  folder's tokenizer.json) and ONNX Runtime GenAI prove their targets; GenAI's own tokenizer and transformers.js'
  (a fourth target, in its layout) read the tokenizer as transformers does.

One export per checkpoint (module fixture) through the real CLI; each test reads what it checks from the files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import run_and_read
from tests.models import RUNNER_CORPUS, write_recipe

PLAINEST = [{"export_format": "dynamo", "mode": "generation", "dynamic": True},
            {"export_format": "onnx", "mode": "generation", "dynamic": True},
            {"export_format": "executorch", "mode": "generation"}]
TJS = {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}
GEMMA3_VOCAB = 262_144  # google/gemma-3-1b-it's config vocabulary, far past the tokenizer's
# Gemma 3's special tokens and their ids: pad 0, eos 1, bos 2, unk 3, mask 4, then the unused ones and the turn marks
GEMMA_SPECIALS = (["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
                  + [f"<unused{i}>" for i in range(99)] + ["<start_of_turn>", "<end_of_turn>"])
END_OF_TURN = 106
GEMMA_GENERATION = {"do_sample": True, "top_k": 64, "top_p": 0.95, "cache_implementation": "hybrid"}
# the runtimes' prompt: "@" and "é" are no piece of the tokenizer's, so they are spelt in byte tokens
PROMPT = "the quick brown fox @ é"


def gemma_tokenizer(folder: Path):
    """A SentencePiece-style BPE with byte fallback as Gemma ships it, trained here (no download) and saved by
    transformers' `GemmaTokenizer`: its specials at Gemma 3's ids, the 256 byte tokens next, then the pieces (`▁`
    for a space, a piece never crossing a word's start); a character the pieces lack is spelt in byte tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # training only: pieces start at ▁
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    backend.train_from_iterator(RUNNER_CORPUS, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=GEMMA_SPECIALS + bytes_, show_progress=False))
    state = json.loads(backend.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tokenizer = GemmaTokenizer(vocab=state["vocab"], merges=merges, add_bos_token=True,
                               additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                               "{{ m['content'] }}<end_of_turn>\n{% endfor %}")
    tokenizer.save_pretrained(folder)
    return tokenizer


def gemma_shaped(folder: Path, recipe: object = {"exports": [*PLAINEST, TJS], "inputs": {"prompt": PROMPT}}) -> Path:
    """A 2-layer Gemma 3 text model (hidden 32) shaped like google/gemma-3-1b-it: bfloat16, tied embeddings, a
    sliding-window layer then a global one, Gemma 3's config vocabulary and special ids, its instruct
    `generation_config.json`, and `gemma_tokenizer`; no eos is ever the argmax, nor an id past the tokenizer's. Its
    window (512, Gemma 3's) is longer than the positions it holds here (256), so it never cuts the cache: the merged
    ONNX graph (GenAI's) and the runner program (a static cache) apply."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = gemma_tokenizer(folder)
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=GEMMA3_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                              sliding_window=512, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=256, pad_token_id=0, eos_token_id=[1, END_OF_TURN],
                              bos_token_id=2, initializer_range=0.2, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight[[tokenizer.eos_token_id, END_OF_TURN]] = 0
        model.get_output_embeddings().weight[len(tokenizer):] = 0
    model.generation_config = GenerationConfig(bos_token_id=2, pad_token_id=0, eos_token_id=[1, END_OF_TURN],
                                               **GEMMA_GENERATION)
    model.to(torch.bfloat16).save_pretrained(folder)
    if recipe is not None:
        write_recipe(folder, recipe)
    return folder


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-shaped")
    return run_and_read(root, gemma_shaped(root / "model"))


def test_the_checkpoint_is_what_gemma_repos_ship(gemma_run) -> None:
    model = gemma_run[0].parent / "model"
    config = json.loads((model / "config.json").read_text())
    assert (config["model_type"], config["dtype"], config["vocab_size"]) == ("gemma3_text", "bfloat16", GEMMA3_VOCAB)
    assert config["tie_word_embeddings"]
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "BPE" and tokenizer["model"]["byte_fallback"] is True
    assert all(f"<0x{b:02X}>" in tokenizer["model"]["vocab"] for b in range(256))
    assert tokenizer["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    assert {"ByteFallback", "Fuse"} <= {d["type"] for d in tokenizer["decoder"]["decoders"]}
    assert json.loads((model / "tokenizer_config.json").read_text())["tokenizer_class"] == "GemmaTokenizer"
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(model)  # the real loading code; a character the pieces lack: bytes
    assert type(loaded).__name__ == "GemmaTokenizer" and loaded.convert_tokens_to_ids("<end_of_turn>") == END_OF_TURN
    assert loaded.tokenize("the fox é") == ["the", "▁fox", "▁", "<0xC3>", "<0xA9>"]


def test_the_plainest_recipe_passes_in_every_format_with_the_repos_tokenizer(gemma_run) -> None:
    out, report, log = gemma_run
    targets = {t["name"]: t for t in report["targets"]}
    assert {name: t["status"] for name, t in targets.items()} == dict.fromkeys(
        ["dynamo", "onnx", "executorch", "tjs"], "passed"), log[-3000:]
    assert {name: t["artifact_dtype"] for name, t in targets.items()} == {
        "dynamo": "bfloat16", "onnx": "float32", "executorch": "float32", "tjs": "float32"}
    runs_in = {name: {p["runtime"]: p for p in t["runtimes"]} for name, t in targets.items()}
    genai, runner = runs_in["onnx"]["ONNX Runtime GenAI"], runs_in["executorch"]["ExecuTorch LLM runner"]
    assert genai["status"] == "passed" and runner["status"] == "passed", (genai, runner)
    model = out.parent / "model"
    for name in ("onnx", "executorch"):  # each runtime read the repo's own tokenizer, copied beside its graph
        assert (out / name / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes(), name


def test_the_stored_weights_ratio_is_read_from_the_files_and_the_tied_table_is_stored_once(gemma_run) -> None:
    from exporters.export.footprint import weights_stored_bytes

    out, report, _ = gemma_run
    for target in report["targets"]:
        name = target["name"]
        stored = weights_stored_bytes(out / name, target["export_format"])
        assert target["weights_stored_bytes"] == stored, name
        # the 262144 x 32 table is 99% of the weights: stored twice, the ratio would be near 2
        assert 0.95 < stored / target["parameter_bytes"] < 1.05, (name, stored, target["parameter_bytes"])


def test_genai_and_the_runner_read_the_byte_fallback_tokenizer_as_transformers_does(gemma_run) -> None:
    """GenAI's own tokenizer (`og.Tokenizer`, from the folder alone) spells a character the pieces lack in byte tokens
    as transformers does and decodes them back; the runner's C++ tokenizer read the proof's prompt as transformers
    did (its prompt token count is checked by the proof)."""
    import onnxruntime_genai as og
    from transformers import AutoTokenizer

    out, report, _ = gemma_run
    text = PROMPT
    transformers = AutoTokenizer.from_pretrained(out / "onnx")
    want = transformers(text, add_special_tokens=False).input_ids  # GenAI's encode adds no bos (a chat template does)
    assert {"<0x40>", "<0xC3>", "<0xA9>"} <= set(transformers.convert_ids_to_tokens(want))
    tokenizer = og.Tokenizer(og.Model(str(out / "onnx")))
    assert tokenizer.encode(text).tolist() == want
    assert tokenizer.decode(want) == text
    runner = next(p for t in report["targets"] for p in t["runtimes"] if p["runtime"] == "ExecuTorch LLM runner")
    assert "tokens" in runner["detail"], runner


def test_the_runner_proof_stops_before_a_byte_its_python_binding_cannot_pass(gemma_run) -> None:
    """A generated byte token that is part of a longer UTF-8 character (`<0xC3>`) reaches Python only as broken text
    (the runner's pybinding decodes each piece): the proof asks the runner for eager's tokens before it and says so;
    one first of all leaves nothing to compare (`unverified`), never a failure of the program."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, GenerationConfig

    from exporters.layouts.executorch_llm import ExecutorchLlm

    model_dir = gemma_run[0].parent / "model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.encode("the fox", add_special_tokens=False)
    fox, byte = tokenizer.convert_tokens_to_ids(["▁fox", "<0xC3>"])

    def reference(new: list[int]) -> dict:
        model = SimpleNamespace(generate=lambda ids, **_: torch.tensor([ids[0].tolist() + new]),
                                generation_config=GenerationConfig(eos_token_id=[1, END_OF_TURN]))
        context = SimpleNamespace(source_dir=model_dir, generate_inputs={"input_ids": torch.tensor([prompt])},
                                  recipe=SimpleNamespace(inputs=SimpleNamespace(prompt=None),
                                                         generation=SimpleNamespace(max_new_tokens=4)),
                                  generation_config=None)
        return ExecutorchLlm().reference(model, context)

    cut = reference([fox, fox, byte, fox])
    assert (cut["tokens"], cut["cut"]) == ([fox, fox], "<0xC3>")
    assert "unverified" in reference([byte, fox])


def test_transformers_js_tokenizes_with_byte_fallback_and_generates_eagers_tokens(gemma_run) -> None:
    """transformers.js on Node.js, from the transformers.js-layout folder alone: its own tokenizer reads the folder's
    tokenizer.json as transformers does (bos, `▁` pieces, `<0x40>` for "@", two byte tokens for "é") and greedy
    generation gives eager's tokens. Installed by `make test-deps`; never skipped."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from exporters.layouts.transformers_js import home  # HF_EXPORT_TRANSFORMERS_JS, else .cache

    modules = str(home())
    if shutil.which("node") is None or not (Path(modules) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps`, or set HF_EXPORT_TRANSFORMERS_JS to a "
                    "folder with node_modules/@huggingface/transformers")
    out = gemma_run[0]
    script = Path(modules) / "tokenize_generate.mjs"
    shutil.copyfile(Path(__file__).with_name("transformers_js") / "tokenize_generate.mjs", script)
    done = subprocess.run(["node", str(script), str(out), "tjs", PROMPT, "8"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    model_dir = out.parent / "model"
    want = AutoTokenizer.from_pretrained(model_dir)(PROMPT).input_ids
    assert got["ids"] == want and got["decoded"] == PROMPT
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # the graph's dtype
    ids = torch.tensor([want])
    with torch.no_grad():
        greedy = eager.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                                do_sample=False)
    assert got["out"] == greedy[0].tolist()

"""The checkpoints owners ship, through the plainest recipe of every format: bfloat16 weights in shards with an index,
tied embeddings, a vocabulary of real size (larger in the config than in the tokenizer), a byte-level BPE tokenizer,
and an instruct `generation_config.json` that turns sampling on with two eos ids.

One export of the three targets (module fixture) through the real CLI; each test reads what it checks from the files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.models import runner_bpe_tokenizer, write_recipe

PLAINEST = [{"export_format": "dynamo", "mode": "generation", "dynamic": True},
            {"export_format": "onnx", "mode": "generation", "dynamic": True},
            {"export_format": "executorch", "mode": "generation"}]
VOCAB = 128_256  # Llama 3's: the config's vocabulary, past the tokenizer's 200 ids
SECOND_EOS = 7  # an instruct model's end-of-turn id beside the tokenizer's eos
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}


def instruct_checkpoint(folder: Path, vocab_size: int = VOCAB, recipe: object = PLAINEST, layers: int = 2) -> Path:
    """A 2-layer Llama (hidden 32; `layers` other depths) shaped like an instruct repo: bfloat16, sharded, tied
    embeddings, a 128k vocabulary (`vocab_size`; at least the tokenizer's), a byte-level BPE with a chat template,
    sampling on and two eos ids in `generation_config.json`; `recipe` written beside it unless None."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = runner_bpe_tokenizer(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=max(vocab_size, len(tokenizer)), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         initializer_range=0.2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # no eos is ever the argmax (every run full length), nor an id past the tokenizer's (a
        # padded vocabulary's rows are never trained: small)
        model.get_output_embeddings().weight[[tokenizer.eos_token_id, SECOND_EOS]] = 0
        model.get_output_embeddings().weight[len(tokenizer):] = 0
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=[tokenizer.eos_token_id, SECOND_EOS], **SAMPLING)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="2MB" if vocab_size > 4096 else "100KB")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                                                "{% endfor %}")
    if recipe is not None:
        write_recipe(folder, recipe)
    return folder


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("shipped")
    model = instruct_checkpoint(root / "model")
    out = root / "out"
    done = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {"model": model, "out": out, "report": report, "targets": {t["name"]: t for t in report["targets"]},
            "output": done.stdout + done.stderr, "returncode": done.returncode}


def test_the_checkpoint_is_what_repos_ship(shipped) -> None:
    model = shipped["model"]
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded
    config = json.loads((model / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] and config["vocab_size"] == VOCAB
    assert json.loads((model / "tokenizer.json").read_text())["pre_tokenizer"]["type"] == "ByteLevel"


def test_the_plainest_recipe_passes_in_every_format(shipped) -> None:
    assert shipped["returncode"] == 0, shipped["output"][-3000:]
    assert {name: t["status"] for name, t in shipped["targets"].items()} == dict.fromkeys(
        ["dynamo", "onnx", "executorch"], "passed")
    runs_in = {name: {p["runtime"]: p["status"] for p in t["runtimes"]} for name, t in shipped["targets"].items()}
    assert runs_in["onnx"]["ONNX Runtime GenAI"] == "passed"
    assert runs_in["executorch"]["ExecuTorch LLM runner"] == "passed"


def test_each_format_is_written_in_a_dtype_its_runtime_runs(shipped) -> None:
    import onnx

    targets = shipped["targets"]
    assert {name: t["dtype"] for name, t in targets.items()} == {
        "dynamo": "bfloat16", "onnx": "float32", "executorch": "float32"}
    report = shipped["report"]
    assert (report["checkpoint_dtype"], report["load_dtype"]) == ("bfloat16", "bfloat16")  # loaded once, as stored
    # the labels are read from the files: what each one holds
    assert {name: t["artifact_dtype"] for name, t in targets.items()} == {
        "dynamo": "bfloat16", "onnx": "float32", "executorch": "float32"}
    graph = onnx.load(str(shipped["out"] / "onnx" / "model.onnx"), load_external_data=False).graph
    floats = {onnx.TensorProto.DataType.Name(t.data_type) for t in graph.initializer
              if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16)}
    assert floats == {"FLOAT"}, floats  # read from the file: the graph holds float32 weights
    from exporters.upstream import load_exported

    program = next(iter(load_exported(shipped["out"] / "dynamo", allow_pickles=True).components.values())).program
    assert {p.dtype for p in program.state_dict.values() if p.is_floating_point()} == {torch.bfloat16}
    # RoPE's inverse frequencies stay in the float32 from_pretrained keeps them in, as eager computes with them (a
    # cast of the bfloat16 model to its own dtype rounded them: other angles at long prompts, #52 audit)
    rotary = {name: t.dtype for name, t in program.constants.items() if name.endswith("inv_freq")}
    assert rotary and set(rotary.values()) == {torch.float32}, rotary
    casts = [f for f in shipped["report"]["findings"] if "the checkpoint is bfloat16" in f]
    assert len(casts) == 2 and any(f.startswith("onnx:") for f in casts) and any(f.startswith("executorch:")
                                                                                  for f in casts)
    assert targets["dynamo"]["quality"]["kind"] == "half"  # bfloat16 judged by half-precision budgets


def test_generation_settings_are_the_repos_own_and_validation_derives_greedy_ones(shipped) -> None:
    out, model = shipped["out"], shipped["model"]
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    assert len(eos) == 2
    for name in ("dynamo", "onnx", "executorch"):
        saved = json.loads((out / name / "generation_config.json").read_text())
        assert {k: saved.get(k) for k in (*SAMPLING, "eos_token_id")} == {**SAMPLING, "eos_token_id": eos}, name
    genai = json.loads((out / "onnx" / "genai_config.json").read_text())
    assert genai["model"]["eos_token_id"] == eos
    runner = json.loads((out / "executorch" / "export.json").read_text())["runner_metadata"]
    assert runner["get_eos_ids"] == eos
    derived = [f for f in shipped["report"]["findings"] if "validation generates greedily" in f]
    assert len(derived) == 1, shipped["report"]["findings"]  # about the model: said once
    assert "do_sample true -> false" in derived[0] and "temperature 0.6" in derived[0]
    for target in shipped["targets"].values():
        assert target["generation"]["status"] == "passed"


def test_check_refuses_a_bfloat16_onnx_target_for_the_cpu_with_its_path(tmp_path) -> None:
    recipe = tmp_path / "export_config.json"
    recipe.write_text('{\n  "exports": [\n    {"export_format": "dynamo"},\n    {"export_format": "onnx",\n'
                      '     "dtype": "bfloat16"}\n  ]\n}\n')
    done = run_cli("check", str(recipe))
    assert done.returncode == 2
    assert "line 5, $.exports[1].dtype" in done.stdout + done.stderr
    assert "leave dtype unset (float32, the default)" in done.stdout + done.stderr


def test_the_checkpoint_dtype_is_read_from_the_legacy_key_and_from_the_weights(tmp_path) -> None:
    from safetensors.torch import save_file

    from exporters.capture.dtypes import checkpoint_dtype

    assert checkpoint_dtype(tmp_path, {"torch_dtype": "float16"}) == "float16"
    assert checkpoint_dtype(tmp_path, {"text_config": {"dtype": "bfloat16"}}) == "bfloat16"
    save_file({"a.weight": torch.zeros(2, dtype=torch.float16), "b": torch.zeros(2, dtype=torch.int64)},
              str(tmp_path / "model.safetensors"))
    assert checkpoint_dtype(tmp_path, {}) == "float16"

"""Decoder-only ONNX folders that ONNX Runtime GenAI, optimum and transformers.js load alone (issue #26 §2, §4).

One export per tiny model (Llama, Qwen2, each with a BPE tokenizer trained in code) through the real CLI, shared by
every check: the merged graph's names and dims, a dynamic batch, `genai_config.json`, the GenAI proof in the report,
and GenAI generating, from the folder alone, what eager greedy `generate` gives for a padded batch of two prompts of
different lengths. `dynamic: true` keeps the batch dynamic for a single graph too (BERT).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, run_cli
from tests.models import BERT_TWO_TARGETS, save_ascii_bpe_tokenizer, tiny_bert, tiny_llama, tiny_qwen2

og = pytest.importorskip("onnxruntime_genai")

RECIPE = {"export_format": "onnx", "mode": "generation", "dynamic": True}
LAYERS = 2
INPUTS = ["input_ids", "attention_mask", "position_ids"] + [
    f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
OUTPUTS = ["logits"] + [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
PROMPTS = ["the quick brown fox jumps over the lazy dog", "hello world"]
NEW_TOKENS = 12


def _export(name: str, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp(f"genai-{name}")
    build = {"llama": tiny_llama, "qwen2": tiny_qwen2}[name]
    model_dir = build(root / "model", RECIPE, initializer_range=0.3)
    save_ascii_bpe_tokenizer(model_dir)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())
    (target,) = report["targets"]
    return {"name": name, "model_dir": model_dir, "folder": out / target["name"], "target": target, "out": out}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _export("llama", tmp_path_factory)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _export("qwen2", tmp_path_factory)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def exported(request):
    """The tiny Llama's or Qwen2's ONNX run: each test runs on both."""
    return request.getfixturevalue(request.param)


def _eager(model_dir: Path, prompts: list[list[int]], pad: int, eos: int) -> list[list[int]]:
    """Eager greedy `generate` of a left-padded batch, each row up to and including its first eos."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    greedy = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=pad, eos_token_id=eos)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)
    return [_until(row[width:].tolist(), eos) for row in out]


def _until(tokens: list[int], eos: int) -> list[int]:
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def _genai(folder: Path, prompts: list[list[int]], pad: int, eos: int) -> list[list[int]]:
    """ONNX Runtime GenAI's greedy tokens for a right-padded batch (how GenAI pads), from the folder alone."""
    model = og.Model(str(folder))
    width = max(map(len, prompts))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=width + NEW_TOKENS, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([p + [pad] * (width - len(p)) for p in prompts], dtype=np.int32))
    rows: list[list[int]] = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in enumerate(generator.get_next_tokens().tolist()):
            if eos not in rows[row]:
                rows[row].append(int(token))
    return [_until(row, eos) for row in rows]


def test_the_target_passes_and_genai_proves_it_in_the_report(exported):
    target = exported["target"]
    assert target["status"] == "passed", target
    (proof,) = [p for p in target["runtimes"] if p["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "passed", proof
    assert "batch of 2" in proof["detail"] and "tokens" in proof["detail"]
    done, total = proof["detail"].split(" ")[0].split("/")
    assert done == total and int(total) > 0
    markdown = (exported["out"] / "report.md").read_text()
    assert "runs in" in markdown and "ONNX Runtime GenAI ✓" in markdown
    assert target["generation"]["status"] == "passed"  # our own loader ran the renamed graph (RenamedRunner)


def test_the_graph_has_the_runtimes_names_dims_and_a_dynamic_batch(exported):
    import onnx

    proto = onnx.load(str(exported["folder"] / "model.onnx"), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*proto.graph.input, *proto.graph.output)}
    assert [v.name for v in proto.graph.input] == INPUTS
    assert [v.name for v in proto.graph.output] == OUTPUTS
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["position_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["logits"] == ["batch_size", "sequence_length", 128]
    for i in range(LAYERS):
        for kv in ("key", "value"):
            assert dims[f"past_key_values.{i}.{kv}"] == ["batch_size", 2, "past_sequence_length", 8]
            assert dims[f"present.{i}.{kv}"] == ["batch_size", 2, "total_sequence_length", 8]
    manifest = json.loads((exported["folder"] / "export.json").read_text())
    assert manifest["components"]["model"]["inputs"]["past_key_values.1.value"] == "cache.layers.1.values"
    assert manifest["components"]["model"]["inputs"]["attention_mask"] == "attention_mask"


def test_onnx_runtime_runs_a_batch_of_three_with_an_empty_cache_as_eager(exported):
    """What optimum and transformers.js do first: a prompt batch on a cache of length 0, sized from the graph."""
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM

    session = ort.InferenceSession(str(exported["folder"] / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    feed = {"input_ids": ids.numpy(), "attention_mask": np.ones((3, 5), dtype=np.int64),
            "position_ids": np.tile(np.arange(5), (3, 1))}
    for name in INPUTS[3:]:
        feed[name] = np.zeros((3, 2, 0, 8), dtype=np.float32)
    logits, *present = session.run(None, feed)
    model = AutoModelForCausalLM.from_pretrained(exported["model_dir"]).eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert logits.shape == (3, 5, 128) and present[0].shape == (3, 2, 5, 8)
    np.testing.assert_allclose(logits, want.numpy(), atol=1e-4, rtol=1e-3)


def test_genai_config_describes_the_graph(exported):
    config = json.loads((exported["model_dir"] / "config.json").read_text())
    genai = json.loads((exported["folder"] / "genai_config.json").read_text())
    model, decoder, search = genai["model"], genai["model"]["decoder"], genai["search"]
    assert model["type"] == config["model_type"]  # both GenAI LLM types
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (1, 2, 3)
    assert model["vocab_size"] == 128 and model["context_length"] == 256
    assert decoder["filename"] == "model.onnx"
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["head_size"],
            decoder["hidden_size"], decoder["num_hidden_layers"]) == (4, 2, 8, 32, 2)
    assert decoder["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                                 "past_value_names": "past_key_values.%d.value"}
    assert decoder["outputs"] == {"logits": "logits", "present_key_names": "present.%d.key",
                                  "present_value_names": "present.%d.value"}
    assert search["past_present_share_buffer"] is False
    assert search["do_sample"] is False and search["num_beams"] == 1 and search["max_length"] == 256


def test_a_model_without_a_bos_id_gets_a_config_genai_parses(tmp_path):
    """OLMo 2, GLM, Qwen2-MoE... have no `bos_token_id`: GenAI refuses a null id ("Expected a number but saw a
    null"), so an id the model lacks is left out of `genai_config.json` (GenAI's default applies)."""
    import onnxruntime_genai as og
    from transformers import GenerationConfig, LlamaConfig

    from exporters.layouts.genai.config import write_genai_config

    config = LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=None,
                         pad_token_id=None)
    path = write_genai_config(tmp_path, config, GenerationConfig(eos_token_id=2))
    content = json.loads(path.read_text())
    assert "bos_token_id" not in content["model"] and content["model"]["pad_token_id"] == 2  # pad: the first eos
    og.Config(str(tmp_path))  # parses
    content["model"]["bos_token_id"] = None  # what was written before: GenAI refuses it
    path.write_text(json.dumps(content))
    with pytest.raises(Exception, match="bos_token_id"):
        og.Config(str(tmp_path))


def test_a_gpt2_graph_runs_in_genai_as_a_decoder(tmp_path):
    """GenAI's own "gpt2" type is its legacy GPT model (one combined `past_%d` per layer): the merged graph's separate
    keys and values run as "decoder", and GenAI generates eager's tokens from the folder."""
    import dataclasses

    from matrix.families import FAMILIES, build

    recipe = {"schema_version": 1, "exports": [{"name": "onnx", "export_format": "onnx", "dynamic": True}],
              "generation": {"max_new_tokens": 6}}
    # one layer: GenAI's decoder type and its generation read the cache's names and heads, which every layer has (#48)
    spec = dataclasses.replace(FAMILIES["gpt2"], overrides={**FAMILIES["gpt2"].overrides, "num_hidden_layers": 1})
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert json.loads((out / "onnx" / "genai_config.json").read_text())["model"]["type"] == "decoder"
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["ONNX Runtime GenAI"]["status"] == "passed", proofs
    assert target["status"] == "passed", target["error"]


def test_genai_generates_what_eager_generates_for_a_padded_batch_of_two(exported):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported["model_dir"])
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    assert len(prompts[0]) != len(prompts[1]) and all(3 not in p for p in prompts)
    want = _eager(exported["model_dir"], prompts, pad=3, eos=2)
    assert _genai(exported["folder"], prompts, pad=3, eos=2) == want
    assert want[0] != want[1]  # the rows really differ: padding is not hiding one of them
    for prompt, row in zip(prompts, want):  # and each row is what the prompt alone generates
        assert _genai(exported["folder"], [prompt], pad=3, eos=2) == [row]


def test_a_folder_genai_cannot_load_fails_the_proof_with_genais_message(exported, tmp_path):
    from exporters.layouts import Genai
    from exporters.layouts.genai.proof import GenaiReference
    GENAI = Genai()

    folder = tmp_path / "broken"
    shutil.copytree(exported["folder"], folder)
    reference = GenaiReference([[5, 6, 7], [5]], [[9], [9]], pad=3, eos=[2], steps=1)
    genai = json.loads((folder / "genai_config.json").read_text())
    genai["model"]["decoder"]["filename"] = "missing.onnx"
    (folder / "genai_config.json").write_text(json.dumps(genai))
    proof = GENAI.prove(folder, reference, None)  # GenAI runs in a child: its error comes back as the proof's
    assert proof.status == "failed" and "missing.onnx" in proof.detail, proof
    (folder / "genai_config.json").unlink()
    proof = GENAI.prove(folder, reference, None)
    assert proof.status == "failed" and "genai_config.json" in proof.detail


def test_genai_tokens_that_differ_from_eager_fail_the_proof(exported):
    from exporters.layouts import Genai
    from exporters.layouts.genai.proof import GenaiReference
    GENAI = Genai()

    wrong = GenaiReference([[5, 6, 7, 8], [5, 6]], [[127] * 4, [127] * 4], pad=3, eos=[2], steps=4)
    proof = GENAI.prove(exported["folder"], wrong, None)
    assert proof.status == "failed" and "tokens equal eager greedy" in proof.detail


def test_genais_proof_child_forked_warm_answers_as_a_cold_one(llama):
    """The tests start this environment's proof children warm (tests/side_launcher.py, `HF_EXPORT_PROOF_PYTHON`):
    GenAI's proof child, forked from the proof launcher, generates for a padded batch of two what a cold
    interpreter generates."""
    from exporters.layouts.genai.proof import CHILD
    from tests.side_launcher import warm_and_cold

    eos = json.loads((llama["model_dir"] / "config.json").read_text())["eos_token_id"]
    spec = {"folder": str(llama["folder"]), "eos": [eos],
            "batches": [{"rows": [[5, 6, 7, 8], [9, 10, 0, 0]], "max_length": 4 + NEW_TOKENS}]}
    found = warm_and_cold(CHILD, spec, llama["folder"])
    assert found["calls"] == ["warm"], found["calls"]
    assert found["warm"] == found["cold"] and found["warm"][1] == "", found
    assert len(found["warm"][0]) == 2 and all(found["warm"][0]) and sum(map(len, found["warm"][0])) > 2, found


OPTIMUM_SCRIPT = Path(__file__).with_name("optimum") / "causal_lm.py"


def optimum_greedy_each(runs: list[tuple[Path, list[list[int]]]], scratch: Path) -> list[dict]:
    """optimum's `ORTModelForCausalLM` greedy over a left-padded batch (pad 3, eos 2), from each `(folder, prompts)`
    folder alone, all in one process of the optimum test venv (#48: its imports paid once): per run `{"inputs": graph
    input names, "new": each row's new tokens}`, or `{"error": traceback}` where that folder failed (RUNS.json is
    written in `scratch`). `make test-deps` creates the pinned venv .cache/optimum-venv
    (tests/optimum/constraints.txt), never the product's environment; HF_EXPORT_OPTIMUM_PYTHON names another
    interpreter that has optimum-onnx. Never skipped."""
    runs_file = scratch / "optimum-runs.json"
    runs_file.write_text(json.dumps([{"folder": str(folder), "prompts": prompts} for folder, prompts in runs]))
    return _optimum_script(["--runs", str(runs_file)])


def optimum_greedy(folder: Path, prompts: list[list[int]]) -> dict:
    """optimum's `ORTModelForCausalLM` greedy over a left-padded batch (pad 3, eos 2), from `folder` alone, in the
    optimum test venv: `{"inputs": graph input names, "new": each row's new tokens}` (as `optimum_greedy_each`)."""
    return _optimum_script([str(folder), json.dumps(prompts)])


def _optimum_script(arguments: list[str]):
    """tests/optimum/causal_lm.py's last line, run with `arguments` then pad 3, eos 2 and NEW_TOKENS."""
    from exporters.layouts.child import SIDE_PYTHON, SIDE_PYTHON_SETTING  # the optimum venv

    python = os.environ.get(SIDE_PYTHON_SETTING) or str(SIDE_PYTHON)
    if not Path(python).is_file():
        pytest.fail("optimum is not installed: run `make test-deps` (.cache/optimum-venv, pinned by "
                    "tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python with optimum-onnx")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([python, str(OPTIMUM_SCRIPT), *arguments, "3", "2", str(NEW_TOKENS)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


OPTIMUM_PROMPTS = [[5, 17, 9, 33, 41, 8, 60], [70, 12, 5]]


@pytest.fixture(scope="module")
def optimum(llama, qwen2, tmp_path_factory) -> dict[str, dict]:
    """optimum's greedy for OPTIMUM_PROMPTS from each folder, by model name: one optimum process for both."""
    names = {"llama": llama, "qwen2": qwen2}
    results = optimum_greedy_each([(names[name]["folder"], OPTIMUM_PROMPTS) for name in names],
                                  tmp_path_factory.mktemp("optimum"))
    return dict(zip(names, results))


def test_optimum_generates_what_eager_generates_for_a_padded_batch_of_two(exported, optimum):
    """optimum's `ORTModelForCausalLM` (transformers 4.x): `make test-deps` creates the pinned venv
    .cache/optimum-venv (tests/optimum/constraints.txt), never the product's environment;
    HF_EXPORT_OPTIMUM_PYTHON names another interpreter that has optimum-onnx. Never skipped. One optimum process
    generates for both folders (the `optimum` fixture), each loaded alone."""
    prompts = OPTIMUM_PROMPTS
    got = optimum[exported["name"]]
    assert "error" not in got, f"optimum on {exported['name']}: {got['error'][-3000:]}"
    assert got["inputs"] == INPUTS
    want = _eager(exported["model_dir"], prompts, pad=3, eos=2)
    assert [_until(row, 2) for row in got["new"]] == want
    assert want[0] != want[1]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """The tiny BERT's ONNX and dynamo targets, both `dynamic: true`, at the default batch of one: the `--jobs 1` run
    tests/test_isolation.py reads too, exported once through the shared store (#48); the test reads the folder."""
    from tests.export_store import MODEL, OUT, exported as stored  # `exported` is this module's Llama/Qwen2 fixture

    model_dir = tiny_bert(tmp_path_factory.mktemp("bert-batch") / "model", BERT_TWO_TARGETS)
    result = stored(model_dir, "run", "--no-bench", MODEL, "--out", OUT, "--quiet", "--jobs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.model_dir, result.out, result.report


def test_dynamic_true_keeps_the_batch_dynamic_at_the_default_batch_of_one(bert):
    import onnx
    import onnxruntime as ort
    from transformers import AutoModel

    model_dir, out, report = bert
    assert {t["name"]: t["status"] for t in report["targets"]} == {"onnx": "passed", "dynamo": "passed"}
    proto = onnx.load(str(out / "onnx" / "model.onnx"), load_external_data=False)
    for value in proto.graph.input:
        assert value.type.tensor_type.shape.dim[0].dim_param, f"{value.name}: batch fixed"
    session = ort.InferenceSession(str(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(5, 90, (3, 7), generator=torch.Generator().manual_seed(1))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    names = {i.name for i in session.get_inputs()}
    got = session.run(None, {k: v.numpy() for k, v in feed.items() if k in names})[0]
    with torch.no_grad():
        want = AutoModel.from_pretrained(model_dir).eval()(**feed).last_hidden_state
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-3)
    program = torch.export.load(str(out / "dynamo" / next(p.name for p in (out / "dynamo").glob("*.pt2"))))
    batch = program.graph_signature.user_inputs[0]
    placeholder = next(n for n in program.graph.nodes if n.name == batch)
    assert not isinstance(placeholder.meta["val"].shape[0], int), "dynamo program: batch fixed"


# A chat template in the tiny tokenizer's own words (its alphabet has no `<|` nor newline): the bos, then each turn
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}hello {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}world{% endif %}")


def test_the_cards_genai_snippet_sends_one_user_turn_in_the_repos_chat_template(llama, hub, tmp_path):
    """The card's GenAI snippet for a folder holding the repo's `chat_template.jinja`, run as written against the Hub
    emulator: its prompt is one user turn in the template with the generation prompt (before: the words alone),
    rendered by GenAI's tokenizer as transformers renders it, and it prints eager greedy `generate()`'s text from that
    prompt (special tokens skipped). The folder is the llama run's, its tokenizer a byte-level BPE of the same special
    ids (GenAI's tokenizer encodes the run's whitespace-split BPE's spaces as id -1, where transformers drops them:
    benchmarks/RESULTS.md), with the template added as the repo's would be copied."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from exporters.capture.generation_settings import greedy
    from exporters.layouts import Genai
    from exporters.layouts.genai import CHAT_PROMPT
    from tests.card_snippets import run_snippet, upload_exports
    from tests.models import BPE_CORPUS, BPE_SPECIALS, train_bpe_tokenizer

    name, out = llama["target"]["name"], tmp_path / "out"
    folder = out / name
    shutil.copytree(llama["folder"], folder)
    train_bpe_tokenizer(folder, BPE_CORPUS, BPE_SPECIALS, vocab_size=128, bos="<s>", eos="</s>", pad="<|pad|>",
                        unk="<unk>", byte_level=True)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    commit = upload_exports(hub, "alice/genai-chat", out, [name])
    target = {**llama["target"], "files": [*llama["target"]["files"], {"path": f"{name}/chat_template.jinja"}]}
    language, code = Genai().snippet("alice/genai-chat", target, commit)
    assert language == "python" and CHAT_PROMPT in code
    done = run_snippet(code, hub, tmp_path / "home", prompt=PROMPTS[1])
    assert done.returncode == 0, (code, done.stderr[-3000:])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[1]}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == f"<s>hello {PROMPTS[1]} world", rendered
    genai = og.Tokenizer(og.Model(str(folder)))
    turn = json.dumps([{"role": "user", "content": PROMPTS[1]}])
    assert genai.apply_chat_template(turn, add_generation_prompt=True) == rendered  # GenAI's rendering, the card's
    ids = torch.tensor([tokenizer(rendered).input_ids])
    assert ids[0].tolist() == genai.encode(rendered).tolist()
    model = AutoModelForCausalLM.from_pretrained(llama["model_dir"]).eval()
    config = greedy(model.generation_config, max_new_tokens=64 - ids.shape[1])  # the card's max_length 64
    with torch.no_grad():
        sequence = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[0].tolist()
    assert len(sequence) > ids.shape[1] + 1, sequence
    assert done.stdout == tokenizer.decode(sequence, skip_special_tokens=True) + "\n", (done.stdout, sequence)

"""The merged decoder ONNX fused for ONNX Runtime's CPU provider (`"ort_fusions": "cpu"`, issue #26 §5), the
recipe docs/recipe.md recommends for ONNX Runtime GenAI on CPU, both ways:

- the batch fixed at 1, where upstream fuses every attention into ONNX Runtime's `GroupQueryAttention` itself;
- the batch dynamic (`exporters.upstream.group_query_attention_at_any_batch`): every attention fused too, in an `If`
  that computes the one call the kernel refuses (several tokens after a past at a batch over 1) in standard ops.

Each passes validation, `onnx.checker` included (ONNX Runtime's `SimplifiedLayerNormalization` lives in ONNX's
domain), and ONNX Runtime GenAI generates eager's greedy tokens from the folder alone; the dynamic one computes what
eager computes for each kind of call and optimum generates a padded batch of two from it.

One CLI run per target (a tiny Llama each), shared by every check on it.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.models import _saved, save_ascii_bpe_tokenizer, tiny_llama
from tests.test_genai import PROMPTS, _eager, _genai, _until, optimum_greedy

og = pytest.importorskip("onnxruntime_genai")

# The merged contract with the batch left static (traced at 1): docs/recipe.md's GenAI-on-CPU recipe.
BATCH_ONE = {"input_ids": {"1": {"name": "sequence_length", "min": 1}},
             "position_ids": {"1": {"name": "sequence_length"}}, "attention_mask": {"1": "auto"},
             "cache.layers.*.keys": {"2": {"name": "past_sequence_length", "min": 0}},
             "cache.layers.*.values": {"2": {"name": "past_sequence_length"}}}
GQA = {"name": "gqa", "export_format": "onnx", "mode": "generation", "merged": True, "ort_fusions": "cpu",
       "components": {"model": {"dynamic_shapes": BATCH_ONE}}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai-fused")
    model_dir = tiny_llama(root / "model", {"exports": [GQA]}, initializer_range=0.3)
    save_ascii_bpe_tokenizer(model_dir)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    targets = {target["name"]: target for target in report["targets"]}
    return {"model_dir": model_dir, "out": out, "targets": targets, "cli": result}


def _ops(folder: Path) -> collections.Counter:
    import onnx

    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return collections.Counter((node.domain, node.op_type) for node in proto.graph.node)


def _batch_dim(folder: Path):
    import onnx

    dim = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_param or dim.dim_value


def test_the_fused_target_passes_validation_and_the_genai_proof(run):
    assert run["cli"].returncode == 0, run["cli"].stdout + run["cli"].stderr
    target = run["targets"]["gqa"]
    assert target["status"] == "passed", target
    assert target["generation"]["status"] == "passed"
    assert target["generation"]["exported_tokens"] == target["generation"]["eager_tokens"]
    (proof,) = [p for p in target["runtimes"] if p["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "passed", proof
    done, total = proof["detail"].split(" ")[0].split("/")
    assert done == total and int(total) > 0
    assert "each prompt alone, the graph's batch is fixed at 1" in proof["detail"], proof
    (component,) = target["components"]
    assert component["verdict"] == "passed", component
    assert any("onnx.checker passed" in note and "SimplifiedLayerNormalization" in note
               for note in component["structural"]), component["structural"]


def test_the_graph_holds_onnx_runtimes_fused_ops(run):
    ops = _ops(run["out"] / "gqa")
    assert ops[("com.microsoft", "GroupQueryAttention")] == 2 and ops[("", "Softmax")] == 0  # every attention
    assert ops[("com.microsoft", "SkipSimplifiedLayerNormalization")] == 4  # 2 layers: after attention and MLP
    assert ops[("", "SimplifiedLayerNormalization")] == 1  # the first norm: no residual to skip
    assert ops[("", "Pow")] == 0 and ops[("", "ReduceMean")] == 0  # no RMSNorm left unfused
    # head size 8: upstream rotates inside GroupQueryAttention for multiples of 16 only (the 58M Llama's 64 does)
    assert ops[("com.microsoft", "RotaryEmbedding")] == 4
    assert _batch_dim(run["out"] / "gqa") == 1


def test_genai_generates_eagers_greedy_tokens_from_the_fused_folder(run):
    from transformers import AutoTokenizer

    folder = run["out"] / "gqa"
    genai = json.loads((folder / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is True  # one buffer, as GenAI's model builder writes
    assert any("past_present_share_buffer true" in finding for finding in run["targets"]["gqa"]["findings"])
    tokenizer = AutoTokenizer.from_pretrained(run["model_dir"])
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    want = _eager(run["model_dir"], prompts, pad=3, eos=2)
    assert want[0] != want[1]
    for prompt, row in zip(prompts, want):
        assert _genai(folder, [prompt], pad=3, eos=2) == [row]


def test_the_past_length_comes_from_the_mask_and_both_buffer_modes_generate_eagers_tokens(run, tmp_path):
    """GenAI's shared buffer feeds a past as long as `max_length`: upstream's fused graph read its length off the
    past's shape (GenAI failed: `GatherND ... invalid index found`), so the export reads it off the attention mask
    and nothing but `GroupQueryAttention` takes a past. The same folder with a buffer per step (`false`, what
    optimum-like callers do: a past as long as what it holds) still generates eager's tokens."""
    import shutil

    import onnx
    from transformers import AutoTokenizer

    proto = onnx.load(str(run["out"] / "gqa" / "model.onnx"), load_external_data=False)
    past = {value.name for value in proto.graph.input if value.name.startswith("past_key_values.")}
    readers = {node.op_type for node in proto.graph.node if past & set(node.input)}
    assert past and readers == {"GroupQueryAttention"}, readers
    folder = tmp_path / "per-step"
    shutil.copytree(run["out"] / "gqa", folder)
    genai = json.loads((folder / "genai_config.json").read_text())
    genai["search"]["past_present_share_buffer"] = False
    (folder / "genai_config.json").write_text(json.dumps(genai))
    tokenizer = AutoTokenizer.from_pretrained(run["model_dir"])
    prompt = tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    [want] = _eager(run["model_dir"], [prompt], pad=3, eos=2)
    assert _genai(folder, [prompt], pad=3, eos=2) == [want]


def test_a_graph_whose_past_is_read_elsewhere_keeps_its_own_buffer_per_step():
    """The rewrite is all or nothing: a past read by anything but `GroupQueryAttention` and the length reads it
    rewrites (here a `Gather` of it) leaves the graph as it is, and GenAI keeps a buffer per step."""
    from onnx import helper

    from exporters.layouts.genai.buffer import share_past_present

    nodes = [helper.make_node("Shape", ["past_key_values.0.key"], ["length"], start=2, end=3),
             helper.make_node("Gather", ["past_key_values.0.key", "index"], ["slice"], axis=2),
             helper.make_node("GroupQueryAttention", ["q", "", "", "past_key_values.0.key"], ["o"],
                              domain="com.microsoft")]
    proto = _decoder_graph(nodes)
    before = proto.SerializeToString()
    assert share_past_present(proto) is False
    assert proto.SerializeToString() == before
    assert share_past_present(_decoder_graph(nodes[:1])) is False  # a plain graph: its present is past + new


def _decoder_graph(nodes):
    """A one-layer merged decoder's inputs (token ids, mask, one past) around `nodes`, whose output is `o`."""
    from onnx import TensorProto, helper

    past = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past", 4])
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total"])
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "g", [ids, mask, past], [out]))


def test_the_genai_proof_opens_a_folder_given_relative_to_the_cwd(run, monkeypatch):
    """`hf-export run --out out` hands the proof a relative folder; GenAI runs in a child whose cwd is a scratch
    folder, so validation resolves it (it failed with `Error opening out/gqa/genai_config.json`)."""
    from exporters.layouts import Genai
    from exporters.layouts.genai.proof import GenaiReference
    GENAI = Genai()
    from exporters.validate.runtimes import prove_all

    monkeypatch.chdir(run["out"])
    wrong = GenaiReference([[5, 6, 7, 8], [5, 6]], [[127] * 4, [127] * 4], pad=3, eos=[2], steps=4)
    [proof] = prove_all([(GENAI, wrong)], Path("gqa"), None)  # what validation calls, with the folder it was given
    assert proof.status == "failed" and "tokens equal eager greedy" in proof.detail, proof  # GenAI ran the folder


# ── `ort_fusions: "cpu"` with the batch dynamic: GroupQueryAttention at any batch, guarded ──

ANY_BATCH = {"name": "gqa-any-batch", "export_format": "onnx", "mode": "generation", "dynamic": True,
             "ort_fusions": "cpu"}
LAYERS_16 = 2


def _llama_head_16(folder: Path) -> Path:
    """A 2-layer Llama with heads of 16 (4 query, 2 key-value): upstream rotates inside `GroupQueryAttention` only
    for head sizes in multiples of 16, so this graph has the fused op's own rotary (the 58M benchmark model's
    layout), unlike `tiny_llama`'s heads of 8."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=2, pad_token_id=3, initializer_range=0.3, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, {"exports": [ANY_BATCH]})


@pytest.fixture(scope="module")
def any_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai-any-batch")
    model_dir = _llama_head_16(root / "model")
    save_ascii_bpe_tokenizer(model_dir)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {"model_dir": model_dir, "folder": out / ANY_BATCH["name"], "target": report["targets"][0], "cli": result}


def _branches(folder: Path):
    """The main graph's nodes and, for each guard (`If`), its then and else branches' nodes."""
    import onnx

    from exporters.upstream import GQA_GUARD_NAME

    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    guards = [node for node in proto.graph.node if node.op_type == "If"]
    assert guards and all(node.name.startswith(GQA_GUARD_NAME) for node in guards)
    return proto, [{a.name: list(a.g.node) for a in guard.attribute} for guard in guards]


def test_a_dynamic_batch_graph_passes_and_genai_generates_a_batch_of_two_from_it(any_batch):
    assert any_batch["cli"].returncode == 0, any_batch["cli"].stdout + any_batch["cli"].stderr
    target = any_batch["target"]
    assert target["status"] == "passed", target
    assert target["generation"]["exported_tokens"] == target["generation"]["eager_tokens"]
    (proof,) = [p for p in target["runtimes"] if p["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "passed" and "batch of 2" in proof["detail"], proof  # one call for both prompts
    (component,) = target["components"]
    assert component["verdict"] == "passed", component  # every probe, the traced batch of 3 after a past included
    genai = json.loads((any_batch["folder"] / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is True  # the guard reads the past up to the mask's length


def test_every_attention_is_fused_rotary_inside_and_guarded_for_the_call_its_kernel_refuses(any_batch):
    proto, branches = _branches(any_batch["folder"])
    assert _batch_dim(any_batch["folder"]) == "batch_size"
    top = collections.Counter(node.op_type for node in proto.graph.node)
    assert top["Softmax"] == 0 and top["GroupQueryAttention"] == 0 and top["If"] == LAYERS_16
    for branch in branches:
        (fused,) = branch["then_branch"]
        assert fused.op_type == "GroupQueryAttention"
        assert {a.name: a.i for a in fused.attribute}["do_rotary"] == 1
        assert {"Softmax", "RotaryEmbedding", "Concat"} <= {node.op_type for node in branch["else_branch"]}
    past = {value.name for value in proto.graph.input if value.name.startswith("past_key_values.")}
    assert not {node.op_type for node in proto.graph.node if past & set(node.input)} - {"Shape"}


def _session(folder: Path, profile_dir: Path | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile_dir is not None:
        options.enable_profiling, options.profile_file_prefix = True, str(profile_dir / "run")
    return ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])


def _ran_fused_kernel(session) -> bool:
    events = json.loads(Path(session.end_profiling()).read_text())
    return any(event.get("args", {}).get("op_name") == "GroupQueryAttention" for event in events)


def _feeds(ids, mask, positions, past):
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": positions.numpy()}
    for i, (key, value) in enumerate(past):
        feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = key.numpy(), value.numpy()
    return feeds


def test_each_call_computes_what_eager_computes_and_generation_runs_the_fused_kernel(any_batch, tmp_path):
    """The merged graph's calls at a batch of 2, each against eager: a left-padded prompt on an empty past, one
    token after it (the fused kernel runs: ONNX Runtime's profile names it), and three tokens after that past, the
    call `GroupQueryAttention`'s kernel refuses at a batch over 1 (`batch_size must be 1 when sequence_length > 1
    and past context is given`): the guard computes it in standard ops and the kernel does not run."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(any_batch["model_dir"]).eval()
    kv_heads, head = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    ids = torch.tensor([[3, 3, 5, 17, 9], [70, 12, 5, 40, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    empty = [(torch.zeros(2, kv_heads, 0, head),) * 2] * LAYERS_16
    calls = [("prompt", ids, mask), ("one token", torch.tensor([[21], [30]]), None),
             ("three tokens", torch.tensor([[6, 7, 8], [9, 10, 11]]), None)]
    cache, past, seen = DynamicCache(config=model.config), empty, mask
    for name, tokens, call_mask in calls:
        seen = call_mask if call_mask is not None else torch.cat([seen, torch.ones_like(tokens)], dim=1)
        positions = (seen.cumsum(-1) - 1).clamp(min=0)[:, -tokens.shape[1]:]
        with torch.no_grad():
            want = model(input_ids=tokens, attention_mask=seen, position_ids=positions, cache=cache,
                         use_cache=True)
        profile = tmp_path / name.replace(" ", "-")
        profile.mkdir()
        session = _session(any_batch["folder"], profile)
        got = session.run(None, _feeds(tokens, seen, positions, past))
        names = [output.name for output in session.get_outputs()]
        logits = dict(zip(names, got))["logits"]
        rows = seen[:, -tokens.shape[1]:].bool().numpy()  # a pad row's logits are nobody's
        np.testing.assert_allclose(logits[rows], want.logits.numpy()[rows], atol=1e-4, rtol=1e-3, err_msg=name)
        past = [(torch.from_numpy(dict(zip(names, got))[f"present.{i}.key"]),
                 torch.from_numpy(dict(zip(names, got))[f"present.{i}.value"])) for i in range(LAYERS_16)]
        for i, layer in enumerate(want.past_key_values.layers):
            np.testing.assert_allclose(past[i][0].numpy(), layer.keys.numpy(), atol=1e-4, rtol=1e-3, err_msg=name)
        ran = _ran_fused_kernel(session)
        # a several-token prompt at a batch over 1 is rotated by standard ops too (docs/upstream-gaps.md #43)
        assert ran == (name == "one token"), (name, ran)


def test_upstream_kernel_rotates_a_first_prompts_sequences_at_the_first_ones_positions():
    """Pins docs/upstream-gaps.md #43 (onnxruntime 1.32, CPU): `GroupQueryAttention` with `do_rotary` and
    `position_ids`, a prompt of several tokens on an empty past, a batch of 3 whose sequences sit at other positions:
    each sequence's keys come out as if it sat at the first one's. Also why the guard sends such a call to standard
    ops. When this starts failing, upstream fixed it: the guard may then keep the fused kernel for that call."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total", "cos", "sin", "positions"]
    types = [TensorProto.FLOAT] * 5 + [TensorProto.INT32] * 2 + [TensorProto.FLOAT] * 2 + [TensorProto.INT64]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=2, kv_num_heads=2, do_rotary=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    batch, length, head = 3, 2, 16
    states = [rng.standard_normal((batch, length, 2 * head)).astype(np.float32) for _ in range(3)]
    past = np.zeros((batch, 2, 0, head), np.float32)
    caches = [rng.standard_normal((64, head // 2)).astype(np.float32) for _ in range(2)]
    positions = np.array([[0, 1], [2, 3], [4, 5]])

    def keys(rows: slice, at: np.ndarray) -> np.ndarray:
        count = rows.stop - rows.start
        feeds = [*(s[rows] for s in states), past[rows], past[rows], np.full(count, length - 1, np.int32),
                 np.array(length, np.int32), *caches, at]
        return session.run(["present_key"], dict(zip(names, feeds)))[0]

    together = keys(slice(0, 3), positions)
    alone = [keys(slice(b, b + 1), positions[b:b + 1]) for b in range(batch)]
    np.testing.assert_allclose(together[:1], alone[0], atol=1e-6)  # the first sequence: right
    as_first = keys(slice(1, 2), positions[:1])
    assert np.abs(together[1:2] - alone[1]).max() > 0.1  # the second: not at its own positions...
    np.testing.assert_allclose(together[1:2], as_first, atol=1e-6)  # ...but at the first one's


def test_optimum_generates_eagers_tokens_for_a_padded_batch_of_two_from_the_guarded_graph(any_batch):
    """optimum's `ORTModelForCausalLM` (its venv, as tests/test_genai.py's check): a left-padded batch of two,
    through the guard's standard ops for the prompt and the fused kernel for every token after it."""
    prompts = [[5, 17, 9, 33, 41, 8, 60], [70, 12, 5]]
    got = optimum_greedy(any_batch["folder"], prompts)
    want = _eager(any_batch["model_dir"], prompts, pad=3, eos=2)
    assert [_until(row, 2) for row in got["new"]] == want
    assert want[0] != want[1]


def test_a_graph_whose_past_is_read_inside_another_if_keeps_its_own_buffer_per_step():
    """A reader of the past inside a subgraph (an `If` that is not the attention's guard) counts as a reader: the
    graph keeps a buffer per step."""
    from onnx import TensorProto, helper

    from exporters.layouts.genai.buffer import share_past_present

    branch = helper.make_graph([helper.make_node("Identity", ["past_key_values.0.key"], ["copy"])], "b", [],
                               [helper.make_tensor_value_info("copy", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["cond"], ["o"], then_branch=branch, else_branch=branch, name="other_if"),
             helper.make_node("GroupQueryAttention", ["q", "", "", "past_key_values.0.key"], ["a"],
                              domain="com.microsoft")]
    proto = _decoder_graph(nodes)
    before = proto.SerializeToString()
    assert share_past_present(proto) is False
    assert proto.SerializeToString() == before


def test_a_fused_attention_the_guard_cannot_write_in_standard_ops_fails_the_export_with_what_to_do():
    """An attribute upstream's CPU fusion does not write today (a softcap) has no standard-op form in the guard:
    the export stops with what to do rather than writing a graph that computes something else for that call."""
    import onnx_ir as ir
    from onnx import TensorProto, helper

    from exporters.upstream.ort_attention import _guard_all

    def value(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    inputs = [value(name, TensorProto.FLOAT, ["batch", "seq", 32]) for name in ("query", "key", "value")]
    inputs += [value(name, TensorProto.FLOAT, ["batch", 2, "past", 16]) for name in ("past_key", "past_value")]
    inputs += [value("seqlens_k", TensorProto.INT32, ["batch"]), value("total", TensorProto.INT32, [])]
    outputs = [value(name, TensorProto.FLOAT, None) for name in ("out", "present_key", "present_value")]

    def model(**attributes):
        node = helper.make_node("GroupQueryAttention", [i.name for i in inputs], [o.name for o in outputs],
                                domain="com.microsoft", num_heads=2, kv_num_heads=2, name="attention", **attributes)
        return ir.serde.deserialize_model(helper.make_model(
            helper.make_graph([node], "g", inputs, outputs),
            opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]))

    with pytest.raises(NotImplementedError, match=r"\['softcap'\].*export with the batch fixed at 1"):
        _guard_all(model(softcap=30.0))
    plain = model()
    _guard_all(plain)
    assert [n.op_type for n in plain.graph][-1] == "If"  # the same attention without it: guarded


# ── the decode step's rewrites (issue #51): one guard condition for every layer, masked rows zeroed unreshaped ──

PLAIN = {"name": "plain", "export_format": "onnx", "mode": "generation", "dynamic": True}


@pytest.fixture(scope="module")
def plain_graphs(tmp_path_factory):
    """The unfused merged graphs (dynamic batch) of two tiny Llamas, as the CLI's export writes them: heads of 16,
    which `GroupQueryAttention` rotates inside, and heads of 8, rotated outside (its guards also test the total
    length). The tests read the graph only: it is exported in this process by the call the CLI's export child makes
    (`_plain_graph`), without the run's validation and runtime proofs (#48)."""
    root = tmp_path_factory.mktemp("decode-step")
    folders = {"rotary inside": _head_16_llama(root / "head-16", {"exports": [PLAIN]}, layers=3, positions=512),
               "rotary outside": tiny_llama(root / "head-8", {"exports": [PLAIN]}, initializer_range=0.3,
                                            max_position_embeddings=512, layers=3)}
    return {name: _plain_graph(folder, root / f"out-{folder.name}") for name, folder in folders.items()}


def _head_16_llama(folder: Path, recipe: dict, layers: int, positions: int) -> Path:
    """A tiny Llama (hidden 64) whose heads of 16 `GroupQueryAttention` rotates inside, saved with `recipe`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, initializer_range=0.3,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, recipe)


def _plain_graph(model_dir: Path, out: Path) -> Path:
    """The recipe's one target exported into `out/plain` as `hf-export run` exports it (the pipeline's export child
    calls `export_to` on the planned target and its components; model.onnx and its data were byte for byte the CLI's,
    #48), without validating it: tests/test_genai.py's plain dynamic Llama runs that validation and both proofs."""
    from exporters.export.convert import export_to
    from exporters.run.context import RunOptions, prepare_run
    from exporters.run.workbench import Workbench

    options = RunOptions(out_dir=out, bench=False)
    context = prepare_run(str(model_dir), options)
    workbench = Workbench.load(context, options, context.targets)
    target = workbench.plan(context.targets[0])
    export_to(workbench.model, target, workbench.components(target, context.recipe), context.recipe,
              out / "plain", [])
    return out / "plain" / "model.onnx"


def _fused(path: Path, folder: Path, rewrites: bool) -> Path:
    """`path`'s graph fused for ONNX Runtime's CPU provider as the exporter fuses it (upstream's steps with this
    project's guards), with the decode step's rewrites or without them; saved into `folder`."""
    import onnx_ir

    from exporters.upstream import group_query_attention_at_any_batch, ort_attention
    from exporters.upstream.patches import patched
    from transformers.exporters.onnxruntime_fusions import fuse_for_onnxruntime

    model = onnx_ir.load(str(path))
    onnx_ir.external_data.load_to_model(model)
    passes = ort_attention.DECODE_STEP_PASSES if rewrites else ()
    with patched(ort_attention, "DECODE_STEP_PASSES", passes), group_query_attention_at_any_batch():
        fuse_for_onnxruntime(model, "cpu")
    folder.mkdir()
    onnx_ir.save(model, str(folder / "model.onnx"), external_data="model.onnx.data")
    return folder / "model.onnx"


def _guard_nodes(path: Path):
    """The main graph's guards (`If`) and the other nodes this project's guard pass wrote (their conditions)."""
    import onnx

    from exporters.upstream import GQA_GUARD_NAME

    proto = onnx.load(str(path), load_external_data=False)
    guards = [node for node in proto.graph.node if node.op_type == "If"]
    written = {value for node in guards for a in node.attribute for n in a.g.node for value in n.output}
    conditions = [node for node in proto.graph.node if node.op_type != "If" and any(
        output.startswith(GQA_GUARD_NAME) and output not in written for output in node.output)]
    return proto, guards, conditions


@pytest.mark.parametrize("layout", ["rotary inside", "rotary outside"])
def test_the_decode_step_rewrites_compute_one_condition_and_zero_masked_rows_without_reshapes(plain_graphs, layout,
                                                                                              tmp_path):
    """Unrewritten, every layer's guard computes its own condition (the query's batch and length: `Shape` x2,
    `Equal` x2, `Or`, with the total's test where the kernel does not rotate) and zeroes masked rows through a
    `Reshape` to heads and back; rewritten, one condition serves every guard and each layer's `Where` reads the
    attention's output itself. The fused skip norms' statistics, which nothing reads, are no longer asked for."""
    import collections

    layers = 3
    before = _fused(plain_graphs[layout], tmp_path / "before", rewrites=False)
    after = _fused(plain_graphs[layout], tmp_path / "after", rewrites=True)
    per_condition = {"Shape": 2, "Equal": 2, "Or": 1} if layout == "rotary inside" else \
        {"Shape": 2, "Equal": 3, "Or": 2, "Reshape": 1, "Cast": 1}
    counted = {}
    for name, path in (("before", before), ("after", after)):
        proto, guards, conditions = _guard_nodes(path)
        assert len(guards) == layers, name
        kernels = collections.Counter(node.op_type for node in conditions if node.op_type != "Constant")
        counted[name] = (proto, guards, kernels, len(conditions))
    _, guards, kernels, written_before = counted["before"]
    assert kernels == {op: count * layers for op, count in per_condition.items()}
    assert len({guard.input[0] for guard in guards}) == layers  # a condition of its own each
    proto, guards, kernels, written_after = counted["after"]
    assert kernels == per_condition  # once
    assert len({guard.input[0] for guard in guards}) == 1
    assert written_before == layers * written_after  # the conditions' constants too
    produced_by = {output: node for node in proto.graph.node for output in node.output}
    wheres = [node for node in proto.graph.node if node.op_type == "Where" and produced_by[node.input[2]].op_type == "If"]
    assert len(wheres) == layers  # the attention's own output, no `Reshape` between
    assert {produced_by[node.input[0]].op_type for node in wheres} == {"Squeeze"}  # the mask, squeezed once
    total = {name: len(counted[name][0].graph.node) for name in counted}
    assert total["before"] - total["after"] == written_after * (layers - 1) + 2 * layers - 2, \
        total  # 2 per layer: the reshapes; 2 more: the squeeze and its axes
    norms = {name: [node for node in counted[name][0].graph.node if node.op_type == "SkipSimplifiedLayerNormalization"]
             for name in counted}
    assert len(norms["before"]) == len(norms["after"]) == 2 * layers  # after each attention and each MLP (the last, the final norm)
    assert all(all(node.output[1:3]) for node in norms["before"])  # the fusion names the statistics
    assert all(list(node.output[1:3]) == ["", ""] and node.output[0] and node.output[3] for node in norms["after"])


@pytest.mark.parametrize("layout", ["rotary inside", "rotary outside"])
def test_the_decode_step_rewrites_change_no_output_of_any_call(plain_graphs, layout, tmp_path):
    """The rewritten graph's every output (logits, every present) equals the unrewritten one's, bit for bit, on
    calls of each kind: one sequence (a prompt, then a token after it), a left-padded batch of two (its prompt, a
    token after it, then three tokens after that past: the call the kernel refuses), and one token after a long
    past (400 tokens, a batch of two with one sequence padded)."""
    import numpy as np
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(_fused(plain_graphs[layout], tmp_path / name, rewrites)),
                                     providers=["CPUExecutionProvider"])
                for name, rewrites in (("before", False), ("after", True))]
    names = [output.name for output in sessions[0].get_outputs()]
    pasts = [i for i in sessions[0].get_inputs() if i.name.startswith("past_key_values.")]
    kv_heads, head = pasts[0].shape[1], pasts[0].shape[3]
    rng = np.random.default_rng(0)

    def run(ids, mask, past):
        ids, mask = np.array(ids, np.int64), np.array(mask, np.int64)
        positions = (mask.cumsum(-1) - 1).clip(min=0)[:, -ids.shape[1]:]
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
        (got, want) = (dict(zip(names, session.run(None, feeds))) for session in sessions[::-1])
        for output in names:
            np.testing.assert_array_equal(got[output], want[output], err_msg=output)
        return {f"past_key_values.{name[len('present.'):]}": value for name, value in got.items()
                if name.startswith("present.")}

    def empty(batch):
        return {i.name: np.zeros((batch, kv_heads, 0, head), np.float32) for i in pasts}

    past = run([[5, 17, 9, 33]], [[1] * 4], empty(1))  # one sequence
    run([[21]], [[1] * 5], past)
    padded = [[1, 1, 1, 1], [0, 0, 1, 1]]
    past = run([[5, 17, 9, 33], [3, 3, 70, 12]], padded, empty(2))  # a left-padded batch of two
    past = run([[21], [30]], [row + [1] for row in padded], past)
    run([[6, 7, 8], [9, 10, 11]], [row + [1, 1, 1, 1] for row in padded], past)  # several tokens after a past
    long_mask = [[1] * 401, [0] * 7 + [1] * 394]
    long_past = {i.name: rng.standard_normal((2, kv_heads, 400, head)).astype(np.float32) for i in pasts}
    run([[21], [30]], long_mask, long_past)  # one token after a long past


# ── `"unpadded": true`: the batch-1 graph written for GenAI's calls (issue #51) ──

# docs/recipe.md's one line: the merged graph's batch fixed at 1 by `unpadded` itself
UNPADDED = {"name": "unpadded", "export_format": "onnx", "mode": "generation", "merged": True, "ort_fusions": "cpu",
            "unpadded": True}


@pytest.fixture(scope="module")
def unpadded_run(tmp_path_factory):
    """One CLI run of a tiny Llama whose heads of 16 `GroupQueryAttention` rotates inside, with the GenAI-on-CPU
    target twice: as the recipe writes it (`gqa`) and written for GenAI's unpadded calls (`unpadded`)."""
    root = tmp_path_factory.mktemp("genai-unpadded")
    model_dir = _head_16_llama(root / "model", {"exports": [GQA, UNPADDED]}, layers=2, positions=256)
    save_ascii_bpe_tokenizer(model_dir)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {"model_dir": model_dir, "out": out, "cli": result,
            "targets": {target["name"]: target for target in report["targets"]}}


def test_the_unpadded_graph_passes_validation_and_genai_generates_eagers_tokens(unpadded_run):
    from transformers import AutoTokenizer

    assert unpadded_run["cli"].returncode == 0, unpadded_run["cli"].stdout + unpadded_run["cli"].stderr
    target = unpadded_run["targets"]["unpadded"]
    assert target["status"] == "passed", target
    assert target["generation"]["exported_tokens"] == target["generation"]["eager_tokens"]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert {"ONNX Runtime GenAI", "optimum"} <= set(proofs), proofs  # optimum's generate() sends one prompt unpadded
    assert all(proof["status"] == "passed" for proof in proofs.values()), proofs
    assert any("written for ONNX Runtime GenAI's calls (unpadded: true)" in finding and "padded call is not computed"
               in finding for finding in target["findings"]), target["findings"]
    assert not any("unpadded: true" in finding for finding in unpadded_run["targets"]["gqa"]["findings"])
    tokenizer = AutoTokenizer.from_pretrained(unpadded_run["model_dir"])
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    for prompt, row in zip(prompts, _eager(unpadded_run["model_dir"], prompts, pad=3, eos=2)):
        assert _genai(unpadded_run["out"] / "unpadded", [prompt], pad=3, eos=2) == [row]


def test_the_unpadded_graph_reads_no_mask_bias_nor_positions_and_runs_the_builders_kernels(unpadded_run):
    """What GenAI's builder writes: each attention with eager's cos / sin as constants (positions 0 .. 255) and no
    bias or positions, no zeroed rows after it, `seqlens_k` not expanded; the mask's and the per-token rotary's
    kernels gone, the rest of the graph as the recipe's own."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from transformers import AutoModelForCausalLM

    graphs = {name: onnx.load(str(unpadded_run["out"] / name / "model.onnx"), load_external_data=False)
              for name in ("gqa", "unpadded")}
    ops = {name: collections.Counter(node.op_type for node in proto.graph.node) for name, proto in graphs.items()}
    attentions = [node for node in graphs["unpadded"].graph.node if node.op_type == "GroupQueryAttention"]
    assert len(attentions) == 2
    initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in graphs["unpadded"].graph.initializer
                    if tensor.data_location != onnx.TensorProto.EXTERNAL}  # the tables: in the graph's file
    for node in attentions:
        assert list(node.input[9:11]) == ["", ""]  # no positions, no bias
        assert node.input[7] in initializers and node.input[8] in initializers
    model = AutoModelForCausalLM.from_pretrained(unpadded_run["model_dir"])
    cos, sin = model.model.rotary_emb(torch_zeros(), torch_arange(256))
    np.testing.assert_array_equal(initializers[attentions[0].input[7]], cos[0, :, :8].numpy())
    np.testing.assert_array_equal(initializers[attentions[0].input[8]], sin[0, :, :8].numpy())
    assert ops["gqa"]["Where"] == 2 and ops["unpadded"]["Where"] == 0  # the zeroed rows, one a layer
    for op in ("Cos", "Sin", "Range", "GatherND", "ReduceSum", "Expand", "And", "Not"):
        assert ops["gqa"][op] > 0 and ops["unpadded"][op] == 0, op  # the mask's and the rotary's computation
    fused = ("GroupQueryAttention", "MatMul", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization")
    assert all(ops["gqa"][op] == ops["unpadded"][op] for op in fused)
    assert sum(ops["unpadded"].values()) < sum(ops["gqa"].values()) - 30


def test_the_unpadded_graph_computes_what_the_recipes_does_on_unpadded_calls_only(unpadded_run):
    """A prompt on an empty past, then a token after it: every output as the recipe's own graph's (the constant
    tables' float32 rounding against ONNX Runtime's `Cos` / `Sin` aside); a left-padded prompt, which the unpadded
    graph does not take (the report says so): other logits at its real positions."""
    import numpy as np
    import onnxruntime as ort

    sessions = {name: ort.InferenceSession(str(unpadded_run["out"] / name / "model.onnx"),
                                           providers=["CPUExecutionProvider"]) for name in ("gqa", "unpadded")}
    names = [output.name for output in sessions["gqa"].get_outputs()]
    pasts = [i for i in sessions["gqa"].get_inputs() if i.name.startswith("past_key_values.")]

    def run(name, ids, mask, past, positions):
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64),
                 "position_ids": np.array([positions], np.int64), **past}
        return dict(zip(names, sessions[name].run(None, feeds)))

    empty = {i.name: np.zeros((1, 2, 0, 16), np.float32) for i in pasts}
    prompt = {name: run(name, [5, 17, 9, 33], [1] * 4, empty, [0, 1, 2, 3]) for name in sessions}
    for output in names:
        np.testing.assert_allclose(prompt["unpadded"][output], prompt["gqa"][output], rtol=0, atol=1e-5,
                                   err_msg=output)
    past = {f"past_key_values.{n[len('present.'):]}": v for n, v in prompt["gqa"].items() if n.startswith("present.")}
    step = {name: run(name, [21], [1] * 5, past, [4]) for name in sessions}
    for output in names:
        np.testing.assert_allclose(step["unpadded"][output], step["gqa"][output], rtol=0, atol=1e-5, err_msg=output)
    padded = {name: run(name, [3, 3, 9, 33], [0, 0, 1, 1], empty, [1, 1, 0, 1])["logits"] for name in sessions}
    assert np.abs(padded["unpadded"][:, 2:] - padded["gqa"][:, 2:]).max() > 1e-2


def test_unpadded_is_refused_where_it_would_change_an_unpadded_call():
    """A recipe without the fusions it rewrites; a model whose mask holds a window (Mistral's `sliding_window`) or
    whose rope tables depend on the length; a graph whose batch is dynamic: each refused with what to do."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from exporters.errors import RecipeError, TargetPlanError
    from exporters.layouts.genai.unpadded import rotary_tables, write_for_unpadded_calls
    from exporters.recipe.load import parse_recipe

    with pytest.raises(RecipeError, match="unpadded rewrites the merged graph that ort_fusions 'cpu' fuses"):
        parse_recipe(json.dumps({"exports": [{"export_format": "onnx", "mode": "generation", "unpadded": True}]}))
    for other in ({"dynamic": True}, {"layout": "transformers.js"}):
        with pytest.raises(RecipeError, match="for one sequence at a time"):
            parse_recipe(json.dumps({"exports": [{**UNPADDED, **other}]}))
    small = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
    with pytest.raises(TargetPlanError, match="sliding_window: a window or chunk lives in the mask"):
        rotary_tables(MistralForCausalLM(MistralConfig(**small, sliding_window=16)))
    dynamic = LlamaConfig(**small, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(TargetPlanError, match="rope type 'dynamic' computes tables that depend"):
        rotary_tables(LlamaForCausalLM(dynamic))
    cos, sin = rotary_tables(LlamaForCausalLM(LlamaConfig(**small)))
    assert cos.shape == sin.shape == (64, 8)
    proto = _unpadded_stub_graph(batch="batch_size")
    with pytest.raises(TargetPlanError, match="batch is not fixed at 1"):
        write_for_unpadded_calls(proto, cos, sin)


def _unpadded_stub_graph(batch):
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "sequence_length"])
    attention = helper.make_node("GroupQueryAttention", ["q"], ["o"], domain="com.microsoft", do_rotary=1)
    return helper.make_model(helper.make_graph([attention], "g", [ids], []))


def torch_zeros():
    import torch

    return torch.zeros(1)


def torch_arange(length):
    import torch

    return torch.arange(length).unsqueeze(0)

"""The merged decoder ONNX fused for ONNX Runtime's CPU provider (`"ort_fusions": "cpu"`, issue #26 §5) in the
recipe docs/recipe.md recommends for ONNX Runtime GenAI on CPU: the merged contract with the batch fixed at 1, where
upstream fuses every attention into ONNX Runtime's `GroupQueryAttention` (with a dynamic batch it fuses the norms,
skip norms and rotary embeddings only: `GroupQueryAttention` takes several tokens after a past for one sequence
only). It passes validation, `onnx.checker` included (ONNX Runtime's `SimplifiedLayerNormalization` lives in ONNX's
domain), and ONNX Runtime GenAI generates eager's greedy tokens from the folder alone, each prompt alone.

One CLI run of a tiny Llama, shared by every check (one target: the suite is near CI's time budget).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.models import save_ascii_bpe_tokenizer, tiny_llama
from tests.test_genai import PROMPTS, _eager, _genai

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
    from onnx import TensorProto, helper

    from exporters.export.genai_buffer import share_past_present

    past = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past", 4])
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total"])
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["past_key_values.0.key"], ["length"], start=2, end=3),
             helper.make_node("Gather", ["past_key_values.0.key", "index"], ["slice"], axis=2),
             helper.make_node("GroupQueryAttention", ["q", "", "", "past_key_values.0.key"], ["o"],
                              domain="com.microsoft")]
    proto = helper.make_model(helper.make_graph(nodes, "g", [ids, mask, past], [out]))
    before = proto.SerializeToString()
    assert share_past_present(proto) is False
    assert proto.SerializeToString() == before
    without_attention = helper.make_model(helper.make_graph(nodes[:1], "g", [ids, mask, past], [out]))
    assert share_past_present(without_attention) is False  # a plain graph: its present is past + new


def test_the_genai_proof_opens_a_folder_given_relative_to_the_cwd(run, monkeypatch):
    """`hf-export run --out out` hands the proof a relative folder; GenAI runs in a child whose cwd is a scratch
    folder, so validation resolves it (it failed with `Error opening out/gqa/genai_config.json`)."""
    from exporters.validate.runtime_genai import GENAI, GenaiReference
    from exporters.validate.runtimes import prove_all

    monkeypatch.chdir(run["out"])
    wrong = GenaiReference([[5, 6, 7, 8], [5, 6]], [[127] * 4, [127] * 4], pad=3, eos=[2], steps=4)
    [proof] = prove_all([(GENAI, wrong)], Path("gqa"), None)  # what validation calls, with the folder it was given
    assert proof.status == "failed" and "tokens equal eager greedy" in proof.detail, proof  # GenAI ran the folder

"""transformers.js dtype files (issue #51, item 2), end to end through the real CLI.

A transformers.js-layout target with `variants: ["fp32", "fp16", "int8-dynamic", "int4", "q4f16"]` ends as ONE
folder holding `onnx/model.onnx`, `model_fp16.onnx`, `model_quantized.onnx`, `model_q4.onnx` and `model_q4f16.onnx`
(transformers.js's names, its src/utils/dtypes.js): each file is judged against eager with its variant's budget, and
one Node child loads the folder with every `dtype` (the pinned transformers.js of `make test-deps`). The card lists the
files with sizes and quality, and its snippet passes `dtype`.

The checkpoint ties its embedding table to its LM head (as most small LLMs do) and its weights are snapped to the
4-bit block grid (as in tests/test_int4_onnx.py), so the q4 files match eager up to float rounding and a wrong packing
shows as a failed budget. The q4 files come from the `int4` variant's own quantizer: the tied table and head stored
once, in 4 bits (`GatherBlockQuantized` over the head's `MatMulNBits` blocks), and transformers.js loads them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from tests.conftest import ROOT, run_cli
from tests.models import snap_to_int4_grid, tiny_llama

VARIANTS = ["fp32", "fp16", "int8-dynamic", "int4", "q4f16"]
RECIPE = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js",
                       "variants": VARIANTS}],
          "inputs": {"sequence_length": 6}, "generation": {"max_new_tokens": 5}}
FILES = {"fp32": "model.onnx", "fp16": "model_fp16.onnx", "q8": "model_quantized.onnx", "q4": "model_q4.onnx",
         "q4f16": "model_q4f16.onnx"}


@dataclass
class Run:
    model: Path
    out: Path
    result: subprocess.CompletedProcess
    target: dict


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    modules = ROOT / ".cache" / "transformers-js" / "node_modules" / "@huggingface" / "transformers"
    if shutil.which("node") is None or not modules.is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps`")
    folder = tiny_llama(tmp_path_factory.mktemp("tjs-dtypes") / "model", RECIPE, initializer_range=0.1,
                        tie_word_embeddings=True)
    snap_to_int4_grid(folder)
    out = tmp_path_factory.mktemp("tjs-dtypes-out")
    result = run_cli("run", str(folder), "--out", str(out), "--no-bench")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {"targets": [{}]}
    [target] = report["targets"]
    return Run(folder, out, result, target)


def test_one_folder_holds_every_dtype_file_under_transformers_js_names(run: Run):
    assert run.result.returncode == 0, run.result.stdout[-3000:] + run.result.stderr[-3000:]
    assert sorted(p.name for p in run.out.iterdir() if p.is_dir()) == ["logs", "tjs"]  # one folder, no view left
    onnx_dir = run.out / "tjs" / "onnx"
    assert sorted(p.name for p in onnx_dir.iterdir()) == sorted([*FILES.values(), *(f"{f}_data" for f in FILES.values())])
    config = json.loads((run.out / "tjs" / "config.json").read_text())["transformers.js_config"]
    assert config == {"dtype": "fp32", "use_external_data_format": dict.fromkeys(FILES.values(), 1)}
    ops = {dtype: {node.op_type for node in onnx.load(str(onnx_dir / name), load_external_data=False).graph.node}
           for dtype, name in FILES.items()}
    assert "MatMulNBits" in ops["q4"] and "MatMulNBits" in ops["q4f16"] and "MatMulNBits" not in ops["fp32"]
    assert "MatMulInteger" in ops["q8"] or "DynamicQuantizeMatMul" in ops["q8"], ops["q8"]
    for dtype in ("q4", "q4f16"):  # the tied table and head once, in 4 bits: no [vocab, hidden] float table left
        graph = onnx.load(str(onnx_dir / FILES[dtype]), load_external_data=False).graph
        assert "GatherBlockQuantized" in ops[dtype], ops[dtype]
        assert not [t.name for t in graph.initializer if list(t.dims) in ([128, 32], [32, 128])
                    and t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)], dtype
    for dtype in ("fp16", "q4f16"):  # float16 inside, float32 at the edges (keep_io_types, as transformers.js converts)
        graph = onnx.load(str(onnx_dir / FILES[dtype]), load_external_data=False).graph
        assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer), dtype
        assert {i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_key_values")} == \
            {onnx.TensorProto.FLOAT}


def test_each_dtype_file_is_judged_with_its_variants_budget(run: Run):
    target = run.target
    assert target["status"] == "passed", json.dumps(target.get("error"), indent=1)
    rows = {row["dtype"]: row for row in target["dtype_files"]}
    assert list(rows) == ["fp32", "fp16", "q8", "q4", "q4f16"]
    assert {row["file"] for row in rows.values()} == {f"onnx/{name}" for name in FILES.values()}
    assert all(row["status"] == "passed" for row in rows.values()), rows
    budgets = {"fp16": "half", "q8": "int8", "q4": "int4", "q4f16": "int4"}
    for dtype, kind in budgets.items():
        quality = rows[dtype]["quality"]
        assert quality["kind"] == kind and quality["judged_by"] == "metrics" and quality["passed"], quality
    assert rows["q4"]["quality"]["budget"]["min_top1_agreement"] == 0.75  # the int4 defaults
    assert rows["fp16"]["quality"]["budget"]["min_top1_agreement"] == 0.98  # the half defaults
    data = {dtype: (run.out / "tjs" / f"{row['file']}_data").stat().st_size for dtype, row in rows.items()}
    # 4 bits a weight, the tied table and head once: a float table left beside them would be 0.18 of fp32's data
    assert data["q4"] < 0.15 * data["fp32"] and data["fp16"] <= 0.5 * data["fp32"], data
    # q4f16 holds q4's 4-bit weights; its float16 parts (scales, norms) are small enough to stay in the graph file
    assert data["q4f16"] <= data["q4"], data
    assert data["q8"] < 0.4 * data["fp32"], data
    for dtype, row in rows.items():  # the graph and its data: what the card's size says
        assert row["bytes"] == data[dtype] + (run.out / "tjs" / row["file"]).stat().st_size


def test_transformers_js_loads_the_folder_with_every_dtype(run: Run):
    [proof] = [p for p in run.target["runtimes"] if p["runtime"] == "transformers.js"]
    assert proof["status"] == "passed", proof
    assert proof["detail"].startswith("5/5 tokens (transformers.js 4.3.2, Node.js); dtype "), proof
    for dtype in ("fp16", "q8", "q4", "q4f16"):
        assert f"{dtype} " in proof["detail"], proof


def test_the_card_lists_the_dtype_files_and_its_snippet_passes_dtype(run: Run):
    from exporters.layouts import TransformersJs

    language, code = TransformersJs().snippet("org/model", run.target, None)
    assert language == "js" and "dtype: \"fp32\"" in code  # the folder's default: the first variant listed
    assert [row["dtype"] for row in run.target["dtype_files"] if row["default"]] == ["fp32"]
    rows = {row["dtype"]: row for row in run.target["dtype_files"]}
    for dtype in ("fp32", "fp16", "q8", "q4", "q4f16"):
        line = next(line for line in code.splitlines() if line.startswith(f'//   dtype "{dtype}"'))
        assert f": {rows[dtype]['bytes'] / 1e6:.2f} MB, " in line, line
    assert "top-1 1.000" in next(line for line in code.splitlines() if line.startswith('//   dtype "q4"'))


def test_a_dtype_file_outside_its_budget_fails_the_target(run: Run, tmp_path):
    """`hf-export validate` of the folder with model_q4.onnx's weights zeroed: that file is judged with the int4
    budget and fails the target, naming it; the other files still pass."""
    copy = tmp_path / "out"
    shutil.copytree(run.out / "tjs", copy / "tjs")
    data = copy / "tjs" / "onnx" / "model_q4.onnx_data"
    data.write_bytes(bytes(data.stat().st_size))
    done = run_cli("validate", str(run.model), str(copy), "--target", "tjs")
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    assert done.returncode == 1 and target["status"] == "failed", done.stderr[-2000:]
    assert "dtype file(s) outside their budget: onnx/model_q4.onnx (q4)" in target["error"]["message"], target["error"]
    rows = {row["dtype"]: row["status"] for row in target["dtype_files"]}
    assert rows == {"fp32": "passed", "fp16": "passed", "q8": "passed", "q4": "failed", "q4f16": "passed"}, rows
    assert json.loads((copy / "tjs" / "export.json").read_text()) == \
        json.loads((run.out / "tjs" / "export.json").read_text())  # restored after each file was judged


def test_a_multi_query_config_is_refused_saying_transformers_js_cannot_feed_its_cache(tmp_path):
    """Issue #51's sweep: Falcon's config sets `multi_query` (its default), which transformers.js 4.3.2 reads as
    GPT-BigCode's fused `past_key_values.{i}.key_value` cache, so it fed none of the graph's key/value inputs and the
    target failed in the proof with transformers.js's "Missing the following inputs", naming no cause (fp32 and every
    dtype file alike). The layout now refuses it before writing the folder: TargetPlanError naming `multi_query` and
    the upstream gap, exit 1, no dtype file written. The model's own default ONNX target is not affected (the
    matrix's falcon row)."""
    from matrix.families import FAMILIES, build

    recipe = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation",
                           "layout": "transformers.js", "variants": ["int4", "fp32"]}],
              "generation": {"max_new_tokens": 2}}
    spec = FAMILIES["falcon"]
    model = build(spec, tmp_path / "model", recipe=recipe)
    assert json.loads((model / "config.json").read_text())["multi_query"] is True
    out = tmp_path / "out"
    done = run_cli("run", str(model), "--out", str(out), "--no-bench", "--quiet")
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert done.returncode == 1 and target["status"] == "failed", (done.stdout[-2000:], target)
    said = target["error"]["message"]
    assert target["error"]["type"] == "TargetPlanError" and "multi_query" in said and "#63" in said, said
    assert not list(out.rglob("model_q4.onnx")), sorted(p.name for p in out.rglob("*"))

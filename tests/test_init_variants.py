"""`hf-export init` proposes the int4 variant of a decoder-only LLM beside fp32 (issue #51, item 5), where it ran and
kept its budget: the proposal's rule (unit), and one run of the real CLI on a tiny Llama whose linear weights sit on
the 4-bit grid (tests/test_int4_onnx.py), so int4 keeps its budget there and `hf-export check` expands the recipe
into `onnx` and `onnx-int4`. (The README quick start's instruct checkpoint tries the variants too and each is
proposed or left out, saying why: tests/test_first_hour.py; tests/test_init.py's Llama checks `--fp32-only`.)
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.init.decide import COMPONENT_GRAPHS, MERGED_GRAPH, RUNNER_GRAPH, FormatResult
from exporters.init.variants import quantized_variant
from tests.conftest import run_cli
from tests.models import tiny_llama
from tests.test_int4_onnx import SEED, snap_to_int4_grid


def test_the_int4_variants_init_proposes_for_a_decoder_only_llm():
    proposals = {(fmt, graph, family): quantized_variant(FormatResult(fmt, graph=graph), family)
                 for fmt in ("dynamo", "onnx", "executorch") for graph in (MERGED_GRAPH, RUNNER_GRAPH, COMPONENT_GRAPHS)
                 for family in ("text", "vision-language")}
    assert {key: value for key, value in proposals.items() if value} == {
        ("onnx", MERGED_GRAPH, "text"): "int4",  # ONNX Runtime GenAI's CPU default
        ("executorch", RUNNER_GRAPH, "text"): "8da4w",  # the ExecuTorch LLM runner's
    }


def test_init_proposes_fp32_and_int4_for_a_decoder_only_llm(tmp_path: Path):
    model = tiny_llama(tmp_path / "model", None, seed=SEED, max_position_embeddings=64, initializer_range=0.3)
    snap_to_int4_grid(model)
    recipe_file = tmp_path / "export_config.json"
    done = run_cli("init", str(model), "--formats", "onnx", "--out", str(recipe_file), "--summary",
                   str(tmp_path / "summary.md"), "--max-seconds", "900")
    assert done.returncode == 0, done.stderr[-4000:]
    [target] = json.loads(recipe_file.read_text())["exports"]
    assert target["name"] == "onnx" and target["variants"] == ["fp32", "int4"], target
    said = " ".join((done.stdout + (tmp_path / "summary.md").read_text()).split())
    assert "onnx-int4" in said and "the int4 variant (onnx-int4) is proposed beside fp32" in said, said[-3000:]
    check = run_cli("check", str(recipe_file))
    assert check.returncode == 0, check.stderr
    assert [line.split(":")[0] for line in check.stdout.splitlines()] == ["onnx", "onnx-int4"]

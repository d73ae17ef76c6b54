"""Models whose plain export holds an op the target's runtime cannot run, traced in ops it can (issue #30's families
in every format):

- a mixture-of-experts decoder runs its experts through transformers' own op `transformers::grouped_mm_fallback`,
  which ExecuTorch has no kernel for ("Missing out variants"): its ExecuTorch program is traced with
  `experts_implementation="batched_mm"` (standard ops), the model's own setting restored after; the split of its
  experts' gate and up projections no longer fixes the prompt of its methods-layout program (ExecuTorch's validator
  asked the length of the split's first tensor, a guard on the token count);
- Qwen2-VL's and Qwen2.5-VL's patch embedding is a `Conv3d` whose kernel covers its input, which neither
  ExecuTorch's portable convolution (3-D and 4-D only) nor XNNPACK runs: it is traced as the matmul it is; Qwen2.5-VL's
  vision tower argsorts a permutation (ExecuTorch has no sort kernel): traced as the scatter that inverts it;
- onnxscript's optimizer removed `x + c` for any |c| <= 1e-8, so an RMS norm lost an epsilon of 1e-8 (Helium):
  ONNX graphs keep it;
- eager references are computed at the thread count the artifact runs at: a reduction split over two threads rounds
  differently from one;
- the LLM runner's layout by default only where the model can have it: BLOOM's own attention code (ALiBi) gets the
  standard ops instead of `llama::custom_sdpa`, and Falcon, whose multi-query keys do not fit the static cache its
  config sizes, gets the methods layout, each said in the report; OPT, which eager runs with the static cache but
  whose runner program cannot be exported (its positions read the mask with `.item()`), is exported again with the
  methods layout, and `hf-export validate` of that folder validates the program it holds.

Each ExecuTorch model is exported once through the real CLI (module-scoped fixtures), at one decoder layer.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH
from tests.export_store import MODEL, OUT, exported, stored_run
from tests.models import family_model, runner_model

# One decoder layer: each fallback below is a property of the family's layer, not of the depth (#48: half the
# program to trace and lower)
ONE_LAYER = {"num_hidden_layers": 1}
ONE_TEXT_LAYER = {"text_config.num_hidden_layers": 1, "text_config.layer_types": ["full_attention"]}


@pytest.fixture(scope="module")
def moe_runner(tmp_path_factory):
    """The LLM runner's tiny Qwen2-MoE (`runner_model`, with the BPE tokenizer the runner reads), one MoE layer, the
    plainest ExecuTorch recipe: `moe_default`'s Qwen2-MoE run, the same stored export (#48: one MoE export, not two)."""
    return _moe_run(tmp_path_factory.mktemp("moe-runner"), RUNNER_MOE)


def _family_executorch(root: Path, family: str, **overrides) -> tuple[Path, dict, str]:
    recipe = {"schema_version": 1, "exports": [PLAINEST_EXECUTORCH], "generation": {"max_new_tokens": 8}}
    return stored_run(family_model(family, root / "model", recipe, **overrides))


@pytest.fixture(scope="module")
def qwen2_5_vl_executorch(tmp_path_factory):
    return _family_executorch(tmp_path_factory.mktemp("qwen2-5-vl-executorch"), "qwen2_5_vl", **ONE_TEXT_LAYER)


@pytest.fixture(scope="module")
def bloom_runner(tmp_path_factory):
    return _family_executorch(tmp_path_factory.mktemp("bloom-runner"), "bloom", **ONE_LAYER)


@pytest.fixture(scope="module")
def falcon_default(tmp_path_factory):
    return _family_executorch(tmp_path_factory.mktemp("falcon-executorch"), "falcon", **ONE_LAYER)


# every decoder-only mixture-of-experts family of the matrix (the hybrids with MoE layers keep the methods layout of
# their state-space layers, the prompt stepped through the decode: tests/test_hybrid.py)
MOE_FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "ernie4_5_moe", "deepseek_v3", "glm4_moe"]


# One MoE layer per family (#48): DeepSeek-V3's and GLM-4-MoE's first layer is dense in the family's model (here it is
# the routed one); EOS never the argmax (a one-layer OLMoE picked it first, and a generation check that saw one token
# is unverified)
MOE_ONE_LAYER = {"deepseek_v3": {"first_k_dense_replace": 0}, "glm4_moe": {"first_k_dense_replace": 0}}


# The methods-layout program with its prompt declared dynamic, a second target of the MoE run of these families (#48:
# one CLI start, model load and eager pass a family serve both tests, which read their target by name)
METHODS_DYNAMIC = {**PLAINEST_EXECUTORCH, "name": "methods-dynamic", "layout": "methods", "dynamic": True}
METHODS_DYNAMIC_FAMILIES = ("qwen3_moe", "deepseek_v3")


# Qwen2-MoE's run is the LLM runner's tiny Qwen2-MoE (4 experts, 2 a token, a shared expert; EOS never the argmax),
# saved with a tokenizer the runner reads: `moe_runner` proves it in the runner, `moe_default` reads its prompt axis
RUNNER_MOE = "qwen2_moe"


def _moe_run(root: Path, family: str) -> tuple[Path, dict, str]:
    """One family's MoE run through the store: the plainest ExecuTorch target (named `executorch`, layout and
    `dynamic` unset), and for METHODS_DYNAMIC_FAMILIES the METHODS_DYNAMIC one beside it; one layer, a MoE one
    (RUNNER_MOE's model is `runner_model`'s, the others the matrix's)."""
    exports = [PLAINEST_EXECUTORCH, *([METHODS_DYNAMIC] if family in METHODS_DYNAMIC_FAMILIES else [])]
    recipe = {"schema_version": 1, "exports": exports, "generation": {"max_new_tokens": 8}}
    if family == RUNNER_MOE:
        return stored_run(runner_model(root / "model", family, recipe, layers=1))
    return stored_run(family_model(family, root / "model", recipe, never_eos=True, **ONE_LAYER,
                                   **MOE_ONE_LAYER.get(family, {})))


def _named(report: dict, name: str) -> dict:
    """The report's target `name` ({} when the run wrote no report or no such target)."""
    return next((t for t in report.get("targets", []) if t["name"] == name), {})


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def moe_default(request, tmp_path_factory):
    """A MoE family's plainest ExecuTorch recipe (layout and `dynamic` unset): the runner's program, or, where the
    model refuses the runner's static cache (DeepSeek-V3's latent attention), the methods program."""
    return _moe_run(tmp_path_factory.mktemp(f"moe-default-{request.param}"), request.param)


@pytest.fixture(scope="module", params=METHODS_DYNAMIC_FAMILIES)
def moe_methods_dynamic(request, tmp_path_factory):
    """A MoE decoder in the methods layout (its prefill a method of its own; DeepSeek-V3's default, its latent
    attention building its keys with `new_empty`), its prompt declared dynamic: the `methods-dynamic` target of the
    family's `moe_default` run (the same stored export)."""
    return _moe_run(tmp_path_factory.mktemp(f"moe-methods-dynamic-{request.param}"), request.param)


@pytest.fixture(scope="module")
def opt_default(tmp_path_factory):
    """OPT with two ExecuTorch targets: the plainest (layout unset) and one that asks for the runner layout."""
    root = tmp_path_factory.mktemp("opt-executorch")
    recipe = {"schema_version": 1, "generation": {"max_new_tokens": 8},
              "exports": [{**PLAINEST_EXECUTORCH, "name": "plain"},
                          {**PLAINEST_EXECUTORCH, "name": "asked", "layout": "runner"}]}
    done = exported(family_model("opt", root / "model", recipe, **ONE_LAYER), "run", "--no-bench", MODEL, "--out",
                    OUT, "--quiet")
    return done


def test_a_default_runner_program_that_cannot_be_exported_is_exported_as_methods(opt_default, tmp_path):
    """OPT runs eagerly with the runner's static cache (the plan-time check passes), but its positions are
    computed with `.item()` on the mask, which torch.export cannot trace: the plainest recipe's target is exported
    again with the methods layout, passes, and says why; the target that asked for the runner layout fails with the
    export's own error (no silent change of what was asked); `hf-export validate` of the folder validates the
    methods program it holds."""
    from tests.conftest import run_cli

    model_dir, out, report, log = opt_default.model_dir, opt_default.out, opt_default.report, opt_default.stdout + \
        opt_default.stderr
    targets = {t["name"]: t for t in report.get("targets", [])}
    plain, asked = targets.get("plain", {}), targets.get("asked", {})
    assert plain.get("status") == "passed", (log[-3000:], json.dumps(plain, indent=1)[:4000])
    assert json.loads((out / "plain" / "export.json").read_text()).get("layout") != "runner"
    finding = next((f for f in plain["findings"] if "the runner program's export failed" in f), "")
    assert "exported again with layout 'methods'" in finding and "Original traceback" not in finding, plain["findings"]
    assert plain["generation"]["status"] == "passed"
    assert asked.get("status") == "failed" and not (out / "asked").exists()
    assert "item" in json.dumps(asked.get("error")), asked.get("error")

    out = opt_default.copy(tmp_path).out  # validate rewrites the report: on a copy of the shared export
    done = run_cli("validate", str(model_dir), str(out), "--target", "plain")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    again = json.loads((out / "report.json").read_text())["targets"]
    assert [t["name"] for t in again] == ["plain"] and again[0]["status"] == "passed", json.dumps(again)[:3000]
    again = again[0]
    assert any("the folder's program has the methods layout" in f for f in again["findings"]), again["findings"]


def test_a_model_with_its_own_attention_code_gets_the_runner_program_without_custom_ops(bloom_runner):
    """BLOOM adds its ALiBi bias in its own attention code, which `llama::custom_sdpa` cannot replace: with the
    custom cache its logits were off by 0.5; by default it gets the standard ops, and the report says why."""
    out, report, log = bloom_runner
    target = report["targets"][0] if report else {}
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    manifest = json.loads((out / target["name"] / "export.json").read_text())
    assert manifest["layout"] == "runner" and manifest["custom_ops"] is False
    assert any("BloomForCausalLM computes attention in its own code" in f for f in target["findings"])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]


def test_a_model_the_static_cache_cannot_hold_falls_back_to_the_methods_layout(falcon_default):
    """Falcon's multi-query attention writes one key head into a static cache sized from `num_kv_heads`: the runner
    program cannot run it (nor export it), so the default layout is the methods one, said in the report; a recipe
    that asks for the runner layout gets the reason as a plan error."""
    out, report, log = falcon_default
    target = report["targets"][0] if report else {}
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    assert json.loads((out / target["name"] / "export.json").read_text()).get("layout") != "runner"
    assert any("FalconForCausalLM does not run with the runner program's static cache" in f
               for f in target["findings"]), target["findings"]
    assert target["generation"]["status"] == "passed"


def test_asking_the_runner_layout_of_such_a_model_is_a_plan_error(tmp_path):
    from exporters.capture.llm_runner import refused
    from exporters.errors import TargetPlanError
    from exporters.recipe.load import parse_recipe
    from matrix.families import FAMILIES, tiny_model

    model = tiny_model(FAMILIES["falcon"])
    asked = parse_recipe('{"export_format": "executorch", "mode": "generation", "layout": "runner"}').exports[0]
    with pytest.raises(TargetPlanError, match="layout 'runner' cannot be exported: FalconForCausalLM"):
        refused(asked, model, {"input_ids": torch.tensor([[5, 6, 7]])})
    plain = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
    assert refused(plain, tiny_model(FAMILIES["llama"]), {"input_ids": torch.tensor([[5, 6, 7]])}) is None


def test_a_mixture_of_experts_decoder_runs_in_the_llm_runner(moe_runner):
    out, report, log = moe_runner
    target = report["targets"][0] if report else {}
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    assert json.loads((out / target["name"] / "export.json").read_text())["layout"] == "runner"
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert len(set(generation["eager_tokens"][0])) > 1, "greedy tokens vary: the check can fail"
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["ExecuTorch LLM runner"] == {"runtime": "ExecuTorch LLM runner", "status": "passed",
                                                "detail": "8/8 tokens", "compared": 8, "asked": 8}
    assert b"grouped_mm" not in (out / target["name"] / "model.pte").read_bytes()


def test_a_mixture_of_experts_program_takes_prompts_of_any_length(moe_methods_dynamic):
    """The prefill of a MoE decoder's methods-layout program, its prompt declared dynamic, runs prompts of other
    lengths than the traced one and matches eager at each (it took only the traced 8 tokens: issue #50)."""
    out, report, log = moe_methods_dynamic
    target = _named(report, METHODS_DYNAMIC["name"])
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    prefill = next(c for c in target["components"] if c["name"] == "prefill")
    lengths = {check["shapes"]["input_ids"][1] for check in prefill["checks"]
               if check["verdict"] == "passed" and all(o["passed"] for o in check["outputs"])}
    assert len(lengths - {8}) >= 2, prefill["checks"]
    assert target["generation"]["status"] == "passed"


def test_every_moe_familys_plainest_executorch_program_takes_prompts_of_any_length(moe_default):
    """Issue #50 item 2: the plainest ExecuTorch recipe of every MoE family of the matrix gives a program whose
    prompt axis is dynamic, matched against eager at prompts of 2, 10 and 19 tokens: the runner's program, or the
    methods program that replaces it where the model cannot have it (DeepSeek-V3's took only its traced 8 tokens)."""
    out, report, log = moe_default
    target = _named(report, "executorch")
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    layout = json.loads((out / target["name"] / "export.json").read_text()).get("layout")
    prompt = next(c for c in target["components"] if c["name"] == ("model" if layout == "runner" else "prefill"))
    lengths = {check["shapes"]["input_ids"][1] for check in prompt["checks"]
               if check["verdict"] == "passed" and all(o["passed"] for o in check["outputs"])}
    assert {2, 10, 19} <= lengths, (layout, prompt["checks"])
    if layout != "runner":
        assert any("keeps the prompt axis dynamic" in f for f in target["findings"]), target["findings"]
    assert target["generation"]["status"] == "passed"


class _GateUp(torch.nn.Module):
    """A MoE expert's gate: its fused gate and up projections split in two over the (tokens x top_k) rows."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        gate, up = rows.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up


def _rows_program(path: Path, validated_whole: bool) -> str:
    from executorch.exir import to_edge

    from exporters.upstream import list_results_validated_whole

    rows = torch.export.Dim("rows", min=2, max=64)
    program = torch.export.export(_GateUp(), (torch.randn(6, 8),), dynamic_shapes=({0: rows},))
    with list_results_validated_whole() if validated_whole else contextlib.nullcontext():
        path.write_bytes(to_edge(program).to_executorch().buffer)
    return str(path)


def test_a_split_keeps_its_dynamic_rows_through_executorch_validation(tmp_path):
    """ExecuTorch's dtype validator asked `len()` of a split's first tensor, which fixed the rows at the traced 6
    (docs/upstream-gaps.md #47); validated whole, the program runs 3 and 20 rows and matches eager."""
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    fixed = runtime.load_program(_rows_program(tmp_path / "fixed.pte", False))
    with pytest.raises(RuntimeError):  # upstream's behaviour: when this passes, the workaround can go
        fixed.load_method("forward").execute([torch.randn(3, 8)])
    program = runtime.load_program(_rows_program(tmp_path / "whole.pte", True))
    for count in (6, 3, 20):
        rows = torch.randn(count, 8)
        torch.testing.assert_close(program.load_method("forward").execute([rows])[0], _GateUp()(rows))


def test_the_experts_setting_is_the_models_own_outside_the_export():
    import dataclasses

    from exporters.upstream import experts_without_custom_ops
    from matrix.families import FAMILIES, tiny_model

    spec = FAMILIES["qwen2_moe"]  # one MoE layer: the setting is each layer's experts' (#48: half the graph to trace)
    model = tiny_model(dataclasses.replace(spec, overrides={**spec.overrides, **ONE_LAYER}))
    ids = torch.tensor([[5, 9, 17, 33, 4]])
    assert model.get_experts_implementation()[""] == "grouped_mm"
    with torch.no_grad():
        before = model(ids).logits
        with experts_without_custom_ops(model):
            assert model.get_experts_implementation()[""] == "batched_mm"
            during = model(ids).logits
            program = torch.export.export(model, (ids,), {"use_cache": False})
    assert model.get_experts_implementation()[""] == "grouped_mm"
    assert not [n for n in program.graph.nodes if "grouped_mm" in str(n.target)]
    torch.testing.assert_close(during, before)  # the same function, other ops


def test_qwen2_5_vl_runs_in_executorch(qwen2_5_vl_executorch):
    """Qwen2.5-VL's vision tower (Qwen2-VL's, plus window attention) has a whole-input `Conv3d` patch embedding and
    restores its window order with `torch.argsort`: neither runs in ExecuTorch as traced (`aten::sort.values` is no
    kernel there); both are traced in ops it has, and the program loads and matches eager."""
    out, report, log = qwen2_5_vl_executorch
    target = report["targets"][0] if report else {}
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    image_encoder = next(c for c in target["components"] if c["name"] == "image_encoder")
    assert image_encoder["passed"] and all(check["passed"] for check in image_encoder["checks"])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]


def test_a_whole_input_conv3d_is_traced_as_a_matmul():
    from exporters.upstream import patch_convolutions_as_matmul

    torch.manual_seed(0)
    patch = torch.nn.Conv3d(3, 16, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=True)
    sliding = torch.nn.Conv3d(3, 16, kernel_size=(2, 2, 2), stride=(1, 1, 1))
    samples = torch.randn(6, 3, 2, 4, 4)
    original = torch.nn.Conv3d.forward
    with torch.no_grad():
        expected, expected_sliding = patch(samples), sliding(samples)
        with patch_convolutions_as_matmul():
            traced = torch.export.export(patch, (samples,))
            kept = torch.export.export(sliding, (samples,))
            torch.testing.assert_close(sliding(samples), expected_sliding)
    targets = [str(n.target) for n in traced.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "conv" in t] and any("linear" in t or "mm" in t for t in targets)
    assert any("conv" in str(n.target) for n in kept.graph.nodes), "another Conv3d is traced as it is"
    torch.testing.assert_close(traced.module()(samples), expected, rtol=1e-5, atol=1e-5)
    assert torch.nn.Conv3d.forward is original, "restored after"


class _WindowOrder(torch.nn.Module):
    """Qwen2.5-VL's last step: rows put back in order by the argsort of the permutation that reordered them."""

    def forward(self, rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        return rows[torch.argsort(order)]


def test_the_argsort_of_a_permutation_is_traced_as_a_scatter_for_qwen2_5_vl_only():
    from matrix.families import FAMILIES, tiny_model

    from exporters.upstream import argsort_of_permutations

    rows, order = torch.randn(7, 4), torch.tensor([3, 0, 6, 1, 5, 2, 4])
    expected, original = rows[torch.argsort(order)], torch.argsort
    with argsort_of_permutations(tiny_model(FAMILIES["qwen2_5_vl"])):
        program = torch.export.export(_WindowOrder(), (rows, order))
        torch.testing.assert_close(torch.argsort(torch.tensor([2.0, 1.0])), torch.tensor([1, 0]))  # floats: as is
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert any("scatter" in t for t in targets) and not any("sort" in t for t in targets), targets
    torch.testing.assert_close(program.module()(rows, order), expected)
    with argsort_of_permutations(tiny_model(FAMILIES["llama"])):
        kept = torch.export.export(_WindowOrder(), (rows, order))
    assert any("sort" in str(n.target) for n in kept.graph.nodes), "another model's argsort is traced as it is"
    assert torch.argsort is original, "restored after"


class _Norm(torch.nn.Module):
    """An RMS norm with the epsilon of Helium's config."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def _onnx(module: torch.nn.Module, x: torch.Tensor):
    import onnx

    program = torch.onnx.export(module, (x,), dynamo=True, optimize=True)
    return onnx.load_from_string(program.model_proto.SerializeToString())


def test_onnx_keeps_a_norm_epsilon_of_1e_8():
    import onnxruntime as ort

    from exporters.upstream import exact_no_op_rewrites

    x = torch.randn(3, 32) * 0.02
    x[1] = 0.0  # an all-zero row: without the epsilon, 0 * rsqrt(0) is NaN
    upstream = _onnx(_Norm(), x)
    assert "Add" not in [n.op_type for n in upstream.graph.node], \
        "onnxscript drops `+ 1e-8` by default; if this fails, upstream fixed it (docs/upstream-gaps.md #38)"
    with exact_no_op_rewrites():
        graph = _onnx(_Norm(), x)
    assert "Add" in [n.op_type for n in graph.graph.node]
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    expected = _Norm()(x).numpy()
    assert not torch.isnan(torch.from_numpy(actual)).any()
    torch.testing.assert_close(torch.from_numpy(actual), torch.from_numpy(expected), rtol=1e-5, atol=1e-6)
    assert "Add" not in [n.op_type for n in _onnx(_Norm(), x).graph.node], "the rules are restored after"


def test_eager_references_are_computed_at_the_artifacts_thread_count():
    from exporters.validate.eager_side import EagerCache

    module, inputs = torch.nn.Linear(4, 4), {"input": torch.ones(2, 4)}
    cache, before = EagerCache(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = cache.run(module, inputs)
        assert cache.run(module, inputs) is first and (cache.hits, cache.misses) == (1, 1)
        torch.set_num_threads(2)
        assert cache.run(module, inputs) is not first and cache.misses == 2, "another thread count: its own reference"
    finally:
        torch.set_num_threads(before)


def _sliced_chain(links: int):
    """An ONNX graph (onnx_ir) of two `Slice`s of one input (the shape of onnxscript's two-output `SlicesSplit`
    pattern) and a chain of `links` Tanh/Neg pairs after them."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    from onnx import helper

    constants = [onnx.numpy_helper.from_array(np.array(value, dtype=np.int64), name)
                 for name, value in [("b0", [0]), ("e0", [8]), ("b1", [8]), ("e1", [16]), ("axis", [-1])]]
    nodes = [helper.make_node("Slice", ["x", "b0", "e0", "axis"], ["a"]),
             helper.make_node("Slice", ["x", "b1", "e1", "axis"], ["b"]), helper.make_node("Mul", ["a", "b"], ["y0"])]
    for i in range(links):
        nodes += [helper.make_node("Tanh", [f"y{i}"], [f"t{i}"]), helper.make_node("Neg", [f"t{i}"], [f"y{i + 1}"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info(f"y{links}", onnx.TensorProto.FLOAT, [2, 8])], constants)
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_onnx_optimizer_tries_a_two_output_pattern_only_where_it_can_match(monkeypatch):
    import onnx_ir as ir
    import onnxscript
    from onnxscript.rewriter import _matcher

    from exporters.upstream import multi_output_patterns_anchored

    tried: list[str] = []  # nodes at which upstream's matcher ran a pattern of several output nodes
    upstream_match = _matcher.SimplePatternMatcher.match

    def counting(self, model, graph, node, **kwargs):
        if not self.pattern.has_single_output_node:
            tried.append(node.op_type)
        return upstream_match(self, model, graph, node, **kwargs)

    monkeypatch.setattr(_matcher.SimplePatternMatcher, "match", counting)
    plain = _sliced_chain(20)
    onnxscript.optimizer.optimize(plain)
    upstream_tries, tried[:] = list(tried), []
    assert len(upstream_tries) > 40 and set(upstream_tries) > {"Slice"}, \
        "upstream tries it at every node; if not, upstream anchored it (docs/upstream-gaps.md #39)"
    with multi_output_patterns_anchored():
        anchored = _sliced_chain(20)
        onnxscript.optimizer.optimize(anchored)
    assert set(tried) == {"Slice"}, tried
    assert ir.serde.serialize_model(anchored) == ir.serde.serialize_model(plain), "the same optimized graph"
    assert _matcher.SimplePatternMatcher.match is counting, "the matcher is restored after"


@pytest.mark.parametrize("fusions", [None, "cpu"], ids=["plain", "ort_fusions"])
def test_onnx_rewriter_tries_a_rule_only_where_its_root_can_match(fusions, monkeypatch, tmp_path):
    """The plainest ONNX target of a one-layer Llama (and with `ort_fusions: "cpu"`, whose fusions are rewrite rules
    too) exported with and without `rules_tried_where_their_root_can_match`: model.onnx and its data byte for byte
    the same, the same rewrites made, a fraction of upstream's attempts."""
    import hashlib

    from onnxscript.rewriter import _rewrite_rule

    from exporters import upstream
    from exporters.export.convert import export_to
    from exporters.run.context import RunOptions, prepare_run
    from exporters.run.workbench import Workbench

    attempts, rewrites = [], []
    real = _rewrite_rule.RewriteRule.try_rewrite

    def counting(self, *args, **kwargs):
        attempts.append(1)
        delta = real(self, *args, **kwargs)
        rewrites.extend([self.name or str(self)] if delta is not None else [])
        return delta

    monkeypatch.setattr(_rewrite_rule.RewriteRule, "try_rewrite", counting)
    spec = {"export_format": "onnx", "mode": "generation", "dynamic": True, **({"ort_fusions": fusions} if fusions else {})}
    model_dir = runner_model(tmp_path / "model", "llama", {"exports": [spec]}, layers=1)
    options = RunOptions(out_dir=tmp_path / "out", bench=False)
    context = prepare_run(str(model_dir), options)
    workbench = Workbench.load(context, options, context.targets)
    target = workbench.plan(context.targets[0])
    components = workbench.components(target, context.recipe)
    seen = {}
    for anchored in (False, True):
        attempts.clear(), rewrites.clear()
        with monkeypatch.context() as scoped:
            if not anchored:
                scoped.setattr(upstream, "rules_tried_where_their_root_can_match", contextlib.nullcontext)
            folder = tmp_path / f"anchored-{anchored}"
            export_to(workbench.model, target, components, context.recipe, folder, [])
        files = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.glob("model.onnx*")}
        seen[anchored] = (files, len(attempts), sorted(rewrites))
    (upstream_files, upstream_attempts, upstream_rewrites), (files, tried, made) = seen[False], seen[True]
    assert set(files) == {"model.onnx", "model.onnx.data"} and files == upstream_files, "the same bytes"
    assert made == upstream_rewrites and made, "the same rewrites"
    assert tried < upstream_attempts / 5, (tried, upstream_attempts)
    assert _rewrite_rule.RewriteRule.try_rewrite is counting, "restored after"

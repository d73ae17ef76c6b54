"""Work the export process skips, and what it keeps:

- torch.onnx's second trace (`run_decompositions`) is skipped for a program it would not change in substance, and
  runs for every other one (`exporters.upstream.decompose_only_what_onnx_lacks`): the graphs compute what eager
  computes either way, at the traced shape and at another. The whole-model case (a merged Llama graph, validated
  against eager and run by ONNX Runtime GenAI) is every ONNX generation test of the suite.
- upstream's patches of model code are resolved only for the modeling modules that are loaded
  (`exporters.upstream.patches_of_loaded_models`): a loaded model's patch still applies, an unloaded module is not
  imported.
- upstream's reshape patch asks a layout proven contiguous only once (`exporters.upstream.contiguity_known_once`):
  the same program, fewer symbolic contiguity tests.
- symbolic size arithmetic already done is not done again (`exporters.upstream.symbolic_arithmetic_once`): the same
  program, a fraction of upstream's symbolic operations; on a torch without the internals it keys on, nothing is
  patched, and the run says its stack is not the tested one (`exporters.version.untested_stack`).
- input sizes that share a named `Dim` get one symbol (`exporters.upstream.named_dims_share_symbols`): every layer
  reuses the first one's fake-tensor results, the program computes what eager computes at another shape, and an
  input that breaks the equality is refused as before, at export and when the program is called.
- torch.onnx's type promotion reads the trace's recorded values (`exporters.upstream.type_promotion_on_traced_values`):
  the same ONNX graph, only the nodes it changes run again.
- torch.onnx's registry of torchlib's functions is built once per process (`exporters.upstream.torchlib_registry_built_once`,
  built by the run before it forks the export children): each export gets a copy of its own, the same ONNX graph;
  tests/test_seq2seq_onnx.py checks through the CLI that no export child builds it again.
- torch's `.pt2` loader resolves each schema class's type hints and parses each symbolic size once
  (`exporters.upstream.pt2_read_once`, entered by `exporters.upstream.load_exported`): the same program (graph, every
  node's value, range constraints, what it computes), a fraction of the sympy parses; every `.pt2` the suite
  validates (each dynamo target) is loaded with it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch

from exporters import upstream
from exporters.upstream.onnx_decompositions import plan_rewrites


class Masked(torch.nn.Module):
    """`&` of two masks (`aten.__and__`, which ONNX's table decomposes), casts (`Tensor.to`, an aliasing composite op),
    a reshape to the same shape and one that changes it."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = (mask > 0) & (x > 0)
        y = torch.where(keep, x, torch.zeros_like(x)).to(torch.float64).to(torch.float32)
        y = y.reshape(x.shape[0], x.shape[1])
        return y * 2 + x.transpose(0, 1).contiguous().reshape(-1).sum()


class InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.add_(mask)
        return y


class Unimplemented(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.arctan(x) + mask  # `aten.arctan` has no ONNX function: the decomposition writes it as `atan`


def _inputs(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows * 100 + cols)
    return torch.randn(rows, cols, generator=generator), torch.randn(rows, cols, generator=generator)


def _export(module: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, tmp_path) -> tuple[int, str]:
    """The module exported to ONNX under the adapter's context: (how many times torch.onnx decomposed, the file)."""
    rows, cols = torch.export.Dim("rows", min=2), torch.export.Dim("cols", min=2)
    program = torch.export.export(module, _inputs(3, 5), dynamic_shapes=({0: rows, 1: cols}, {0: rows, 1: cols}))
    calls = []
    real = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    with upstream.decompose_only_what_onnx_lacks():
        onnx_program = torch.onnx.export(program, args=(), kwargs=dict(zip(("x", "mask"), _inputs(3, 5))),
                                         optimize=True)
    path = str(tmp_path / "model.onnx")
    onnx_program.save(path)
    return len(calls), path


def _implemented() -> set:
    """The ops torch.onnx's registry has an ONNX function for, as `decompose_with_registry` computes them."""
    from torch.onnx._internal.exporter import _decomp, _registration

    return set(_decomp.get_onnx_implemented_overloads(_registration.ONNXRegistry.from_torchlib()))


def _assert_runs_like_eager(module: torch.nn.Module, path: str) -> None:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for rows, cols in ((3, 5), (4, 9)):  # the traced shape and another
        x, mask = _inputs(rows, cols)
        (got,) = session.run(None, dict(zip(names, (x.numpy(), mask.numpy()))))
        np.testing.assert_allclose(got, module(x, mask).numpy(), rtol=1e-6, atol=1e-6)


def test_a_program_of_implemented_ops_is_translated_as_traced(monkeypatch, tmp_path):
    module = Masked()
    program = torch.export.export(module, _inputs(3, 5))
    implemented = _implemented()
    planned = {str(node.target) for node, _ in plan_rewrites(program, implemented)}
    assert {"aten.__and__.Tensor", "aten.to.dtype", "aten.reshape.default"} <= planned

    decompositions, path = _export(module, monkeypatch, tmp_path)
    assert decompositions == 0
    _assert_runs_like_eager(module, path)


def test_a_node_added_after_the_trace_without_its_value_is_left_to_the_decomposition():
    """Upstream's FX fixes add nodes without the traced value the translation reads (Gemma 3's `detach_` becomes a
    `detach` with no `val`); the decomposition's retrace records it, so such a program is decomposed."""
    program = torch.export.export(Masked(), _inputs(3, 5))
    implemented = _implemented()
    assert plan_rewrites(program, implemented) is not None
    output = next(node for node in program.graph.nodes if node.op == "output")
    with program.graph.inserting_before(output):
        program.graph.call_function(torch.ops.aten.detach.default, args=(output.args[0][0],))
    assert plan_rewrites(program, implemented) is None


@pytest.mark.parametrize("module", [InPlace(), Unimplemented()], ids=["in-place op", "op ONNX lacks"])
def test_any_other_program_is_decomposed_as_upstream_does(module, monkeypatch, tmp_path):
    decompositions, path = _export(module, monkeypatch, tmp_path)
    assert decompositions == 1
    _assert_runs_like_eager(module, path)


PATCH_RESOLUTION = textwrap.dedent("""
    import sys
    import transformers.models.qwen2_vl.modeling_qwen2_vl as loaded
    from transformers.exporters import utils
    from exporters import upstream

    real_forward = loaded.VisionAttention.forward
    with upstream.patches_of_loaded_models(), utils.apply_patches("dynamo"):
        patched = loaded.VisionAttention.forward is not real_forward
        unloaded = [name for name in ("transformers.models.mra.modeling_mra",
                                      "transformers.models.glm4v.modeling_glm4v") if name in sys.modules]
    print(patched, loaded.VisionAttention.forward is real_forward, unloaded)
""")


def test_upstream_patches_resolve_only_for_loaded_modeling_modules():
    """In a fresh process: Qwen2-VL's vision attention (loaded) is patched during the trace and restored after;
    MRA's and GLM-4V's modules (patched by upstream too, not loaded) are not imported."""
    run = subprocess.run([sys.executable, "-c", PATCH_RESOLUTION], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True True []"


class Layers(torch.nn.Module):
    """Four layers that reshape (upstream's patch asks each input's contiguity) contiguous activations of dynamic
    sizes, and one transposed (not contiguous: the patch clones it)."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        for linear in self.linears:
            heads = linear(x).view(batch, length, 2, 4).transpose(2, 3)
            x = x + heads.reshape(batch, length, 8)  # a transposed input: not contiguous
            x = x.reshape(batch * length, 8).view(batch, length, 8)
        return x


def _trace_layers(monkeypatch: pytest.MonkeyPatch, cached: bool) -> tuple[list[str], int]:
    """`Layers` traced under upstream's ONNX patches: (its call_function targets in order, the contiguity tests
    upstream's reshape patch ran)."""
    from transformers.exporters import utils as upstream_utils

    asked = []
    real = upstream_utils.is_contiguous_or_false

    def counting(a):
        asked.append(1)
        return real(a)

    monkeypatch.setattr(upstream_utils, "is_contiguous_or_false", counting)
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("length", min=2, max=64)}}
    stack = upstream.contiguity_known_once() if cached else contextlib.nullcontext()
    with stack, upstream_utils.apply_patches("onnx"):
        program = torch.export.export(Layers().eval(), (torch.randn(2, 5, 8),), dynamic_shapes=dims, strict=False,
                                      prefer_deferred_runtime_asserts_over_guards=True)
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    return targets, len(asked)


def test_a_layout_proven_contiguous_is_not_asked_again(monkeypatch):
    plain, asked_plain = _trace_layers(monkeypatch, cached=False)
    cached, asked_cached = _trace_layers(monkeypatch, cached=True)
    assert "aten.clone.default" in plain, "the transposed input is cloned by upstream's patch"
    assert cached == plain, "the same program"
    assert asked_cached < asked_plain / 2, (asked_cached, asked_plain)


def _counting_symbolic_operations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every symbolic operation upstream computes builds its FX node through this one method of the shape environment
    (`binary_magic_impl`): counting its calls counts the operations computed."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    calls: list[int] = []
    real = ShapeEnv._create_fx_call_function

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ShapeEnv, "_create_fx_call_function", counting)
    return calls


def test_symbolic_arithmetic_already_done_is_not_done_again(monkeypatch):
    from transformers.exporters import utils as upstream_utils

    calls = _counting_symbolic_operations(monkeypatch)
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("length", min=2, max=64)}}
    programs, computed = [], []
    for kept in (False, True):
        calls.clear()
        with upstream.symbolic_arithmetic_once() if kept else contextlib.nullcontext(), \
                upstream_utils.apply_patches("onnx"):
            programs.append(torch.export.export(Layers().eval(), (torch.randn(2, 5, 8),), dynamic_shapes=dims,
                                                strict=False, prefer_deferred_runtime_asserts_over_guards=True))
        computed.append(len(calls))
    plain, kept = programs
    assert str(kept.graph) == str(plain.graph), "the same program"
    assert kept.range_constraints == plain.range_constraints
    assert computed[1] < computed[0] / 5, computed
    from torch.fx.experimental import sym_node
    assert all(getattr(fn, "__name__", "") != "compute" for fn in vars(sym_node.SymNode).values()), "restored"


class Decoder(torch.nn.Module):
    """Four layers, each attending over its own cache (`batch` and `past` shared by every cache, as a decoder's
    key/value cache layers share them)."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor, caches: list[torch.Tensor]) -> torch.Tensor:
        for cache, linear in zip(caches, self.linears):
            states = torch.cat([cache, linear(x)], dim=1)
            x = x + torch.softmax(states @ states.transpose(1, 2), dim=-1)[:, -x.shape[1]:, :] @ states
        return x


def _decoder_inputs(batch: int, length: int, past: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(batch * 100 + past)
    return torch.randn(batch, length, 8, generator=generator), [torch.randn(batch, past, 8, generator=generator)
                                                                   for _ in range(4)]


def _decoder_dims() -> tuple:
    batch, past = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("past", min=1, max=64)
    return {0: batch, 1: torch.export.Dim("length", min=1, max=64)}, [{0: batch, 1: past}] * 4


def _export_decoder(shared: bool, inputs=None):
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()
    misses = FakeTensorMode.cache_misses
    torch.manual_seed(0)
    with upstream.named_dims_share_symbols() if shared else contextlib.nullcontext():
        program = torch.export.export(Decoder().eval(), inputs or _decoder_inputs(3, 2, 5),
                                      dynamic_shapes=_decoder_dims(), strict=False,
                                      prefer_deferred_runtime_asserts_over_guards=True)
    return program, FakeTensorMode.cache_misses - misses


def test_input_sizes_sharing_a_named_dim_get_one_symbol():
    plain, plain_misses = _export_decoder(shared=False)
    shared, shared_misses = _export_decoder(shared=True)

    def cache_sizes(program):
        return [tuple(str(size) for size in node.meta["val"].shape[:2]) for node in program.graph.nodes
                if node.op == "placeholder" and node.name.startswith("caches")]

    assert len(set(cache_sizes(shared))) == 1 and len(set(cache_sizes(plain))) == 1  # upstream unifies after
    assert len(shared.range_constraints) == len(plain.range_constraints) == 3
    assert shared_misses < plain_misses * 0.7, (shared_misses, plain_misses)  # layers reuse the first one's results

    def ops(program):
        return sorted(str(n.target) for n in program.graph.nodes if n.op == "call_function"
                      and "assert" not in str(n.target) and "sym_size" not in str(n.target) and "eq" != n.target.__name__)

    assert ops(shared) == ops(plain)  # the same computation; upstream's in-graph asserts of the equalities aside
    torch.manual_seed(0)
    eager = Decoder().eval()
    for shape in ((3, 2, 5), (5, 3, 7), (1, 1, 2)):  # the traced shape and others
        x, caches = _decoder_inputs(*shape)
        torch.testing.assert_close(shared.module()(x, caches), eager(x, caches), rtol=1e-6, atol=1e-6)

    x, caches = _decoder_inputs(5, 3, 7)
    caches[2] = caches[2][:4]  # a cache whose batch is not the input's: refused when called, as upstream does
    for program in (plain, shared):
        with pytest.raises(AssertionError, match=r"caches\[2\]\.size\(\)\[0\] == x\.size\(\)\[0\]"):
            program.module()(x, caches)


def test_inputs_that_break_a_named_dim_are_refused_as_upstream_refuses_them():
    x, caches = _decoder_inputs(3, 2, 5)
    caches[1] = torch.randn(3, 6, 8)  # `past` is 5 for the other caches
    for shared in (False, True):
        with pytest.raises(torch._dynamo.exc.UserError, match=r"\[1\]\.size\(\)\[1\] = 6 is not equal to"):
            _export_decoder(shared, inputs=(x, caches))


class Mixed(torch.nn.Module):
    """Ops whose inputs torch.onnx's type promotion casts (float times int64, int64 true division) beside ops it
    leaves."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        y = x * idx + idx / 2
        z = torch.where(idx > 1, y, x.to(torch.float16).float())
        return z.sum(-1) + (idx.shape[1] * x).mean()


def test_type_promotion_reads_the_recorded_values(monkeypatch):
    runs: list[str] = []
    real = torch.fx.Interpreter.run_node

    def counting(self, node):
        if type(self).__name__ == "_TypePromotionInterpreter":
            runs.append(node.op)
        return real(self, node)

    monkeypatch.setattr(torch.fx.Interpreter, "run_node", counting)
    x, idx = torch.randn(3, 5), torch.randint(0, 4, (3, 5))
    dims = {0: torch.export.Dim("rows", min=2), 1: torch.export.Dim("cols", min=2)}
    graphs, ran = [], []
    for kept in (False, True):
        runs.clear()
        program = torch.export.export(Mixed(), (x, idx), dynamic_shapes=(dims, dims))
        with upstream.type_promotion_on_traced_values() if kept else contextlib.nullcontext():
            onnx_program = torch.onnx.export(program, args=(), kwargs={"x": x, "idx": idx}, optimize=True)
        model = onnx_program.model_proto
        for node in model.graph.node:
            node.name = ""
            del node.metadata_props[:]
        graphs.append(model.SerializeToString(deterministic=True))
        ran.append(runs.count("call_function"))
    assert graphs[0] == graphs[1], "the same ONNX graph"
    assert {"Cast", "Div", "Mul", "Where"} <= {node.op_type for node in model.graph.node}
    assert 0 < ran[1] < ran[0] / 2, ran  # only the nodes the pass changes (and the casts it adds) run again
    session = onnxruntime.InferenceSession(graphs[1], providers=["CPUExecutionProvider"])
    for rows, cols in ((3, 5), (4, 9)):
        x, idx = torch.randn(rows, cols), torch.randint(0, 4, (rows, cols))
        (got,) = session.run(None, {"x": x.numpy(), "idx": idx.numpy()})
        np.testing.assert_allclose(got, Mixed()(x, idx).numpy(), rtol=1e-5, atol=1e-5)


def test_the_torchlib_registry_is_built_once_and_each_export_gets_a_copy(monkeypatch):
    from torch.onnx._internal.exporter import _registration

    builds: list[int] = []
    real = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__

    def counting(cls, opset_version=18):
        builds.append(opset_version)
        return real(cls, opset_version)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counting))
    monkeypatch.setattr(upstream.onnx_decompositions, "_REGISTRIES", {})
    x, idx = torch.randn(3, 5), torch.randint(0, 4, (3, 5))
    program = torch.export.export(Mixed(), (x, idx))
    plain = torch.onnx.export(program, args=(), kwargs={"x": x, "idx": idx}, optimize=True).model_proto
    assert len(builds) == 1
    with upstream.torchlib_registry_built_once():
        first = _registration.ONNXRegistry.from_torchlib()
        first.register_op(torch.ops.aten.relu.default, lambda x: x)  # a custom translation stays in its copy
        second = _registration.ONNXRegistry().from_torchlib()
        once = torch.onnx.export(program, args=(), kwargs={"x": x, "idx": idx}, optimize=True).model_proto
    assert len(builds) == 2, "built once for every export in the block"
    assert first is not second and first.functions is not second.functions
    assert len(first.get_decomps(torch.ops.aten.relu.default)) == len(second.get_decomps(torch.ops.aten.relu.default)) + 1
    for opset in (18, 20, 23):  # every opset's own functions, as upstream keeps them
        with upstream.torchlib_registry_built_once():
            copied = _registration.ONNXRegistry.from_torchlib(opset)
        built = real(_registration.ONNXRegistry, opset)
        assert copied.opset_version == opset and copied.functions.keys() == built.functions.keys()
        assert all([m.onnx_function for m in copied.functions[k]] == [m.onnx_function for m in built.functions[k]]
                   for k in built.functions)
    for model in (plain, once):
        for node in model.graph.node:
            node.name = ""
            del node.metadata_props[:]
    assert once.SerializeToString(deterministic=True) == plain.SerializeToString(deterministic=True)


def test_symbolic_arithmetic_is_upstreams_on_a_torch_without_its_key(monkeypatch):
    """The lent GPU image's torch 2.11 has no `ShapeEnv._replacements_version_counter`, and an export there ended in
    an AttributeError (benchmarks/RESULTS.md, GPU check of 2026-12-06). Such a torch cannot be installed beside the
    pinned one, so the check that decides is stood in for: where it says the key is absent, the shortcut patches
    nothing and the trace is upstream's own; on the pinned torch the key is present."""
    from torch.fx.experimental import sym_node

    from exporters.upstream import internals

    assert internals.symbolic_key_present()
    before = dict(vars(sym_node.SymNode))
    monkeypatch.setattr(internals, "symbolic_key_present", lambda: False)
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("length", min=2, max=64)}}
    from transformers.exporters import utils as upstream_utils

    with upstream.symbolic_arithmetic_once(), upstream_utils.apply_patches("onnx"):
        assert dict(vars(sym_node.SymNode)) == before, "nothing patched"
        program = torch.export.export(Layers().eval(), (torch.randn(2, 5, 8),), dynamic_shapes=dims, strict=False,
                                      prefer_deferred_runtime_asserts_over_guards=True)
    assert program.module()(torch.randn(3, 7, 8)).shape[:2] == (3, 7)


def test_a_run_on_another_torch_says_its_stack_is_not_the_tested_one(monkeypatch, tmp_path):
    """A user who installs without constraints.txt gets another torch (the GPU image's 2.11): the run says so in its
    warnings (report.md's findings, the CLI), naming the version and the tested one. The installed versions are
    stood in for: another torch cannot be installed beside the pinned one."""
    from exporters.run import context

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "export_config.json").write_text('{"export_format": "onnx"}')
    options = context.RunOptions(out_dir=tmp_path / "out")
    assert not any("tested" in w for w in context.prepare_run(str(tmp_path), options).warnings)
    real = context.installed_version
    monkeypatch.setattr(context, "installed_version",
                        lambda package: "2.11.0+cu130" if package == "torch" else real(package))
    said = [w for w in context.prepare_run(str(tmp_path), options).warnings if "tested" in w]
    assert said == ["the installed stack is not the tested one: torch 2.11.0+cu130 (tested 2.13.0); exports may fail "
                    "or differ: install with `-c constraints.txt` (README, Two commands)"], said

def _load_counting(path, once: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, int, int]:
    """The program at `path`, loaded with or without `pt2_read_once`, and how many sympy parses and type-hint
    resolutions torch's deserializer ran."""
    import sympy
    import typing
    from torch._export.serde import serialize

    parses, hints = [], []
    real_sympify, real_hints = sympy.sympify, typing.get_type_hints
    monkeypatch.setattr(sympy, "sympify", lambda *a, **k: parses.append(1) or real_sympify(*a, **k))
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: hints.append(1) or real_hints(*a, **k))
    with upstream.pt2_read_once() if once else contextlib.nullcontext():
        program = torch.export.load(str(path))
    assert serialize.typing is typing, "restored"
    return program, len(parses), len(hints)


def test_a_pt2_is_read_as_torch_reads_it_with_each_type_and_size_once(monkeypatch, tmp_path):
    torch.manual_seed(0)
    traced = torch.export.export(Decoder().eval(), _decoder_inputs(3, 2, 5), dynamic_shapes=_decoder_dims(),
                                 strict=False, prefer_deferred_runtime_asserts_over_guards=True)
    torch.export.save(traced, str(tmp_path / "decoder.pt2"))
    plain, plain_parses, plain_hints = _load_counting(tmp_path / "decoder.pt2", False, monkeypatch)
    once, once_parses, once_hints = _load_counting(tmp_path / "decoder.pt2", True, monkeypatch)

    assert str(once.graph) == str(plain.graph), "the same program"
    assert [(n.name, str(n.meta.get("val"))) for n in once.graph.nodes] == \
        [(n.name, str(n.meta.get("val"))) for n in plain.graph.nodes], "every node's value, sizes included"
    assert str(once.range_constraints) == str(plain.range_constraints)
    assert once_parses < plain_parses / 2, (once_parses, plain_parses)
    assert once_hints < plain_hints / 10, (once_hints, plain_hints)
    for shape in ((3, 2, 5), (5, 3, 7)):  # the traced shape and another
        x, caches = _decoder_inputs(*shape)
        torch.testing.assert_close(once.module()(x, caches), plain.module()(x, caches), rtol=0, atol=0)

"""Work the export process skips, and what it keeps:

- torch.onnx's second trace (`run_decompositions`) is skipped for a program it would not change in substance, and
  runs for every other one (`exporters.upstream.decompose_only_what_onnx_lacks`): the graphs compute what eager
  computes either way, at the traced shape and at another. The whole-model case (a merged Llama graph, validated
  against eager and run by ONNX Runtime GenAI) is every ONNX generation test of the suite.
- upstream's patches of model code are resolved only for the modeling modules that are loaded
  (`exporters.upstream.patches_of_loaded_models`): a loaded model's patch still applies, an unloaded module is not
  imported.
- upstream's reshape patch asks a layout proven contiguous only once (`exporters.upstream.contiguity_known_once`):
  the same program, fewer symbolic contiguity tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap

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

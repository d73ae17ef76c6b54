"""ExecuTorch lowering computes what the model computes: XNNPACK's GELU node ignores `approximate` and runs the exact
GELU, so the tanh-approximated one (SigLIP, Gemma) is left to the portable kernels (docs/upstream-gaps.md #24)."""

from __future__ import annotations

import pytest
import torch


class LinearGelu(torch.nn.Module):
    def __init__(self, approximate: str):
        super().__init__()
        torch.manual_seed(0)
        self.approximate = approximate
        self.linear = torch.nn.Linear(257, 257)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x), approximate=self.approximate)


def lowered(module: torch.nn.Module, x: torch.Tensor):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exporters.upstream import tanh_gelu_kept_off_xnnpack

    with tanh_gelu_kept_off_xnnpack():
        edge = to_edge_transform_and_lower(torch.export.export(module, (x,)), partitioner=[XnnpackPartitioner()])
    return edge


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_lowered_to_executorch_matches_eager(approximate):
    from executorch.runtime import Runtime

    x = torch.linspace(-4, 4, 257 * 3).reshape(3, 257)
    module = LinearGelu(approximate).eval()
    edge = lowered(module, x)
    graph = edge.exported_program().graph
    calls = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert any("executorch_call_delegate" in c for c in calls)  # the linear still runs in XNNPACK
    assert any("gelu" in c for c in calls) == (approximate == "tanh")  # only the tanh GELU is kept out
    program = Runtime.get().load_program(edge.to_executorch().buffer)
    out = program.load_method("forward").execute([x])[0]
    with torch.no_grad():
        assert float((out - module(x)).abs().max()) < 2e-5  # XNNPACK's exact GELU is 4.7e-4 away from tanh's

"""ExecuTorch lowering computes what the model computes: XNNPACK's GELU node ignores `approximate` and runs the exact
GELU, so the tanh-approximated one (SigLIP, Gemma) is left to the portable kernels (docs/upstream-gaps.md #24); the
upsample fusion that runs only where a graph has an upsample, and the SDPA fusion that runs only where a partition has a
softmax, change no program."""

from __future__ import annotations

import contextlib
import copy
import functools

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

    from exporters.upstream import xnnpack_lowering

    with xnnpack_lowering():
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


class Upsampled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bilinear", align_corners=False)


def _buffer(module: torch.nn.Module, args: tuple, skip=None) -> bytes:
    """The program XNNPACK lowering gives `module`, upstream's as it is, or with the pass `skip` (one of our context
    managers) skipping what it cannot change."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(module, args)
    with skip() if skip is not None else contextlib.nullcontext():
        return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def _plain() -> tuple[torch.nn.Module, torch.Tensor]:
    """A linear and a GELU on a (3, 257) input: a graph without any op the skipped passes rewrite (seeded: every
    call builds the same module and input)."""
    return LinearGelu("none").eval(), torch.randn(3, 257)


@functools.lru_cache(maxsize=1)
def _upstream_plain() -> tuple[bytes, tuple[str, ...]]:
    """Upstream's program for `_plain()` and the passes that retraced a graph while it was lowered (`ExportPass.call`
    counted), lowered once a process: three tests compare their skip against it (#48: one lowering, not three)."""
    plain, x = _plain()
    with _retraces_counted() as retraces:
        program = _buffer(plain, (x,))
    return program, tuple(retraces)


@contextlib.contextmanager
def _retraces_counted():
    """The names of the passes that retrace a graph (`ExportPass.call`) while the block runs, in order."""
    from executorch.exir.pass_base import ExportPass

    retraces: list[str] = []
    real = ExportPass.call

    def counted(self, graph_module):
        retraces.append(type(self).__name__)
        return real(self, graph_module)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExportPass, "call", counted)
        yield retraces


def test_the_upsample_fusion_skipped_without_an_upsample_changes_no_program():
    """The skip is exact: upstream's patterns (pinned executorch) are each the one `upsample_bilinear2d.vec` node,
    which the pass leaves as it is, so a graph without it gets the same program byte for byte; a graph with an
    upsample still goes through the pass (same program as upstream's)."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    from exporters.upstream import upsample_fusion_only_with_upsample

    for pattern in bilinear_2d.get_graphs_dict():
        calls = [str(n.target) for n in pattern.graph.nodes if n.op == "call_function"]
        assert len(calls) == 1 and "upsample_bilinear2d.vec" in calls[0], calls
    plain, x = _plain()
    assert _buffer(plain, (x,), upsample_fusion_only_with_upsample) == _upstream_plain()[0]
    upsampled, image = Upsampled().eval(), torch.randn(1, 3, 8, 8)
    assert _buffer(upsampled, (image,), upsample_fusion_only_with_upsample) == _buffer(upsampled, (image,))


class Attention(torch.nn.Module):
    """An attention with a 2-D additive mask: the decomposed graph XNNPACK's SDPA fusion matches."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.project = torch.nn.Linear(16, 16)

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(self.project(q), k, v, attn_mask=mask)


class Routed(torch.nn.Module):
    """A MoE's router: a softmax over a linear's logits, no batched matmul (XNNPACK takes both into one partition)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.router = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.router(x), dim=-1) * 2.0


class Unmasked(torch.nn.Module):
    """An attention without a mask (Whisper's): a softmax between two batched matmuls, no safe softmax's guard."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.project = torch.nn.Linear(16, 16)

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(self.project(q), k, v)


def test_the_sdpa_fusion_skipped_without_a_softmax_and_a_bmm_changes_no_program():
    """The skip is exact: every pattern of upstream's SDPA fusion (pinned executorch) has a softmax, a `bmm` and the
    safe softmax's guard (`SDPA_OPS`), each node an ancestor of the output the matcher starts from, so a partition
    without one of them gets the same program byte for byte (a plain linear, a router's softmax, an attention with or
    without a mask: the pass is not run on them, and the attention's program computes it); a graph holding a
    pattern still goes through the pass and is fused as upstream fuses it."""
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
    from executorch.backends.xnnpack.partition.graphs import sdpa
    from executorch.runtime import Runtime

    from exporters.upstream import sdpa_fusion_only_with_softmax
    from exporters.upstream.xnnpack_passes import SDPA_OPS, has_call_to

    patterns = sdpa.get_graphs()
    assert patterns and all(has_call_to(pattern, op) for pattern in patterns for op in SDPA_OPS)
    for pattern in patterns:  # the matcher walks up from the output: every node of a pattern must find its op
        output = next(n for n in pattern.graph.nodes if n.op == "output")
        ancestors, todo = set(), [output]
        while todo:
            todo += [n for n in todo.pop().all_input_nodes if n not in ancestors and not ancestors.add(n)]
        assert ancestors == {n for n in pattern.graph.nodes if n.op != "output"}
    plain, x = _plain()
    assert _buffer(plain, (x,), sdpa_fusion_only_with_softmax) == _upstream_plain()[0]
    routed, x = Routed().eval(), torch.randn(3, 16)
    with _retraces_counted() as upstream_retraces:
        upstream_routed = _buffer(routed, (x,))
    with _retraces_counted() as retraces:
        assert _buffer(routed, (x,), sdpa_fusion_only_with_softmax) == upstream_routed
    assert "ConvertToSDPAPass" in upstream_retraces and "ConvertToSDPAPass" not in retraces  # the softmax was delegated
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    # #48 (twelfth round): an attention without a mask reaches XNNPACK with its softmax and bmms and no guard
    with _retraces_counted() as upstream_retraces:
        upstream_unmasked = _buffer(Unmasked().eval(), (q, k, v))
    with _retraces_counted() as retraces:
        assert _buffer(Unmasked().eval(), (q, k, v), sdpa_fusion_only_with_softmax) == upstream_unmasked
    assert "ConvertToSDPAPass" in upstream_retraces and "ConvertToSDPAPass" not in retraces
    attention, mask = Attention().eval(), torch.zeros(5, 5)
    with _retraces_counted() as upstream_retraces:
        upstream_program = _buffer(attention, (q, k, v, mask))
    with _retraces_counted() as retraces:
        program = _buffer(attention, (q, k, v, mask), sdpa_fusion_only_with_softmax)
    # the guard's ops (`where`, `any`, ...) have no XNNPACK partitioner config: a masked attention's partition lacks
    # them too, and upstream's pass ran there and matched nothing
    assert "ConvertToSDPAPass" in upstream_retraces and "ConvertToSDPAPass" not in retraces
    assert program == upstream_program
    # a graph that holds a pattern (a partitioner that took the guard) still goes through the pass, and is fused
    matches = []
    real_create = ConvertToSDPAPass.create_sdpa
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConvertToSDPAPass, "create_sdpa", lambda self, *a: matches.append(1) or real_create(self, *a))
        for pattern in patterns:
            upstream_fused = ConvertToSDPAPass(None).call(copy.deepcopy(pattern)).graph_module
            with sdpa_fusion_only_with_softmax():
                fused = ConvertToSDPAPass(None).call(copy.deepcopy(pattern)).graph_module
            assert fused.code == upstream_fused.code and has_call_to(fused, "scaled_dot_product_attention")
    assert len(matches) == 2 * len(patterns), matches
    out = Runtime.get().load_program(program).load_method("forward").execute([q, k, v, mask])[0]
    with torch.no_grad():
        assert float((out - attention(q, k, v, mask)).abs().max()) < 1e-5


class ConvNormActivations(torch.nn.Module):
    """A 2-D and a 1-D convolution with a batch norm, a ReLU, a hardtanh, a PReLU and a max pool: every op the XNNPACK
    passes of `xnnpack_passes.ONLY_WHERE` rewrite."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.norm = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.conv1d, self.prelu = torch.nn.Conv1d(3, 4, 3, padding=1), torch.nn.PReLU()
        self.norm.running_mean.uniform_(-0.5, 0.5)
        self.norm.running_var.uniform_(0.5, 1.5)

    def forward(self, x, s):
        y = self.prelu(torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2))
        return y, torch.nn.functional.hardtanh(self.conv1d(s))


def test_the_xnnpack_passes_skipped_where_they_rewrite_nothing_change_no_program():
    """The skip is exact: on a graph without the ops a pass rewrites (a linear and a GELU) the passes of
    `ONLY_WHERE` retrace nothing and the program is byte for byte upstream's; on a graph with every one of those ops
    they all run, and the program is upstream's too (and computes the model)."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.runtime import Runtime

    from exporters.upstream.xnnpack_passes import ONLY_WHERE, xnnpack_passes_only_where_they_apply

    default = {cls.__name__ for cls in XNNPACKPassManager(None).passes}
    assert {name for _, name, _ in ONLY_WHERE} <= default  # every pass skipped is one upstream runs
    plain, x = _plain()
    upstream_program, upstream_retraces = _upstream_plain()  # lowered with ExportPass.call counted as here
    with _retraces_counted() as retraces:
        assert _buffer(plain, (x,), xnnpack_passes_only_where_they_apply) == upstream_program
    skipped = {name for _, name, _ in ONLY_WHERE}
    assert skipped & set(upstream_retraces) and not skipped & set(retraces), (upstream_retraces, retraces)
    convolved, inputs = ConvNormActivations().eval(), (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 9))
    with _retraces_counted() as retraces:
        program = _buffer(convolved, inputs, xnnpack_passes_only_where_they_apply)
    # the passes whose ops reach XNNPACK's preprocessing ran (the batch norm is fused, the max pool's getitem gone)
    assert {"FuseBatchNormPass", "FuseActivationPass", "Conv1dUnsqueezePass", "PReLUReshapePass"} <= set(retraces)
    assert program == _buffer(convolved, inputs)
    outputs = Runtime.get().load_program(program).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        assert all(float((out - expected).abs().max()) < 1e-5 for out, expected in zip(outputs, convolved(*inputs)))


class KeptAndRefused(torch.nn.Module):
    """A linear XNNPACK keeps whole (its weight a parameter) and, as `case` says, one its checks refuse (the weight an
    input: left to the `EDGE_DO_NOT_DECOMP` path's second decomposition) or an input written in place (a cache of
    the methods layout: a retrace writes it back once more)."""

    def __init__(self, case: str):
        super().__init__()
        torch.manual_seed(0)
        self.case, self.linear = case, torch.nn.Linear(16, 16)

    def forward(self, x, w):
        y = torch.nn.functional.silu(self.linear(x)).transpose(0, 1)
        if self.case == "refused":
            return torch.nn.functional.linear(y.transpose(0, 1), w)
        if self.case == "mutated":
            w.add_(1.0)
        return y + w.mean()


# upstream's program for `KeptAndRefused(case)`, as a test lowered it (the bytes read only the seeded module and the
# inputs' shapes): tests comparing their skip with it share one lowering a process (#48)
_KEPT_UPSTREAM: dict[str, bytes] = {}


def _upstream_kept(case: str) -> bytes:
    """Upstream's program for `KeptAndRefused(case)`, lowered once a process (or taken from the test that did)."""
    if case not in _KEPT_UPSTREAM:
        _KEPT_UPSTREAM[case] = _buffer(KeptAndRefused(case).eval(), (torch.randn(4, 16), torch.randn(16, 16)))
    return _KEPT_UPSTREAM[case]


@pytest.mark.parametrize("case", ["accepted", "refused", "mutated"])
def test_the_second_decomposition_skipped_where_nothing_is_left_to_decompose_changes_no_program(case):
    """The skip is exact: where XNNPACK's checks accept every linear the first decomposition kept (silu and
    transpose decomposed), the second decomposition is skipped and the program is byte for byte upstream's; where a
    check refuses one, or the program writes an input in place, it still runs and the program is upstream's too (and
    computes the model)."""
    from executorch.runtime import Runtime
    from torch.export import ExportedProgram

    from exporters.upstream import second_decomposition_only_where_it_decomposes

    module, inputs = KeptAndRefused(case).eval(), (torch.randn(4, 16), torch.randn(16, 16))
    _upstream_plain()  # XNNPACK's pattern graphs built (decomposed too) by a first lowering, once a process (#48)
    tables = []
    real = ExportedProgram.run_decompositions

    def counted(self, decomp_table=None, *args, **kwargs):
        tables.append(decomp_table)
        return real(self, decomp_table, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExportedProgram, "run_decompositions", counted)
        upstream_program = _buffer(module, inputs)
        upstream_runs, tables[:] = len(tables), []
        program = _buffer(module, inputs, second_decomposition_only_where_it_decomposes)
    assert program == upstream_program
    assert _KEPT_UPSTREAM.setdefault(case, upstream_program) == upstream_program  # one lowering's bytes as another's
    assert upstream_runs == 3 and len(tables) == (2 if case == "accepted" else 3), (upstream_runs, len(tables))
    out = Runtime.get().load_program(program).load_method("forward").execute([t.clone() for t in inputs])[-1]  # after a mutated input
    with torch.no_grad():
        assert float((out - module(*inputs)).abs().max()) < 1e-5


class CatsAndMatmuls(torch.nn.Module):
    """With `long`, a cat of six tensors (`DecomposeConcatenate` splits it) after a view of a linear whose weight is
    an input (XNNPACK refuses it: no mm reaches a partition, so `ConvertToLinearPass` is skipped); without, a cat of
    two after a ReLU, where every pass added to `ONLY_WHERE` and `EDGE_ONLY_WHERE` is skipped."""

    def __init__(self, long: bool):
        super().__init__()
        self.long = long

    def forward(self, x, w):
        # a linear whose weight is an input: XNNPACK's checks refuse to keep it whole, so it reaches XNNPACK as mm
        y = torch.relu(x) if not self.long else torch.nn.functional.linear(x, w).view(-1, 8)
        parts = [y * i for i in range(6 if self.long else 2)]
        return torch.cat(parts, dim=1).sigmoid()


@pytest.mark.parametrize("long", [False, True])
def test_the_passes_added_skip_only_where_they_rewrite_nothing_and_change_no_program(long):
    """The skip is exact for the passes added in the seventh round (`ConvertToLinearPass`, `InsertPadQDQPass`,
    `DecomposeConcatenate` of XNNPACK; `to_edge`'s `NormalizeTransposePass` and
    `ReplaceBrokenOpsWithFunctionalOpsPass`): on a graph with nothing they rewrite they do not retrace, and the
    program is byte for byte upstream's; on one with a six-tensor cat the cat's pass runs, and the program is
    upstream's too (and computes the model)."""
    from executorch.runtime import Runtime

    from exporters.upstream import xnnpack_lowering
    from exporters.upstream.xnnpack_passes import EDGE_ONLY_WHERE, has_long_cat, rewrites_any

    module, inputs = CatsAndMatmuls(long).eval(), (torch.randn(3, 6), torch.randn(8, 6))
    with _retraces_counted() as retraces:
        upstream_program = _buffer(module, inputs)
        upstream_retraces, retraces[:] = list(retraces), []
        program = _buffer(module, inputs, xnnpack_lowering)
    assert program == upstream_program
    added = {"ConvertToLinearPass", "DecomposeConcatenate"} | {name for _, name, _ in EDGE_ONLY_WHERE}
    assert added <= set(upstream_retraces), upstream_retraces  # upstream retraced with every one of them
    if long:  # the refused linear stays outside XNNPACK (no mm in a partition): only the cat's pass runs
        assert "DecomposeConcatenate" in retraces and "ConvertToLinearPass" not in retraces, retraces
    else:
        assert not added & set(retraces), retraces
    assert has_long_cat(torch.fx.symbolic_trace(CatsAndMatmuls(True)))
    assert not has_long_cat(torch.fx.symbolic_trace(CatsAndMatmuls(False)))
    assert rewrites_any(torch.export.export(module, inputs).graph_module, "view") == long  # aten.view.default
    out = Runtime.get().load_program(program).load_method("forward").execute(list(inputs))[0]
    with torch.no_grad():
        assert float((out - module(*inputs)).abs().max()) < 1e-5


def _histories(edge) -> list:
    """Every node's name and provenance (`meta["from_node"]`, each record as a dict, ancestors included) in the edge
    program and in each program it delegated; a record's graph (`graph_id`, an object's address) by the order it is
    first met, which two lowerings of one program share."""
    programs = [edge.exported_program()]
    programs += [module.original_module for module in edge.exported_program().graph_module.modules()
                 if hasattr(module, "original_module")]
    graphs: dict[int, int] = {}

    def renumbered(record: dict) -> dict:
        return {**record, "graph_id": graphs.setdefault(record["graph_id"], len(graphs)),
                "from_node": [renumbered(source) for source in record["from_node"]]}

    return [(node.name, [renumbered(source.to_dict()) for source in node.meta.get("from_node", [])])
            for program in programs for node in program.graph.nodes]


@pytest.mark.parametrize("case", ["plain", "refused"])
def test_provenance_shared_while_lowering_changes_no_program_and_no_history(case):
    """The history shared, not deep-copied, is the same history: every node of the edge program and of its delegated
    programs carries the same records, and the program is byte for byte upstream's."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exporters.upstream import provenance_shared_while_lowering

    module, inputs = _plain() if case == "plain" else (KeptAndRefused(case).eval(), (torch.randn(4, 16), torch.randn(16, 16)))
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    lowered = []
    for skip in (contextlib.nullcontext, provenance_shared_while_lowering):
        with skip():
            edge = to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[XnnpackPartitioner()])
        lowered.append((_histories(edge), edge.to_executorch().buffer))
    (upstream_histories, upstream_program), (histories, program) = lowered
    assert any(len(sources) for _, sources in upstream_histories)  # provenance is recorded
    assert histories == upstream_histories
    assert program == upstream_program


@pytest.mark.parametrize("case", ["plain", "refused"])
def test_cia_ops_materialized_once_collect_the_same_ops_and_change_no_program(case):
    """Looking torch's CompositeImplicit ops up once per collection, not once per op namespace, collects the same
    ops, and the lowering gives the same program byte for byte (with the second decomposition of a refused linear)."""
    from torch._export import utils

    from exporters.upstream import cia_ops_materialized_once

    lookups = []
    real = utils._materialize_cpp_cia_ops

    def counted():
        lookups.append(1)
        return real()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "_materialize_cpp_cia_ops", counted)
        upstream_ops, upstream_lookups = utils._collect_all_valid_cia_ops(), len(lookups)
        lookups.clear()
        with cia_ops_materialized_once():
            ops = utils._collect_all_valid_cia_ops()
    assert ops == upstream_ops and upstream_lookups > 10 and len(lookups) == 1, (upstream_lookups, len(lookups))
    if case == "plain":
        plain, x = _plain()
        assert _buffer(plain, (x,), cia_ops_materialized_once) == _upstream_plain()[0]
    else:
        module, inputs = KeptAndRefused(case).eval(), (torch.randn(4, 16), torch.randn(16, 16))
        assert _buffer(module, inputs, cia_ops_materialized_once) == _upstream_kept(case)


class QuantizedRoundTrip(torch.nn.Module):
    """A tensor quantized to int8 and back in the program's own graph (nothing delegated): what `QuantFusionPass`'s
    patterns start from."""

    def forward(self, x):
        q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)
        return torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8) * 2.0


def _runner_bytes(module: torch.nn.Module, args: tuple, partitioned: bool, skip=None) -> bytes:
    """`module`'s program as the runners write it (`do_quant_fusion_and_const_prop`), XNNPACK-lowered or not."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower

    program = torch.export.export(module, args)
    edge = (to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]) if partitioned
            else to_edge(program))
    with skip() if skip is not None else contextlib.nullcontext():
        return edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)).buffer


@pytest.mark.parametrize("case", ["float", "quantized"])
def test_quant_fusion_skipped_without_a_quantized_op_changes_no_program(case):
    """The skip is exact: every pattern of `to_executorch`'s quantization fusion holds an op of
    `QUANTIZED_NAMESPACES`, so a float program (a linear and a GELU, delegated) gets the same program byte for byte
    without the patterns built; a graph with quantize/dequantize still gets them tried, and upstream's program."""
    import executorch.kernels.quantized  # noqa: F401 (quantized_decomposed and its out variants)
    from executorch.exir.passes import _quant_patterns_and_replacements as patterns_module
    from executorch.exir.passes import quant_fusion_pass

    from exporters.upstream import quant_fusion_only_with_quantized_ops
    from exporters.upstream.xnnpack_passes import QUANTIZED_NAMESPACES, has_call_to

    patterns = patterns_module.get_quant_patterns_and_replacements({})
    for pattern, _, _ in patterns:
        graph = pattern if isinstance(pattern, torch.fx.GraphModule) else torch.fx.symbolic_trace(pattern)
        assert has_call_to(graph, *QUANTIZED_NAMESPACES), graph.code
    module, args = (_plain()[0], (_plain()[1],)) if case == "float" else (QuantizedRoundTrip(), (torch.randn(3, 8),))
    built = []
    real = quant_fusion_pass.get_quant_patterns_and_replacements
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_fusion_pass, "get_quant_patterns_and_replacements",
                      lambda *a, **k: built.append(1) or real(*a, **k))
        upstream_program = _runner_bytes(module, args, case == "float")
        upstream_built, built[:] = len(built), []
        program = _runner_bytes(module, args, case == "float", quant_fusion_only_with_quantized_ops)
    assert program == upstream_program
    assert upstream_built == 1 and len(built) == (0 if case == "float" else 1), (upstream_built, len(built))

"""XNNPACK's graph passes run only where they can change something (part of the adapter to upstream); lowering keeps
each node's provenance without deep-copying its history ([`provenance_shared_while_lowering`]).

XNNPACK's preprocessing runs its whole list of passes on every partition it delegates, and nearly every pass ends
by retracing the partition under fake tensors, whether it changed a node or not. A program split by ops XNNPACK does
not take (the LLM runner's `llama::update_cache` / `llama::custom_sdpa`, a method per component) has a dozen
partitions, so those retraces are most of its lowering. A pass whose every rewrite starts at an op the partition
does not call cannot change it: here it returns the graph as it is, and the retrace of a pass that does run (the
channels-last pass, run on every partition) gives the same graph. tests/test_lowering.py checks the programs are
byte-identical.

```
partition ──► RemoveClone ─ DimOrderRevert ─ Upsample* ─ Linear* ─ CustomMeta* ─ SDPA* ─ ConstProp ─ FuseBN* ─
              DecomposeBN* ─ FuseActivation* ─ Cat* ─ GetItem* ─ PadQDQ* ─ Conv1d* ─ PReLU* ─ ChannelsLast ─ Copy*
              (* runs only where the partition calls one of its ops)
```
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.export.decomp_utils as decomp_utils
import torch.export.exported_program as exported_program
from torch._export import utils as export_utils
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx.passes.infra.pass_base import PassResult

from exporters.upstream.patches import patched

PASSES = "executorch.backends.xnnpack._passes"
# What every pattern of XNNPACK's SDPA fusion holds (`executorch.backends.xnnpack.partition.graphs.sdpa`): a softmax
# and the two batched matmuls around it (a router's softmax after a linear, a MoE's, is not an attention), and the
# safe softmax's guard of fully masked rows (`eq` -inf, `logical_not`, `any`, `full_like`, `where`: the decomposition
# of an attention with a mask; one without, Whisper's, has a softmax and bmms and none of these). The pass's matcher
# matches every node of a pattern (each an ancestor of its output) to a node calling the same op, so a partition
# that lacks one of these cannot hold a pattern
SOFTMAX = "_softmax"
SDPA_OPS = (SOFTMAX, "bmm", "aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.full_like.default",
            "aten.where.self")
# Each pass (module, class, under PASSES or executorch.backends) and the ops its rewrites start from (a node of the
# graph whose op name contains one of them), read from the pinned executorch's sources: `FuseBatchNormPass` and
# `DecomposeBatchNorm` rewrite batch norms, `FuseActivationPass` a relu / hardtanh after an op, `Conv1dUnsqueezePass`
# 1-D convolutions, `PReLUReshapePass` a PReLU, `RemoveGetItemPass` the getitem of a max pool or `max.dim`,
# `PropagateCustomMetaPass` quantize / dequantize nodes, `RemoveRedundantCopyPass` `_to_copy` pairs,
# `ConvertToLinearPass` an `mm` / `addmm` / `bmm` (a linear decomposed), `InsertPadQDQPass` a `constant_pad_nd`, and
# `DecomposeConcatenate` a `cat` of more than `CAT_INPUTS` tensors ("has_long_cat": the test `has_long_cat`, not an op).
ONLY_WHERE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (f"{PASSES}.fuse_batch_norm", "FuseBatchNormPass", ("batch_norm",)),
    (f"{PASSES}.decompose_batch_norm", "DecomposeBatchNorm", ("batch_norm",)),
    (f"{PASSES}.fuse_activation_pass", "FuseActivationPass", ("relu", "hardtanh")),
    (f"{PASSES}.conv1d_unsqueeze_pass", "Conv1dUnsqueezePass", ("convolution",)),
    (f"{PASSES}.prelu_reshape_pass", "PReLUReshapePass", ("prelu",)),
    ("executorch.backends.transforms.remove_getitem_op", "RemoveGetItemPass", ("max_pool2d_with_indices", "max.dim")),
    (f"{PASSES}.propagate_custom_meta_pass", "PropagateCustomMetaPass", ("quantize_",)),
    (f"{PASSES}.remove_redundant_copy_pass", "RemoveRedundantCopyPass", ("_to_copy",)),
    (f"{PASSES}.convert_to_linear", "ConvertToLinearPass", ("mm",)),
    (f"{PASSES}.insert_pad_qdq", "InsertPadQDQPass", ("constant_pad_nd",)),
    (f"{PASSES}.decompose_cat", "DecomposeConcatenate", ("has_long_cat",)),
)
# XNNPACK's `DecomposeConcatenate` splits a `cat` of more than this many tensors (XNNPACK's concatenate takes at most
# five): a graph whose every cat is within it is returned as it was, after a retrace
CAT_INPUTS = 5


def has_long_cat(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a node of the graph concatenates more than `CAT_INPUTS` tensors (`DecomposeConcatenate`'s rewrite).

    Example:
        >>> class Cat(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.cat([x] * 6)
        >>> has_long_cat(torch.fx.symbolic_trace(Cat())), has_long_cat(torch.fx.symbolic_trace(torch.nn.ReLU()))
        (True, False)
    """
    return any(node.op == "call_function" and "cat" in str(node.target) and node.args
               and isinstance(node.args[0], (list, tuple)) and len(node.args[0]) > CAT_INPUTS
               for node in graph_module.graph.nodes)


def has_call_to(graph_module: torch.fx.GraphModule, *names: str) -> bool:
    """Whether a node of the graph calls an op whose name contains one of `names` (`upsample_bilinear2d`,
    `_softmax`).

    Example:
        >>> graph = torch.fx.symbolic_trace(torch.nn.Softmax(dim=-1))
        >>> has_call_to(graph, "softmax"), has_call_to(graph, "relu", "prelu")
        (True, False)
    """
    return any(node.op == "call_function" and any(name in str(node.target) for name in names)
               for node in graph_module.graph.nodes)


def _applies(graph_module: torch.fx.GraphModule, ops: tuple[str, ...], every: bool = False) -> bool:
    """Whether a pass of `ONLY_WHERE` whose rewrites start from `ops` could change the graph (with `every`, a pass
    whose every pattern holds all of `ops`)."""
    if ops == ("has_long_cat",):
        return has_long_cat(graph_module)
    if every:
        return all(has_call_to(graph_module, op) for op in ops)
    return has_call_to(graph_module, *ops)


@contextlib.contextmanager
def _pass_only_where(pass_class: Any, *op_names: str, every: bool = False) -> Iterator[None]:
    """`pass_class` (an XNNPACK graph pass) runs only on a graph with a call to one of `op_names` (with `every`, to
    each of them); on any other graph it returns the graph unchanged, as the pass itself would have (its rewrites all
    start at one of those ops, or its every pattern holds them all)."""
    real = pass_class.call

    def call(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        if not _applies(graph_module, op_names, every):
            return PassResult(graph_module, False)
        return real(self, graph_module)

    with patched(pass_class, "call", call):
        yield


@contextlib.contextmanager
def upsample_fusion_only_with_upsample() -> Iterator[None]:
    """While ExecuTorch lowers, XNNPACK's `ConvertToUpsampleBilinear2d` pass runs only on a graph that has a bilinear
    upsample. The pass builds its patterns by exporting and lowering a bilinear module four times, once per
    process (10 s of a tiny BERT's 60 s ExecuTorch export, under load), then retraces the graph; with the pinned
    executorch every pattern is the single `upsample_bilinear2d.vec` node, which it leaves as it is
    (tests/test_lowering.py checks both), so a graph without that op is never changed by it.

    Example:
        >>> with upsample_fusion_only_with_upsample():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d

    with _pass_only_where(ConvertToUpsampleBilinear2d, "upsample_bilinear2d"):
        yield


@contextlib.contextmanager
def sdpa_fusion_only_with_softmax() -> Iterator[None]:
    """While ExecuTorch lowers, XNNPACK's `ConvertToSDPAPass` runs only on a partition that calls every op its
    patterns hold ([`SDPA_OPS`]: a softmax, batched matmuls, the safe softmax's guard). The pass builds its patterns
    (an attention with a 2-D mask decomposed into `bmm`s, a scale, the mask's add and a safe softmax) by exporting
    and lowering an attention module twice, once per process (2.2 s of a tiny Llama's runner program, 1.4 s of a
    one-layer Whisper's), then retraces each partition; a partition without one of those ops cannot hold a pattern,
    so the pass could not change it (the LLM runner's program with custom ops: its attention is
    `llama::custom_sdpa`, outside XNNPACK; a MoE's router softmax after a linear: 1.2 s of a one-layer Qwen2-MoE's
    lowering; an attention without a mask, Whisper's: a plain softmax; tests/test_lowering.py checks the patterns
    and that the programs are byte-identical).

    Example:
        >>> with sdpa_fusion_only_with_softmax():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass

    with _pass_only_where(ConvertToSDPAPass, *SDPA_OPS, every=True):
        yield


@contextlib.contextmanager
def xnnpack_passes_only_where_they_apply() -> Iterator[None]:
    """While ExecuTorch lowers, each XNNPACK pass of [`ONLY_WHERE`] runs only on a partition that calls one of the
    ops its rewrites start from; elsewhere it returns the partition unchanged instead of retracing it (a tiny
    Llama's runner program: 13 partitions, 11 of 17 passes each), and XNNPACK's pass manager leaves it out instead
    of checking the partition around it. Which ops each pass rewrites is read from the
    pinned executorch; tests/test_lowering.py checks the programs it gives are byte-identical to upstream's.

    Example:
        >>> with xnnpack_passes_only_where_they_apply():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    only_where: dict[Any, tuple[str, ...]] = {}
    with contextlib.ExitStack() as stack:
        for module, name, ops in ONLY_WHERE:
            # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
            pass_class = getattr(importlib.import_module(module), name)
            stack.enter_context(_pass_only_where(pass_class, *ops))
            only_where[pass_class] = ops
        stack.enter_context(patched(XNNPACKPassManager, "transform", _transform_only_where(only_where)))
        yield


def _transform_only_where(only_where: dict[Any, tuple[str, ...]]) -> Any:
    """`XNNPACKPassManager.transform` that leaves out a pass of `only_where` (pass class -> the ops its rewrites
    start from) on a program that calls none of its ops: the pass would return the graph unchanged, and the pass
    manager's checks around it (recompile, lint, validate) would give back the same program."""
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack._passes.xnnpack_pass import XNNPACKPass
    from executorch.exir.pass_base import ExportPass  # deferred: heavy
    from executorch.exir.program._program import _transform  # deferred: heavy

    def transform(self: Any) -> Any:
        program = self.exported_program
        for pass_class in self.passes:
            ops = only_where.get(pass_class)
            if ops is not None and not _applies(program.graph_module, ops):
                continue
            if issubclass(pass_class, XNNPACKPass):
                graph_pass = pass_class(program)
            elif issubclass(pass_class, ExportPass):
                graph_pass = pass_class()
            else:  # upstream's own refusal
                raise RuntimeError(f"Expecting ExportPass or ExportPass(), but got pass: {pass_class}")
            program = _transform(program, graph_pass)
        return program

    return transform


# What the default decomposition table holds for these ops is the op itself: `sym_size.int` is a CompositeImplicit op
# that the table lists with its own kernel (`x.size(dim)`), which traces back to `sym_size.int`
DECOMPOSE_TO_THEMSELVES = ("aten.sym_size.int",)


def _decomposes_nothing(program: Any, table: dict) -> bool:
    """Whether decomposing `program` with `table` would give it back as it is: no node (control-flow branches
    included) calls an op `table` decomposes into others, and the program mutates no input of its caller (a retrace
    writes each such input back once more: a second `copy` into it, the methods layout's caches)."""
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    if any(spec.kind == OutputKind.USER_INPUT_MUTATION for spec in program.graph_signature.output_specs):
        return False
    ops = {op for op in table if str(op) not in DECOMPOSE_TO_THEMSELVES}
    return not contains_any_call_fn_target_op(program.graph_module, ops)


@contextlib.contextmanager
def second_decomposition_only_where_it_decomposes() -> Iterator[None]:
    """While ExecuTorch lowers, the second decomposition of the `EDGE_DO_NOT_DECOMP` path (a partitioner with
    `check_op_support`, XNNPACK's) runs only where a node is left to decompose. The path decomposes once keeping the
    partitioner's ops, renames the kept nodes its checks accept into the `EDGE_DO_NOT_DECOMP` namespace, and
    decomposes again (a full retrace) for the nodes its checks refused; where every kept node passed, the graph has
    no op of the table left and the retrace changes nothing (upstream's own one-pass path skips the same call on the
    same condition), unless the program mutates an input (then the retrace adds a copy, which stays).
    tests/test_lowering.py checks the programs are byte-identical.

    Example:
        >>> with second_decomposition_only_where_it_decomposes():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    import executorch.exir.program._program as program_module

    renamed: list[Any] = []  # the program whose kept nodes were just renamed: its next decomposition is the second
    real_rename = program_module._replace_aten_ops_with_transformed_ops
    real_decompose = ExportedProgram.run_decompositions

    def rename(name: str, program: Any, partitioner: Any) -> Any:
        renamed[:] = [program]
        return real_rename(name, program, partitioner)

    def run_decompositions(self: Any, decomp_table: Any = None, *args: Any, **kwargs: Any) -> Any:
        second = bool(renamed) and renamed[0] is self and not args and not kwargs and decomp_table is not None
        renamed.clear()
        if second and _decomposes_nothing(self, decomp_table):
            return self
        return real_decompose(self, decomp_table, *args, **kwargs)

    with patched(program_module, "_replace_aten_ops_with_transformed_ops", rename), \
            patched(ExportedProgram, "run_decompositions", run_decompositions):
        yield


# The aten → edge passes of `to_edge` (`executorch.exir.passes.base_pre_op_replace_passes`) that retrace every
# program and rewrite only one kind of node: `NormalizeTransposePass` an `aten.t.default` (into `t_copy`),
# `ReplaceBrokenOpsWithFunctionalOpsPass` a view op (into its `_copy`; `ReplaceViewOpsWithViewCopyOpsPass`, which runs
# before it, leaves none in the programs measured). Each: (module, class, the test whether a node is one it rewrites).
EDGE_ONLY_WHERE: tuple[tuple[str, str, str], ...] = (
    ("executorch.exir.passes.normalize_transpose_pass", "NormalizeTransposePass", "transpose"),
    ("executorch.exir.passes.replace_broken_ops_with_function_ops_pass", "ReplaceBrokenOpsWithFunctionalOpsPass", "view"),
)


def _rewrites(node: torch.fx.Node, kind: str) -> bool:
    """Whether `node` is one an `EDGE_ONLY_WHERE` pass of `kind` rewrites: `aten.t.default`, or an op that is a view
    (the pass's own test, `OpOverload.is_view`)."""
    if node.op != "call_function":
        return False
    if kind == "transpose":
        return node.target == torch.ops.aten.t.default
    return bool(getattr(node.target, "is_view", False))


def rewrites_any(graph_module: torch.fx.GraphModule, kind: str) -> bool:
    """Whether a node of the graph, or of a graph it calls (a control-flow branch), is one the `EDGE_ONLY_WHERE`
    pass of `kind` rewrites.

    Example:
        >>> class Transposed(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.aten.t.default(x) + 1
        >>> graph = torch.fx.symbolic_trace(Transposed())
        >>> rewrites_any(graph, "transpose"), rewrites_any(graph, "view")  # `t` is a view op too
        (True, True)
        >>> rewrites_any(torch.fx.symbolic_trace(torch.nn.ReLU()), "view")
        False
    """
    return any(_rewrites(node, kind) for module in graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


@contextlib.contextmanager
def edge_passes_only_where_they_apply() -> Iterator[None]:
    """While ExecuTorch lowers, the aten → edge passes of [`EDGE_ONLY_WHERE`] run only on a program with a node they
    rewrite; elsewhere they give the graph back as it is instead of retracing it (the passes after them retrace it
    anyway: `ScalarToTensorPass`, `SymToTensorPass`, ...). About 0.25 s of CPU each, per method, on a tiny Llama's
    runner program; tests/test_lowering.py checks the programs are byte-identical to upstream's.

    Example:
        >>> with edge_passes_only_where_they_apply():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    with contextlib.ExitStack() as stack:
        for module, name, kind in EDGE_ONLY_WHERE:
            # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
            pass_class = getattr(importlib.import_module(module), name)
            stack.enter_context(patched(pass_class, "call", _call_only_where(pass_class.call, kind)))
        yield


def _call_only_where(real: Any, kind: str) -> Any:
    """A pass's `call` that returns a graph without a node of `kind` unchanged, and runs `real` on any other."""

    def call(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        if not rewrites_any(graph_module, kind):
            return PassResult(graph_module, False)
        return real(self, graph_module)

    return call


def _node_source_sharing_history(self: Any, node: Any, pass_name: str = "", action: Any = None) -> None:
    """`torch.fx.traceback.NodeSource.__init__` that keeps the node's history (`from_node`: NodeSource objects
    nothing changes after they are built) in a list of its own, its entries shared, instead of deep-copying it."""
    _NODE_SOURCE_INIT(self, None, pass_name, action)
    if node:
        self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
        history = node.meta.get("from_node", [])
        self.from_node = list(history) if isinstance(history, list) else copy.deepcopy(history)


_NODE_SOURCE_INIT = torch.fx.traceback.NodeSource.__init__


@contextlib.contextmanager
def provenance_shared_while_lowering() -> Iterator[None]:
    """While ExecuTorch lowers, each node a retrace makes records where it came from (`meta["from_node"]`, a
    `NodeSource`) with its source's history shared, not deep-copied: upstream deep-copies the whole chain of
    ancestors for every node of every retrace, a chain one level deeper after each pass (0.4 s of samples of a
    one-layer Llama's runner-program lowering, 7% of its export). No code changes a `NodeSource` once built (torch
    and executorch read it: ETRecord's serializer, the debug handles), so the histories hold the same records;
    tests/test_lowering.py checks the programs are byte-identical and every node's history the same.

    Example:
        >>> with provenance_shared_while_lowering():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    with patched(torch.fx.traceback.NodeSource, "__init__", _node_source_sharing_history):
        yield


@contextlib.contextmanager
def cia_ops_materialized_once() -> Iterator[None]:
    """While ExecuTorch lowers, torch's list of the CompositeImplicit ops a decomposition may keep
    (`torch._export.utils._collect_all_valid_cia_ops`, read by every `run_decompositions` and every materialization
    of a `CustomDecompTable`: four times in a tiny Llama's runner-program lowering) asks the C++ dispatcher for its
    CompositeImplicit registrations and looks each one up in `torch.ops` once per call, not once per op namespace
    walked (40 with executorch and torchao loaded: 55 ms a call, 7 once; that lowering's 165 lookups become 4). The
    lookups only make `torch.ops` hold those ops; the
    walks between them register nothing, so the set collected is the same (tests/test_lowering.py checks it, and that
    the programs are byte-identical).

    Example:
        >>> with cia_ops_materialized_once():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    real_collect, real_materialize = export_utils._collect_all_valid_cia_ops, export_utils._materialize_cpp_cia_ops

    def collect() -> set:
        real_materialize()
        with patched(export_utils, "_materialize_cpp_cia_ops", lambda: None):
            return real_collect()

    with patched(export_utils, "_collect_all_valid_cia_ops", collect), \
            patched(exported_program, "_collect_all_valid_cia_ops", collect), \
            patched(decomp_utils, "_collect_all_valid_cia_ops", collect):
        yield


# The op namespaces every pattern of `to_executorch`'s quantization fusion holds one op of (executorch's
# `_quant_patterns_and_replacements`: dequantize / quantize of `quantized_decomposed` or `torchao`)
QUANTIZED_NAMESPACES = ("quantized_decomposed", "torchao")


@contextlib.contextmanager
def quant_fusion_only_with_quantized_ops() -> Iterator[None]:
    """While a program goes to ExecuTorch with `do_quant_fusion_and_const_prop` (the LLM and multimodal runners'
    programs), `QuantFusionPass` builds and tries its 23 patterns (each traced and lowered to edge ops again, per
    call: 0.19 s of a one-layer Llama's float runner program) only on a graph that calls a quantized op
    ([`QUANTIZED_NAMESPACES`]); every pattern holds one and the rewriter matches the top graph only, so elsewhere it
    matches nothing. The rest of the pass (the quantized cat, the nodes' values, the dead code) and the constant
    propagation after it run as before; tests/test_lowering.py checks the patterns and that the programs are
    byte-identical.

    Example:
        >>> with quant_fusion_only_with_quantized_ops():  # doctest: +SKIP
        ...     edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir.passes import quant_fusion_pass

    real = quant_fusion_pass.QuantFusionPass.call

    def call(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        if has_call_to(graph_module, *QUANTIZED_NAMESPACES):
            return real(self, graph_module)
        with patched(quant_fusion_pass, "get_quant_patterns_and_replacements", lambda *args, **kwargs: []):
            return real(self, graph_module)

    with patched(quant_fusion_pass.QuantFusionPass, "call", call):
        yield

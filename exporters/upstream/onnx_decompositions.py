"""torch.onnx's second trace skipped where it would change nothing the ONNX translation needs (docs/upstream-gaps.md
#21): part of the one adapter (`exporters.upstream`).

`torch.onnx.export(program)` first runs `program.run_decompositions(table)`: a second full trace of the program under
fake tensors, which decomposes the ops ONNX has no function for, lowers the aliasing composite ops (`reshape`,
`contiguous`, `to`) and functionalizes in-place ops. On a 58M Llama's merged generation graph that trace is ~8 s of a
~37 s run, and it changes six node kinds of 565, each of which the translation can take as it is or after a
one-node rewrite. [`decompose_only_what_onnx_lacks`] translates such a program as traced, and hands every other
program to the real decomposition unchanged. Its type-promotion pass then runs every node once more under fake
tensors to learn dtypes the trace recorded: [`type_promotion_on_traced_values`] reads them instead (#40). Each export
builds torch.onnx's registry of torchlib's functions again (a signature per function); [`torchlib_registry_ready`]
builds it once in the process that forks the export children, [`torchlib_registry_built_once`] hands each export a
copy (#49).

Example:
    >>> with decompose_only_what_onnx_lacks():  # doctest: +SKIP
    ...     onnx_program = torch.onnx.export(exported_program, args=(), kwargs=inputs)
"""

from __future__ import annotations

import contextlib
import logging
import operator
from typing import Any, Callable, Iterator

import torch
from torch._export.utils import _is_cia_op, _is_preservable_cia_op
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from exporters.upstream.patches import patched

aten = torch.ops.aten

# Python's tensor operators, traced as `aten.__and__` (which ONNX's table decomposes), and the aten op they are
SAME_OP = {
    aten.__and__.Tensor: aten.bitwise_and.Tensor,
    aten.__or__.Tensor: aten.bitwise_or.Tensor,
    aten.__xor__.Tensor: aten.bitwise_xor.Tensor,
}
# `Tensor.to`, an aliasing composite op the decomposition always lowers to `_to_copy` (a cast in ONNX)
CASTS = frozenset({aten.to.dtype, aten.to.device, aten.to.dtype_layout, aten.to.other})
# shape-only ops that are the identity when the output's shape is the input's
RESHAPES = frozenset({aten.reshape.default, aten.view.default})
# aliasing composite ops that the decomposition always lowers and whose ONNX function is the lowering's meaning
# (`Reshape`, `Identity`); any other is left to the decomposition, since ONNX's function for it never runs there
AS_TRACED = frozenset({aten.reshape.default, aten.contiguous.default})
# nodes torch.onnx removes after the decomposition (`_fx_passes.remove_assertion_nodes`)
ASSERTIONS = frozenset({aten.sym_constrain_range_for_size.default, aten._assert_async.default,
                        aten._assert_async.msg, aten._assert_scalar.default, aten._assert_tensor_metadata.default})

Rewrite = Callable[[torch.fx.Node], None]


@contextlib.contextmanager
def decompose_only_what_onnx_lacks() -> Iterator[None]:
    """While an ONNX graph is exported, a program whose every op ONNX implements as traced (after the one-node
    rewrites of `plan_rewrites`: no in-place op, no higher-order op, nothing ONNX's table would decompose) skips
    torch.onnx's `run_decompositions`; any other program is decomposed as upstream does. Validation compares the
    graph with the eager model either way.

    Example:
        >>> with decompose_only_what_onnx_lacks():  # doctest: +SKIP
        ...     torch.onnx.export(exported_program, args=(), kwargs=inputs)
    """
    from torch.onnx._internal.exporter import _decomp, _fx_passes  # deferred: ONNX exports only

    real = _fx_passes.decompose_with_registry

    def decompose(program: torch.export.ExportedProgram, registry: Any) -> torch.export.ExportedProgram:
        rewrites = plan_rewrites(program, set(_decomp.get_onnx_implemented_overloads(registry)))
        if rewrites is None:
            return real(program, registry)
        for node, rewrite in rewrites:
            rewrite(node)
        program.graph.eliminate_dead_code()
        program.graph_module.recompile()
        return program

    with patched(_fx_passes, "decompose_with_registry", decompose):
        yield


def plan_rewrites(program: torch.export.ExportedProgram,
                  implemented: set[Any]) -> list[tuple[torch.fx.Node, Rewrite]] | None:
    """The rewrites that make `program` translatable as traced, or None where it needs the real decomposition: an
    op ONNX does not implement (after `SAME_OP` and `CASTS`), an aliasing composite op outside `AS_TRACED`, a node
    without its traced value (a node an FX fix added after the trace), an in-place or `out=` op (the decomposition
    functionalizes those), a higher-order op or a nested graph. Nothing is changed here.

    Example:
        >>> plan_rewrites(torch.export.export(torch.nn.ReLU(), (torch.ones(2),)), {torch.ops.aten.relu.default})
        []
    """
    if any(isinstance(module, torch.fx.GraphModule) for module in program.graph_module.children()):
        return None
    rewrites: list[tuple[torch.fx.Node, Rewrite]] = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if target in ASSERTIONS:
            continue
        if "val" not in node.meta:  # the translation reads every value's shape and type; the retrace records them
            return None
        if not isinstance(target, torch._ops.OpOverload):
            if target is operator.getitem or (callable(target) and target in implemented
                                              and not isinstance(target, torch._ops.HigherOrderOperator)):
                continue
            return None
        if target._schema.is_mutable:
            return None
        if target in SAME_OP and SAME_OP[target] in implemented:
            rewrites.append((node, _retarget(SAME_OP[target])))
        elif target in CASTS and isinstance(node.meta.get("val"), torch.Tensor) and aten._to_copy.default in implemented:
            rewrites.append((node, _cast))
        elif target in RESHAPES and _same_shape(node):
            rewrites.append((node, _input_itself))
        elif target not in implemented or (_is_cia_op(target) and not _is_preservable_cia_op(target)
                                           and target not in AS_TRACED):
            return None
    return rewrites


def _retarget(op: torch._ops.OpOverload) -> Rewrite:
    def rewrite(node: torch.fx.Node) -> None:
        node.target = op
    return rewrite


def _cast(node: torch.fx.Node) -> None:
    node.target = aten._to_copy.default
    node.args = (node.args[0],)
    node.kwargs = {"dtype": node.meta["val"].dtype}


def _input_itself(node: torch.fx.Node) -> None:
    node.replace_all_uses_with(node.args[0])


def _same_shape(node: torch.fx.Node) -> bool:
    """Whether a reshape's output has its input's shape, provably for every size the program takes."""
    source = node.args[0]
    before = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    after = node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor) or before.dim() != after.dim():
        return False
    return all(statically_known_true(a == b) for a, b in zip(before.shape, after.shape))


@contextlib.contextmanager
def type_promotion_on_traced_values() -> Iterator[None]:
    """While an ONNX graph is exported, torch.onnx's type-promotion pass (`InsertTypePromotion`) reads the values
    the trace recorded (`node.meta["val"]`) instead of running every node of the program again under fake tensors:
    a third pass over the whole graph, with symbolic sizes, to learn the input dtypes of the few ops that have a
    promotion rule (docs/upstream-gaps.md #40). A node the pass changes (a cast inserted, an overload replaced) is
    still run, as upstream does, and so is any node without a recorded value; the casts it inserts are the same,
    since a rule reads only dtypes and Python types, which the recorded values have.

    Example:
        >>> with type_promotion_on_traced_values():  # doctest: +SKIP
        ...     torch.onnx.export(exported_program, args=(), kwargs=inputs)
    """
    from torch.onnx._internal.fx.passes import type_promotion  # deferred: ONNX exports only

    interpreter = type_promotion._TypePromotionInterpreter
    real = interpreter.run_node

    def run_node(self: Any, node: torch.fx.Node) -> Any:
        recorded = node.meta.get("val")
        if node.op != "call_function" or not _fake_values(recorded):
            return real(self, node)
        with self._set_current_node(node):
            if rule := type_promotion.get_type_promotion_rule(node, self.type_promotion_table):
                before = (node.target, node.args, node.kwargs)
                self._maybe_promote_node(node, rule)
                if (node.target, node.args, node.kwargs) != before:  # promoted and run again: its new value
                    return self.env[node]
        return recorded

    with patched(interpreter, "run_node", run_node):
        yield


def _fake_values(value: Any) -> bool:
    """Whether a recorded value is what running its node under fake tensors gives: fake tensors, symbolic or plain
    numbers, in tuples or lists; not None (a node without a recorded value) and not a real tensor."""
    leaves = torch.utils._pytree.tree_leaves(value)
    return value is not None and bool(leaves) and all(
        isinstance(leaf, (FakeTensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) for leaf in leaves)



# torch.onnx's registry of torchlib's functions for every opset (before upstream keeps an opset's own), built once in
# this process by `torchlib_registry_ready`
_REGISTRIES: dict[str, Any] = {}
REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"


def torchlib_registry_ready() -> Any:
    """torch.onnx's registry of torchlib's functions, built once in this process: a process that forks export
    children builds it before the fork, so that every child's export copies it ([`torchlib_registry_built_once`])
    instead of building it again (0.5 s: a signature per function). It holds every opset's functions (upstream's
    build keeps an opset's own at its end, which the copy does). Its "torchvision is not installed" warnings are left
    out (upstream logs them at every build; no torchvision op is registered either way).

    Example:
        >>> len(torchlib_registry_ready().functions) > 100  # doctest: +SKIP
        True
    """
    from torch.onnx._internal.exporter import _constants, _registration  # deferred: ONNX exports only

    if "all" not in _REGISTRIES:
        owner = _registration.ONNXRegistry
        build = owner.__dict__["from_torchlib"].__func__
        build = getattr(build, "__wrapped__", build)  # upstream's own, also inside `torchlib_registry_built_once`
        logger = logging.getLogger(REGISTRY_LOGGER)
        with contextlib.ExitStack() as stack:
            stack.callback(logger.setLevel, logger.level)
            logger.setLevel(logging.ERROR)
            stack.enter_context(patched(owner, "_cleanup_registry_based_on_opset_version", lambda self: None))
            _REGISTRIES["all"] = build(owner, _constants.TORCHLIB_OPSET)
    return _REGISTRIES["all"]


@contextlib.contextmanager
def torchlib_registry_built_once() -> Iterator[None]:
    """While an ONNX graph is exported, torch.onnx's `ONNXRegistry.from_torchlib(opset_version)` copies the registry
    built once in this process ([`torchlib_registry_ready`]) and keeps the opset's own functions as upstream's build
    does at its end: the same functions and metadata objects, in lists of its own, so a custom translation an export
    registers stays in its copy (docs/upstream-gaps.md #49).

    Example:
        >>> with torchlib_registry_built_once():  # doctest: +SKIP
        ...     torch.onnx.export(exported_program, args=(), kwargs=inputs)
    """
    from torch.onnx._internal.exporter import _constants, _registration  # deferred: ONNX exports only

    def from_torchlib(cls: type, opset_version: int = _constants.TORCHLIB_OPSET) -> Any:
        built = torchlib_registry_ready()
        registry = cls()
        registry._opset_version = opset_version
        registry.functions = {target: list(metas) for target, metas in built.functions.items()}
        registry._cleanup_registry_based_on_opset_version()
        return registry

    from_torchlib.__wrapped__ = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__  # type: ignore[attr-defined]
    with patched(_registration.ONNXRegistry, "from_torchlib", classmethod(from_torchlib)):
        yield

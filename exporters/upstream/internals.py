"""The stack's private interfaces this project relies on, kept in the adapter so that a release that changes them
is adapted here: ExecuTorch's `.pte` layout (segments, named data), the one place `generate()` assembles its
logits processors, how upstream resolves the targets of its trace-time patches, the contiguity test of its
`reshape` patch, torch's symbolic size arithmetic (`SymNode`'s operations) and how `torch.export` gives input
sizes their symbols, the cache layers a non-strict `torch.export` of the static-cache wrapper reads, and how
torch's `.pt2` deserializer reads its schema's type hints and its symbolic sizes.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch._dynamo.source import TensorProperty, TensorPropertySource
from torch._export import non_strict_utils
from torch._export.serde import schema as serde_schema
from torch._export.serde import serialize as serde
from torch.export.dynamic_shapes import _Constraint
from torch.fx.experimental import sym_node
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from transformers import modeling_utils
from transformers.exporters import utils as upstream_utils

from exporters.upstream.patches import patched, patched_item

__all__ = ["checkpoint_read_not_mapped", "contiguity_known_once", "named_dims_share_symbols", "patches_of_loaded_models", "pte_float_dtypes", "pte_weight_bytes",
           "recording_logits_processors", "cache_layers_through_buffers", "subclass_named_as",
           "symbolic_arithmetic_once", "symbolic_key_present"]


def pte_weight_bytes(path: Path) -> int:
    """The weight bytes a `.pte` stores, each segment once: its constant segment, the named-data segments (where
    XNNPACK keeps its weights) and what each delegate's blob holds of weights: an XNNPACK blob's constant data (its
    header says how much; the rest is its graph), any other backend's whole blob (Core ML's holds its model), and
    any constant buffer kept inside the flatbuffer."""
    # executorch.exir is loaded only where a .pte is measured: it costs seconds at start-up
    from executorch.exir._serialize._program import _ExtendedHeader, _flatbuffer_to_program

    with path.open("rb") as handle:
        header = _ExtendedHeader.from_bytes(handle.read(64)[8:])
        if not header.is_valid():
            return path.stat().st_size  # no segments: everything is inline in the flatbuffer
        handle.seek(0)
        program = _flatbuffer_to_program(handle.read(header.program_size))
        blobs: dict[tuple[str, int], tuple[str, bytes, int]] = {}  # (where, index) -> backend, first bytes, size
        for plan in program.execution_plan:
            for delegate in plan.delegates:
                index = delegate.processed.index
                if delegate.processed.location.name == "SEGMENT":  # else INLINE, in the flatbuffer
                    segment = program.segments[index]
                    handle.seek(header.segment_base_offset + segment.offset)
                    blobs[("segment", index)] = (delegate.id, handle.read(_XNN_HEADER_BYTES), segment.size)
                else:
                    data = bytes(program.backend_delegate_data[index].data)
                    blobs[("inline", index)] = (delegate.id, data[:_XNN_HEADER_BYTES], len(data))
    segments = {entry.segment_index for entry in program.named_data or []}
    constant = program.constant_segment
    if constant is not None and constant.offsets:
        segments.add(constant.segment_index)
    segments -= {index for where, index in blobs if where == "segment"}
    return (sum(program.segments[index].size for index in segments)
            + sum(_delegate_weight_bytes(*blob) for blob in blobs.values())
            + sum(len(buffer.storage) for buffer in program.constant_buffer or []))


# XNNPACK's blob header (executorch/backends/xnnpack/serialization/xnnpack_graph_serialize.py, XNNHeader): 4 zero
# bytes, magic "XH00", header length (2), flatbuffer offset (4) and size (4), constant data offset (4) and size (8)
_XNN_HEADER_BYTES = 30


def _delegate_weight_bytes(backend: str, head: bytes, size: int) -> int:
    if backend == "XnnpackBackend" and head[4:8] == b"XH00" and len(head) >= _XNN_HEADER_BYTES:
        return int.from_bytes(head[22:30], "little")
    return size  # a blob we cannot read into: every byte may be a weight


# ExecuTorch's scalar types (c10's numbering) of floating-point tensors, by the dtype names reports use
_PTE_FLOATS = {5: "float16", 6: "float32", 7: "float64", 15: "bfloat16"}


def pte_float_dtypes(path: Path) -> dict[str, int]:
    """How many of a `.pte`'s tensor values (weights and activations its plans hold) are of each floating-point dtype:
    what the program computes in (delegated weights are not values; their activations are)."""
    # executorch.exir is loaded only where a .pte is read (see pte_weight_bytes)
    from executorch.exir._serialize._program import _ExtendedHeader, _flatbuffer_to_program

    with path.open("rb") as handle:
        header = _ExtendedHeader.from_bytes(handle.read(64)[8:])
        handle.seek(0)
        program = _flatbuffer_to_program(handle.read(header.program_size) if header.is_valid() else handle.read())
    counts: dict[str, int] = {}
    for plan in program.execution_plan:
        for value in plan.values:
            name = _PTE_FLOATS.get(int(getattr(value.val, "scalar_type", -1)))
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
    return counts


@contextmanager
def recording_logits_processors(model, sink: list) -> Iterator[None]:
    """Record (a deep copy of, before first use) the logits processors `generate()` builds."""
    build = model._get_logits_processor  # the one place generate() assembles them (transformers 5.24)

    def recording(*args, **kwargs):
        processors = build(*args, **kwargs)
        sink.append(copy.deepcopy(processors, memo={id(model): model}))
        return processors

    with patched(model, "_get_logits_processor", recording):
        yield


def subclass_named_as(kind: type, attributes: dict[str, typing.Any]) -> type:
    """A subclass of `kind` holding `attributes`, named as `kind` itself (module and qualified name), for an instance
    whose class gains methods or properties: what finds a class by its dotted path (transformers' cache pytree, which
    a non-strict `torch.export` flattens and rebuilds the module's attributes through; pickling) finds `kind`.

    Example:
        >>> class Layer: ...
        >>> sub = subclass_named_as(Layer, {"size": 2})
        >>> issubclass(sub, Layer), sub.__qualname__ == Layer.__qualname__, sub.size
        (True, True, 2)
    """
    return type(kind.__name__, (kind,), {**attributes, "__module__": kind.__module__, "__qualname__": kind.__qualname__})


@contextmanager
def cache_layers_through_buffers(wrapper: torch.nn.Module) -> Iterator[None]:
    """While a non-strict `torch.export` traces transformers' static-cache wrapper, each cache layer reads its
    tensors (`keys`, `values`, `cumulative_length`) through the wrapper's buffers (`key_cache_{i}`, ...), which
    the trace swaps for its fake tensors. The layers hold the real tensors themselves, so without it non-strict export
    reads them behind the module's back: the cache becomes anonymous constants (`lifted_tensor_*`, the plain
    StaticLayer) or fails on `.item()` of a real tensor in the trace (the custom-ops cache). Strict export (Dynamo)
    follows the references, at three times the CPU (a tiny Llama's runner program: 1.94 s strict, 0.66 s
    non-strict; benchmarks/RESULTS.md, fourteenth round). Each layer's class is a subclass with those three
    attributes as properties for the block only.

    Example:
        >>> with cache_layers_through_buffers(program.wrapper):  # doctest: +SKIP
        ...     torch.export.export(program, (), kwargs, strict=False)
    """
    with contextlib.ExitStack() as stack:
        for i, layer in enumerate(wrapper.static_cache.layers):
            names = {"keys": f"key_cache_{i}", "values": f"value_cache_{i}",
                     "cumulative_length": f"cumulative_length_{i}"}
            kind = type(layer)
            layer.__class__ = subclass_named_as(kind, {
                attribute: property(lambda self, name=name: getattr(wrapper, name),
                                    lambda self, value, name=name: setattr(wrapper, name, value))
                for attribute, name in names.items()})
            stack.callback(setattr, layer, "__class__", kind)  # `patched` reads no class off an instance
        yield


@contextmanager
def checkpoint_read_not_mapped() -> Iterator[None]:
    """While `from_pretrained` loads, its safetensors shards are read (`pread`) instead of memory-mapped. Mapped, every
    page of a shard that a tensor was read from stays resident (and counted in the process's RSS) until the last shard
    is read: loading a bfloat16 checkpoint in float32 peaks at the float32 weights plus all the shards (1.66x the
    float32 weights, benchmarks/RESULTS.md). Read, each tensor is a temporary that is converted and dropped: the peak
    is the loaded weights plus the few tensors in flight. The tensors are the same bytes either way.

    Example:
        >>> with checkpoint_read_not_mapped():  # doctest: +SKIP
        ...     model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    """
    mapped = modeling_utils.safe_open

    def read_open(filename, framework, device="cpu", backend="mmap"):
        return mapped(filename, framework=framework, device=device, backend="pread")

    with patched(modeling_utils, "safe_open", read_open):
        yield


@contextmanager
def patches_of_loaded_models() -> Iterator[None]:
    """While a model is exported, upstream's trace-time patches of model code (`transformers.models.<family>.
    modeling_<family>.<Class>.forward`: 34, of 32 families, for the dynamo trace every format starts
    with) are resolved only for the modeling modules already imported. A module that is not imported holds no
    class of the model being traced, so its patch could not apply; resolving it imports the module (141 modules, 0.9 s
    of every export process on a 2-core machine: benchmarks/RESULTS.md). Every other patch resolves as upstream's.

    Example:
        >>> with patches_of_loaded_models():  # doctest: +SKIP
        ...     OnnxExporter().export(model, inputs, config)
    """
    real = upstream_utils.import_dotted_path

    def import_dotted_path(path: str, missing_ok: bool = False):
        if missing_ok and _modeling_module_not_loaded(path):
            return None
        return real(path, missing_ok=missing_ok)

    with patched(upstream_utils, "import_dotted_path", import_dotted_path):
        yield


def _modeling_module_not_loaded(path: str) -> bool:
    """`transformers.models.<family>.<module>[.<attribute>...]` whose module is not in `sys.modules`."""
    parts = path.split(".")
    return len(parts) >= 4 and parts[:2] == ["transformers", "models"] and ".".join(parts[:4]) not in sys.modules


@contextmanager
def contiguity_known_once() -> Iterator[None]:
    """While a model is traced, upstream's `reshape`/`view` patch (`transformers.exporters.utils._patch_reshape`)
    asks `is_contiguous_or_false` of every input, which on symbolic sizes and strides is a symbolic evaluation each
    time (a quarter of `torch.export`'s time on a 24-layer decoder: docs/upstream-gaps.md #31), and every layer asks
    it of the same sizes and strides. A `True` answer is kept per shape environment, sizes and strides, and given
    again: a layout proven contiguous stays so (the shape environment only gains facts, and the proof's guards are
    already in it), so the trace is the same. `False` (not contiguous, or not decidable) is asked again every time.

    Example:
        >>> with contiguity_known_once():  # doctest: +SKIP
        ...     OnnxExporter().export(model, inputs, config)
    """
    real = upstream_utils.is_contiguous_or_false
    proven: dict[int, tuple[object, set[tuple]]] = {}  # by id of the shape environment, which is held alive

    def is_contiguous_or_false(a) -> bool:
        layout = _layout(a)
        if layout is None:
            return real(a)
        env, key = layout
        known = proven.setdefault(id(env), (env, set()))[1]
        if key in known:
            return True
        answer = real(a)
        if answer:
            known.add(key)
        return answer

    with patched(upstream_utils, "is_contiguous_or_false", is_contiguous_or_false):
        yield


def _layout(a) -> tuple[object, tuple] | None:
    """A tensor's shape environment (None when every size is concrete) and its sizes and strides as hashable
    expressions; None for a tensor without strides."""
    try:
        dims = (*a.shape, *a.stride())
    except Exception:  # no strides (sparse, nested): asked every time
        return None
    env = next((d.node.shape_env for d in dims if isinstance(d, torch.SymInt)), None)
    return env, (a.dim(), *(d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in dims))


@contextmanager
def symbolic_arithmetic_once() -> Iterator[None]:
    """While a model is traced, an arithmetic or comparison of two symbolic sizes that the shape environment has
    already computed, from the same expressions in the same state, is not computed again: its expression, type and
    hint are kept and a new node is built from them, as upstream builds one. Every fake tensor's storage size,
    contiguity and element count is such arithmetic (~60,000 operations on a 58M Llama's merged graph), and every
    layer repeats the first one's; upstream caches only the symbolic expression (256 per operation), not the rest
    of the work around it (docs/upstream-gaps.md #42). The key holds both expressions as stored, their types and
    hints, and the environment's replacement version (an expression is resolved through the replacements, which
    only a new version changes), so the node built is the one upstream would build. Not kept: `mod` (it reads
    value ranges, which change without a new version), operations while the tracer records symbolic arithmetic
    (a proxy mode), and any environment that records its events or validates translation.

    Example:
        >>> with symbolic_arithmetic_once():  # doctest: +SKIP
        ...     OnnxExporter().export(model, inputs, config)
    """

    if not symbolic_key_present():  # another torch than the pinned one: upstream's arithmetic, unpatched
        yield
        return
    real = {name: fn for name, fn in vars(sym_node.SymNode).items() if _binary_operation(fn) not in (None, "mod")}
    known: dict[int, tuple[object, dict]] = {}  # by id of the shape environment, which is held alive

    def kept(name: str, operation):
        def compute(self, other):
            env = self.shape_env
            if (env is None or type(other) is not sym_node.SymNode or other.shape_env is not env
                    or env.should_record_events or env._translation_validation_enabled or get_proxy_mode()
                    or torch._logging._internal.GET_DTRACE_STRUCTURED):
                return operation(self, other)
            key = (name, self._expr, other._expr, self.pytype, other.pytype, self._hint, other._hint,
                   self._optimized_summation, other._optimized_summation, env._replacements_version_counter)
            cache = known.setdefault(id(env), (env, {}))[1]
            try:
                done = cache.get(key)
            except TypeError:  # an unhashable hint
                return operation(self, other)
            if done is None:
                result = operation(self, other)
                cache[key] = (result._expr, result.pytype, result._hint, result._optimized_summation)
                return result
            expr, pytype, hint, summation = done
            return sym_node.SymNode(expr, env, pytype, sym_node._NO_HINT if hint is None else hint,
                                    optimized_summation=summation)
        return compute

    with contextlib.ExitStack() as stack:
        for name, operation in real.items():
            stack.enter_context(patched(sym_node.SymNode, name, kept(name, operation)))
        yield


def symbolic_key_present() -> bool:
    """Whether this torch has what [`symbolic_arithmetic_once`] keys on: the shape environment's replacement version
    (torch 2.13's; torch 2.11 has none, and an export there would end in an AttributeError) and `SymNode`'s
    `_optimized_summation`. Without them the trace runs upstream's arithmetic, as without the shortcut.

    Example:
        >>> symbolic_key_present()  # the pinned torch (constraints.txt)
        True
    """
    env = ShapeEnv()
    return hasattr(env, "_replacements_version_counter") and hasattr(env.create_unbacked_symint().node,
                                                                     "_optimized_summation")


def _binary_operation(fn) -> str | None:
    """The operation of one of `SymNode`'s binary methods (`_add`, `_eq`, ...), as upstream builds them
    (`_make_node_magic`'s `binary_magic_impl`); None for any other attribute."""
    inner = getattr(fn, "__wrapped__", None)
    if getattr(inner, "__name__", None) != "binary_magic_impl" or not inner.__closure__:
        return None
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__))
    return cells["method"].cell_contents if "method" in cells else None


@contextmanager
def named_dims_share_symbols() -> Iterator[None]:
    """While a model is traced, the input sizes that share a named `Dim` of the dynamic shapes (`batch_size` of
    every input, `past_sequence_length` of every cache layer) get one symbol, given to the first and reused for the
    others, as duck sizing gives one symbol to equal sizes. Upstream (`torch.export`'s non-strict `make_fake_inputs`)
    gives each input size its own symbol and checks the named equalities only after the trace, so each decoder layer
    computes with its own symbols: no layer's fake-tensor results or symbolic arithmetic are reused by the next, and a
    58M Llama's trace misses its caches ~1,000 times (docs/upstream-gaps.md #41). The program's contract is the same:
    the named sizes were declared equal, and the check after the trace still runs. A size whose value differs from
    the named symbol's (a spec the inputs do not fit) gets its own symbol, so upstream's check reports it as before.
    The equalities are known during the trace rather than asserted in the graph: upstream's in-graph asserts of them
    are gone, and the program's input check still refuses an input that breaks one.

    Example:
        >>> with named_dims_share_symbols():  # doctest: +SKIP
        ...     torch.export.export(model, (), inputs, dynamic_shapes={"input_ids": {0: batch}, "mask": {0: batch}})
    """

    real = non_strict_utils.fakify
    named_symbols: dict[int, tuple[object, dict[str, object]]] = {}  # by id of the shape environment, held alive

    def fakify(mode, kp, t, t_constraints, sources, *args, **kwargs):
        env = getattr(mode, "shape_env", None)
        names = {dim: constraint.name for dim, constraint in t_constraints.get(id(t), {}).items()
                 if type(constraint) is _Constraint and constraint.name}
        if (env is None or not env.duck_shape or not names or not isinstance(t, torch.Tensor)
                or is_traceable_wrapper_subclass(t)):  # its inner tensors' sizes have indices of their own
            return real(mode, kp, t, t_constraints, sources, *args, **kwargs)
        symbols = named_symbols.setdefault(id(env), (env, {}))[1]
        create = env.create_symbol

        def create_symbol(val, source, dynamic_dim=DimDynamic.DUCK, constraint_dim=None, *rest, **options):
            name = names.get(source.idx) if isinstance(source, TensorPropertySource) \
                and source.prop is TensorProperty.SIZE else None
            known = symbols.get(name)
            if known is not None and env.backed_var_to_val.get(known) == val and val not in (0, 1):
                # upstream's duck sizing, with the named symbol as the one for val
                with patched_item(env.val_to_var, val, known):
                    return create(val, source, DimDynamic.DUCK, None, *rest, **options)
            symbol = create(val, source, dynamic_dim, constraint_dim, *rest, **options)
            if name is not None and name not in symbols and getattr(symbol, "is_Symbol", False):
                symbols[name] = symbol
            return symbol

        with patched(env, "create_symbol", create_symbol):
            return real(mode, kp, t, t_constraints, sources, *args, **kwargs)

    with patched(non_strict_utils, "fakify", fakify):
        yield


@contextmanager
def pt2_read_once() -> Iterator[None]:
    """While a `.pt2` is loaded, torch's deserializer neither resolves a schema class's type hints nor parses a
    symbolic size it has already read again (docs/upstream-gaps.md #59). Its `_dict_to_dataclass` calls
    `typing.get_type_hints` for every object of the JSON graph (5,550 times for a 2-layer Llama's merged graph:
    a quarter of the load), and `_parse_sym_expr` runs sympy's parser on every size and stride of every node's
    tensor (1,350 times, a quarter more) where a graph has a few dozen distinct expressions.

    The schema's classes and their annotations never change, so their hints are resolved once per class (with the
    schema's names, as torch asks; any other call of `get_type_hints` goes to typing's). A symbolic size read again,
    by the same deserializer's shape environment and with the same hint, is the object its first reading gave: the
    first reading cached it by name, gave it its hint and value range (the ranges are fixed before the graph is
    read), which a second reading finds done; only the shape environment's record of the Python stack that created
    a symbol (`var_to_stack`, for error messages) keeps the first reading's stack instead of the last's.
    tests/test_trace_shortcuts.py loads a program both ways and compares graphs, node values and range constraints.

    Example:
        >>> with pt2_read_once():  # doctest: +SKIP
        ...     torch.export.load("model.pt2")
    """
    real_hints = typing.get_type_hints
    names = vars(serde_schema)
    hints: dict[type, dict] = {}

    def get_type_hints(obj, globalns=None, localns=None, include_extras=False):
        if globalns is not names or localns is not None or include_extras or not isinstance(obj, type):
            return real_hints(obj, globalns, localns, include_extras)
        if obj not in hints:
            hints[obj] = real_hints(obj, globalns)
        return hints[obj]

    view = types.ModuleType("typing")  # torch's module reads `typing.get_type_hints`: this one has ours
    view.__dict__.update(vars(typing))
    view.get_type_hints = get_type_hints
    real_parse = serde.GraphModuleDeserializer._parse_sym_expr
    parsed: dict[int, tuple[object, dict]] = {}  # by id of the deserializer's shape environment, held alive

    def _parse_sym_expr(self, expr_str, hint=None):
        env = getattr(self, "shape_env", None)
        if env is None or not isinstance(expr_str, str) or not isinstance(hint, (int, float, type(None))):
            return real_parse(self, expr_str, hint)
        done = parsed.setdefault(id(env), (env, {}))[1]
        key = (expr_str, type(hint), hint)
        if key not in done:
            done[key] = real_parse(self, expr_str, hint)
        return done[key]

    with patched(serde, "typing", view), \
            patched(serde.GraphModuleDeserializer, "_parse_sym_expr", _parse_sym_expr):
        yield

"""The stack's private interfaces this project relies on, kept in the adapter so that a release that changes them
is adapted here: ExecuTorch's `.pte` layout (segments, named data), the one place `generate()` assembles its
logits processors, how upstream resolves the targets of its trace-time patches, and the contiguity test of its
`reshape` patch.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.exporters import utils as upstream_utils

__all__ = ["contiguity_known_once", "patches_of_loaded_models", "pte_weight_bytes", "recording_logits_processors"]


def pte_weight_bytes(path: Path) -> int:
    """The constant segment and the named-data segments (delegates' weights) of a `.pte`, each segment once."""
    # executorch.exir is loaded only where a .pte is measured: it costs seconds at start-up
    from executorch.exir._serialize._program import _ExtendedHeader, _flatbuffer_to_program

    with path.open("rb") as handle:
        header = _ExtendedHeader.from_bytes(handle.read(64)[8:])
        if not header.is_valid():
            return path.stat().st_size  # no segments: everything is inline in the flatbuffer
        handle.seek(0)
        program = _flatbuffer_to_program(handle.read(header.program_size))
    segments = {entry.segment_index for entry in program.named_data or []}
    constant = program.constant_segment
    if constant is not None and constant.offsets:
        segments.add(constant.segment_index)
    return sum(program.segments[index].size for index in segments)


@contextmanager
def recording_logits_processors(model, sink: list) -> Iterator[None]:
    """Record (a deep copy of, before first use) the logits processors `generate()` builds."""
    build = model._get_logits_processor  # the one place generate() assembles them (transformers 5.24)

    def recording(*args, **kwargs):
        processors = build(*args, **kwargs)
        sink.append(copy.deepcopy(processors, memo={id(model): model}))
        return processors

    shadowed = "_get_logits_processor" in vars(model)
    model._get_logits_processor = recording
    try:
        yield
    finally:
        if shadowed:
            model._get_logits_processor = build
        else:
            del model._get_logits_processor


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

    upstream_utils.import_dotted_path = import_dotted_path
    try:
        yield
    finally:
        upstream_utils.import_dotted_path = real


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

    upstream_utils.is_contiguous_or_false = is_contiguous_or_false
    try:
        yield
    finally:
        upstream_utils.is_contiguous_or_false = real


def _layout(a) -> tuple[object, tuple] | None:
    """A tensor's shape environment (None when every size is concrete) and its sizes and strides as hashable
    expressions; None for a tensor without strides."""
    try:
        dims = (*a.shape, *a.stride())
    except Exception:  # no strides (sparse, nested): asked every time
        return None
    env = next((d.node.shape_env for d in dims if isinstance(d, torch.SymInt)), None)
    return env, (a.dim(), *(d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in dims))

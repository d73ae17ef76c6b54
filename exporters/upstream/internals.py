"""The stack's private interfaces this project relies on, kept in the adapter so that a release that changes them
is adapted here: ExecuTorch's `.pte` layout (segments, named data) and the one place `generate()` assembles its
logits processors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["pte_weight_bytes", "recording_logits_processors"]


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

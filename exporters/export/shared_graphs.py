"""An ONNX target's graphs taken from a twin target's export of the same run, in the export child (issue #48).

Two ONNX targets of one run often trace the very same components with the very same settings and differ only in what
is done to the saved graphs afterwards: optimum's layout and transformers.js's (`layout`), one decoder graph or two
(`merged: false` on an encoder-decoder), the dtype files a layout adds (`variants`). The run
(`exporters.run.twins`) decides which targets are such twins, from what the export reads; the first twin's child
keeps a copy of its folder as upstream saved it (before any rewrite: names, merge, file options) and a later twin's
child copies that folder instead of tracing, converting and optimizing the same graphs again. Every step after the
save runs in each twin as before, so each folder is what its own export would have written (byte for byte: the
export is deterministic for the same module, inputs and config, tests/test_shared_graphs.py).

    >>> with sharing(reuse=None, keep=Path("/tmp/kept")):  # doctest: +SKIP
    ...     export_to(model, target, components, recipe, staging, notes)  # its saved graphs also kept
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

__all__ = ["copied_into", "keep", "sharing"]

_PLAN: dict[str, Path | None] = {"reuse": None, "keep": None}


@contextlib.contextmanager
def sharing(reuse: Path | None, keep: Path | None) -> Iterator[None]:
    """Within: take the saved graphs from `reuse` (a twin's kept folder) instead of exporting, or keep a copy of
    them in `keep` for a later twin."""
    before = dict(_PLAN)
    _PLAN.update(reuse=reuse, keep=keep)
    try:
        yield
    finally:
        _PLAN.update(before)


def copied_into(directory: Path) -> bool:
    """Copy a twin's saved graphs into `directory` where this export takes them (True); False: export as usual."""
    source = _PLAN["reuse"]
    if source is None:
        return False
    shutil.copytree(source, directory, dirs_exist_ok=True)
    return True


def keep(directory: Path) -> None:
    """A copy of the graphs just saved in `directory`, as upstream saved them, for the twins that follow."""
    destination = _PLAN["keep"]
    if destination is not None:
        shutil.copytree(directory, destination, dirs_exist_ok=True)

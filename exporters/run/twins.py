"""ONNX targets of one run that export the same graphs: traced, converted and optimized once (issue #48).

A recipe often asks for the same ONNX export in two or three deployment shapes: optimum's layout and transformers.js's
(`layout`), one decoder graph and two (`merged: false` on an encoder-decoder), with and without a layout's dtype
files (`variants`). Each target used to trace, decompose, translate and optimize its components in its own child
(tests/test_seq2seq_onnx.py's T5 run: three times the same three graphs). Here the run finds the targets whose
export reads exactly the same things, its *twins*:

- the same component modules (the same objects: the workbench captures once per decomposition, `Workbench.components`),
  fed the same inputs (every tensor's dtype, shape and bytes; every other leaf's value; the same structure),
- the same upstream config per component (`exporters.export.convert.component_configs`: every upstream field of the
  target, the dynamic shapes with their names and ranges), the same generation config saved beside the graphs, the
  same device and dtype, no quantizer, and the same trace patches (`convert._tracing` reads the layout only for
  Granite Speech: the layout is then part of the key).

The first twin exports as before and its child keeps a copy of the folder upstream saved (before any rewrite:
`exporters.export.shared_graphs`); a later twin waits for it, then its child copies that folder instead of exporting,
and every step after the save (names, merge, file options, the layout's files, quantized variants, validation, proofs)
runs for it as before. Anything that cannot be compared (an input leaf that is not a tensor, a number, a string or a
plain object of those) makes a target no one's twin: it exports alone. A first twin that fails leaves the others to
export alone. The kept copy (the saved graphs' size again on disk, in a hidden folder of the output folder) is made
only where another ONNX target of the same dtype could follow, and removed when the group's exports end.

    twins = Twins(out_dir, targets, model, recipe)
    pending.append(item)                     # once captured (keyed on its first look: who exports the graphs)
    twins.take_ready(pending)                # the next item that waits for no twin's export
    Isolated(twins.sharing(name, work))      # its child keeps the saved graphs, or takes its twin's
    twins.finished(name, ok)                 # the twins that waited may start; kept copies removed by `close()`
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from exporters import fsutil
from exporters.export.convert import artifact_generation_config, component_configs
from exporters.export.shared_graphs import sharing

__all__ = ["Twins", "export_key"]

_PLAIN = (bool, int, float, str, type(None))


class _Unkeyed(Exception):
    """An input the key cannot describe: the target exports alone."""


def _describe(value: Any, depth: int = 0) -> Any:
    """A comparable description of an input leaf: tensors by dtype, shape, strides and bytes, plain values by value,
    containers and plain objects (a cache) by their content."""
    if depth > 8:
        raise _Unkeyed("too deep")
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
        return ("tensor", str(value.dtype), tuple(value.shape), value.stride(), str(value.device), digest)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_describe(v, depth + 1) for v in value])
    if isinstance(value, dict):
        return ("dict", [(repr(k), _describe(v, depth + 1)) for k, v in value.items()])
    if isinstance(value, (torch.dtype, torch.device)):
        return (type(value).__name__, str(value))
    if hasattr(value, "__dict__") and not callable(value):
        return (type(value).__qualname__, type(value).__module__,
                [(k, _describe(v, depth + 1)) for k, v in sorted(vars(value).items())])
    raise _Unkeyed(type(value).__name__)


def export_key(target: Any, components: Any, recipe: Any, model: Any, device: str) -> str | None:
    """What an ONNX target's export reads, as a digest (equal digests: the same saved graphs); None for a target that
    shares with no one (not ONNX, quantized, or an input the key cannot describe)."""
    if target.export_format != "onnx" or target.quantize is not None or not components:
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    try:
        configs = component_configs(target, components, recipe, [], None)
        generation = artifact_generation_config(model, target, recipe)
        parts = [device, target.dtype, model_type, target.layout if model_type == "granite_speech" else None,
                 generation.to_json_string() if generation is not None else None]
        for name, (module, inputs) in components.items():
            parts.append((name, id(module), type(module).__qualname__, _describe(inputs), repr(configs[name])))
    except Exception:  # noqa: BLE001 - anything not comparable: the target exports alone (its export says why)
        return None
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class Twins:
    """Which targets of a group export the same ONNX graphs, and where the first one's saved graphs are kept."""

    def __init__(self, out_dir: Path, targets: list[Any], model: Any, recipe: Any):
        self.out_dir, self.model, self.recipe = out_dir, model, recipe
        self.dtypes = {t.name: t.dtype for t in targets if t.export_format == "onnx" and t.quantize is None}
        self.keys: dict[str, str | None] = {}
        self.owner: dict[str, str] = {}  # key -> the target that exports its graphs
        self.kept: dict[str, Path | None] = {}  # key -> its saved graphs (None: its export failed), once finished
        self.root: Path | None = None

    def _key(self, item: Any) -> None:
        """Key a captured target (`item`: the pipeline's `_Export`) on its first look, in planned order, so that the
        first of a group's twins owns the export."""
        target = item.target
        if target.name not in self.keys:
            key = export_key(target, item.components, self.recipe, self.model, item.result.device)
            self.keys[target.name] = key
            if key is not None:
                self.owner.setdefault(key, target.name)

    def _waits(self, name: str) -> bool:
        key = self.keys.get(name)
        return key is not None and self.owner[key] != name and key not in self.kept

    def take_ready(self, pending: list[Any]) -> Any:
        """The first of `pending` (captured targets in planned order) that waits for no twin's export, taken out of it
        (None: each waits for one still exporting)."""
        for item in pending:
            self._key(item)
            if not self._waits(item.target.name):
                pending.remove(item)
                return item
        return None

    def sharing(self, name: str, work: Callable[[], Any], result: Any = None) -> Callable[[], Any]:
        """A target's export `work` for its child, within what is decided here, in the run's process: keep its saved
        graphs for its twins, or take its twin's (said in `result`'s findings: the target's report)."""
        key = self.keys.get(name)
        reuse = keep = None
        if key is not None and self.owner[key] != name:
            reuse = self.kept.get(key)
            if reuse is not None and result is not None:
                result.findings.append(f"ONNX graphs traced once in this run: copied from target `{self.owner[key]}`'s "
                                       "export, which read the same components, inputs and settings (no trace here)")
        elif key is not None and list(self.dtypes.values()).count(self.dtypes.get(name)) > 1:  # a twin may follow
            if self.root is None:
                self.root = Path(tempfile.mkdtemp(prefix=".shared-graphs-", dir=self.out_dir))
            keep = self.root / key[:16]
        def within() -> Any:
            with sharing(reuse, keep):
                return work()

        return within

    def finished(self, name: str, ok: bool) -> bool:
        """A target's export ended (`ok`: its folder is in place); returns `ok`."""
        key = self.keys.get(name)
        if key is not None and self.owner[key] == name:
            kept = self.root / key[:16] if self.root is not None else None
            self.kept[key] = kept if ok and kept is not None and kept.is_dir() else None
        return ok

    def close(self) -> None:
        """Remove the kept copies (every twin has started and ended)."""
        if self.root is not None:
            fsutil.remove(self.root)
            self.root = None

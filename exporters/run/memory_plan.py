"""Memory planned before the model is loaded: a run that cannot fit stops at once (`MemoryPlanError`, exit 2), never
as an out-of-memory kill an hour in; one that fits only with fewer exports at once runs with fewer.

The parameters are counted from the checkpoint's safetensors headers (the 8-byte length and the JSON header of each
file the `model.safetensors.index.json` names, else of every `*.safetensors` file; no tensor is read). The model is
held in one dtype at a time: the first reference group's, converted in place between groups
(`exporters.capture.dtypes.reference_groups`); the export children fork from it and share its pages, and a child
whose target is in another dtype casts its own copy (`exporters.run.pipeline._export_work`). So, per group `g` and
with `jobs` of its exports at once (its largest ones):

    peak(g) = PARENT_STACK + weights(g) + sum over the jobs largest targets t of g of
              (EXPORT_STACK + cast(t) + WORKING[format of t] x weights(dtype of t))

- `weights(d)`: the floating-point parameters at `d`'s width, other tensors as stored (d None: as the checkpoint);
- `cast(t)`: `weights(dtype of t)` when it differs from the group's dtype, else 0;
- `WORKING`: what an export and the validation of its artifact hold beyond the loaded weights, in weights of the
  artifact's dtype: the measured peak over the weights, less the 1 the loaded weights account for. ExecuTorch 1.1:
  a TinyLlama-1.1B-shaped checkpoint (4.4 GB in float32) peaked at 9.3 GB, 2.1x (issue #46), and the
  Qwen2.5-0.5B-shaped one at a peak PSS of 2.09x (benchmarks/RESULTS.md, "Scale: a 0.5B model"). ONNX 0.55: the
  0.5B's peak PSS 2,879 MiB for 1.98 GB, 1.53x. dynamo 1.0: the 0.5B's `dynamo-merged` peak PSS 3,759 MiB, 1.99x
  (the eager model and the loaded `.pt2` side by side);
- `PARENT_STACK` (640 MiB: torch, transformers and the runtimes before any model, "~0.6 GiB" in RESULTS.md) and
  `EXPORT_STACK` (512 MiB a child: the graphs and the lowering stacks, "~0.45 GiB" in the 0.5B ExecuTorch profile).

The load is below the first group's `peak(g)`: a load that converts reads the shards instead of mapping them
(`exporters.capture.loading.load_model`), so it holds the weights at the group's dtype plus the tensors being
converted (1.08-1.11x, `benchmarks/bench_load_memory.py`).
The run's estimate is the largest `peak(g)`; `hf-export validate` exports nothing and counts as one job (the artifact
it loads beside the eager model). It is checked against the memory available: `EXPORT_ACTION_MEMORY_LIMIT` when the
operator sets it (`8GB`, `512MiB`, bytes), else the lesser of `MemAvailable` (/proc/meminfo) and the room the
cgroup limits leave (v2 `memory.max` less `memory.current`, v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`,
plus the reclaimable file cache, of this process's cgroup and every parent: a container's limit). Nothing is checked where neither can be read or the checkpoint has
no safetensors.

Example:
    >>> counts = WeightCounts(floating=1_000_000_000, other_bytes=0, stored_dtype="bfloat16")
    >>> counts.bytes_in("float32") / 1e9, counts.bytes_in(None) / 1e9
    (4.0, 2.0)
    >>> round(export_need(counts, "executorch", "float32", "float32") / 1e9, 2)  # no cast: the parent's pages
    4.94
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.capture.dtypes import reference_groups, safetensors_header
from exporters.errors import MemoryPlanError
from exporters.run.resources import cgroup_room, meminfo_available

__all__ = ["LIMIT_ENV", "MemoryPlan", "WeightCounts", "count_weights", "counts_from_headers", "estimate",
           "export_need", "free_memory", "plan_memory"]

LIMIT_ENV = "EXPORT_ACTION_MEMORY_LIMIT"
WORKING = {"executorch": 1.1, "onnx": 0.55, "dynamo": 1.0}  # see the module: measured peaks over the weights, less 1
PARENT_STACK = 640 * 2**20
EXPORT_STACK = 512 * 2**20
_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
_SAFETENSORS_FLOAT = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_SAFETENSORS_WIDTH = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                      "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


@dataclass(frozen=True)
class WeightCounts:
    """The checkpoint's tensors as its headers describe them: floating-point elements, the bytes of the others, and
    the dtype most floating bytes are stored in."""

    floating: int
    other_bytes: int
    stored_dtype: str | None

    def bytes_in(self, dtype: str | None) -> int:
        """The weights' bytes when the floating parameters are held in `dtype` (None: as stored)."""
        width = _WIDTH.get(dtype or self.stored_dtype or "float32", 4)
        return self.floating * width + self.other_bytes


@dataclass
class MemoryPlan:
    """What the plan found: the estimate at the chosen `jobs`, the memory available and where that was read."""

    estimate_bytes: int | None
    available_bytes: int | None
    available_from: str | None
    jobs: int
    weights_bytes: int | None = None  # the loaded weights

    def to_dict(self) -> dict[str, Any]:
        return {"estimate_bytes": self.estimate_bytes, "available_bytes": self.available_bytes,
                "available_from": self.available_from, "jobs": self.jobs, "weights_bytes": self.weights_bytes}


def count_weights(folder: Path) -> WeightCounts | None:
    """The tensors the folder's safetensors headers describe (the index's shards when there is one); None when there
    is no safetensors file or a header does not read."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
            files = [folder / name for name in sorted(names) if isinstance(name, str) and Path(name).name == name]
        else:
            files = sorted(folder.glob("*.safetensors"))
    except (OSError, ValueError, AttributeError):
        return None
    headers = [safetensors_header(path) for path in files]
    return None if any(header is None for header in headers) else counts_from_headers(headers)


def counts_from_headers(headers: list[dict[str, Any]]) -> WeightCounts | None:
    """The tensors a checkpoint's safetensors headers describe (each a file's JSON header: `{name: {dtype, shape}}`),
    wherever they were read (a folder, or the Hub's byte ranges: the bot sizes a machine before any weight is
    downloaded); None without a header.

    Example:
        >>> counts_from_headers([{"w": {"dtype": "BF16", "shape": [1000, 1000]}, "__metadata__": {}}])
        WeightCounts(floating=1000000, other_bytes=0, stored_dtype='bfloat16')
    """
    floating, other, by_dtype = 0, 0, {}
    for header in headers:
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            elements = 1
            for dim in entry.get("shape") or []:
                elements *= int(dim)
            code = entry.get("dtype")
            if code in _SAFETENSORS_FLOAT:
                floating += elements
                by_dtype[_SAFETENSORS_FLOAT[code]] = by_dtype.get(_SAFETENSORS_FLOAT[code], 0) + elements
            else:
                other += elements * _SAFETENSORS_WIDTH.get(code, 4)
    if not headers:
        return None
    stored = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None
    return WeightCounts(floating=floating, other_bytes=other, stored_dtype=stored)


def export_need(counts: WeightCounts, export_format: str, dtype: str | None, group_dtype: str | None) -> int:
    """What one export adds to the run's memory: its stack, its cast copy (when its dtype is not the group's) and its
    working set."""
    own = counts.bytes_in(dtype)
    cast = own if (dtype or counts.stored_dtype) != (group_dtype or counts.stored_dtype) else 0
    return EXPORT_STACK + cast + int(WORKING.get(export_format, 1.1) * own)


def estimate(counts: WeightCounts, targets: list[tuple[str, str | None]], checkpoint: str | None, jobs: int) -> int:
    """The run's peak (see the module) for `targets` as `(format, dtype)` with `jobs` exports at once."""
    checkpoint = checkpoint or counts.stored_dtype
    peak = 0
    for group_dtype, members in reference_groups([dtype for _, dtype in targets], checkpoint):
        held = group_dtype or checkpoint
        needs = sorted((export_need(counts, targets[i][0], targets[i][1] or checkpoint, held) for i in members),
                       reverse=True)
        peak = max(peak, PARENT_STACK + counts.bytes_in(held) + sum(needs[:jobs]))
    return peak


def parse_limit(text: str) -> int:
    """Bytes from `8GB`, `512MiB`, `1.5G` or a plain number; `MemoryPlanError` otherwise."""
    cleaned = text.strip().upper().removesuffix("B").strip()
    number, unit = cleaned.rstrip("KMGTI"), cleaned[len(cleaned.rstrip("KMGTI")):]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise MemoryPlanError(f"{LIMIT_ENV}={text!r} is not a size: write it like 8GB, 512MiB or a number of bytes",
                              option="memory_limit") from None
    if value <= 0:
        raise MemoryPlanError(f"{LIMIT_ENV} must be more than 0, got {text!r}", option="memory_limit")
    return int(value)


def free_memory() -> tuple[int | None, str | None]:
    """The memory this run may use and where that was read: the operator's `EXPORT_ACTION_MEMORY_LIMIT`, else the
    lesser of `MemAvailable` and the room the cgroup v2 limits leave; `(None, None)` where none can be read."""
    limit = os.environ.get(LIMIT_ENV, "").strip()
    if limit:
        return parse_limit(limit), LIMIT_ENV
    found = [(value, source) for value, source in ((meminfo_available(), "MemAvailable"),
                                                   (cgroup_room(), "cgroup memory limit")) if value is not None]
    return min(found) if found else (None, None)


def gigabytes(value: int) -> str:
    """`9.3 GB` (decimal, as the benchmarks write them)."""
    if value >= 1e9:
        return f"{value / 1e9:.1f} GB"
    return f"{value / 1e6:.0f} MB" if value >= 1e7 else f"{value / 1e6:.2f} MB"


def plan_memory(folder: Path, targets: list[tuple[str, str | None]], checkpoint: str | None, jobs: int,
                requested: bool, notes: list[str], selects: str = "target") -> MemoryPlan:
    """The jobs the run can afford, at most `jobs` (the operator's `requested`, or the cores'), for `targets` as
    `(format, dtype)` of the checkpoint in `folder`; fewer is said in `notes`. `selects`: the option that picks the
    targets (`target`; `formats` for `init`), named in the refusal.

    Raises:
        MemoryPlanError: even one export at a time does not fit; the message names the need, the memory available
            and what to change.
    """
    counts = count_weights(folder)
    available, source = free_memory()
    if counts is None or not targets:
        return MemoryPlan(None, available, source, jobs)
    loaded = counts.bytes_in(reference_groups([d for _, d in targets], checkpoint or counts.stored_dtype)[0][0]
                             or checkpoint)
    need = estimate(counts, targets, checkpoint, jobs)
    if available is None or need <= available:
        return MemoryPlan(need, available, source, jobs, loaded)
    fits = next((j for j in range(jobs - 1, 0, -1) if estimate(counts, targets, checkpoint, j) <= available), None)
    if fits is None:
        one = estimate(counts, targets, checkpoint, 1)
        raise MemoryPlanError(_refusal(one, available, source, loaded, len(targets), selects), option="jobs")
    notes.append(f"memory: {jobs} exports at once need about {gigabytes(need)}, more than the "
                 f"{gigabytes(available)} available ({source}); {fits} at once instead (`jobs`)"
                 + ("" if requested else ", from the cores"))
    return MemoryPlan(estimate(counts, targets, checkpoint, fits), available, source, fits, loaded)


def _refusal(need: int, available: int, source: str, loaded: int, targets: int, selects: str) -> str:
    """The message of a run that does not fit even one export at a time (`jobs` 1)."""
    changes = [f"one {selects.removesuffix('s')} per run (`{selects}`)"] if targets > 1 else []
    changes.append("a machine with more memory")
    if source == LIMIT_ENV:
        changes.append(f"a higher {LIMIT_ENV}")
    return (f"this run needs about {gigabytes(need)} of memory even with one export at a time (`jobs` 1; "
            f"{gigabytes(loaded)} of weights loaded, {targets} target(s)) and {gigabytes(available)} is available "
            f"({source}): nothing was loaded or exported; try {', or '.join(changes)}")

"""How many exports the machine can run at once: cores, and memory against an estimate of each export's peak.

Tracing, lowering and the ONNX optimizer are mostly single-threaded Python, so two exports on two cores take little
more wall time than one. Memory decides the rest: each export child shares the parent's model pages (fork) and adds
its own graph, decompositions and serialized program, measured at up to ~3x the weights for generation exports.

Example:
    >>> default_jobs(weight_bytes=100 * 2**20, targets=3, cores=2, available=8 * 2**30)
    2
    >>> default_jobs(weight_bytes=4 * 2**30, targets=3, cores=8, available=20 * 2**30)
    1
    >>> with threads_left(busy=1, cores=2) as threads:  # validation next to one running export, on 2 cores
    ...     threads
    1
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

EXPORT_PEAK_FACTOR = 3.0  # an export child's own memory, in weights (measured in benchmarks/RESULTS.md)
EXPORT_BASE_BYTES = 768 * 2**20  # torch.export and the lowering stacks, before any weight
HEADROOM = 0.8  # leave a fifth of what is free to the parent's validation and the system


def available_memory() -> int | None:
    """Bytes of memory this process may still use: the lesser of `MemAvailable` and the room the cgroup limits above
    it leave (a container's limit), None where neither can be read."""
    found = [value for value in (meminfo_available(), cgroup_room()) if value is not None]
    return min(found) if found else None


def meminfo_available() -> int | None:
    """Bytes of memory available now on the machine (Linux `MemAvailable`), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # no /proc, or a line that does not read
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The least room any cgroup limit above this process leaves (limit less usage, the reclaimable file cache
    counted as room), None when none is set: cgroup v2 (`memory.max`, `memory.current`) and v1's memory controller
    (`memory.limit_in_bytes`, `memory.usage_in_bytes`), this process's group and every parent."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    rooms: list[int] = []
    for line in lines:
        hierarchy, _, path = line.partition(":")[2].partition(":")
        if hierarchy == "":  # v2
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in hierarchy.split(","):  # v1
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        folder = base / path.lstrip("/")
        while True:
            room = _room(folder, *files)
            if room is not None:
                rooms.append(room)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(rooms) if rooms else None


def _room(folder: Path, limit_file: str, usage_file: str, inactive: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text(encoding="ascii").strip()
        if limit == "max" or int(limit) >= 1 << 60:  # no limit (v1 writes a page-rounded 2**63)
            return None
        usage = int((folder / usage_file).read_text(encoding="ascii"))
        stat = dict(line.split() for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines()
                    if len(line.split()) == 2)
        return max(0, int(limit) - usage + int(stat.get(inactive, 0)))
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs(*, weight_bytes: int, targets: int, cores: int | None = None, available: int | None = None) -> int:
    """Exports to run at once: at most one per core and per target, and never more than memory allows."""
    cores = usable_cores() if cores is None else cores
    available = available_memory() if available is None else available
    jobs = max(1, min(cores, targets))
    if available is not None:
        per_export = EXPORT_BASE_BYTES + EXPORT_PEAK_FACTOR * weight_bytes
        jobs = min(jobs, max(1, int(available * HEADROOM // per_export)))
    return jobs


@contextlib.contextmanager
def threads_left(*, busy: int, cores: int | None = None) -> Iterator[int]:
    """torch's intra-op threads set, for the duration, to the cores that `busy` running exports leave free (at least
    one, never more than before); restored afterwards. Validation runs next to the exports still running: OpenMP
    threads that outnumber the free cores wait on a sibling the scheduler has parked at every parallel region, which
    made a validation beside an export several times slower (benchmarks/RESULTS.md). ONNX Runtime sessions opened
    inside take the same count (`exporters.upstream.lean_session_options`)."""

    before = torch.get_num_threads()
    cores = usable_cores() if cores is None else cores
    wanted = max(1, min(before, cores - busy))
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)

"""Measure the support matrix: build each family's tiny model, run the plainest recipe for every format through the
real CLI (`hf-export run`), read report.json, and write docs/coverage.md (and docs/coverage.json).

```
families ──► build tiny model + recipe ──► hf-export run (one process per family, N at a time) ──► report.json
                                                                                              ──► coverage.md
```

Families run in parallel, each in its own `hf-export run` process limited to one thread, as many at a time as the
machine has cores and memory for (`--jobs`). Nothing needs the network.

Example:
    python -m matrix --families llama,clip --formats dynamo,onnx --out /tmp/coverage.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matrix.families import FAMILIES, KINDS, FamilySpec, build

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("dynamo", "onnx", "executorch")
MEMORY_PER_JOB_GB = 3.0
# a vision- or audio-language ExecuTorch program that kept the methods layout says why in its findings
# (exporters.capture.multimodal_runner.NOT_MULTIMODAL); the runtime whose proof therefore did not apply
NOT_MULTIMODAL_PREFIX = ("the ExecuTorch program has a method per component (layout 'methods'), not ExecuTorch "
                         "MultimodalRunner's layout: ")
MULTIMODAL_RUNTIME = "ExecuTorch MultimodalRunner"
# the report's decline of a methods-layout program, without the reason (exporters.layouts.executorch_multimodal)
METHODS_KEPT = "the target's findings say why"
DEFAULT_TIMEOUT_S = 1800


def plainest_recipe(formats: list[str]) -> dict[str, Any]:
    """The recipe a new user writes first: the format, dynamic shapes where the format takes them, mode left to the
    tool, nothing else."""
    exports = []
    for export_format in formats:
        target: dict[str, Any] = {"name": export_format, "export_format": export_format}
        if export_format != "executorch":
            target["dynamic"] = True
        exports.append(target)
    return {"schema_version": 1, "exports": exports}


@dataclass
class Cell:
    """One family x format outcome."""

    status: str
    cause: str = ""  # "", "upstream", "ours", "mismatch", "unverified", "timeout"
    reason: str = ""
    generation: str | None = None
    # what the runtimes the artifact is for showed ({"runtime", "status", "detail"}, as report.json's `runtimes`);
    # None: measured before the matrix recorded them
    runtimes: list[dict[str, str]] | None = None


@dataclass
class Row:
    family: str
    kind: str
    model_class: str
    mode: str | None = None
    seconds: float = 0.0
    cells: dict[str, Cell] = field(default_factory=dict)
    note: str = ""
    cpu_s: float = 0.0  # CPU seconds of the family's run and its forked exports; 0: not recorded


def default_jobs() -> int:
    """As many families at a time as there are cores, fewer when memory is short (about 3 GB per run)."""
    cores = os.cpu_count() or 1
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        available = MEMORY_PER_JOB_GB * cores
    return max(1, min(cores, int(available // MEMORY_PER_JOB_GB)))


def classify(target: dict[str, Any]) -> Cell:
    """The cell for one target of report.json: the status, and for a failure who it is on and why."""
    status = target.get("status", "failed")
    generation = (target.get("generation") or {}).get("status")
    if status == "passed":  # its runtime proofs kept: one that did not run is shown as such, never as a pass
        runtimes = [{key: str(proof.get(key) or "") for key in ("runtime", "status", "detail")}
                    for proof in target.get("runtimes") or []]
        refused = _runner_refused(target, runtimes)
        if refused:  # the report's own decline, said without the reason (METHODS_KEPT): the finding's reason instead
            runtimes = [proof for proof in runtimes if proof["runtime"] != MULTIMODAL_RUNTIME]
        return Cell(status, generation=generation, runtimes=runtimes + refused)
    error = target.get("error") or {}
    message = str(error.get("message") or "")
    root = error.get("root_cause") or {}
    if root:
        message += f" [root cause: {root.get('type')}: {root.get('message')}]" if "root cause" not in message else ""
    if not message:  # failed only in the runtime that reads it (ONNX Runtime GenAI, the ExecuTorch runner...)
        failed = [f"{r.get('runtime')}: {r.get('detail')}" for r in target.get("runtimes") or []
                  if r.get("status") == "failed"]
        message = "; ".join(failed) or f"{error.get('type') or 'failed'} with no message in report.json"
    upstream = str(error.get("upstream") or "")
    if upstream:  # said first: the reason is cut at 400 characters, and a long message would lose it at its end
        message = f"[{upstream}] {message.replace(f' [{upstream}]', '')}"
    if status == "unverified":
        reasons = target.get("unverified") or [message or "a check did not run"]
        return Cell(status, "unverified", _short("; ".join(str(r) for r in reasons)), generation)
    if status in ("timed_out", "crashed"):
        return Cell(status, "timeout" if status == "timed_out" else "upstream", message[:400], generation)
    if message.startswith("sample inputs could not be made") or "UnsupportedModelError" in str(error.get("type")):
        cause = "ours"
    elif "exporting component" in message or "the saved artifact does not load" in message:
        cause = "upstream"
    elif "outputs differ from the eager model" in message or "first divergence" in message:
        cause = "mismatch"
    elif "generation parity failed" in message:
        cause = "upstream"  # the exported graphs do not run through generation
    elif "missing component" in message:
        cause = "ours"
    else:
        cause = "upstream"
    return Cell(status, "upstream" if upstream else cause, _short(message), generation)


def _runner_refused(target: dict[str, Any], runtimes: list[dict[str, str]]) -> list[dict[str, str]]:
    """ExecuTorch MultimodalRunner declined, with the report's reason, where a vision- or audio-language program
    kept the methods layout because the model does not fit the runner's (`exporters.capture.multimodal_runner`
    `NOT_MULTIMODAL`, said in the target's findings): a row says why that runtime's proof did not apply (where the
    report declined it in general, `exporters.layouts.executorch_multimodal.METHODS_KEPT`, that entry's place)."""
    if any(proof["runtime"] == MULTIMODAL_RUNTIME and not (proof["status"] == "declined"
                                                           and proof["detail"].endswith(METHODS_KEPT))
           for proof in runtimes):
        return []
    for finding in target.get("findings") or []:
        text = str(finding.get("message") if isinstance(finding, dict) else finding)
        if NOT_MULTIMODAL_PREFIX in text:
            why = text.split(NOT_MULTIMODAL_PREFIX, 1)[1]
            return [{"runtime": MULTIMODAL_RUNTIME, "status": "declined", "detail": f"cannot take this model: {why}"}]
    return []


def _short(message: str, limit: int = 400) -> str:
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit] + " …"


def build_family(spec: FamilySpec, formats: list[str], work: Path) -> Row | None:
    """Save one family's tiny model and recipe under `work`; a row of failures when it cannot be built."""
    folder = work / spec.name
    shutil.rmtree(folder, ignore_errors=True)
    try:
        build(spec, folder / "model", recipe=plainest_recipe(formats))
    except Exception as err:  # a family that cannot even be built is a row of failures, not a crash of the matrix
        reason = _short(f"building the tiny model failed: {type(err).__name__}: {err}")
        return Row(spec.name, spec.kind, spec.model_class, note=spec.note,
                   cells={f: Cell("failed", "ours", reason) for f in formats})
    return None


def run_family(spec: FamilySpec, formats: list[str], work: Path, timeout: float) -> Row:
    """Run the plainest recipe on a built family through the CLI, and read its report."""
    row = Row(spec.name, spec.kind, spec.model_class, note=spec.note)
    folder = work / spec.name
    started = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    # --no-bench: the matrix records outcomes, not speed; timing every artifact (20 runs each, in fresh processes)
    # would only lengthen `make coverage`, and a target's status never depends on it.
    command = [sys.executable, "-m", "exporters.cli", "run", str(folder / "model"), "--out", str(folder / "out"),
               "--quiet", "--no-cache", "--no-bench"]
    code, tail, cpu, timed_out = _run_measured(command, env, timeout)
    row.seconds, row.cpu_s = round(time.time() - started, 1), round(cpu, 1)
    if timed_out:
        row.cells = {f: Cell("timed_out", "timeout", f"the family's run exceeded {timeout:.0f} s") for f in formats}
        return row
    report_path = folder / "out" / "report.json"
    if not report_path.is_file():
        row.cells = {f: Cell("failed", "ours", _short(f"no report.json (exit {code}): {tail}"))
                     for f in formats}
        return row
    report = json.loads(report_path.read_text())
    by_name = {t["name"]: t for t in report.get("targets", [])}
    for export_format in formats:
        target = by_name.get(export_format)
        row.cells[export_format] = classify(target) if target else Cell("failed", "ours", "target missing from report")
        row.mode = row.mode or (target or {}).get("mode")
    return row


def _run_measured(command: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float, bool]:
    """Run `command` and return its exit code, the tail of its output, the CPU seconds it and the processes it
    waited for used (the forked exports included: unlike wall time, this does not grow when the machine is shared),
    and whether it was killed for running past `timeout`."""
    killed = threading.Event()
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)

        def kill() -> None:
            killed.set()
            process.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read()[-2000:]
    return process.returncode, tail, usage.ru_utime + usage.ru_stime, killed.is_set()


def estimate_s(rows: list[Row], cores: int) -> float:
    """The wall time a full run takes on an idle machine with `cores` cores and as many families at a time: the
    families' CPU seconds (each run and the exports it forked) spread over the cores. A row measured before CPU time
    was recorded counts the median CPU seconds of its kind's timed rows that exported something (a row that failed
    before exporting took seconds; of all timed rows when its kind has none): its wall seconds, taken on a shared
    machine, say little about the CPU it needs."""
    timed = [row for row in rows if row.cpu_s]
    exported = [row for row in timed if any(cell.status == "passed" for cell in row.cells.values())]
    every = [row.cpu_s for row in exported or timed]

    def cpu(row: Row) -> float:
        if row.cpu_s:
            return row.cpu_s
        same = [r.cpu_s for r in exported if r.kind == row.kind] or [r.cpu_s for r in timed if r.kind == row.kind]
        same = same or every
        return statistics.median(same) if same else row.seconds  # nothing timed at all: wall is all there is

    return sum(cpu(row) for row in rows) / max(1, cores)


def untimed(rows: list[Row]) -> list[str]:
    """The families whose row has no CPU seconds (measured before they were recorded)."""
    return [row.family for row in rows if not row.cpu_s]


def machine() -> str:
    memory = ""
    try:
        memory = f", {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB memory"
    except (ValueError, OSError, AttributeError):
        pass
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores{memory}, Python {platform.python_version()}"


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def kept_rows(out: Path, names: list[str], formats: list[str]) -> tuple[dict[str, Row], str | None]:
    """The rows of an earlier table (`out`'s JSON) for the families not in `names`, when it measured the same
    formats, and the dates they were measured between (that table's kept rows may be older than the table): a rerun
    of a few families keeps the rest of the matrix."""
    path = out.with_suffix(".json")
    if not path.is_file():
        return {}, None
    data = json.loads(path.read_text())
    if data["meta"]["formats"] != formats:
        return {}, None
    rows = {}
    for raw in data["rows"]:
        if raw["family"] in names or raw["family"] not in FAMILIES:
            continue
        cells = {name: Cell(**cell) for name, cell in raw.pop("cells").items()}
        raw["note"] = FAMILIES[raw["family"]].note  # the family's note as it reads now (why a cell fails, say)
        rows[raw["family"]] = Row(**raw, cells=cells)
    meta = data["meta"]
    since = meta.get("kept_since") or str(meta.get("kept_from") or meta["date"]).split(" to ")[0]
    return rows, f"{since} to {meta['date']}" if since != meta["date"] else meta["date"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated family names (default: all)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats")
    parser.add_argument("--jobs", type=int, default=None, help="families run at a time (default: by cores/memory)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per family")
    parser.add_argument("--work", type=Path, default=None, help="where models and outputs go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "coverage.md")
    parser.add_argument("--update", action="store_true",
                        help="keep the existing table's rows (its JSON beside it) for the families not run now")
    args = parser.parse_args(argv)
    names = args.families.split(",") if args.families else list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    formats = args.formats.split(",")
    jobs = args.jobs or default_jobs()
    work = args.work or Path(tempfile.mkdtemp(prefix="coverage-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    print(f"{len(names)} families x {formats}, {jobs} at a time, work dir {work}", flush=True)

    # Built one after another in this process (a second each), then run N at a time, each in its own process.
    unbuilt = {name: build_family(FAMILIES[name], formats, work) for name in names}

    # With --update every earlier row stays until its family is measured again: a run stopped early (killed, or a
    # time limit) leaves the earlier rows of the families it had not finished, not a shorter table.
    finished, kept_from = kept_rows(args.out, [], formats) if args.update else ({}, None)
    fresh: set[str] = set()
    listed = [name for name in FAMILIES if name in names or name in finished]
    lock = threading.Lock()
    cores = os.cpu_count() or 1  # the estimate is for a full run with a family per core on this machine, idle

    def write(final: bool) -> None:
        """The table of the families measured so far, rewritten after each one: a run stopped early (a nightly
        job's time limit) still leaves every measured row, and says how many were planned."""
        from matrix.render import render

        rows = [finished[name] for name in listed if name in finished]
        kept_count = sum(1 for name in finished if name not in fresh)
        kept = {"kept": kept_count, "kept_from": kept_from, "kept_since": (kept_from or "").split(" to ")[0]} \
            if kept_count else {}
        meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                "jobs": jobs, "elapsed_s": round(time.time() - started), "versions": versions(), "formats": formats,
                "recipe": plainest_recipe(formats), "planned": len(listed), "complete": final, **kept,
                "unfinished": [name for name in names if name not in fresh],
                "estimate_s": round(estimate_s(rows, cores)), "estimate_cores": cores, "untimed": untimed(rows)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(rows, meta))
        args.out.with_suffix(".json").write_text(json.dumps(
            {"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")

    def one(name: str) -> Row:
        row = unbuilt[name] or run_family(FAMILIES[name], formats, work, args.timeout)
        marks = " ".join(f"{f}={row.cells[f].status}" for f in formats)
        print(f"  {name:32s} {row.seconds:7.1f} s ({row.cpu_s:7.1f} s CPU)  {marks}", flush=True)
        with lock:
            finished[name] = row
            fresh.add(name)
            write(final=False)
        return row

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, names))
    write(final=True)
    print(f"wrote {args.out} in {(time.time() - started) / 60:.1f} min", flush=True)
    return 0


__all__ = ["Cell", "KINDS", "Row", "build_family", "classify", "estimate_s", "kept_rows", "main", "plainest_recipe",
           "run_family", "untimed"]

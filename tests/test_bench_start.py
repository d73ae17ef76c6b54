"""The benchmark's forkserver (it imports torch, ONNX Runtime and the product: ~5.5 CPU-s) starts only when a target is
to be timed: a run whose targets all fail, or were all reused, never starts it; a fresh run still benchmarks.

The three runs start warm (forked from this worker's CLI launcher, tests/cli_launcher.py; #48: three cold starts were
about a third of the module's CPU), and the process tree watched is the launcher's: it runs nothing but this test's
call meanwhile, and the forkserver, a child of the CLI's process, lives until the run ends, and no longer: the run's
process ends it at its exit (`exporters.validate.benchmark._end_forkserver`)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from tests import cli_launcher
from tests.conftest import ROOT
from tests.models import tiny_llama

FORKSERVER = b"multiprocessing.forkserver"


def _descendants(root: int) -> list[int]:
    """The processes below `root` now (read from /proc: each process's parent)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        parent = int(stat[stat.rfind(b")") + 2:].split()[1])
        parents.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def _run_watching(*args: str) -> tuple[subprocess.CompletedProcess, list[int]]:
    """`hf-export run ...` through the real CLI, started warm, watching the launcher's process tree meanwhile: (the
    finished process, its stdout and stderr joined; the pid of the forkserver seen below it, if one ran). The
    forkserver lives from its start to the run's end, so a 0.1 s poll sees it."""
    root = cli_launcher.launcher().process.pid
    seen, finished = [], threading.Event()

    def watch() -> None:
        while not finished.is_set() and not seen:
            for pid in _descendants(root):
                try:
                    if FORKSERVER in Path(f"/proc/{pid}/cmdline").read_bytes():
                        seen.append(pid)
                except OSError:
                    pass
            finished.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        launched = cli_launcher.launch(["run", *args], {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 900, warm=True)
    finally:
        finished.set()
        watcher.join()
    assert launched.how == "warm", f"the run started {launched.how}: the launcher's tree would not hold it"
    done = launched.done
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout + done.stderr, ""), seen


def test_the_forkserver_starts_only_for_a_target_to_time(tmp_path: Path):
    model = tiny_llama(tmp_path / "model", layers=1)
    out = tmp_path / "out"

    # every target fails: nothing to time, no forkserver. The failure is the 0.01 s deadline, which no export child
    # meets (its start alone takes longer), and an export that ends past its deadline is timed out whenever the
    # parent looks; a deadline of a second was a race a fast export could win.
    failed, seen = _run_watching(str(model), "--out", str(tmp_path / "failed"), "--timeout", "0.01", "--quiet")
    report = json.loads((tmp_path / "failed" / "report.json").read_text())
    assert report["status"] != "passed" and all(t["status"] != "passed" for t in report["targets"]), failed.stdout
    assert not seen, "a run whose targets all failed started the benchmark's forkserver"

    fresh, seen = _run_watching(str(model), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    assert fresh.returncode == 0 and report["status"] == "passed", fresh.stdout
    assert seen, "the passing target was timed without the forkserver the benchmark forks from"
    # the run's process ended it (SIGKILL, reaped) before it exited: no server left to free its stack after the run
    # (its own teardown, ~1 CPU s, benchmarks/RESULTS.md tenth round)
    assert not Path(f"/proc/{seen[0]}").exists(), "the forkserver outlived the run that started it"
    bench = report["targets"][0]["bench"]
    assert bench["latency"] and bench["size_bytes"] > 0 and report["machine"], bench

    again, seen = _run_watching(str(model), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    assert again.returncode == 0 and report["targets"][0]["cached"] is True, again.stdout
    assert not seen, "a rerun whose targets were all reused started the benchmark's forkserver"

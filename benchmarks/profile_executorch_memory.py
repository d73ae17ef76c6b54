"""Where the peak memory of an ExecuTorch export goes, phase by phase (issues #15 §3 P5, #19 §2).

Runs the real `hf-export run` in this process with the ExecuTorch steps wrapped: the export child (forked from the
pipeline, so it inherits the wrappers) prints its current RSS and its peak so far (`VmRSS`, `VmHWM` from
/proc/self/status) at every boundary: each component's torch.export + backend preparation, `to_edge` + XNNPACK
lowering, `to_executorch` (emission, serialization), writing the `.pte` and the `.ptd`. The phase whose end first
shows the final peak is where the peak was reached.

    .venv/bin/python benchmarks/profile_executorch_memory.py MODEL_DIR --recipe '{"export_format": "executorch",
        "mode": "generation", "merged": true}'

Writes one line per phase to `--log` (`[memory] phase: rss X MiB, peak Y MiB`) and the parameter bytes of the model for the
ratio. Nothing here changes what is exported.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


LOG = sys.stderr  # the export child's stderr goes to the run's log, so marks are written to --log as well


def mark(phase: str) -> None:
    line = (f"[memory] {time.strftime('%H:%M:%S')} pid {os.getpid()} {phase}: rss {_status_mib('VmRSS'):.0f} MiB, "
            f"peak {_status_mib('VmHWM'):.0f} MiB")
    print(line, file=LOG, flush=True)


_WATCHING = False


def _watch_growth(step_mib: float = float(os.environ.get("PROFILE_STEP_MIB", 256))) -> None:
    """In this process, from now on: whenever RSS has grown by `step_mib` since the last report, write where the
    main thread is (its innermost frames), so growth inside one long phase is attributed to a call site."""
    import threading
    import traceback

    global _WATCHING
    if _WATCHING:  # one watcher a process
        return
    _WATCHING = True
    main = threading.main_thread().ident

    def watch() -> None:
        last = _status_mib("VmRSS")
        while True:
            time.sleep(0.2)
            now = _status_mib("VmRSS")
            if now - last >= step_mib:
                frame = sys._current_frames().get(main)
                stack = traceback.extract_stack(frame)[-14:] if frame is not None else []
                where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack))
                print(f"[memory] {time.strftime('%H:%M:%S')} grew to {now:.0f} MiB in: {where}", file=LOG, flush=True)
                last = now

    threading.Thread(target=watch, daemon=True).start()


def _wrapped(owner, name: str, phase: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def call(*args, **kwargs):
        if phase.startswith(("to_edge", "the runner program")):
            _watch_growth()
        mark(f"before {phase}")
        result = original(*args, **kwargs)
        mark(f"after {phase}")
        return result

    setattr(owner, name, call)


def install() -> None:
    import importlib

    import torch
    from executorch.exir.program import _program
    from torch.export import ExportedProgram

    from exporters.upstream import exporter_class  # upstream is reached through the one adapter

    executorch_exporter = exporter_class("executorch")
    exporter_executorch = importlib.import_module(executorch_exporter.__module__)

    _wrapped(executorch_exporter, "export_program", "torch.export + backend preparation of a component")
    from exporters.upstream import llm_runner  # the LLM runner's program (generation targets)

    _wrapped(llm_runner, "export_runner_program", "the runner program: export, lowering, emission")
    _wrapped(torch.export, "export", "  torch.export.export")
    _wrapped(ExportedProgram, "module", "  ExportedProgram.module()")
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    _wrapped(exporter_executorch, "to_edge_transform_and_lower", "to_edge + XNNPACK lowering")
    _wrapped(ExportedProgram, "run_decompositions", "  run_decompositions (to_edge)")
    _wrapped(XnnpackBackend, "preprocess", "  XNNPACK preprocess of a partition")
    _wrapped(_program.EdgeProgramManager, "to_executorch", "to_executorch (emit + serialize)")
    _wrapped(_program.ExecutorchProgramManager, "write_to_file", "writing the .pte")
    _wrapped(_program.ExecutorchProgramManager, "write_tensor_data_to_file", "writing the .ptd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--recipe", default='{"export_format": "executorch", "mode": "generation", "merged": true}')
    parser.add_argument("--log", type=Path, default=Path("executorch-memory.log"), help="where the marks go")
    args = parser.parse_args()
    global LOG
    LOG = args.log.open("a", buffering=1)
    params_file = args.model / "params.json"
    if params_file.is_file():
        params = json.loads(params_file.read_text())["parameter_bytes"]
        print(f"[memory] parameter bytes: {params / 2**20:.0f} MiB", file=LOG)
    install()
    mark("start (stack imported)")
    from exporters.cli import app

    with tempfile.TemporaryDirectory() as work:
        recipe = Path(work) / "recipe.json"
        recipe.write_text(json.dumps([json.loads(args.recipe)]))
        try:
            app(["run", str(args.model), "--config", str(recipe), "--out", str(Path(work) / "out"), "--no-bench",
                 "--no-cache", "--jobs", "1"])
        except SystemExit as exit_:
            mark(f"end (exit {exit_.code})")
        report = Path(work) / "out" / "report.json"
        for target in json.loads(report.read_text())["targets"] if report.is_file() else []:
            print(f"[memory] target {target['name']}: {target['status']}, files {target.get('total_bytes')} B, "
                  f"weights stored {target.get('weights_stored_bytes')} B of {target.get('parameter_bytes')} B",
                  file=LOG)


if __name__ == "__main__":
    main()

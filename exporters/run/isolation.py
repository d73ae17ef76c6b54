"""Run one export in a forked child process: a crash or a hang costs that target only, and its noise goes to a log.

The child inherits the loaded model (fork, no copy), sends everything it prints (upstream warnings, torch logs) to
the target's log file, and reports back through a small JSON result file. The parent waits with a timeout.

Example:
    >>> import tempfile
    >>> log = Path(tempfile.mkdtemp()) / "t.log"
    >>> run_isolated(lambda: {"answer": 42}, log_path=log, timeout=60)["answer"]
    42
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from exporters import fsutil
from exporters.errors import error_record, render_root_cause
from exporters.status import CRASHED, TIMED_OUT

# The runtimes an export may load (seconds and native memory each): the child's log names those it loaded, so a run
# that imports one its targets do not need shows in the log (an ONNX-only run loads no ExecuTorch).
RUNTIME_MODULES = ("executorch", "torchao", "onnx", "onnxscript", "onnxruntime", "onnxruntime_genai")
LOADED_RUNTIMES = "runtimes loaded in the export process:"


def loaded_runtimes() -> list[str]:
    """The [`RUNTIME_MODULES`] this process has imported (its own imports and those inherited at fork)."""
    return [name for name in RUNTIME_MODULES if name in sys.modules]


def _redirect_output(log_path: Path) -> None:
    """Send everything the child prints (upstream warnings, torch logs) to the target's log file."""
    handle = fsutil.open_log(log_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(handle, 1)
    os.dup2(handle, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    for logger in (logging.getLogger(), logging.getLogger("transformers"), logging.getLogger("torch")):
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)


def _child(work: Callable[[], dict[str, Any]], result_path: Path, log_path: Path) -> None:
    _redirect_output(log_path)
    try:

        # The parent's OpenMP pool does not survive fork: a parallel region in the child would wait forever on its
        # threads (the reason DataLoader workers do the same). Tracing and lowering are single-threaded Python anyway.
        torch.set_num_threads(1)
        # What the child inherits (the imported stack, the loaded model: half a million objects) lives as long as it
        # does: the collector leaves it alone, so the child's collections (automatic, and the one after each
        # component) walk only the objects it makes, and do not write to the pages it shares with the parent
        gc.freeze()
        info = work()
        result = {"ok": True, **info, "ended": time.monotonic()}  # the system's clock: the parent reads it too
    except BaseException as err:  # everything is reported; the parent decides the status
        record = error_record(err, limit=4000)
        result = {"ok": False, **record, "traceback": traceback.format_exc(limit=-15)}
        # the runtimes first: the log's tail (what the report quotes) is the failure and its root cause
        print(LOADED_RUNTIMES, ", ".join(loaded_runtimes()) or "none", file=sys.stderr)
        print(result["traceback"], file=sys.stderr)
        if "root_cause" in record:  # the traceback prints the cause first: the log's tail names it too
            print(render_root_cause(record), file=sys.stderr)
    else:
        print(LOADED_RUNTIMES, ", ".join(loaded_runtimes()) or "none", file=sys.stderr)
    fsutil.write_file(result_path, json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Isolated:
    """`work` running in a forked child process, started at construction; several can run at once.

    `wait(seconds)` waits at most that long for it to end; `result()` (once ended, or past its `timeout`, when the
    child is killed) is `work`'s dict with `"ok": True`, or `{"ok": False, "type", "message"}` for an exception,
    with `"status": "crashed" | "timed_out"` when the process died or ran past `timeout` seconds.
    """

    def __init__(self, work: Callable[[], dict[str, Any]], *, log_path: Path, timeout: float):
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.result_path = log_path.with_suffix(".result.json")
        self.result_path.unlink(missing_ok=True)
        context = multiprocessing.get_context("fork")
        self.process = context.Process(target=_child, args=(work, self.result_path, log_path), daemon=True)
        self.process.start()

    @property
    def sentinel(self) -> int:
        """A handle `multiprocessing.connection.wait` can wait on with others."""
        return self.process.sentinel

    def done(self) -> bool:
        return not self.process.is_alive() or time.monotonic() >= self.deadline

    def wait(self, seconds: float | None = None) -> bool:
        """Wait until the child ended or its deadline passed (at most `seconds`); whether it is done."""
        left = max(0.0, self.deadline - time.monotonic())
        self.process.join(left if seconds is None else min(seconds, left))
        return self.done()

    def _timed_out(self) -> dict[str, Any]:
        return {"ok": False, "status": TIMED_OUT, "type": "TimeoutError",
                "message": f"the export ran past its timeout of {self.timeout:g} s and was stopped"}

    def result(self) -> dict[str, Any]:
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            return self._timed_out()
        self.process.join()
        if not self.result_path.exists():
            code = self.process.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            return {"ok": False, "status": CRASHED, "type": "Crash",
                    "message": f"the exporting process died ({how}) before finishing; see the log"}
        result = json.loads(self.result_path.read_text())
        self.result_path.unlink()
        if result.get("ok") and result.pop("ended", 0.0) > self.deadline:
            # it finished, but after its deadline, while the parent was busy (computing the eager side): the verdict
            # is the timeout's whenever the parent looked
            return self._timed_out()
        return result


def run_isolated(work: Callable[[], dict[str, Any]], *, log_path: Path, timeout: float) -> dict[str, Any]:
    """Run `work` in a forked process and wait for it; its printed output is appended to `log_path`. The result is
    [`Isolated.result`]'s."""
    run = Isolated(work, log_path=log_path, timeout=timeout)
    run.wait()
    return run.result()


def error_text(err: BaseException, prefix: str = "") -> str:
    """The whole of `err` for a log: its message (with `prefix`) and the traceback of its chain."""
    return f"{prefix}{type(err).__name__}: {err}\n{''.join(traceback.format_exception(err))}"


def log_error(log_path: Path, text: str, *, fresh: bool = False) -> None:
    """Append `text` to the target's log (`fresh`: the log starts with it, nothing of an earlier run left)."""
    if fresh:
        fsutil.fresh_file(log_path, text)
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(fsutil.open_log(log_path), "a") as handle:
        handle.write(text)


def logged_error(err: BaseException, log_path: Path, *, prefix: str = "", fresh: bool = False) -> dict[str, Any]:
    """[`error_record`] of `err` for the report, its whole message and traceback written to the target's log (the
    report's line names the log: what to change first, the rest there)."""
    log_error(log_path, error_text(err, prefix), fresh=fresh)
    return error_record(err, prefix=prefix)


def log_excerpt(log_path: Path, limit: int = 3000) -> str:
    """The last `limit` characters of a log ('' when there is none)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]

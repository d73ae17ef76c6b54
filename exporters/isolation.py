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

import json
import logging
import multiprocessing
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from .errors import describe_error
from .status import CRASHED, TIMED_OUT


def _redirect_output(log_path: Path) -> None:
    """Send everything the child prints (upstream warnings, torch logs) to the target's log file."""
    handle = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
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
        import torch

        # The parent's OpenMP pool does not survive fork: a parallel region in the child would wait forever on its
        # threads (the reason DataLoader workers do the same). Tracing and lowering are single-threaded Python anyway.
        torch.set_num_threads(1)
        info = work()
        result = {"ok": True, **info}
    except BaseException as err:  # everything is reported; the parent decides the status
        result = {
            "ok": False,
            "type": type(err).__name__,
            "message": describe_error(err, 4000).split(": ", 1)[-1],
            "traceback": traceback.format_exc(limit=-15),
        }
        print(result["traceback"], file=sys.stderr)
    result_path.write_text(json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_isolated(work: Callable[[], dict[str, Any]], *, log_path: Path, timeout: float) -> dict[str, Any]:
    """Run `work` in a forked process; its printed output is appended to `log_path`.

    Returns `work`'s dict with `"ok": True`, or `{"ok": False, "type", "message"}` for an exception, with
    `"status": "crashed" | "timed_out"` when the process died or ran past `timeout` seconds (it is then killed).
    """
    result_path = log_path.with_suffix(".result.json")
    result_path.unlink(missing_ok=True)
    context = multiprocessing.get_context("fork")
    process = context.Process(target=_child, args=(work, result_path, log_path), daemon=True)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return {"ok": False, "status": TIMED_OUT, "type": "TimeoutError",
                "message": f"the export ran past its timeout of {timeout:g} s and was stopped"}
    if not result_path.exists():
        code = process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return {"ok": False, "status": CRASHED, "type": "Crash",
                "message": f"the exporting process died ({how}) before finishing; see the log"}
    result = json.loads(result_path.read_text())
    result_path.unlink()
    return result


def log_excerpt(log_path: Path, limit: int = 3000) -> str:
    """The last `limit` characters of a log ('' when there is none)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]

"""The last call of a tests/optimum script once its answer is printed (#48): the exit handlers run, stdout and stderr
are flushed, and the interpreter's teardown is skipped (`os._exit(0)`), as the product's proof children end
(`END_WITHOUT_TEARDOWN` in exporters/layouts/child.py): freeing torch, transformers, optimum and ONNX Runtime module
by module is ~1 CPU s of a script whose answer is already on its stdout (benchmarks/RESULTS.md, tenth round). Runs in
the optimum test venv (stdlib only; the scripts import it from their own folder).

A script that raised never reaches the call: it ends as the interpreter ends it, with its traceback and exit code 1.
A flush that fails raises here, with the same ending. With a non-daemon thread still running the call returns and the
interpreter ends the process as usual, waiting for the thread.

    from ending import end_without_teardown
    print(json.dumps(answer))
    end_without_teardown()
"""

import atexit
import os
import sys
import threading


def end_without_teardown() -> None:
    """End the process with status 0 without the interpreter's teardown (see the module's docstring)."""
    if any(thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
           for thread in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

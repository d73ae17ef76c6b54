"""One place that mutes the stack's import chatter, for every front door (the CLI, the Action, the bot), and ends
their process without the interpreter's teardown ([`exit_without_teardown`]).

Importing the stack prints lines that are not about the user's run: torchao (loaded by transformers' quantizer
registry once ExecuTorch's stack is installed) warns that its CUDA kernels do not load on a CPU machine ("Failed to
load …/torchao/_C_mxfp8….so", "…_C_cutlass_90a.abi3.so"), and torch's pytree warns that torchao registers enums
("<enum 'KernelPreference'> is an Enum subclass and is now natively supported…"). Both are log records, so raising
their loggers to ERROR before the stack is imported mutes them; real problems are errors and still show.

A forked child inherits the levels; a fresh interpreter (a spawned process) calls `mute_import_chatter()` itself,
which every entrypoint does first.

Example:
    >>> mute_import_chatter()
    >>> import logging
    >>> logging.getLogger("torchao").getEffectiveLevel() == logging.ERROR
    True
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from huggingface_hub.utils import disable_progress_bars

__all__ = ["NOISY_LOGGERS", "exit_without_teardown", "mute_import_chatter", "no_progress_bars"]

#: Loggers whose import-time warnings are muted (their errors still show).
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def mute_import_chatter() -> None:
    """Raise the stack's chatty import-time loggers to ERROR. Idempotent; call it before importing the stack."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def no_progress_bars() -> None:
    """No download, upload or weight-loading progress bars, in this process and in every child it starts. The
    environment variable alone does not do it here: huggingface_hub reads it once, at import, and every front door has
    imported it by the time its options are parsed; transformers reads it at its own import, which a long-lived
    process (a bot worker, a warm start) has also done before.

    Example:
        >>> from huggingface_hub.utils import are_progress_bars_disabled
        >>> no_progress_bars()
        >>> are_progress_bars_disabled(), os.environ["HF_HUB_DISABLE_PROGRESS_BARS"]
        (True, '1')
    """
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    disable_progress_bars()
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:  # imported before the options were parsed: it read the variable then
        transformers_logging.disable_progress_bar()


def exit_without_teardown(done: SystemExit) -> None:
    """End the process with `done`'s status once the command is over: the exit handlers run (logging, temporary
    folders, child processes), the output is flushed, and the interpreter's teardown is skipped. That teardown frees
    the loaded model, the runtimes and torch's caches object by object (~2 s after an export, measured in
    benchmarks/RESULTS.md) for a process that is ending anyway. With a non-daemon thread still running the process
    exits as usual, which waits for it.

    Example:
        >>> exit_without_teardown(SystemExit(0))  # doctest: +SKIP
    """
    if any(thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
           for thread in threading.enumerate()):
        raise done
    code = done.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as the interpreter does for `sys.exit("message")`
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

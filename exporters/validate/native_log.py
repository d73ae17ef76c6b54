"""What native runtimes print on stderr while an artifact loads or runs, caught and put where it belongs.

ExecuTorch says why a method does not load or run only on stderr (`[operator_registry.cpp:277] kernel
'aten::sort.values' not found`, `[op_convolution.cpp:363] Check failed ...`); its exception carries a bare code
(`error: 0x14`). Around the calls that load or run an artifact, `native_messages` catches the process's stderr: when
the call fails, the runtime's error lines join the exception as a note (`describe_error` shows it), and its chatter
(`[cpuinfo_utils.cpp:87] Failed to open midr file ...`, printed once per process) never reaches the terminal.
Anything else written meanwhile (Python warnings, the progress display) is written out again unchanged.

Example:
    >>> with native_messages():  # doctest: +SKIP
    ...     program.load_method("image_encoder")
    RuntimeError: Failed to load method image_encoder, error: 0x:14
    (runtime log: kernel 'aten::sort.values' not found)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from typing import Iterator

# `[file.cpp:123] message`: ExecuTorch's log format (ET_LOG)
NATIVE_LINE = re.compile(r"^\[[\w./-]+\.(?:cpp|cc|c|h):\d+\] ?(.*)$")
# What says why a call failed, not how it went
FAILURE_WORDS = re.compile(r"fail|not found|error|invalid|mismatch|expect|missing|unsupported", re.IGNORECASE)
MAX_REASON_LINES = 4


def runtime_reason(text: str) -> str | None:
    """The native error lines in `text` (the last few, without their source location), or None.

    Example:
        >>> runtime_reason("[cpuinfo_utils.cpp:71] Reading file x\\n[operator_registry.cpp:277] kernel 'aten::sort.values' not found\\n")
        "kernel 'aten::sort.values' not found"
    """
    lines = [m.group(1).strip() for m in map(NATIVE_LINE.match, text.splitlines()) if m]
    failures = [line for line in lines if line and FAILURE_WORDS.search(line) and "midr" not in line]
    return "; ".join(dict.fromkeys(failures[-MAX_REASON_LINES:])) or None


def _flush_c_streams() -> None:
    """Flush C stdio buffers: a runtime's `fprintf(stderr, ...)` may sit in one (stderr is not always unbuffered)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def native_messages() -> Iterator[None]:
    """Catch stderr (the file descriptor, where native code writes) for the duration; see the module docstring."""
    sys.stderr.flush()
    _flush_c_streams()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to catch (a closed descriptor): nothing would be printed either
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failure: BaseException | None = None
        try:
            yield
        except BaseException as err:
            failure = err
            raise
        finally:
            sys.stderr.flush()
            _flush_c_streams()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            others = "".join(line for line in text.splitlines(keepends=True) if not NATIVE_LINE.match(line))
            if others:
                sys.stderr.write(others)
                sys.stderr.flush()
            reason = runtime_reason(text) if failure is not None else None
            if reason:
                failure.add_note(f"runtime log: {reason}")

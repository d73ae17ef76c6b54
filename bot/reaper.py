"""Keep an export's whole process tree tied to its worker: `python -m bot.reaper --parent PID -- ARGV...`.

The `local` backend starts every export run through this small process (stdlib only, nothing else to do, so it acts
on a signal at once):

```
worker ──Popen(new session, PDEATHSIG=SIGTERM)──► reaper (a subreaper) ──fork+exec (PDEATHSIG=SIGKILL)──► hf-export
                                                                                      └─ forked target exports, ...
```

- It marks itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): whatever the export forks and orphans (a
  target's child outliving `hf-export`, a process that left the group with `setsid`) is reparented to the reaper,
  not to init, so it stays in reach.
- It dies with the worker: the worker sets `PR_SET_PDEATHSIG = SIGTERM` on it, and it checks at start that its
  parent is still `--parent` (the worker may have died before the death signal was armed).
- On SIGTERM, SIGINT or SIGHUP (the worker died, timed out the run, or cancelled it), or once `hf-export` itself
  ended, it kills every process descended from it (found in `/proc`, repeated until none is left, reaping as it
  goes), then ends: with `hf-export`'s exit status, or killed by SIGKILL when it was stopped (as a killed run reads).

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-m", "bot.reaper", "--", sys.executable, "-c", "raise SystemExit(3)"]
    ...                ).returncode
    3
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    pass


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def descendants(root: int) -> list[int]:
    """Live processes descended from `root` (zombies left out), from `/proc`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(root: int, *, rounds: int = 200) -> None:
    """SIGKILL every descendant of `root` until none is left (a process forking meanwhile is caught next round)."""
    for _ in range(rounds):
        pids = descendants(root)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap()
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parent = None
    if args[:1] == ["--parent"]:
        parent, args = int(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m bot.reaper [--parent PID] -- ARGV...", file=sys.stderr)
        return 2
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def stop(signum, _frame):
        raise _Stop(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    me = os.getpid()
    stopped = False
    status = 0
    try:
        if parent is not None and os.getppid() != parent:  # the worker died before its death signal was armed
            raise _Stop(signal.SIGTERM)
        child = os.fork()
        if child == 0:  # the export: dies if the reaper does (even by SIGKILL); default signal handling
            try:
                for signum in STOP_SIGNALS:
                    signal.signal(signum, signal.SIG_DFL)
                if prctl is not None:
                    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
                if os.getppid() != me:
                    os._exit(137)
                os.execvp(args[0], args)
            finally:
                os._exit(127)
        while True:  # reap everything reparented to us until the export itself ends
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                break
    except _Stop:
        stopped = True
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        kill_tree(me)
        _reap()
    if stopped:
        os.kill(me, signal.SIGKILL)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(me, os.WTERMSIG(status))  # read as the export's own death by that signal
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main())

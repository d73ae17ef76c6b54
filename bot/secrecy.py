"""Secrets stay in the bot's memory, out of reach of the processes it starts.

An export runs a model repo's code when the operator allowed it, as the bot's own user: it can read
`/proc/<pid>/environ` (the environment a process started with, not what it removed since) and `/proc/<pid>/cmdline`
of every process of that user, its worker among them. So, once the settings are read (`bot.settings`, from the
environment or from `*_FILE` files), the web process and every worker call [`withhold_secrets`]:

- every variable that held a secret (`SECRET_ENV`, and its `*_FILE` path) leaves `os.environ`, and its value is
  overwritten with zeros where `/proc/<pid>/environ` shows it (the environment block the process started with);
- the process becomes not dumpable (`prctl(PR_SET_DUMPABLE, 0)`, Linux): its `/proc/<pid>/environ`, `mem` and
  `ptrace` are closed to processes of the same user; its children (which `exec`) are dumpable again, and hold only
  what `bot.backends.local` gives them: the Hub token an export needs, nothing else.

Example:
    >>> env = {"WEBHOOK_SECRET": "s", "HF_TOKEN_FILE": "/run/secrets/hf", "PATH": "/usr/bin"}
    >>> withhold_secrets(env, harden=False)
    ['HF_TOKEN_FILE', 'WEBHOOK_SECRET']
    >>> env
    {'PATH': '/usr/bin'}
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import MutableMapping

from .settings import SECRET_ENV

PR_SET_DUMPABLE = 4


def withhold_secrets(environ: MutableMapping[str, str] | None = None, *, harden: bool = True) -> list[str]:
    """Remove the bot's secret variables (and their `*_FILE` paths) from `environ` (default: this process's
    environment, wiped where `/proc/<pid>/environ` shows it) and, with `harden`, make this process not dumpable.
    Returns the names removed."""
    names = sorted(name for name in (environ if environ is not None else os.environ)
                   if name in SECRET_ENV or name.removesuffix("_FILE") in SECRET_ENV)
    if environ is None:
        _wipe_start_environment({name.encode() for name in names})
        environ = os.environ
    for name in names:
        del environ[name]
    if harden:
        not_dumpable()
    return names


def not_dumpable() -> bool:
    """`prctl(PR_SET_DUMPABLE, 0)`: this process's `/proc` files (environ, mem) and `ptrace` are closed to processes
    of the same user, and it leaves no core dump. False where the platform has no `prctl`."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return False
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _wipe_start_environment(names: set[bytes]) -> None:
    """Overwrite with zeros the values of `names` in the environment block this process started with (what
    `/proc/<pid>/environ` shows: removing a variable only drops its pointer). Only strings inside that block are
    touched; nothing happens where the platform does not expose it."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5)
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, IndexError, ValueError, AttributeError):
        return
    index = 0
    while environ[index]:
        address = environ[index]
        index += 1
        if not start <= address < end:
            continue
        entry = ctypes.string_at(address)
        name, _, value = entry.partition(b"=")
        if name in names and address + len(entry) < end:
            ctypes.memset(address + len(name) + 1, 0, len(value))

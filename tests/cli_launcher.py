"""The real CLI started warm (#48): each `hf-export` a test runs is forked from a per-worker process that has already
imported the heavy, environment-blind part of the stack, instead of a cold interpreter importing it again (~3 of the
~4.5 CPU seconds `python -m exporters.cli run` spends before it does anything; benchmarks/RESULTS.md).

    test ──(argv, env, cwd; fds 0/1/2)──► launcher: `python -m tests.cli_launcher SOCKET LIFELINE`, has imported
         ◄──pid, then the exit status───    PRELOAD (no torch op ever ran in it), forks one child per call:
                                            env := exactly the env given, chdir(cwd), fds 0/1/2, sys.path[0] = cwd,
                                            runpy.run_module("exporters.cli", run_name="__main__") as `-m` does

The child is the CLI in its own process: its own pid, exit code, stdout and stderr pipes (read as
`subprocess.run(capture_output=True, text=True)` reads them), atexit handlers, and a timeout that kills it. Only
modules that a cold `import exporters.run.pipeline` loads anyway are preloaded (so an export child the CLI forks holds
what it would hold cold), and none that reads the environment the tests vary: huggingface_hub, transformers and
exporters read HF_* and their settings at import, so every child imports them itself. The launcher records every
environment key the preload read (`os.environ`) and starts a call cold when the env given changes one of them or one
read below Python (`COLD_KEYS`, `COLD_PREFIXES`: the interpreter, the loader, OpenMP, the locale), or when the cwd holds
a module named like a preloaded one (`-m` puts the cwd first on sys.path).

A call may name another module (`python -m action`: tests/test_action.py's `run_action`) and a PYTHONPATH of its
own, whose entries the child puts on sys.path where a cold interpreter puts them, in place of the launcher's (a call
whose entry holds a module named like a preloaded package starts cold).

`HF_EXPORT_TEST_COLD_CLI=1` starts every call cold; `HF_EXPORT_TEST_CLI_LOG=FILE` appends one line per call (warm or
cold, and why cold). A child shares the launcher's hash seed (a cold interpreter draws its own).

Example:
    >>> done = launch(["--help"], dict(os.environ), ROOT, 60).done  # doctest: +SKIP
    >>> done.returncode, "Usage" in done.stdout  # doctest: +SKIP
    (0, True)
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "exporters.cli"  # what a call runs as `python -m`, unless it names another module (`python -m action`)
CLI = [sys.executable, "-m", MODULE]
PATH_KEY = "PYTHONPATH"  # a call may change it: its entries go on the child's sys.path unless one shadows the preload
COLD_ENV, LOG_ENV = "HF_EXPORT_TEST_COLD_CLI", "HF_EXPORT_TEST_CLI_LOG"
# What `import exporters.run.pipeline` loads that reads no HF_* or product setting at import (measured: benchmarks/
# RESULTS.md, "The CLI started warm in the tests"); tests/test_cli_launcher.py checks both halves of that sentence.
PRELOAD = ("numpy", "scipy.optimize", "sympy", "torch", "torch._dynamo", "torch.export", "torchao", "safetensors",
           "tokenizers", "PIL.Image")
# Read below Python's os.environ, at start-up or when a library loads: a change starts the call cold.
COLD_KEYS = frozenset({"PYTHONUNBUFFERED", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "HOME", "PATH"})
COLD_PREFIXES = ("PYTHON", "LD_", "LC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "MALLOC_", "GLIBC_", "CUDA_",
                 "TORCH", "PYTORCH", "NPY_", "NUMPY_", "SCIPY_", "TQDM_", "SYMPY_", "MPMATH_")
SCANNERS = {"tqdm.utils": "TQDM_"}  # modules that iterate os.environ at import, and the keys they look for
_HEADER = struct.Struct("!Q")


@dataclass
class Launch:
    """One call: the finished process as `subprocess.run` returns it, how it started ("warm" or "cold: why")."""

    done: subprocess.CompletedProcess
    how: str
    pid: int | None = None


class _Launcher:
    """The client's handle on this process's launcher (started on first use, one per pytest-xdist worker)."""

    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="hf-export-cli-")
        self.socket_path = os.path.join(folder, "socket")
        self.log_path = os.path.join(folder, "launcher.log")
        lifeline_read, self.lifeline = os.pipe()  # the launcher ends when this process does (EOF on its end)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.cli_launcher", self.socket_path,
                                             str(lifeline_read)], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=log, pass_fds=[lifeline_read])
        os.close(lifeline_read)
        ready = self.process.stdout.readline()
        self.process.stdout.close()
        if not ready:
            raise RuntimeError(f"the CLI launcher did not start: {Path(self.log_path).read_text()[-3000:]}")
        facts = json.loads(ready)
        self.reads, self.scanned, self.packages = set(facts["reads"]), facts["scanned"], set(facts["packages"])
        self.owner = os.getpid()

    def env_differs(self, env: dict[str, str]) -> str:
        """The first key of `env` that differs from the launcher's and is read at start-up ("" when none)."""
        unknown = [module for module in self.scanned if module not in SCANNERS]
        prefixes = COLD_PREFIXES + tuple(SCANNERS[module] for module in self.scanned if module in SCANNERS)
        for key in sorted(set(env) | set(self.env)):
            if key == PATH_KEY and not unknown and key not in self.reads:
                continue  # the child puts its entries on sys.path as the interpreter does; checked below
            if env.get(key) != self.env.get(key) and (unknown or key in self.reads or key in COLD_KEYS
                                                       or key.startswith(prefixes)):
                return key
        return ""

    def cold_reason(self, env: dict[str, str], cwd: Path) -> str:
        """Why a call with `env` in `cwd` cannot start warm ("" when it can)."""
        if key := self.env_differs(env):
            return f"{key} differs from the launcher's and is read at start-up"
        launcher_entries = _entries(self.env.get(PATH_KEY), ROOT)
        for entry in _entries(env.get(PATH_KEY), cwd):
            if entry not in launcher_entries and (shadow := self._shadow(entry)):
                return f"{PATH_KEY} entry {entry} {shadow}"
        if not os.path.isdir(cwd):
            return f"cwd {cwd} cannot be listed"
        shadow = self._shadow(str(cwd))
        return f"the cwd {shadow}, which -m would import from there" if shadow else ""

    def _shadow(self, folder: str) -> str:
        """How `folder` on sys.path would change what the preload imported ("" when it would not): it holds a module
        named like a preloaded package, or it cannot be listed."""
        try:
            shadows = {name.removesuffix(".py") for name in os.listdir(folder)} & self.packages
        except FileNotFoundError:
            return ""  # a folder that is not there imports nothing
        except OSError:
            return "cannot be listed"
        return f"holds {sorted(shadows)[0]}" if shadows else ""

    def close(self) -> None:
        """Stop the launcher (its running children finish on their own)."""
        if self.process.poll() is None and self.owner == os.getpid():
            os.close(self.lifeline)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_launcher: _Launcher | None = None
_lock = threading.Lock()
_cold_because = ""  # set by tests/conftest.py for a test that starts the CLI cold on purpose


def launcher() -> _Launcher:
    """This process's launcher, started on first use (a forked test process starts its own)."""
    global _launcher
    with _lock:
        # A worker whose own environment changed under its launcher (something it ran in process set a variable
        # read at start-up) gets a fresh one: else every later call, with the worker's environment, starts cold.
        if (_launcher is None or _launcher.owner != os.getpid() or _launcher.process.poll() is not None
                or _launcher.env_differs({**os.environ, "PYTHONUNBUFFERED": "1"})):
            if _launcher is not None and _launcher.owner == os.getpid():
                _launcher.close()
            _launcher = _Launcher()
            atexit.register(_launcher.close)
        return _launcher


def shut_down() -> None:
    """Stop this process's launcher, if one was started (pytest's session end calls it)."""
    if _launcher is not None:
        _launcher.close()


def set_cold(reason: str) -> None:
    """Start every call cold while `reason` is set (a test about the CLI's start-up); "" starts them warm again."""
    global _cold_because
    _cold_because = reason


def launch(args: list[str], env: dict[str, str], cwd: Path, timeout: float, warm: bool | None = None,
           module: str = MODULE) -> Launch:
    """Run `hf-export *args` (`python -m <module> *args`) with exactly `env` in `cwd`: forked from the launcher when
    it can be, else cold. `warm=False` starts it cold; `warm=True` warm even under HF_EXPORT_TEST_COLD_CLI=1 or a cold
    test (the launcher's own tests), unless the call cannot start warm."""
    if warm is None:
        reason = (os.environ.get(COLD_ENV) == "1" and f"{COLD_ENV}=1") or _cold_because
    else:
        reason = "" if warm else "asked"
    if not reason:
        try:
            reason = launcher().cold_reason(env, cwd)
        except (OSError, RuntimeError, ValueError) as err:
            reason = f"the launcher failed: {err}"
    if log := os.environ.get(LOG_ENV):
        with open(log, "a") as file:
            file.write(f"{'cold: ' + reason if reason else 'warm'}\t{module}\t{args[0] if args else ''}\n")
    if reason:
        return Launch(subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                                     cwd=cwd, timeout=timeout), f"cold: {reason}")
    return _warm(args, env, cwd, timeout, module)


def _text(data: bytes) -> str:
    """Bytes as `subprocess.run(text=True)` decodes them (the locale's encoding, universal newlines)."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _warm(args: list[str], env: dict[str, str], cwd: Path, timeout: float, module: str) -> Launch:
    deadline = time.monotonic() + timeout
    command = [sys.executable, "-m", module, *args]
    request = json.dumps({"args": args, "env": env, "cwd": str(Path(cwd).resolve()), "module": module}).encode()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    chunks: dict[int, list[bytes]] = {out_read: [], err_read: []}
    answer = b""  # "PID\nSTATUS\n" from the launcher
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    selector = selectors.DefaultSelector()
    try:
        try:
            control.connect(launcher().socket_path)
            stdin = 0 if _valid_fd(0) else os.open(os.devnull, os.O_RDONLY)  # inherited, as a cold child's is
            socket.send_fds(control, [_HEADER.pack(len(request))], [stdin, out_write, err_write])
            control.sendall(request)
            if stdin:
                os.close(stdin)
        finally:
            os.close(out_write)
            os.close(err_write)
        for fileobj in (out_read, err_read, control):
            selector.register(fileobj, selectors.EVENT_READ)
        # Both pipes until they close, as communicate() reads them, then the exit status: all before the deadline.
        while answer.count(b"\n") < 2 or any(fd in selector.get_map() for fd in chunks):
            left = deadline - time.monotonic()
            if left <= 0:
                if answer.count(b"\n") < 2:  # not reaped yet: the launcher, which reaps it, kills it (no pid reused)
                    control.sendall(b"kill\n")
                    answer += _rest(control, answer)
                raise subprocess.TimeoutExpired(command, timeout, output=b"".join(chunks[out_read]),
                                                stderr=b"".join(chunks[err_read]))
            for key, _ in selector.select(left):
                data = control.recv(64) if key.fileobj is control else os.read(key.fd, 65536)
                if key.fileobj is control:
                    answer += data
                elif data:
                    chunks[key.fd].append(data)
                if not data:
                    selector.unregister(key.fileobj)
                if key.fileobj is control and not data and answer.count(b"\n") < 2:
                    raise RuntimeError(f"the CLI launcher ended mid-call: {Path(launcher().log_path).read_text()}")
    finally:
        selector.close()
        control.close()
        os.close(out_read)
        os.close(err_read)
    pid, status = (int(line) for line in answer.split(b"\n")[:2])
    done = subprocess.CompletedProcess(command, status, _text(b"".join(chunks[out_read])),
                                       _text(b"".join(chunks[err_read])))
    return Launch(done, "warm", pid)


def _rest(control: socket.socket, answer: bytes) -> bytes:
    """What the launcher still has to say until `answer` holds the pid and the exit status."""
    more = b""
    while (answer + more).count(b"\n") < 2 and (data := control.recv(64)):
        more += data
    return more


def _entries(value: str | None, base: Path | str) -> list[str]:
    """The sys.path entries a PYTHONPATH of `value` gives an interpreter started in `base` (absolute, in order)."""
    return [os.path.abspath(os.path.join(base, entry)) for entry in (value or "").split(os.pathsep) if entry]


def _valid_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ── The launcher process ─────────────────────────────────────────────────────


def _preload() -> dict:
    """Import PRELOAD, recording each os.environ key read on the way (and who iterated the whole environment)."""
    reads, scanned = set(), set()
    get_item, iterate = os._Environ.__getitem__, os._Environ.__iter__

    def caller(frame) -> str:
        while frame and frame.f_globals.get("__name__") in ("os", "collections.abc", __name__):
            frame = frame.f_back
        return frame.f_globals.get("__name__", "?") if frame else "?"

    def recorded_get(self, key):
        if sys._getframe(1).f_code.co_name != "__iter__":  # ItemsView's reads are its iteration's, named below
            reads.add(key.decode() if isinstance(key, bytes) else key)
        return get_item(self, key)

    def recorded_iter(self):
        scanned.add(caller(sys._getframe(1)))
        return iterate(self)

    before = {name.split(".")[0] for name in sys.modules}
    os._Environ.__getitem__, os._Environ.__iter__ = recorded_get, recorded_iter
    try:
        for module in PRELOAD:
            __import__(module)
    finally:
        os._Environ.__getitem__, os._Environ.__iter__ = get_item, iterate
    packages = {name.split(".")[0] for name in sys.modules} - before
    return {"reads": sorted(reads), "scanned": sorted(scanned), "packages": sorted(packages)}


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
    (size,) = _HEADER.unpack(header)
    payload = b""
    while len(payload) < size and (chunk := connection.recv(size - len(payload))):
        payload += chunk
    return json.loads(payload), list(fds)


def serve(listener: socket.socket, lifeline: int) -> tuple[dict, list[int]] | None:
    """Answer calls on `listener` until the client ends (EOF on `lifeline`); returns only in a forked child, with
    its request and fds."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(lifeline, selectors.EVENT_READ, "lifeline")
    children: dict[int, tuple[int, int, socket.socket]] = {}  # pid -> (pidfd, pid, connection)
    while True:
        for key, _ in selector.select():
            kind = key.data
            if kind == "lifeline" and not os.read(lifeline, 1):
                return None
            if kind == "accept":
                connection, _ = listener.accept()
                try:
                    request, fds = _receive(connection)
                except (OSError, ValueError) as err:
                    print(f"bad request: {err!r}", file=sys.stderr, flush=True)
                    connection.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    for pidfd, _, other in children.values():
                        os.close(pidfd)
                        other.close()
                    selector.close()
                    listener.close()
                    connection.close()
                    os.close(lifeline)
                    return request, fds
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pid] = (pidfd, pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
                selector.register(connection, selectors.EVENT_READ, ("asks", pid))
                _send(connection, f"{pid}\n")
            elif isinstance(kind, tuple) and kind[1] in children:
                pidfd, pid, connection = children[kind[1]]
                if kind[0] == "asks":
                    try:
                        asked = connection.recv(64)
                    except OSError:
                        asked = b""
                    if asked.startswith(b"kill"):
                        os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still the child's
                    elif not asked:
                        selector.unregister(connection)  # the client left; the child runs on
                    continue
                _, status = os.waitpid(pid, 0)
                selector.unregister(pidfd)
                if connection.fileno() in selector.get_map():
                    selector.unregister(connection)
                os.close(pidfd)
                _send(connection, f"{os.waitstatus_to_exitcode(status)}\n")
                connection.close()
                del children[pid]


def _send(connection: socket.socket, text: str) -> None:
    try:
        connection.sendall(text.encode())
    except OSError:
        pass  # the client left (its test timed out or ended): nothing to tell


def become_cli(request: dict, fds: list[int]) -> None:
    """In the forked child: take the call's fds, cwd, environment and argv, then run `python -m exporters.cli`."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    launcher_entries = _entries(os.environ.get(PATH_KEY), ROOT)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # what `-m` puts first, then the call's PYTHONPATH in place of the launcher's (cold_reason: none shadows the preload)
    rest = [entry for entry in sys.path[1:] if entry not in launcher_entries]
    sys.path[:] = [os.getcwd(), *_entries(os.environ.get(PATH_KEY), os.getcwd()), *rest]
    importlib.invalidate_caches()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()  # a cold interpreter seeds numpy's global generator afresh
    sys.argv = ["", *request["args"]]  # runpy puts the module's path first, as `-m` does
    module = request.get("module", MODULE)
    sys.orig_argv = [sys.executable, "-m", module, *request["args"]]
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    try:
        # What `python -m` itself calls (runpy.run_module would run the CLI in a temporary module instead): the same
        # __main__, the same frames in a traceback.
        runpy._run_module_as_main(module)
    except SystemExit:
        raise
    except BaseException as err:  # uncaught, as the interpreter reports it: from `-m`'s frame on, exit code 1
        err.__traceback__ = err.__traceback__.tb_next  # the hook prints the exception's own traceback
        sys.excepthook(type(err), err, err.__traceback__)
        raise SystemExit(1) from None


def main() -> None:
    """`python -m tests.cli_launcher SOCKET LIFELINE_FD`: preload, say so on stdout, serve."""
    socket_path, lifeline = sys.argv[1], int(sys.argv[2])
    facts = _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    facts["threads"] = threading.active_count()
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    child = serve(listener, lifeline)
    if child is not None:
        become_cli(*child)


if __name__ == "__main__":
    main()

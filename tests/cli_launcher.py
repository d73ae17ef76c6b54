"""The real CLI started warm (#48): each `hf-export` a test runs is forked from a per-worker process that has already
imported the stack, instead of a cold interpreter importing it again (~4.5 CPU seconds `python -m exporters.cli run`
spends before it does anything; benchmarks/RESULTS.md).

    test ──(argv, env, cwd; fds 0/1/2)──► launcher: `python -m tests.cli_launcher SOCKET LIFELINE`, has imported
         ◄──"pid stage", exit status──    PRELOAD (environment-blind; no torch op ever ran in it)
                                            │ fork, once per environment (what STAGE2 read at import)
                                            ▼
                                          zygote (comm ZYGOTE_NAME): took that call's env, imported STAGE2
                                          (huggingface_hub, transformers, typer, rich, ours); forks one child per
                                          call whose env agrees on every key STAGE2 read, and reaps it
                                            │ fork, once per format (FORMAT_READY) and environment
                                            ▼
                                          format zygote (comm FORMAT_ZYGOTE_NAME): also loaded what a run of
                                          that format loads before its first export child (`exporter_ready`);
                                          serves the `run` calls whose every target has that format (`run_format`)
                                            ▼
                                          child: env := exactly the env given, chdir(cwd), fds 0/1/2,
                                          sys.path[0] = cwd, runpy runs `exporters.cli` as `-m` does

The child is the CLI in its own process: its own pid, exit code, stdout and stderr pipes (read as
`subprocess.run(capture_output=True, text=True)` reads them), atexit handlers, and a timeout that kills it. Only
modules that a cold `hf-export run` loads before it exports, and the torch and sympy internals every export loads at
its first symbolic shape (`EXPORT_INTERNALS`), are preloaded (so an export child the CLI forks holds what it would
hold cold). The launcher's PRELOAD reads no setting the tests vary; it records every environment key the
preload read (`os.environ`) and starts a call cold when the env given changes one of them or one read below Python
(`COLD_KEYS`, `COLD_PREFIXES`: the interpreter, the loader, OpenMP, the locale), or when the cwd holds a module named
like a preloaded one (`-m` puts the cwd first on sys.path). huggingface_hub, transformers and ours read HF_* and their
settings at import (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE, CI, TRANSFORMERS_VERBOSITY, ...): those are STAGE2, imported
in a zygote with one call's environment, recording each key read; a call whose values differ on any of them gets
another zygote (at most MAX_ZYGOTES live, the least recently used ended), so no call sees another's values
(tests/test_cli_launcher.py proves it against cold runs). A call whose PYTHONPATH adds entries, or whose cwd holds a
package STAGE2 imported (or ours resolving to other files), is forked from the launcher and imports STAGE2 itself.
What a zygote shares with its children that a cold interpreter draws afresh: the hash seed, and transformers'
telemetry SESSION_ID.

A call may name another module (`python -m action`: tests/test_action.py's `run_action`) and a PYTHONPATH of its
own, whose entries the child puts on sys.path where a cold interpreter puts them, in place of the launcher's (a call
whose entry holds a module named like a preloaded package starts cold). A call may instead be code, run as
`python -c CODE` runs it (tests/card_snippets.py's `run_snippet`: a model card's snippet as written): it is always
forked from the launcher, never a zygote, so nothing of huggingface_hub, transformers or ours is imported before the
snippet imports it itself. Once the code has run to its end, the child ends without the interpreter's teardown
(tests/optimum/ending.py's `end_without_teardown`, stdlib only, as the side venv's scripts end: exit handlers run,
output flushed), as `hf-export` does; code that raised or called `sys.exit` ends as the interpreter ends it. A runtime
proof's call from a shim (tests/side_launcher.py: `"leave": "kill"`, `"teardown"`) leads its own process group, which
the launcher kills when the shim ends first, and ends as the interpreter ends a cold `python -c` (the product's code
carries its own ending). A call's fds 0/1/2 stay open in the launcher until it has reaped the child, so the caller's
pipes end only once the child is gone (never a zombie behind a closed pipe).

`HF_EXPORT_TEST_COLD_CLI=1` starts every call cold; `HF_EXPORT_TEST_CLI_LOG=FILE` appends one line per call (warm or
cold and why, the module, the command, the stage: `base:N` or `zygote:N`, the Nth call that process served).

Example:
    >>> done = launch(["--help"], dict(os.environ), ROOT, 60).done  # doctest: +SKIP
    >>> done.returncode, "Usage" in done.stdout  # doctest: +SKIP
    (0, True)
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import importlib.machinery
import json
import locale
import os
import runpy
import selectors
import shutil
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

from tests.optimum.ending import end_without_teardown

ROOT = Path(__file__).resolve().parents[1]
MODULE = "exporters.cli"  # what a call runs as `python -m`, unless it names another module (`python -m action`)
CLI = [sys.executable, "-m", MODULE]
PATH_KEY = "PYTHONPATH"  # a call may change it: its entries go on the child's sys.path unless one shadows the preload
COLD_ENV, LOG_ENV = "HF_EXPORT_TEST_COLD_CLI", "HF_EXPORT_TEST_CLI_LOG"
# What `import exporters.run.pipeline` loads that reads no HF_* or product setting at import (measured: benchmarks/
# RESULTS.md, "The CLI started warm in the tests"); tests/test_cli_launcher.py checks both halves of that sentence.
# What every export then loads at its first symbolic shape, each child again (~0.5 CPU s of a tiny run): torch's
# `symbolic_shapes.uninteresting_files()` (the modules whose frames a guard's provenance skips) and sympy's
# `Add.flatten` (tests/test_cli_launcher.py loads them cold the same two ways)
EXPORT_INTERNALS = ("torch._compile", "torch._dynamo.eval_frame", "torch._higher_order_ops", "torch._inductor.sizevars",
                    "torch._library.custom_ops", "torch._library.fake_impl", "torch._logging",
                    "torch._subclasses.fake_tensor", "torch._subclasses.meta_utils", "torch.export._trace",
                    "sympy.calculus.accumulationbounds", "sympy.matrices.expressions", "sympy.tensor.tensor")
PRELOAD = ("numpy", "scipy.optimize", "sympy", "torch", "torch._dynamo", "torch.export", "torchao", "safetensors",
           "tokenizers", "PIL.Image", *EXPORT_INTERNALS)
# Read below Python's os.environ, at start-up or when a library loads: a change starts the call cold.
COLD_KEYS = frozenset({"PYTHONUNBUFFERED", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "HOME", "PATH"})
COLD_PREFIXES = ("PYTHON", "LD_", "LC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "MALLOC_", "GLIBC_", "CUDA_",
                 "TORCH", "PYTORCH", "NPY_", "NUMPY_", "SCIPY_", "TQDM_", "SYMPY_", "MPMATH_")
# Modules that iterate os.environ at import, and the keys they look for (networkx, which torch._inductor loads: its
# backends' settings, networkx/utils/backends.py)
SCANNERS = {"tqdm.utils": "TQDM_", "networkx.utils.backends": "NETWORKX_"}
# The rest of what `python -m exporters.cli run` imports before it exports (the CLI's own imports, then the pipeline
# its `run` imports): huggingface_hub, transformers, typer, rich, pydantic and ours, which read HF_* and their settings
# at import. A zygote imports them with one call's environment and serves every later call that agrees with it on
# each key they read (eighth round of #48: ~1.5 CPU s a call that each child paid).
STAGE2 = ("typer", "rich.console", "rich.markup", "exporters.fsutil", "exporters.errors", "exporters.publish",
          "exporters.publish.destination", "exporters.publish.problem", "exporters.recipe.load",
          "exporters.recipe.model", "exporters.recipe.model_limits", "exporters.report.build", "exporters.quiet",
          "exporters.run.pipeline")
# What the side environment's launcher imports (`tests.side_launcher`: optimum's and sentence-transformers' proofs,
# which a run starts as `HF_EXPORT_OPTIMUM_PYTHON -c CODE SPEC`): what those proofs import before they read the
# folder, but for ONNX Runtime (~0.2 CPU s of the ~5): its import starts a thread its forked children cannot do
# without (a child of a launcher that had imported it hung or died in `std::system_error` creating its session).
# optimum.onnxruntime's names load onnxruntime when first read, so the child imports it.
SIDE_PRELOAD = ("numpy", "torch", "transformers", "transformers.modeling_utils", "transformers.generation.utils",
                "transformers.models.auto.modeling_auto", "onnx", "sentence_transformers")
# What the main environment's proof launcher imports (`tests.side_launcher`: ExecuTorch's runners and ASR proof, ONNX
# Runtime GenAI, which a run starts as `HF_EXPORT_PROOF_PYTHON -c CODE SPEC`), before it runs the code it is given
# (`exporters.layouts.executorch_llm.RUNTIME_WITHOUT_COMPILER`: executorch's runtime pybindings without the
# compiler's package). None of them starts a thread. The runner pybinding (`executorch.extension.llm.runner`) is
# left to the child: it prints a line on stderr as it loads (its tokenizer's regex), which a cold child prints too,
# and costs nothing once the runtime is loaded.
PROOF_PRELOAD = ("numpy", "torch", "onnxruntime_genai")
PRELOADS = {"cli": PRELOAD, "side": SIDE_PRELOAD, "proof": PROOF_PRELOAD}
MAX_ZYGOTES = 3  # the worker's own environment's, and the last two others' (a test's Hub emulator and HF_HOME)
ZYGOTE_NAME = "hf-cli-zygote"  # its /proc/PID/comm
# What a `run` loads before it forks its first export child (`exporters.upstream.exporter_ready`: ExecuTorch's
# compiler ~2 CPU s, ONNX's exporter and torchlib's registry ~1.5 s), each run again: a zygote forks one child per
# format that has loaded it (a format zygote) and serves from it the runs whose every target has that format.
FORMAT_READY = ("executorch", "onnx")
FORMAT_ZYGOTE_NAME = "hf-cli-format"  # its /proc/PID/comm
_HEADER = struct.Struct("!Q")


@dataclass
class Launch:
    """One call: the finished process as `subprocess.run` returns it, how it started ("warm" or "cold: why")."""

    done: subprocess.CompletedProcess
    how: str
    pid: int | None = None
    stage: str = ""  # warm: "base:N" (forked from the launcher) or "zygote:N" (from a zygote), its Nth call


class _Launcher:
    """The client's handle on this process's launcher (started on first use, one per pytest-xdist worker)."""

    def __init__(self) -> None:
        self.folder = folder = tempfile.mkdtemp(prefix="hf-export-cli-")
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
        """Stop the launcher (its running children finish on their own) and remove its folder (socket, log)."""
        if self.owner != os.getpid():
            return
        if self.process.poll() is None:
            os.close(self.lifeline)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


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
           module: str = MODULE, code: str | None = None, export_format: str | None = None) -> Launch:
    """Run `hf-export *args` (`python -m <module> *args`, or `python -c <code> *args` when `code` is given) with
    exactly `env` in `cwd`: forked from the launcher when it can be, else cold. `warm=False` starts it cold;
    `warm=True` warm even under HF_EXPORT_TEST_COLD_CLI=1 or a cold test (the launcher's own tests), unless the call
    cannot start warm. `export_format`: the format zygote to serve it from (default: `run_format` of the call)."""
    if warm is None:
        reason = (os.environ.get(COLD_ENV) == "1" and f"{COLD_ENV}=1") or _cold_because
    else:
        reason = "" if warm else "asked"
    if not reason:
        try:
            reason = launcher().cold_reason(env, cwd)
        except (OSError, RuntimeError, ValueError) as err:
            reason = f"the launcher failed: {err}"
    called = None
    try:
        if reason:
            called = Launch(subprocess.run(_command(args, module, code), capture_output=True, text=True, env=env,
                                           cwd=cwd, timeout=timeout), f"cold: {reason}")
        else:
            if export_format is None:
                export_format = run_format(args, Path(cwd)) if module == MODULE and code is None else ""
            called = _warm(args, env, cwd, timeout, module, code, export_format)
        return called
    finally:
        if log := os.environ.get(LOG_ENV):  # one line a call: how it started, its module, command and stage
            with open(log, "a") as file:
                file.write(f"{'cold: ' + reason if reason else 'warm'}\t{'-c' if code is not None else module}\t"
                       f"{args[0] if args else ''}\t"
                           f"{called.stage if called else 'raised'}\n")


def run_format(args: list[str], cwd: Path) -> str:
    """The export format of every target a `hf-export run *args` call in `cwd` exports, where it is one of
    FORMAT_READY and the recipe can be read here (a local model folder's own, or `--config`); "" otherwise (the call
    is served by its environment's zygote, which loads the formats' modules in the run, as a cold one does).

    Example:
        >>> run_format(["run", "examples/demo-model", "--out", "out"], ROOT)  # doctest: +SKIP
        ''
    """
    if not args or args[0] != "run":
        return ""
    try:
        from typer.main import get_command

        from exporters.cli import app
        from exporters.recipe.load import find_recipe, load_recipe_file

        params = get_command(app).commands["run"].make_context("run", list(args[1:]), resilient_parsing=True).params
        if params.get("config"):  # a regular file only: reading a FIFO here would block the test
            recipe = load_recipe_file(cwd / params["config"]) if (cwd / params["config"]).is_file() else None
        else:
            found = find_recipe(cwd / params["model"]) if (cwd / str(params.get("model"))).is_dir() else None
            recipe = found[0] if found else None
    except Exception:  # noqa: BLE001  (no format zygote: the run itself says what is wrong)
        return ""
    chosen = params.get("target") or []
    formats = {str(target.export_format) for target in (recipe.exports if recipe else [])
               if not chosen or target.name in chosen}
    return formats.pop() if len(formats) == 1 and formats <= set(FORMAT_READY) else ""


def _command(args: list[str], module: str, code: str | None) -> list[str]:
    """The command line a cold interpreter runs for the call."""
    return [sys.executable, *(["-c", code] if code is not None else ["-m", module]), *args]


def _text(data: bytes) -> str:
    """Bytes as `subprocess.run(text=True)` decodes them (the locale's encoding, universal newlines)."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _warm(args: list[str], env: dict[str, str], cwd: Path, timeout: float, module: str,
          code: str | None = None, export_format: str = "") -> Launch:
    deadline = time.monotonic() + timeout
    command = _command(args, module, code)
    request = json.dumps({"args": args, "env": env, "cwd": str(Path(cwd).resolve()), "module": module,
                          "code": code, "format": export_format}).encode()
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
    started, status = answer.decode().split("\n")[:2]
    pid, stage = started.split(" ")
    done = subprocess.CompletedProcess(command, int(status), _text(b"".join(chunks[out_read])),
                                       _text(b"".join(chunks[err_read])))
    return Launch(done, "warm", int(pid), stage)


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


def _preload(modules: tuple[str, ...] = PRELOAD) -> dict:
    """Import `modules`, recording each os.environ key read on the way (and who iterated the whole environment)."""
    return _recorded(lambda: [__import__(module) for module in modules])


def _recorded(load) -> dict:
    """Call `load`, recording each os.environ key read on the way (and who iterated the whole environment), and the
    top-level packages it imported."""
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
        load()
    finally:
        os._Environ.__getitem__, os._Environ.__iter__ = get_item, iterate
    packages = {name.split(".")[0] for name in sys.modules} - before
    return {"reads": sorted(reads), "scanned": sorted(scanned), "packages": sorted(packages)}


def _receive(connection: socket.socket, count: int = 3) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, count)
    if not header:
        raise EOFError("the sender closed the connection")
    (size,) = _HEADER.unpack(header)
    payload = b""
    while len(payload) < size and (chunk := connection.recv(size - len(payload))):
        payload += chunk
    return json.loads(payload), list(fds)


def _cold_origin(name: str, path: list[str]) -> str | None:
    """Where a cold interpreter whose sys.path is `path` finds the top-level module `name` (its spec's origin), with
    this process's import machinery (an editable install's finder included)."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = finder.find_spec(name, path)
        else:
            find = getattr(finder, "find_spec", None)
            spec = find(name, None) if find else None
        if spec is not None:
            return spec.origin
    return None


class _Zygote:
    """A process forked from the launcher that has also imported STAGE2 with one call's environment: it serves the
    calls whose environment agrees with that one on every key its imports read (`fits`)."""

    def __init__(self, pid: int, pair: socket.socket, env: dict[str, str], facts: dict, export_format: str = "") -> None:
        self.pid, self.pair, self.pidfd, self.format = pid, pair, os.pidfd_open(pid), export_format
        self.scanners = [module for module in facts["scanned"]]
        self.values = {key: env.get(key) for key in facts["reads"]}
        prefixes = tuple(SCANNERS.get(module, "") for module in self.scanners)
        self.prefixed = {key: value for key, value in env.items() if prefixes and key.startswith(prefixes)}
        self.whole = env if any(module not in SCANNERS for module in self.scanners) else None
        self.origins, self.packages = facts["origins"], set(facts["packages"]) - set(facts["origins"])

    def same_environment(self, env: dict[str, str]) -> bool:
        """Whether a call with `env` would have read, while importing STAGE2, exactly what this zygote read."""
        if self.whole is not None:
            return env == self.whole
        prefixes = tuple(SCANNERS.get(module, "") for module in self.scanners)
        prefixed = {key: value for key, value in env.items() if prefixes and key.startswith(prefixes)}
        return prefixed == self.prefixed and all(env.get(key) == value for key, value in self.values.items())

    def imports_alike(self, request: dict) -> bool:
        """Whether a cold interpreter for `request` would import STAGE2 from where this zygote did: its cwd holds
        no module named like a package STAGE2 loaded, and ours (exporters) resolve to the same files."""
        cwd = request["cwd"]
        try:
            listed = {name.removesuffix(".py") for name in os.listdir(cwd)}
        except OSError:
            return False
        if listed & self.packages:
            return False
        launcher_entries = _entries(os.environ.get(PATH_KEY), ROOT)
        rest = [entry for entry in sys.path[1:] if entry not in launcher_entries]  # as become_cli builds it
        path = [cwd, *_entries(request["env"].get(PATH_KEY), cwd), *rest]
        return all(_cold_origin(name, path) == origin for name, origin in self.origins.items())

    def forward(self, connection: socket.socket, request: dict, fds: list[int]) -> None:
        """Hand the call (its connection to the client and its fds) to this zygote, which forks and reaps it."""
        payload = json.dumps(request).encode()
        socket.send_fds(self.pair, [_HEADER.pack(len(payload))], [connection.fileno(), *fds])
        self.pair.sendall(payload)


class _Zygotes:
    """The launcher's zygotes, the most recently used last; at most MAX_ZYGOTES live (the oldest other than the
    worker's own environment's is told to end: it finishes its running calls first). A zygote's own (`by_format`):
    its format zygotes, at most one a format and environment read, the oldest ending first."""

    def __init__(self, by_format: bool = False) -> None:
        self.live: list[_Zygote] = []
        self.ending: dict[int, _Zygote] = {}  # by pidfd: told to end or ended, not reaped yet
        self.by_format = by_format

    def eligible(self, request: dict) -> bool:
        """A call whose PYTHONPATH adds entries the launcher lacks imports STAGE2 from its own sys.path, and code (a
        snippet) imports what it imports itself: no zygote. A format zygote serves a run of its format only."""
        if self.by_format:
            return request.get("format") in FORMAT_READY
        if request.get("code") is not None:
            return False
        launcher_entries = _entries(os.environ.get(PATH_KEY), ROOT)
        return all(entry in launcher_entries for entry in _entries(request["env"].get(PATH_KEY), request["cwd"]))

    def find(self, request: dict) -> _Zygote | None:
        wanted = (request.get("format") or "") if self.by_format else ""  # the launcher's own zygotes have none
        for zygote in reversed(self.live):
            if zygote.format == wanted and zygote.same_environment(request["env"]):
                self.live.remove(zygote)
                self.live.append(zygote)
                return zygote
        return None

    def add(self, zygote: _Zygote, selector: selectors.BaseSelector) -> None:
        selector.register(zygote.pidfd, selectors.EVENT_READ, ("zygote", zygote.pidfd))
        self.live.append(zygote)
        # the least recently used ends first, but never the worker's own environment's (most calls are its)
        others = [live for live in self.live if self.by_format or not live.same_environment(dict(os.environ))]
        while len(self.live) > (len(FORMAT_READY) if self.by_format else MAX_ZYGOTES) and others:
            self.end(others.pop(0))

    def end(self, zygote: _Zygote) -> None:
        """Tell `zygote` to end (EOF on its pair); the launcher reaps it when it has."""
        zygote.pair.close()
        self.ending[zygote.pidfd] = zygote
        if zygote in self.live:
            self.live.remove(zygote)

    def reap(self, pidfd: int, selector: selectors.BaseSelector) -> None:
        """Reap the zygote of `pidfd`, which has ended (told to, or on its own)."""
        zygote = self.ending.pop(pidfd, None)
        if zygote is None:
            zygote = next(live for live in self.live if live.pidfd == pidfd)
            self.live.remove(zygote)
            zygote.pair.close()
        os.waitpid(zygote.pid, 0)
        selector.unregister(pidfd)
        os.close(pidfd)

    def fds(self) -> list[int]:
        """Every fd of theirs this process holds (a forked process closes them)."""
        return [fd for zygote in [*self.live, *self.ending.values()]
                for fd in (zygote.pidfd, zygote.pair.fileno()) if fd >= 0]


def _start_zygote(request: dict) -> tuple[int, socket.socket] | tuple[None, socket.socket]:
    """Fork a zygote for `request`'s environment: (pid, the launcher's end of the pair) in the launcher, (None, the
    zygote's end) in the zygote."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        return None, theirs
    theirs.close()
    return pid, ours


def _zygote_facts(pair: socket.socket, timeout: float = 600) -> dict | None:
    """The facts a new zygote reports once it has imported STAGE2 (None: its imports failed or it ended)."""
    pair.settimeout(timeout)
    line = b""
    try:
        while not line.endswith(b"\n") and (data := pair.recv(65536)):
            line += data
    except OSError:
        return None
    finally:
        pair.settimeout(None)
    facts = json.loads(line) if line.endswith(b"\n") else None
    return facts if facts and facts.get("ok") else None


def become_zygote(request: dict, pair: socket.socket, export_format: str = "") -> None:
    """In a new zygote: take the call's environment, import STAGE2 (recording what it read), report, then serve the
    calls the launcher passes on. A failed import ends it: the call is forked from the launcher and fails in its
    own import, as a cold one does. With `export_format` (a format zygote, forked from a zygote): load what a run
    of that format loads before its first export child instead (`exporters.upstream.exporter_ready`)."""
    with open("/proc/self/comm", "w") as comm:
        comm.write(FORMAT_ZYGOTE_NAME if export_format else ZYGOTE_NAME)
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        if export_format:
            from exporters.upstream import exporter_ready  # imported by STAGE2 (the pipeline) already

            facts = {**_recorded(lambda: exporter_ready(export_format)), "ok": True}
        else:
            facts = {**_preload(STAGE2), "ok": True}
    except BaseException as err:  # noqa: BLE001  (said to the launcher, which starts the call without us)
        pair.sendall((json.dumps({"ok": False, "error": repr(err)}) + "\n").encode())
        os._exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    facts["origins"] = {name: sys.modules[name].__spec__.origin for name in facts["packages"]
                        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is not None
                        and str(sys.modules[name].__spec__.origin or "").startswith(str(ROOT) + os.sep)}
    facts["threads"] = threading.active_count()
    pair.sendall((json.dumps(facts) + "\n").encode())
    child = serve(pair, None, None if export_format else _Zygotes(by_format=True),
                  f"zygote-{export_format}" if export_format else "zygote")
    if child is None:
        os._exit(0)  # its calls have ended: nothing to flush, and the stack's teardown would cost ~1 CPU s
    if child[0] == "zygote":
        become_zygote(*child[1:], export_format=child[1]["format"])
    else:
        become_cli(*child[1:])  # then this process ends as the CLI's does


def serve(source: socket.socket, lifeline: int | None, zygotes: _Zygotes | None,
          stage: str = "base") -> tuple | None:
    """Answer calls from `source` until the client ends (EOF on `lifeline`; a zygote's `source` is its pair with the
    launcher, whose EOF ends it once its running calls have ended). Returns only in a forked process: ("call",
    request, fds) in a call's child, ("zygote", request, pair) in a new zygote."""
    selector = selectors.DefaultSelector()
    selector.register(source, selectors.EVENT_READ, "call")
    if lifeline is not None:
        selector.register(lifeline, selectors.EVENT_READ, "lifeline")
    # pid -> (pidfd, pid, connection, the call's fds 0/1/2: held until the child is reaped, so the client's pipes end
    # only once it has been, as a cold child's do when its parent has waited for it)
    children: dict[int, tuple[int, int, socket.socket, list[int]]] = {}
    # calls whose child (in its own process group) ends with its client, and what it started (`"leave": "kill"`: a
    # run's proof, whose run kills the shim's process group at its timeout)
    killed_on_leave: set[int] = set()
    served, draining = 0, False

    def close_inherited(*more: int) -> None:
        for pidfd, _, other, held in children.values():
            os.close(pidfd)
            other.close()
            for fd in held:
                os.close(fd)
        for fd in [*(zygotes.fds() if zygotes else []), *more]:
            os.close(fd)
        selector.close()
        source.close()
        if lifeline is not None:
            os.close(lifeline)

    while not (draining and not children):
        for key, _ in selector.select():
            kind = key.data
            if kind == "lifeline" and not os.read(lifeline, 1):
                return None
            if kind == "call":
                connection = None if lifeline is None else source.accept()[0]
                try:
                    if connection is None:  # a zygote: the launcher passes the client's connection first
                        request, fds = _receive(source, 4)
                        connection, fds = socket.socket(fileno=fds[0]), fds[1:]
                    else:
                        request, fds = _receive(connection)
                except (OSError, ValueError, EOFError) as err:
                    if lifeline is None and isinstance(err, EOFError):  # told to end: the running calls first
                        selector.unregister(source)
                        draining = True
                        continue
                    print(f"bad request: {err!r}", file=sys.stderr, flush=True)
                    if connection is not None:
                        connection.close()
                    continue
                zygote = None
                if zygotes is not None and zygotes.eligible(request):
                    zygote = zygotes.find(request)
                    if zygote is None:
                        pid, pair = _start_zygote(request)
                        if pid is None:
                            close_inherited(connection.detach(), *fds)
                            return "zygote", request, pair
                        facts = _zygote_facts(pair)
                        zygote = _Zygote(pid, pair, request["env"], facts,
                                         request["format"] if zygotes.by_format else "") if facts else None
                        if zygote is None:
                            pair.close()
                            os.waitpid(pid, 0)
                        else:
                            zygotes.add(zygote, selector)
                    if zygote is not None and not zygote.imports_alike(request):
                        zygote = None
                if zygote is not None:
                    zygote.forward(connection, request, fds)
                    connection.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                served += 1
                pid = os.fork()
                if pid == 0:
                    close_inherited(connection.detach())
                    return "call", request, fds
                pidfd = os.pidfd_open(pid)
                children[pid] = (pidfd, pid, connection, fds)
                if request.get("leave") == "kill":
                    killed_on_leave.add(pid)
                selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
                selector.register(connection, selectors.EVENT_READ, ("asks", pid))
                _send(connection, f"{pid} {stage}:{served}\n")
            elif isinstance(kind, tuple) and kind[0] == "zygote":
                zygotes.reap(kind[1], selector)
            elif isinstance(kind, tuple) and kind[1] in children:
                pidfd, pid, connection, held = children[kind[1]]
                if kind[0] == "asks":
                    try:
                        asked = connection.recv(64)
                    except OSError:
                        asked = b""
                    if asked.startswith(b"kill") or (not asked and pid in killed_on_leave):
                        _kill(pid, pid in killed_on_leave)  # not reaped yet: the pid is still the child's
                    if not asked:
                        selector.unregister(connection)  # the client left; the child runs on unless killed
                    continue
                _, status = os.waitpid(pid, 0)
                selector.unregister(pidfd)
                if connection.fileno() in selector.get_map():
                    selector.unregister(connection)
                os.close(pidfd)
                for fd in held:
                    os.close(fd)
                _send(connection, f"{os.waitstatus_to_exitcode(status)}\n")
                connection.close()
                del children[pid]
                killed_on_leave.discard(pid)
    return None


def _kill(pid: int, group: bool) -> None:
    """Kill the call's child `pid` (not reaped yet), with its process group where it leads one (`group`)."""
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
            return
    except ProcessLookupError:  # it has not made its group yet: itself only
        pass
    os.kill(pid, signal.SIGKILL)


def _send(connection: socket.socket, text: str) -> None:
    try:
        connection.sendall(text.encode())
    except OSError:
        pass  # the client left (its test timed out or ended): nothing to tell


def become_cli(request: dict, fds: list[int]) -> None:
    """In the forked child: take the call's fds, cwd, environment and argv, then run `python -m exporters.cli` (or
    the call's module, or its code as `python -c` does). A call that ends with its client (`"leave": "kill"`) leads
    its own process group, which the launcher kills; one that asks for `"teardown"` ends as the interpreter ends a
    cold `python -c` (the code's own ending aside), its modules freed."""
    if request.get("leave") == "kill":
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    launcher_entries = _entries(os.environ.get(PATH_KEY), ROOT)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    code = request.get("code")
    # what `-m` puts first ('' for `-c`), then the call's PYTHONPATH in place of the launcher's (cold_reason: none
    # shadows the preload)
    rest = [entry for entry in sys.path[1:] if entry not in launcher_entries]
    sys.path[:] = ["" if code is not None else os.getcwd(), *_entries(os.environ.get(PATH_KEY), os.getcwd()), *rest]
    importlib.invalidate_caches()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()  # a cold interpreter seeds numpy's global generator afresh
    if "random" in sys.modules:
        sys.modules["random"].seed()  # and Python's
    module = request.get("module", MODULE)
    sys.orig_argv = _command(request["args"], module, code)
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    if code is not None:
        _run_code(code, request["args"], main_module)
        if not request.get("teardown"):
            end_without_teardown()  # the code ran to its end (an exception or `sys.exit` raised past this line)
        return
    sys.argv = ["", *request["args"]]  # runpy puts the module's path first, as `-m` does
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


def _run_code(code: str, args: list[str], main_module: types.ModuleType) -> None:
    """`python -c code *args` in this process: `__main__` as `-c` makes it, the code compiled as `<string>`, an
    uncaught exception reported from the code's own frame on (exit code 1)."""
    sys.argv = ["-c", *args]
    main_module.__dict__.update(__loader__=importlib.machinery.BuiltinImporter, __spec__=None, __package__=None,
                                __annotations__={})
    try:
        exec(compile(code, "<string>", "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001  (as the interpreter reports it)
        err.__traceback__ = err.__traceback__.tb_next  # this frame is not the code's
        sys.excepthook(type(err), err, err.__traceback__)
        raise SystemExit(1) from None


def main() -> None:
    """`python -m tests.cli_launcher SOCKET LIFELINE_FD [PRELOAD [CODE]]`: preload (`PRELOADS`: the CLI's stack, the
    side environment's runtimes or this one's), run CODE (Python source), say so on stdout, serve."""
    socket_path, lifeline = sys.argv[1], int(sys.argv[2])
    modules, code = PRELOADS[sys.argv[3] if len(sys.argv) > 3 else "cli"], sys.argv[4] if len(sys.argv) > 4 else ""
    facts = _recorded(lambda: ([__import__(module) for module in modules], exec(code, {}) if code else None))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    facts["threads"] = threading.active_count()
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    child = serve(listener, lifeline, _Zygotes())
    if child is None:
        os._exit(0)  # the client has ended; the stack's teardown would only cost CPU
    if child[0] == "zygote":
        become_zygote(*child[1:])
    else:
        become_cli(*child[1:])


if __name__ == "__main__":
    main()

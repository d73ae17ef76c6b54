"""Proven where it is deployed: each target folder is loaded, alone, by the runtime its layout is for (the ExecuTorch
LLM runner, ONNX Runtime GenAI, ...), which runs it; the report's "runs in" column says what each one showed.

```
before the eager model is released          beside our own checks of the artifact, kept where those passed
check.reference(model, context) ──────────► check.prove(directory, reference, context) ──► RuntimeProof
(eager tokens for the runtime's prompt)     (the runtime's own code, from the folder alone)
```

The proofs run in a thread while validation runs its own checks ([`ProofsInFlight`]): each runtime works in a child
process, so the two overlap on the cores; a target whose own checks failed keeps no proof (its children are ended).

A runtime child ([`run_in_child`]) runs the runtime's code on a folder nobody vouched for, so it is held short: its
environment is an allow-list (`child_environment`: the paths, locale, temporary folder and thread settings a runtime
reads; never a token, a secret, a key or a password, whatever the name), its memory is limited by the folder's size
(`memory_limit`: `RLIMIT_DATA`, the heap and every private writable mapping, at `MEMORY_FLOOR_BYTES` plus
`MEMORY_PER_FOLDER_BYTE` times the folder's bytes; not `RLIMIT_AS`, which counts the virtual space runtimes and CUDA
reserve without using it), and it is killed, with everything it started, past the target's timeout.

A runtime check is registered in `RUNTIME_CHECKS`; `checks_for` picks those whose layout the target has. A proof is
`passed` (the runtime ran it and matched eager), `failed` (the runtime refused or ran it differently, with the
runtime's own message: the target fails) or `unverified` (the runtime cannot run here, e.g. it is not installed or
needs a GPU: said in the column, never called a pass).

Example:
    >>> RuntimeProof("ONNX Runtime GenAI", "passed", "8/8 tokens").to_dict()
    {'runtime': 'ONNX Runtime GenAI', 'status': 'passed', 'detail': '8/8 tokens'}
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from exporters.errors import describe_error, recoverable
from exporters.redact import secret_name
from exporters.recipe.model import Recipe, Target
from exporters.validate.folder_trust import screen_folder

ProofStatus = Literal["passed", "failed", "unverified"]
CHILD_TIMEOUT_S = 3600.0  # a target without a timeout of its own (the run's default per target)
MEMORY_FLOOR_BYTES = 2 << 30  # Python and the runtime's own libraries (the measured children: 120-370 MB of data)
MEMORY_PER_FOLDER_BYTE = 4  # the weights loaded (ONNX Runtime copies external data), the arena and activations
# What a runtime child's environment may hold (`child_environment`), and what it never holds whatever the name
CHILD_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
                       "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
                       "PYTHONUNBUFFERED", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
CHILD_ENV_PREFIXES = ("LC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_")
OUT_OF_MEMORY = re.compile(r"MemoryError|bad_alloc|Cannot allocate memory|out of memory|failed to allocate",
                           re.IGNORECASE)


@dataclass
class RuntimeProof:
    """What one deployment runtime showed for a target folder."""

    runtime: str
    status: ProofStatus
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RuntimeContext:
    """What a runtime check may read: the target, its recipe, the model's kind and the eager side's inputs."""

    target: Target
    recipe: Recipe
    family: str
    generate_inputs: dict[str, Any]
    generation_config: Any = None
    source_dir: Path | None = None  # the model folder (tokenizer and processor files), read as data only

    @property
    def timeout_s(self) -> float:
        """How long a runtime's child may run: the target's timeout (a run sets it on the planned target: the
        recipe's, else `--timeout`, else the default)."""
        return float(getattr(self.target, "timeout", None) or CHILD_TIMEOUT_S)


def child_timeout(context: RuntimeContext | None) -> float:
    """The seconds a runtime's child may run for `context` (`RuntimeContext.timeout_s`); the default without one."""
    return context.timeout_s if context is not None else float(CHILD_TIMEOUT_S)


class RuntimeCheck(Protocol):
    """A deployment runtime's proof of one layout. A runtime that executes from a config in the folder names it in
    an `executes` attribute (GenAI: `genai_config.json`): it applies only where this run's export wrote that file
    (`folder_trust.may_read`)."""

    runtime: str

    def applies(self, target: Target, directory: Path) -> bool:
        """Whether the target's layout is one this runtime loads."""

    def may_apply(self, target: Target, components: list[str]) -> bool:
        """Before the folder exists: whether the target, with the components it is to have, can have a layout this
        runtime loads. True wherever `applies` can be, so the references computed ahead of the artifact cover every
        check that will apply."""

    def reference(self, model: Any, context: RuntimeContext) -> Any:
        """The eager side (computed before the model is released)."""

    def prove(self, directory: Path, reference: Any, context: RuntimeContext) -> RuntimeProof:
        """Load `directory` alone in the runtime's own code, run it, compare with `reference`."""


RUNTIME_CHECKS: list[RuntimeCheck] = []


def register_runtime_check(check: RuntimeCheck) -> RuntimeCheck:
    """Add a runtime check (each runtime's module registers its own)."""
    RUNTIME_CHECKS.append(check)
    return check


def checks_for(target: Target, directory: Path) -> list[RuntimeCheck]:
    """The registered checks that apply to the target's layout."""
    return [check for check in RUNTIME_CHECKS if check.applies(target, directory)]


def checks_possible(target: Target, components: list[str]) -> list[RuntimeCheck]:
    """The registered checks that may apply to the target once it is exported with `components` (a superset of
    `checks_for`)."""
    return [check for check in RUNTIME_CHECKS if check.may_apply(target, components)]


def runtimes_applying(targets: list[Target]) -> Callable[[str, Path], list[str]]:
    """For merging matrix legs (`exporters.report.aggregate`): (target name, its folder) -> the runtimes whose
    registered check applies to the planned target of that name in that folder (none for a name not planned). A
    leg's proof of any other runtime is not merged. The checks register when `exporters.validate.checks` is
    imported."""
    planned = {target.name: target for target in targets}

    def applying(name: str, directory: Path) -> list[str]:
        target = planned.get(name)
        return [] if target is None else [check.runtime for check in checks_for(target, directory)]

    return applying


def references_for(checks: list[RuntimeCheck], model: Any, context: RuntimeContext) -> list[tuple[RuntimeCheck, Any]]:
    """Each check with its eager reference (an exception is kept as the reference: its proof then fails)."""
    pairs = []
    for check in checks:
        try:
            pairs.append((check, check.reference(model, context)))
        except BaseException as err:  # the eager side failed (a tokenizer's panic too): the proof says so
            if not recoverable(err):
                raise
            pairs.append((check, err))
    return pairs


def prove_all(pairs: list[tuple[RuntimeCheck, Any]], directory: Path, context: RuntimeContext,
              cancelled: threading.Event | None = None) -> list[RuntimeProof]:
    """Every runtime's proof of `directory`; a runtime that raises fails with its own message. The folder is
    resolved first: a runtime runs in a child whose cwd is a scratch folder (`run_in_child`), where a relative
    `--out` would miss. A folder `folder_trust.screen_folder` refuses is proven by none. Once `cancelled` is set, no
    further proof starts."""
    directory = directory.resolve()
    # whoever calls: no runtime reads a link, a native library or a key that loads code (folder_trust)
    refused = screen_folder(directory) if pairs else []
    if refused:
        return [RuntimeProof(check.runtime, "failed", "not run: " + "; ".join(refused)) for check, _ in pairs]
    proofs = []
    for check, reference in pairs:
        if cancelled is not None and cancelled.is_set():
            break
        if isinstance(reference, BaseException):
            proofs.append(RuntimeProof(check.runtime, "failed", f"eager reference: {describe_error(reference)}"))
            continue
        try:
            proofs.append(check.prove(directory, reference, context))
        except BaseException as err:
            if not recoverable(err):
                raise
            proofs.append(RuntimeProof(check.runtime, "failed", describe_error(err)))
    return proofs



class ProofsInFlight:
    """`prove_all` in a thread, started before validation's own checks of the artifact and collected after them
    (`result`): the runtimes' children and our checks share the cores instead of taking turns. `cancel` (also on
    leaving a `with` block) ends the proofs where the target's own checks failed: no further proof starts and the
    running child is killed.

    Example:
        >>> with ProofsInFlight([], Path("."), None) as proofs:
        ...     proofs.result()
        []
    """

    def __init__(self, pairs: list[tuple[RuntimeCheck, Any]], directory: Path, context: RuntimeContext) -> None:
        self._proofs: list[RuntimeProof] = []
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._prove, args=(pairs, directory, context), daemon=True,
                                        name="runtime-proofs")
        self._thread.start()

    def _prove(self, pairs: list[tuple[RuntimeCheck, Any]], directory: Path, context: RuntimeContext) -> None:
        self._proofs = prove_all(pairs, directory, context, self._cancelled)

    def result(self) -> list[RuntimeProof]:
        """Every proof, once the last runtime finished."""
        self._thread.join()
        return self._proofs

    def cancel(self) -> None:
        """End the proofs (a no-op once they finished): none starts, the running child is killed."""
        self._cancelled.set()
        while self._thread.is_alive():  # a child started just as the flag was set is killed on the next turn
            child = _CHILDREN.get(self._thread.ident)
            if child is not None:
                _kill_group(child)
            self._thread.join(timeout=0.2)

    def __enter__(self) -> ProofsInFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


_CHILDREN: dict[int | None, subprocess.Popen] = {}  # the runtime child each proving thread waits on


def run_in_child(code: str, spec: dict[str, Any], *, folder: Path | None = None,
                 timeout_s: float = CHILD_TIMEOUT_S) -> tuple[Any, str]:
    """Run a runtime's own code in a child Python (a native crash or a hang there ends the proof, not the run):
    `code` reads `json.loads(sys.argv[1])` (`spec` plus `"result"`, a path) and writes its JSON answer there.

    The child holds no secret (`child_environment`), may use `memory_limit(folder)` bytes, and is killed with its
    process group after `timeout_s` seconds.

    Returns `(answer, "")`, or `(None, why)` with the child's own error lines.

    Example:
        >>> run_in_child("import json, sys; s = json.loads(sys.argv[1]); json.dump(s['x'] * 2, open(s['result'], 'w'))",
        ...              {"x": 21})
        (42, '')
    """
    limit = memory_limit(folder)
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        # the limit is the child's first statement (hard and soft: what runs after it cannot raise it)
        first = f"import resource; resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit}))\n"
        command = [sys.executable, "-c", first + code, json.dumps({**spec, "result": str(result)})]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=scratch,
                              env=child_environment(), start_new_session=True) as run:
            _CHILDREN[threading.get_ident()] = run
            try:
                _, stderr = run.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(run)
                run.communicate()
                return None, f"it did not finish in {timeout_s:g} s (the target's timeout) and was killed"
            finally:
                _CHILDREN.pop(threading.get_ident(), None)
        if run.returncode != 0 or not result.is_file():
            why = child_message(stderr) or f"exit status {run.returncode}"
            if OUT_OF_MEMORY.search(stderr):
                why = (f"it ran out of memory: a runtime child may use {limit >> 20} MiB ({MEMORY_FLOOR_BYTES >> 20} "
                       f"MiB and {MEMORY_PER_FOLDER_BYTE}x the folder's {_folder_bytes(folder) >> 20} MiB): {why}")
            return None, why
        return json.loads(result.read_text()), ""


def child_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a runtime child: the allow-listed variables of `environ` (default `os.environ`: paths,
    locale, temporary folder, thread settings), never one whose name says token, secret, key, password, credential or
    auth (`HF_TOKEN`, `GITHUB_TOKEN`, `WEBHOOK_SECRET`, `AWS_SECRET_ACCESS_KEY`...).

    Example:
        >>> child_environment({"PATH": "/usr/bin", "HF_TOKEN": "hf_x", "OMP_NUM_THREADS": "2", "OMP_API_KEY": "k"})
        {'PATH': '/usr/bin', 'OMP_NUM_THREADS': '2'}
    """
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if (name in CHILD_ENV or name.startswith(CHILD_ENV_PREFIXES)) and not secret_name(name)}


def memory_limit(folder: Path | None) -> int:
    """The bytes of data (`RLIMIT_DATA`) a runtime child may use on `folder`: `MEMORY_FLOOR_BYTES` plus
    `MEMORY_PER_FOLDER_BYTE` times the folder's bytes.

    Example:
        >>> memory_limit(None) == MEMORY_FLOOR_BYTES
        True
    """
    return MEMORY_FLOOR_BYTES + MEMORY_PER_FOLDER_BYTE * _folder_bytes(folder)


def _folder_bytes(folder: Path | None) -> int:
    """The bytes of the files under `folder` (links not followed)."""
    if folder is None:
        return 0
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _kill_group(run: subprocess.Popen) -> None:
    """Kill a runtime child and whatever it started (its own process group)."""
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        run.kill()


def child_message(stderr: str) -> str:
    """A runtime's own error lines (ExecuTorch logs `E ...` / `[file:line] ...`, Python a traceback), else the
    last lines."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if " E " in f" {line}" or "Error" in line or "error" in line or "Missing" in line]
    return " | ".join((errors or lines)[-4:])[:600]

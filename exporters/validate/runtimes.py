"""Proven where it is deployed: each target folder is loaded, alone, by the runtime its layout is for (the ExecuTorch
LLM runner, ONNX Runtime GenAI, ...), which runs it; the report's "runs in" column says what each one showed.

```
before the eager model is released          beside our own checks of the artifact, kept where those passed
check.reference(model, context) ──────────► check.prove(directory, reference, context) ──► RuntimeProof
(eager tokens for the runtime's prompt)     (the runtime's own code, from the folder alone)
```

The proofs run in a thread while validation runs its own checks ([`ProofsInFlight`]): each runtime works in a child
process, so the two overlap on the cores; a target whose own checks failed keeps no proof (its children are ended).

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
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from exporters.errors import describe_error
from exporters.recipe.model import Recipe, Target

ProofStatus = Literal["passed", "failed", "unverified"]
CHILD_TIMEOUT_S = 600


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


class RuntimeCheck(Protocol):
    """A deployment runtime's proof of one layout."""

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
        except Exception as err:  # the eager side failed: the proof says so
            pairs.append((check, err))
    return pairs


def prove_all(pairs: list[tuple[RuntimeCheck, Any]], directory: Path, context: RuntimeContext,
              cancelled: threading.Event | None = None) -> list[RuntimeProof]:
    """Every runtime's proof of `directory`; a runtime that raises fails with its own message. The folder is
    resolved first: a runtime runs in a child whose cwd is a scratch folder (`run_in_child`), where a relative
    `--out` would miss. Once `cancelled` is set, no further proof starts."""
    directory = directory.resolve()
    proofs = []
    for check, reference in pairs:
        if cancelled is not None and cancelled.is_set():
            break
        if isinstance(reference, Exception):
            proofs.append(RuntimeProof(check.runtime, "failed", f"eager reference: {describe_error(reference)}"))
            continue
        try:
            proofs.append(check.prove(directory, reference, context))
        except Exception as err:
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
                child.kill()
            self._thread.join(timeout=0.2)

    def __enter__(self) -> ProofsInFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


_CHILDREN: dict[int | None, subprocess.Popen] = {}  # the runtime child each proving thread waits on


def run_in_child(code: str, spec: dict[str, Any], timeout_s: int = CHILD_TIMEOUT_S) -> tuple[Any, str]:
    """Run a runtime's own code in a child Python (a native crash or a hang there ends the proof, not the run):
    `code` reads `json.loads(sys.argv[1])` (`spec` plus `"result"`, a path) and writes its JSON answer there.

    Returns `(answer, "")`, or `(None, why)` with the child's own error lines.

    Example:
        >>> run_in_child("import json, sys; s = json.loads(sys.argv[1]); json.dump(s['x'] * 2, open(s['result'], 'w'))",
        ...              {"x": 21})
        (42, '')
    """
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        command = [sys.executable, "-c", code, json.dumps({**spec, "result": str(result)})]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=scratch) as run:
            _CHILDREN[threading.get_ident()] = run
            try:
                _, stderr = run.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                run.kill()
                run.communicate()
                return None, f"it did not finish in {timeout_s} s"
            finally:
                _CHILDREN.pop(threading.get_ident(), None)
        if run.returncode != 0 or not result.is_file():
            return None, child_message(stderr) or f"exit status {run.returncode}"
        return json.loads(result.read_text()), ""


def child_message(stderr: str) -> str:
    """A runtime's own error lines (ExecuTorch logs `E ...` / `[file:line] ...`, Python a traceback), else the
    last lines."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if " E " in f" {line}" or "Error" in line or "error" in line or "Missing" in line]
    return " | ".join((errors or lines)[-4:])[:600]

"""Proven where it is deployed: each target folder is loaded, alone, by the runtime its layout is for (the ExecuTorch
LLM runner, ONNX Runtime GenAI, ...), which runs it; the report's "runs in" column says what each one showed.

```
before the eager model is released          beside our own checks of the artifact, kept where those passed
check.reference(model, context) ──────────► check.prove(directory, reference, context) ──► RuntimeProof
(eager tokens for the runtime's prompt)     (the runtime's own code, from the folder alone)
```

The proofs run in a thread while validation runs its own checks ([`ProofsInFlight`]): each runtime works in a child
process, so the two overlap on the cores; a target whose own checks failed keeps no proof (its children are ended).

Each runtime works in a child held short (`exporters.layouts.child`: an allow-listed environment, a memory limit
from the folder's size, the target's timeout). Each proof is a layout's (`exporters.layouts.LAYOUTS`, registered
there once); `checks_for` picks those whose layout the target has. A proof is
`passed` (the runtime ran it and matched eager), `failed` (the runtime refused or ran it differently, with the
runtime's own message: the target fails) or `unverified` (the runtime cannot run here, e.g. it is not installed or
needs a GPU: said in the column, never called a pass). A generating runtime's proof counts the new tokens it compared
of those asked (`RuntimeProof.compared`, `asked`): eager and the runtime are both made to generate the full count
where the runtime can be told to go on past eos; where it cannot and generation ended early, the detail is flagged
("⚠ 5 of 8 tokens compared (...)"), and a proof over fewer than two tokens is `unverified` (`RuntimeProof.judged`).

Example:
    >>> RuntimeProof("ONNX Runtime GenAI", "passed", "8/8 tokens").to_dict()
    {'runtime': 'ONNX Runtime GenAI', 'status': 'passed', 'detail': '8/8 tokens'}
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from exporters.errors import describe_error, recoverable
from exporters.layouts import LAYOUTS, Layout, RuntimeContext, RuntimeProof, components_in, kill_child_of
from exporters.recipe.model import Target
from exporters.validate.folder_trust import screen_folder

RuntimeCheck = Layout  # a runtime's proof is its layout's (exporters.layouts.base.Layout)


def checks_for(target: Target, directory: Path) -> list[RuntimeCheck]:
    """The registered checks that apply to the target's layout (and whose runtime can take the model)."""
    return [check for check in LAYOUTS if check.applies(target, directory) and not check.declines(target, directory)]


def declined(target: Target, directory: Path) -> list[RuntimeProof]:
    """A `declined` proof for each layout the target would have whose runtime cannot take the model (a family,
    cache kind or tokenizer kind it does not hold, a graph it cannot feed: `Layout.declines`, asked where
    `Layout.may_decline`), with the reason; the artifact's own verdict stands."""
    components = list(components_in(directory))
    return [RuntimeProof(layout.runtime, "declined", f"cannot take this model: {why}") for layout in LAYOUTS
            if layout.may_decline(target, components) and (why := layout.declines(target, directory))]


def checks_possible(target: Target, components: list[str]) -> list[RuntimeCheck]:
    """The registered checks that may apply to the target once it is exported with `components` (a superset of
    `checks_for`)."""
    return [check for check in LAYOUTS if check.may_apply(target, components)]


def runtimes_applying(targets: list[Target]) -> Callable[[str, Path], list[str]]:
    """For merging matrix legs (`exporters.report.aggregate`): (target name, its folder) -> the runtimes whose
    layout applies to the planned target of that name in that folder (none for a name not planned). A leg's proof of
    any other runtime is not merged."""
    planned = {target.name: target for target in targets}

    def applying(name: str, directory: Path) -> list[str]:
        target = planned.get(name)
        if target is None:
            return []
        return [check.runtime for check in checks_for(target, directory)] + \
            [proof.runtime for proof in declined(target, directory)]

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
            proofs.append(check.prove(directory, reference, context).judged())  # a short proof flagged, once
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
            kill_child_of(self._thread.ident)
            self._thread.join(timeout=0.2)

    def __enter__(self) -> ProofsInFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()



"""Every error the library raises, one hierarchy by cause, each saying what to fix.

```
ExportActionError
├── RecipeError          a recipe is invalid (JSON path + line; `problems` lists every one)
│   ├── JsonPositionError  the text is not JSON
│   └── ShapeSpecError   a dynamic-shape entry does not fit the model's inputs
├── RemoteCodeError      the model or an artifact needs code from its folder, and that was not allowed
├── ModelSourceError     the model cannot be found or read
├── DeviceError          the requested device is not here
├── MemoryPlanError      the run's estimated peak memory does not fit what is available
├── ArtifactError        an artifact folder cannot be loaded (or would run code to load)
├── UnsupportedModelError  the model's inputs or stages cannot be prepared (says what is missing)
├── EagerStageError      a parity check through the graphs ran a module with eager weights
├── DecodeStepError      a generation decode can run one step and never a second
├── TargetPlanError      a target's settings do not fit this model (a merged graph for an encoder-decoder)
├── PublishError         publishing to the Hub failed
├── InitError            `hf-export init` found no format that exports and validates
└── AggregateError       report parts of a split run cannot be merged
```

Native code can fail in a way no `except Exception` catches: a Rust extension (tokenizers, safetensors) that panics
raises pyo3's `PanicException`, a `BaseException`. [`recoverable`] says which failures a guard around native code
(a runtime proof, a tokenizer, an ONNX Runtime session, an ExecuTorch loader) turns into a failed target: every
`Exception` and a native panic, never `KeyboardInterrupt` or `SystemExit`.

The library speaks no front end's language: an error that a setting can fix names the setting in backticks
(`` `trust_remote_code` ``) and carries it as `option`; the CLI, the Action and the bot word it for their users with
[`ExportActionError.worded`].

Example:
    >>> err = RemoteCodeError("acme/x needs code from its repo; allow it with `trust_remote_code`",
    ...                       option="trust_remote_code")
    >>> err.worded({"trust_remote_code": "--trust-remote-code"})
    'acme/x needs code from its repo; allow it with --trust-remote-code'
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AggregateError",
    "ArtifactError",
    "DecodeStepError",
    "DeviceError",
    "EagerStageError",
    "ExportActionError",
    "InitError",
    "JsonPositionError",
    "MemoryPlanError",
    "ModelSourceError",
    "PublishError",
    "RecipeError",
    "RecipeProblem",
    "RemoteCodeError",
    "ShapeSpecError",
    "UnsupportedModelError",
    "TargetPlanError",
    "describe_error",
    "error_line",
    "error_record",
    "first_line",
    "recoverable",
    "recovering",
    "render_root_cause",
    "root_cause",
    "upstream_cause",
    "without_ansi",
]


class ExportActionError(Exception):
    """Base class for the errors of this package.

    Args:
        message: what went wrong and what to do; a setting is named in backticks.
        option: the setting that fixes it (`trust_remote_code`, `target`, `config`, `repo_id`, `token`...), if any.
    """

    def __init__(self, message: str = "", *, option: str | None = None):
        self.message = message
        self.option = option
        super().__init__(message)

    def __str__(self) -> str:
        return self.message

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with the option written the way a front end spells it (`--trust-remote-code`)."""
        text = str(self)
        for option, spelled in names.items():
            text = text.replace(f"`{option}`", spelled)
        return text


@dataclass(frozen=True)
class RecipeProblem:
    """One problem in a recipe: where (JSON `path`, 1-based `line`) and what.

    Example:
        >>> RecipeProblem("$.exports[0].opset", 7, "unknown key 'opset'").render()
        "line 7, $.exports[0].opset: unknown key 'opset'"
    """

    path: str
    line: int | None
    message: str

    def render(self) -> str:
        """`line N, PATH: message` (the form every front end prints)."""
        where = f"line {self.line}, " if self.line else ""
        return f"{where}{self.path}: {self.message}"


class RecipeError(ExportActionError):
    """An export recipe is invalid.

    Carries where the problem is: `file`, the JSON `path` (like `$.exports[0].opset_version`) and the 1-based `line`
    in that file, so the message points straight at the line to fix. `problems` lists every problem found (the first
    one is also `path`/`line`/`message`).

    Example:
        >>> err = RecipeError("unknown key 'opset'; did you mean 'opset_version'?", path="$.exports[0].opset", line=7)
        >>> str(err)
        "$.exports[0].opset (line 7): unknown key 'opset'; did you mean 'opset_version'?"
        >>> [p.render() for p in err.problems]
        ["line 7, $.exports[0].opset: unknown key 'opset'; did you mean 'opset_version'?"]
    """

    def __init__(self, message: str, *, path: str = "$", line: int | None = None, file: str | None = None,
                 problems: list[RecipeProblem] | None = None, option: str | None = None):
        self.path = path
        self.line = line
        self.file = file
        self.problems: list[RecipeProblem] = problems or [RecipeProblem(path, line, message)]
        super().__init__(message, option=option)

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f" (line {self.line})"
        if self.file:
            where = f"{self.file}: {where}"
        return f"{where}: {self.message}"


class JsonPositionError(RecipeError):
    """The recipe text is not valid JSON; `line` and `column` are 1-based."""

    def __init__(self, message: str, line: int, column: int):
        self.column = column
        super().__init__(f"{message} (line {line}, column {column})", line=line)


class ShapeSpecError(RecipeError):
    """A dynamic-shape entry of the recipe does not fit the model's inputs (`path` names the entry)."""


class RemoteCodeError(ExportActionError):
    """The model (`auto_map`) or an artifact folder needs code from its files, and the operator did not allow it."""


class ModelSourceError(ExportActionError):
    """The model could not be found or read (missing folder, repo, revision or config)."""


class DeviceError(ExportActionError):
    """The requested device is not available here (a `cuda` target on a machine without a GPU)."""


class MemoryPlanError(ExportActionError):
    """The run's estimated peak memory does not fit what is available, even one export at a time; raised before the
    model is loaded (`exporters.run.memory_plan`). The message names the need, the memory available and what to
    change."""


class ArtifactError(ExportActionError):
    """An artifact folder cannot be loaded: no manifest, unknown files, or files whose loading would run code; or an
    export `init` handed over is not the one it signed (exporters.run.handover: exported again)."""


class TargetPlanError(ExportActionError):
    """A target's settings do not fit this model: a merged graph for a model without a key-value cache or with
    several graphs, a layout for a component set it cannot hold."""


class PublishError(ExportActionError):
    """Publishing to the Hub failed; the message says what to do (and never holds the token).

    `retryable`: trying again later may succeed (the Hub or the network failed, a concurrent push moved the PR);
    False when it will not fix itself (401/403/404, an invalid repo id, a run too large to publish). `status` is the
    Hub's HTTP status, when there was one.
    """

    def __init__(self, message: str = "", *, option: str | None = None, retryable: bool = False,
                 status: int | None = None):
        self.retryable = retryable
        self.status = status
        super().__init__(message, option=option)


class AggregateError(ExportActionError):
    """The report parts of a split run cannot be merged: none found, unreadable, or from different models, commits
    or recipes."""


class InitError(ExportActionError):
    """`hf-export init` could not export and validate any of the requested formats; `result` (an `InitResult`)
    holds each format's reason."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class EagerStageError(ExportActionError):
    """A parity check through exported graphs ran a module with eager weights that is not an exported stage (the
    comparison would be meaningless); the message names the module."""


class UnsupportedModelError(ExportActionError):
    """The model cannot be prepared for export: no sample-input layout for its family and no processor in the
    folder, or a structure this tool does not know. The message names what is missing."""


def root_cause(err: BaseException) -> BaseException:
    """The innermost exception of `err`'s chain (`__cause__`, else an implicit `__context__`)."""
    seen = {id(err)}
    while True:
        inner = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
        if inner is None or id(inner) in seen:
            return err
        seen.add(id(inner))
        err = inner


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
# Failures whose cause is upstream, by what their message says: (pattern, what to say, upstream issue or gap)
UPSTREAM_CAUSES = (
    # aten::erfinv, and torch.onnx's decomposition of it, prims.erf_inv
    (re.compile(r"erf_?inv", re.I), "`aten::erfinv` has no ONNX operator and no ExecuTorch kernel",
     "docs/upstream-gaps.md #45"),
    (re.compile(r"complex(64|128|float|double)|view_as_complex|view_as_real|aten[.:]+polar|aten[.:]+complex", re.I),
     "complex-number RoPE (`torch.polar`, `view_as_complex`): ExecuTorch has no kernels for complex tensors "
     "(`view_as_complex_copy`); torch 2.13's ONNX exporter takes them", "pytorch/pytorch#126972, onnx/onnx#4785; "
     "docs/upstream-gaps.md #45"),
)


def without_ansi(text: str) -> str:
    """`text` without terminal colour and cursor codes (some runtimes colour their errors).

    Example:
        >>> without_ansi("\x1b[31mKernelCall failed\x1b[0m")
        'KernelCall failed'
    """
    return _ANSI.sub("", str(text))


def upstream_cause(message: str) -> str | None:
    """What a failure's message shows to be upstream's, with the operator and the upstream issue; None otherwise.

    Example:
        >>> upstream_cause("Exporting the operator 'aten::erfinv' to ONNX is not supported")
        'upstream: `aten::erfinv` has no ONNX operator and no ExecuTorch kernel (docs/upstream-gaps.md #45)'
    """
    for pattern, what, where in UPSTREAM_CAUSES:
        if pattern.search(message):
            return f"upstream: {what} ({where})"
    return None


def describe_error(err: BaseException, limit: int = 2000) -> str:
    """`Type: message`, with the root cause appended when a wrapper hides it; cut to `limit` characters.

    Example:
        >>> try:
        ...     try:
        ...         raise ValueError("bos_token_id has to be defined")
        ...     except ValueError as inner:
        ...         raise RuntimeError("capture failed") from inner
        ... except RuntimeError as err:
        ...     describe_error(err)
        'RuntimeError: capture failed [root cause: ValueError: bos_token_id has to be defined]'
    """
    text = f"{type(err).__name__}: {err}"
    cause = root_cause(err)
    if cause is not err and str(cause).strip()[:200] not in text:
        text += f" [root cause: {type(cause).__name__}: {cause}]"
    notes = getattr(err, "__notes__", None)  # what the runtime printed (exporters.validate.native_log), for one
    if notes:
        text += f" ({'; '.join(str(note) for note in notes)})"
    text = without_ansi(text)
    return text if len(text) < limit else text[:limit] + " …"


class DecodeStepError(ExportActionError):
    """A generation target's decode could run one step and never a second (its cache length would be fixed at the
    traced size); the message names the recipe change that fixes it."""


def error_record(err: BaseException, *, prefix: str = "", limit: int = 2000) -> dict[str, Any]:
    """The error as report.json records it: `type` and `message` of the exception raised, and, when a wrapper hides
    it, `root_cause` (the innermost exception's `type` and `message`), kept apart so no cut of a long message can
    lose it.

    Example:
        >>> try:
        ...     try:
        ...         raise ValueError("Image features and image tokens do not match")
        ...     except ValueError as inner:
        ...         raise RuntimeError("Make sure the inputs are compatible with model.generate()") from inner
        ... except RuntimeError as err:
        ...     record = error_record(err)
        >>> record["root_cause"]
        {'type': 'ValueError', 'message': 'Image features and image tokens do not match'}
    """
    text = without_ansi(f"{prefix}{err}")
    record: dict[str, Any] = {"type": type(err).__name__, "message": text if len(text) < limit else text[:limit] + " …"}
    cause = root_cause(err)
    message = ""
    if cause is not err:
        message = without_ansi(str(cause))
        record["root_cause"] = {"type": type(cause).__name__,
                                "message": message if len(message) < limit else message[:limit] + " …"}
    upstream = upstream_cause(f"{text} {message}")
    if upstream:  # said where every reader of the message sees it (report.md, the card, the CLI)
        record["upstream"] = upstream
        record["message"] += f" [{upstream}]"
    return record


def first_line(message: str, limit: int = 300) -> str:
    """The first whole line of `message`, what a one-line summary shows: a line that ends with a colon introduces
    the next one and takes it along (`GenerationConfig is invalid:` then what is wrong), a list marker is dropped;
    longer than `limit`, it is cut at the last sentence end in its second half, else at the last space, and ends
    with ` …` (never mid-word; the whole message is in the log).

    Example:
        >>> first_line("GenerationConfig is invalid: \\n- `temperature`: set `do_sample=True`.\\nIf you're using ...")
        'GenerationConfig is invalid: `temperature`: set `do_sample=True`.'
        >>> first_line("You should set `do_sample=True` or unset `temperature` in the file.", limit=40)
        'You should set `do_sample=True` or …'
    """
    lines = [line.strip() for line in without_ansi(message).splitlines() if line.strip()]
    line = lines.pop(0) if lines else ""
    while line.endswith(":") and lines:
        line = f"{line} {lines.pop(0).lstrip('-*• ').strip()}"
    if len(line) <= limit:
        return line
    head = line[:limit - 1]
    end = max(head.rfind(". "), head.rfind("; "))
    if end >= limit // 2:
        return head[:end + 1] + " …"
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).rstrip(" ,;:-") + " …"


def error_line(error: Mapping[str, Any] | None, limit: int = 300) -> str:
    """A recorded error ([`error_record`]) in one whole line: `Type: ` and the first line of its message, then
    ` — root cause: Type: ` and the root cause's first line when the wrapper hides it (never when the wrapper's
    message already says it), or ` — hint: ` and what to change when the message carries our `hint:` line; an
    upstream cause ([`upstream_cause`]) comes first. The full message and traceback are in the target's log.

    Example:
        >>> error_line({"type": "ValueError", "message": "GenerationConfig is invalid: \\n- bad `top_p`\\n\\nFix it.",
        ...             "root_cause": {"type": "ValueError", "message": "GenerationConfig is invalid: \\n- bad `top_p`"}})
        'ValueError: GenerationConfig is invalid: bad `top_p`'
        >>> error_line({"type": "RuntimeError", "message": "capture failed",
        ...             "root_cause": {"type": "ValueError", "message": "bos_token_id has to be defined"}})
        'RuntimeError: capture failed — root cause: ValueError: bos_token_id has to be defined'
        >>> error_line({"type": "RuntimeError", "message": "failed [upstream: no erfinv]", "upstream": "upstream: no erfinv"})
        'upstream: no erfinv — RuntimeError: failed'
    """
    error = error or {}
    if upstream := error.get("upstream"):  # said first: a long message's cut would lose it at its end
        rest = {**error, "upstream": None, "message": str(error.get("message") or "").removesuffix(f" [{upstream}]")}
        return f"{upstream} — {error_line(rest, max(60, limit - len(upstream) - 3))}"
    message = str(error.get("message") or "no message; see the log")
    hint = next((line.strip() for line in message.splitlines() if line.strip().startswith("hint: ")), "")
    if hint and not message.startswith("hint: "):  # ours: what to change, said after the upstream message
        said = first_line(hint, limit * 3 // 4)  # what to change comes first for the room; the message takes the rest
        return f"{error.get('type') or 'Error'}: {first_line(message, max(60, limit - len(said) - 3))} — {said}"
    cause = error.get("root_cause")
    said = first_line(cause.get("message") or "", limit) if isinstance(cause, Mapping) else ""
    if not said or said in first_line(message, len(message)) or said in " ".join(message.split()):
        return f"{error.get('type') or 'Error'}: {first_line(message, limit)}"
    return (f"{error.get('type') or 'Error'}: {first_line(message, limit * 2 // 5)} — root cause: "
            f"{cause.get('type')}: {first_line(str(cause.get('message')), limit * 3 // 5)}")


def render_root_cause(error: Mapping[str, Any] | None) -> str:
    """`root cause: Type: message` for a recorded error that has one, else ''."""
    cause = (error or {}).get("root_cause")
    if not isinstance(cause, Mapping):
        return ""
    return f"root cause: {cause.get('type')}: {cause.get('message')}"


def recoverable(err: BaseException) -> bool:
    """Whether a guard around native code turns `err` into a failure of its target: every `Exception`, and a panic
    of a Rust extension (pyo3's `PanicException`, a `BaseException`: each extension has its own class, all named
    `PanicException` in the module `pyo3_runtime`); never `KeyboardInterrupt`, `SystemExit` or `GeneratorExit`.

    Used as `except BaseException as err: if not recoverable(err): raise`.

    Example:
        >>> recoverable(ValueError("bad")), recoverable(KeyboardInterrupt()), recoverable(SystemExit(1))
        (True, False, False)
        >>> PanicException = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})
        >>> recoverable(PanicException("Onig: Regex search error: retry-limit-in-match over"))
        True
    """
    if isinstance(err, Exception):
        return True
    if isinstance(err, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return False
    return any(cls.__name__ == "PanicException" and cls.__module__ == "pyo3_runtime" for cls in type(err).__mro__)


@dataclass
class Recovered:
    """What a [`recovering`] block caught: the error, or None when it finished."""

    error: BaseException | None = None


@contextmanager
def recovering() -> Iterator[Recovered]:
    """A guard around native code: an error [`recoverable`] accepts ends the block and is kept (`.error`); any other
    (`KeyboardInterrupt`, `SystemExit`) goes on.

    Example:
        >>> with recovering() as guard:
        ...     raise ValueError("the tokenizer panicked")
        >>> describe_error(guard.error)
        'ValueError: the tokenizer panicked'
    """
    guard = Recovered()
    try:
        yield guard
    except BaseException as err:
        if not recoverable(err):
            raise
        guard.error = err

"""GitHub Actions workflow commands (stdout), step outputs (`GITHUB_OUTPUT`) and the job summary
(`GITHUB_STEP_SUMMARY`), with the runner's escaping rules.

Text that did not come from the Action itself (upstream's logs, model code, error messages, the Hub's answers) is
printed inside `untrusted()`: between `::stop-commands::<random token>` and `::<token>::` the runner obeys no
workflow command, so a `::error::`, `::add-mask::` or `::set-output` line inside a log is shown, never run.

Example:
    >>> escape_data("50% done\\nnext")
    '50%25 done%0Anext'
    >>> escape_property("a,b:c")
    'a%2Cb%3Ac'
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from exporters.report.markdown import close_fences

SUMMARY_LIMIT = 1024 * 1024  # bytes the runner accepts per step summary
SUMMARY_NOTE = "\n\n> [!NOTE]\n> The summary was truncated to GitHub's 1 MiB limit; the full report is `report.md`.\n"


def escape_data(value: str) -> str:
    """Escape a command's message: `%`, CR and LF."""
    return str(value).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """Escape a command property (`file=`, `title=`...): also `:` and `,`."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def command(name: str, message: str = "", **properties: object) -> str:
    """One workflow command line, e.g. `::error file=a.json,line=3::bad`."""
    props = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items()
                     if value is not None and value != "")
    return f"::{name}{' ' + props if props else ''}::{escape_data(message)}"


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def error(message: str, *, file: str | None = None, line: int | None = None, title: str | None = None) -> None:
    emit(command("error", message, file=file, line=line, title=title))


def warning(message: str, *, file: str | None = None, line: int | None = None, title: str | None = None) -> None:
    emit(command("warning", message, file=file, line=line, title=title))


def notice(message: str, *, title: str | None = None) -> None:
    emit(command("notice", message, title=title))


def add_mask(value: str | None) -> None:
    """Ask the runner to hide `value` in every later log line (each line of a multi-line secret too)."""
    if not value:
        return
    for part in {value, *value.splitlines()}:
        if part.strip():
            emit(f"::add-mask::{escape_data(part)}")


@contextlib.contextmanager
def group(title: str) -> Iterator[None]:
    """A collapsible log section (groups do not nest on GitHub)."""
    sys.stderr.flush()
    emit(f"::group::{escape_data(title)}")
    try:
        yield
    finally:
        sys.stderr.flush()
        emit("::endgroup::")


@contextlib.contextmanager
def untrusted() -> Iterator[None]:
    """Print inside: the runner obeys no workflow command until the block ends (a fresh random token each time, so
    the text cannot end the block early)."""
    token = secrets.token_hex(16)
    sys.stderr.flush()
    emit(f"::stop-commands::{token}")
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        emit(f"::{token}::")


def format_outputs(outputs: Mapping[str, str]) -> str:
    """`name=value` lines, or `name<<DELIMITER` blocks for values with line breaks (always for JSON documents)."""
    chunks = []
    for name, value in outputs.items():
        value = "" if value is None else str(value)
        if "\n" in value or "\r" in value or name.endswith("json"):
            delimiter = f"ghadelimiter_{uuid.uuid4()}"
            while delimiter in value:  # practically never; keep the block unambiguous anyway
                delimiter = f"ghadelimiter_{uuid.uuid4()}"
            chunks.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            chunks.append(f"{name}={value}\n")
    return "".join(chunks)


def set_outputs(path: Path | None, outputs: Mapping[str, str]) -> None:
    """Append step outputs to the `GITHUB_OUTPUT` file (nothing outside a runner)."""
    if path is None:
        return
    with path.open("a", encoding="utf-8") as handle:
        handle.write(format_outputs(outputs))


def truncate_summary(markdown: str, limit: int = SUMMARY_LIMIT) -> str:
    """`markdown` cut to `limit` bytes with a note; a code fence the cut leaves open is closed first."""
    data = markdown.encode("utf-8")
    if len(data) <= limit:
        return markdown
    room = limit - len(SUMMARY_NOTE.encode("utf-8"))
    closed = close_fences(data[:room].decode("utf-8", errors="ignore"))
    extra = len(closed.encode()) - room
    if extra > 0:  # the closing fence must fit too
        closed = close_fences(data[:room - extra - 1].decode("utf-8", errors="ignore"))
    return closed + SUMMARY_NOTE


def write_summary(path: Path | None, markdown: str) -> None:
    """Append Markdown to the job summary, cut to 1 MiB with a note."""
    if path is None:
        return
    used = path.stat().st_size if path.exists() else 0
    with path.open("a", encoding="utf-8") as handle:
        handle.write(truncate_summary(markdown, max(SUMMARY_LIMIT - used, len(SUMMARY_NOTE.encode()))))

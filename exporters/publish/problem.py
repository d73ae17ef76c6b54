"""When a repo cannot be exported at all, its owner hears it in one discussion: the recipe does not parse or
validate, the model cannot be loaded, or loading it would run code from the repo and that was not allowed.

```
RecipeError | ModelSourceError | RemoteCodeError | DeviceError ──► Problem ──► OUT/problem.json (hf-export run, exit 2)
Problem + the commit ──► report_problem ──► decide (the slot of a failed run's report) ──► open | update | unchanged
                                                                                          | superseded
a run that passes (publish_report), or close_failure_discussions ──► the discussion closed with a comment
```

The discussion shares the slot of a failed export's report (kind `failure`, the recipe, the base branch), so a repo
holds at most one open thread saying "this does not export", whatever the cause: a later run updates it (the
description is rewritten, a comment notifies watchers), the same problem at the same commit changes nothing, and the
first run that passes closes it. Each recipe problem is listed with its JSON path and line, the line linked to the
file at that commit (`{endpoint}/{repo}/blob/{sha}/export_config.json#L7`), then what to do.

The texts speak no front end's language: options stay in backticks unless the caller passes `names` (how it spells
them), and `notes` are the caller's own lines (e.g. a bot saying how to stop it).

Example:
    >>> from exporters.errors import RecipeError, RecipeProblem
    >>> err = RecipeError("unknown key 'dynamik'", path="$.dynamik", line=3, file="/tmp/x/export_config.json")
    >>> problem = problem_from_error(err)
    >>> problem.kind, problem.file, problem.lines()
    ('recipe', 'export_config.json', ["line 3, $.dynamik: unknown key 'dynamik'"])
    >>> line_url("https://huggingface.co", "org/m", "a" * 40, "export_config.json", 3)[-26:]
    'aaaa/export_config.json#L3'
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from exporters.errors import (
    DeviceError,
    ExportActionError,
    ModelSourceError,
    RecipeError,
    RecipeProblem,
    RemoteCodeError,
)
from exporters.publish import texts
from exporters.publish.decide import decide, in_slot
from exporters.publish.destination import check_repo_id
from exporters.publish.hub import HubClient
from exporters.publish.markers import render_marker
from exporters.publish.plan import KIND_FAILURE, MARKER_VERSION
from exporters.publish.run import PublishResult, settle_duplicate, thread_links, write_json
from exporters.redact import scrub
from exporters.report.markdown import cell, inert

PROBLEM_FILE = "problem.json"
ProblemKind = Literal["recipe", "model", "remote_code", "device", "resources"]
_KINDS: tuple[tuple[type[ExportActionError], ProblemKind], ...] = (
    (RecipeError, "recipe"), (RemoteCodeError, "remote_code"), (ModelSourceError, "model"), (DeviceError, "device"))
HEADLINES: dict[str, str] = {
    "recipe": "the recipe `{file}` is invalid",
    "model": "the model cannot be loaded",
    "remote_code": "loading the model would run code from its repo, which is not allowed here",
    "device": "the recipe asks for a device the exporter does not have",
    "resources": "the export needs a larger machine than this exporter may use",
}
WHAT_TO_DO: dict[str, str] = {
    "recipe": "fix the lines above and {push} (`hf-export check {file}` checks a recipe on your machine; "
              "the recipe format: the JSON Schema `export_config.schema.json` and `docs/recipe.md` of export-action).",
    "model": "make sure the model loads with `transformers` at this commit (`config.json`, the weights), then "
             "{push}.",
    "remote_code": "a model with its own code (`auto_map` in `config.json`) is exported only where running that code "
                   "was allowed (`trust_remote_code`): ask for it, or use an architecture `transformers` ships.",
    "device": "make the recipe's targets run on the CPU (`device`), or export on a machine with the device.",
    "resources": "export fewer or smaller targets (a `dtype` of half the width, one target per run), or ask the "
                 "exporter's operator for a larger machine.",
}


@dataclass(frozen=True)
class Problem:
    """Why a repo could not be exported at all. `message` is the library's (options in backticks, `option` names
    the one that fixes it); a recipe problem also has the recipe's `file` name and every `problems` entry (JSON path,
    line, message)."""

    kind: ProblemKind
    message: str
    option: str | None = None
    file: str | None = None
    problems: tuple[RecipeProblem, ...] = field(default=())

    @property
    def headline(self) -> str:
        """E.g. "the recipe `export_config.json` is invalid"."""
        return HEADLINES[self.kind].format(file=self.file or "export_config.json")

    def lines(self, names: Mapping[str, str] | None = None) -> list[str]:
        """One line per problem (`line N, PATH: message` for a recipe), options worded with `names`."""
        rendered = [p.render() for p in self.problems] if self.problems else [self.message]
        return [_worded(text, names) for text in rendered]

    def scrubbed(self, secrets: Iterable[str] = ()) -> Problem:
        """This problem with `secrets`, and anything shaped like a token, removed from every message."""
        return replace(self, message=scrub(self.message, secrets),
                       problems=tuple(replace(p, message=scrub(p.message, secrets)) for p in self.problems))

    @property
    def fingerprint(self) -> str:
        """Same problem, same fingerprint (what `decide` compares, with the commit, to leave a discussion as is)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "option": self.option, "file": self.file,
                "problems": [{"path": p.path, "line": p.line, "message": p.message} for p in self.problems]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """The inverse of `to_dict`; `ValueError` when `data` is not one."""
        if data.get("kind") not in HEADLINES or not isinstance(data.get("message"), str):
            raise ValueError(f"not a problem record: {str(data)[:200]}")
        problems = tuple(RecipeProblem(str(p["path"]), p.get("line") if isinstance(p.get("line"), int) else None,
                                       str(p["message"])) for p in data.get("problems") or [])
        return cls(data["kind"], data["message"], data.get("option"), data.get("file"), problems)


def problem_from_error(err: BaseException) -> Problem | None:
    """The `Problem` an error stands for (None: not one that stops a repo from being exported at all)."""
    for error_type, kind in _KINDS:
        if isinstance(err, error_type):
            assert isinstance(err, ExportActionError)
            if isinstance(err, RecipeError):
                return Problem(kind, err.message, err.option, Path(err.file).name if err.file else None,
                               tuple(err.problems))
            return Problem(kind, err.message, err.option)
    return None


def write_problem(out_dir: Path, problem: Problem) -> None:
    """`OUT/problem.json` (replaced atomically): what stopped a run before anything was exported."""
    write_json(Path(out_dir), PROBLEM_FILE, {**problem.to_dict(), "schema_version": 1})


def read_problem(out_dir: Path) -> Problem | None:
    """`OUT/problem.json` as written by `write_problem`; None when there is none (or it is not one)."""
    path = Path(out_dir) / PROBLEM_FILE
    try:
        return Problem.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _worded(text: str, names: Mapping[str, str] | None) -> str:
    return ExportActionError(text).worded(names) if names else text


_PLAIN_PATH = re.compile(r"[\w$.\[\]*\- ]+")


def _code(text: str) -> str:
    """`text` (a JSON path) as an inline code span fit for a table cell (nothing inside can close it or split the
    row); a path holding anything else than names, indexes and wildcards (a hostile key: `<`, `@`, a link) as inert
    plain text instead (`markdown.inert`), whatever a renderer does with mentions or HTML inside code spans."""
    flat = " ".join(str(text).split())[:200]
    if not _PLAIN_PATH.fullmatch(flat):
        return inert(flat, 200)
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}".replace("|", "\\|")


def line_url(endpoint: str, repo_id: str, commit: str, file: str, line: int | None) -> str:
    """Where a line of a repo's file is shown on the Hub, at one commit."""
    anchor = f"#L{line}" if line else ""
    return f"{endpoint.rstrip('/')}/{repo_id}/blob/{commit}/{quote(file)}{anchor}"


def problem_marker(problem: Problem, source_sha: str, *, base: str = "main", recipe: str = "repo") -> dict[str, Any]:
    """The marker of a problem discussion: the failure slot, the commit, and the problem's fingerprint."""
    return {"v": MARKER_VERSION, "kind": KIND_FAILURE, "recipe": recipe, "base": base, "source_sha": source_sha,
            "problem": problem.kind, "fingerprint": problem.fingerprint}


def problem_title(problem: Problem, source_sha: str) -> str:
    """E.g. `Export blocked: the recipe export_config.json is invalid (source 1a2b3c4)`."""
    return f"Export blocked: {problem.headline.replace('`', '')} (source {source_sha[:7]})"[:200]


def problem_body(problem: Problem, *, file_url: str | None = None, base: str | None = "main",
                 names: Mapping[str, str] | None = None) -> list[str]:
    """What stops the export, in Markdown lines, for every front end (the Hub discussion, the Action's job summary):
    each recipe problem with its JSON path and its line (linked as `{file_url}#L{line}` when the file has an
    address), or the message; then what to do (`base`: the branch to push the fix to; None: not named).

    Example:
        >>> body = problem_body(Problem("model", "no config.json in acme/x"), base=None)
        >>> body[0], body[-1][:40]
        ('> no config.json in acme/x', '**What to do**: make sure the model load')
    """
    lines = []
    if problem.problems:
        lines += ["| line | JSON path | problem |", "|---|---|---|"]
        for entry in problem.problems:
            where = str(entry.line) if entry.line else "–"
            if entry.line and file_url:
                where = f"[{entry.line}]({file_url}#L{entry.line})"
            # the message quotes the recipe (an unknown key is the owner's text): inert, no mention, no image
            lines.append(f"| {where} | {_code(entry.path)} | {inert(_worded(entry.message, names), 500)} |")
    else:
        # the message may quote the repo (its `auto_map` classes, a file name): inert like a recipe's key
        lines.append(f"> {inert(_worded(problem.message, names), 1500)}")
    push = f"push to `{base}`" if base else "push again"
    what = WHAT_TO_DO[problem.kind].format(push=push, file=problem.file or "export_config.json")
    return [*lines, "", f"**What to do**: {_worded(what, names)}"]


def problem_description(problem: Problem, *, repo_id: str, source_sha: str, endpoint: str, base: str = "main",
                        names: Mapping[str, str] | None = None, notes: Sequence[str] | None = None) -> str:
    """The discussion's text: what stops the export (`problem_body`, each recipe line linked to the file at the
    commit), that the discussion follows later runs, the caller's `notes` (default: `texts.NOTES`), the marker."""
    file_url = line_url(endpoint, repo_id, source_sha, problem.file, None) if problem.file else None
    lines = [f"**export-action cannot export `{repo_id}` at `{source_sha[:7]}`**: {problem.headline}. Nothing was "
             "exported or published.", "", *problem_body(problem, file_url=file_url, base=base, names=names), "",
             f"This discussion is updated by later runs, and closed once an export of `{base}` passes.", ""]
    lines += [*(texts.NOTES if notes is None else notes)]
    return "\n".join([*lines, "", render_marker(problem_marker(problem, source_sha, base=base))])


def report_problem(repo_id: str, problem: Problem, *, source_sha: str, token: str | None = None,
                   endpoint: str | None = None, base: str = "main", names: Mapping[str, str] | None = None,
                   notes: Sequence[str] | None = None) -> PublishResult:
    """Tell `repo_id` that it cannot be exported at `source_sha`: open the failure discussion, or update the open one
    (description rewritten, a comment for watchers); `unchanged` when it already says this about this commit,
    `superseded` when a newer commit's thread or a newer export exists. Raises `PublishError`.

    Example:
        >>> result = report_problem("org/model", problem, source_sha=sha, token=os.environ["HF_TOKEN"])  # doctest: +SKIP
        >>> result.operation, result.discussion_url  # doctest: +SKIP
        ('discussion', 'https://huggingface.co/org/model/discussions/4')
    """
    check_repo_id(repo_id)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    me = hub.whoami()
    marker = problem_marker(problem, source_sha, base=base)
    title = problem_title(problem, source_sha)
    text = problem_description(problem, repo_id=repo_id, source_sha=source_sha, endpoint=hub.api.endpoint, base=base,
                               names=names, notes=notes)

    def attempt(dedupe: bool) -> PublishResult:
        decision = decide(marker, hub.view_at(source_sha, base, me))
        if decision.operation in ("superseded", "unchanged"):
            links = thread_links(decision.thread) if decision.thread else {}
            return PublishResult(decision.operation, message=decision.reason, **links)
        if decision.thread is not None:
            thread = decision.thread
            hub.refresh(thread, title, text)
            hub.comment(thread.num, f"Still blocked at source `{source_sha[:7]}`: {cell(problem.headline, 200)}. "
                                    "The description above is updated.")
            return PublishResult("discussion", discussion_url=thread.url,
                                 message=f"updated discussion #{thread.num}: {problem.headline}")
        created = hub.call("open a discussion", hub.api.create_discussion, repo_id, title, description=text)
        if dedupe and settle_duplicate(hub, me, created.num, marker, "failure report") is not None:
            return attempt(dedupe=False)
        return PublishResult("discussion", discussion_url=created.url,
                             message=f"opened discussion #{created.num}: {problem.headline}")

    return attempt(dedupe=True)


def close_failure_discussions(repo_id: str, *, comment: str, token: str | None = None, endpoint: str | None = None,
                              base: str = "main", recipe: str = "repo") -> list[int]:
    """Close our open failure discussions of the slot (a problem, or a failed run's report) with `comment`, e.g. when
    the repo moved back to inputs that were exported already. The numbers closed. Raises `PublishError`."""
    check_repo_id(repo_id)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    view = hub.view_at(None, base, hub.whoami())
    slot = {"kind": KIND_FAILURE, "recipe": recipe, "base": base}
    closed = []
    for thread in in_slot(view, slot):
        if thread.is_open:
            hub.close(thread.num, comment)
            closed.append(thread.num)
    return closed


__all__ = ["PROBLEM_FILE", "Problem", "close_failure_discussions", "line_url", "problem_body",
           "problem_description", "problem_from_error", "problem_marker", "problem_title", "read_problem", "report_problem", "write_problem"]

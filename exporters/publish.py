"""Publish a run's validated artifacts to the Hub as a pull request (or its failure report as a discussion).

```
OUT/report.json ──► plan (files, card section, title, text, marker) ──► find our open PR ──► create / update / nothing
```

What goes into the model repo (one commit per run, on `refs/pr/N`):

- `exports/<target>/...`: the artifacts of every passing target, loadable with
  `ExportedModel.from_pretrained(repo, revision="refs/pr/N", subfolder="exports/<target>", trust_remote_code=True)`;
- `exports/report.json`, `exports/report.md`: the validation report;
- `README.md`: an "Exports" section between `<!-- export-action:exports:start -->` and
  `<!-- export-action:exports:end -->`, replaced on every run (YAML front matter and the rest of the card untouched);
- stale files under `exports/` (a target removed from the recipe) are deleted, so the PR mirrors the run.

**Identity.** Each PR or discussion this tool opens carries a hidden marker (an HTML comment) in its description:
`<!-- export-action:publish {"kind": ..., "recipe": ..., "base": ..., "source_sha": ..., ...} -->`. A *slot* is
(repo, account, kind, recipe, base branch): kind is `exports` (a PR) or `failure` (a discussion), recipe is `repo` for
the model's own recipe (`export_config.json` or `config.json`'s `export_config`) and the file name for any other
recipe file, base is the branch the PR targets. A slot holds at most one open thread: a recipe *change* updates the
same PR. Only threads opened by the token's account (whoami) count: another account's PR is never touched.

**What happens** (`PublishResult.operation`):

- `created`: no open PR in the slot: a PR is opened with one commit.
- `updated`: the open PR's fingerprint differs (source sha, recipe sha256, tool versions, cache keys, targets): a
  commit is pushed to its `refs/pr/N`, its title and description are refreshed (the first comment is edited; when
  editing is refused, the new report is added as a comment instead).
- `unchanged`: same fingerprint as the open PR (or as the newest merged/closed one: a PR the owner closed is not
  reopened for the same inputs): nothing is written.
- `discussion`: the run failed (and `publish_failed` is off, or no target passed): no artifact is pushed; the report
  is posted as a discussion, or the open one is updated (description edited, plus a short comment). An open exports
  PR of the slot gets a comment pointing to it.
- `none`: a dry run: nothing is written; `PublishResult.plan` holds what would be pushed.

When a run passes, open failure discussions of the slot are closed with a comment that links the PR.
The token never appears in messages or errors: every Hub error is re-raised as `PublishError` with the token
scrubbed, saying what to do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, TypeVar

from .errors import PublishError
from .redact import scrub
from .report import human_size, variants_table

EXPORTS_DIR = "exports"
CARD_START = "<!-- export-action:exports:start -->"
CARD_END = "<!-- export-action:exports:end -->"
MARKER_TAG = "export-action:publish"
MARKER_VERSION = 1
KIND_EXPORTS, KIND_FAILURE = "exports", "failure"
OWN_RECIPE_FILES = ("export_config.json", "config.json")
OPEN_STATUSES = ("open", "draft")
FINGERPRINT_KEYS = ("source_sha", "weights_sha256", "recipe_sha256", "versions", "cache_keys", "published", "failed")
_MARKER_RE = re.compile(r"<!--\s*" + re.escape(MARKER_TAG) + r"\s+(\{.*?\})\s*-->", re.S)
# Formats whose programs are pickled (torch.export .pt2): loading them runs code, so it needs trust_remote_code.
_NEEDS_TRUST = ("dynamo",)
# The report part of a PR / discussion text: room is left for the summary and the marker under the Hub's limit.
DESCRIPTION_REPORT_LIMIT = 55_000

T = TypeVar("T")


@dataclass
class PlannedFile:
    """One file of the commit: `path_in_repo`, and where its bytes come from (`local` file or generated text)."""

    path_in_repo: str
    size: int
    local: Path | None = None
    sha256: str | None = None
    note: str = ""


@dataclass
class PublishPlan:
    """What a publish would push: computed from OUT/report.json alone (no network).

    Example:
        >>> plan = plan_publish("org/model", Path("out"))  # doctest: +SKIP
        >>> print(plan.render())  # doctest: +SKIP
    """

    repo_id: str
    kind: str  # "exports" (a pull request) or "failure" (a discussion)
    base: str
    title: str
    report: dict[str, Any]
    markdown: str
    published: list[str]
    failed: list[str]
    files: list[PlannedFile]
    marker: dict[str, Any]
    card_section: str = ""
    deletions: list[str] = field(default_factory=list)
    action: str = ""  # filled by a dry run: what would happen

    @property
    def is_pull_request(self) -> bool:
        return self.kind == KIND_EXPORTS

    def description(self, pr_num: int | None = None) -> str:
        """The PR / discussion text: a summary, the report, the hidden marker."""
        if self.is_pull_request:
            return pr_description(self, pr_num)
        return failure_description(self)

    def render(self) -> str:
        """A readable plan: the action, the title, every file with its size, then the PR or discussion text."""
        what = "pull request" if self.is_pull_request else "discussion (no artifacts: the run failed)"
        lines = [f"Publish plan for {self.repo_id} ({what} against {self.base})"]
        if self.action:
            lines.append(f"  action: {self.action}")
        lines.append(f"  title:  {self.title}")
        if self.is_pull_request:
            total = sum(f.size for f in self.files)
            lines.append(f"  files:  {len(self.files) + 1} to upload ({human_size(total)} + README.md)")
            width = max((len(f.path_in_repo) for f in self.files), default=10)
            for planned in self.files:
                lines.append(f"    {planned.path_in_repo:<{width}}  {human_size(planned.size):>9}  {planned.note}".rstrip())
            lines.append(f"    {'README.md':<{width}}  {'':>9}  model card: the Exports section is replaced")
            for path in self.deletions:
                lines.append(f"    {path:<{width}}  {'':>9}  deleted (not in this run)")
        lines += ["", "----- description -----", self.description(), "----- end -----"]
        return "\n".join(lines)


@dataclass
class PublishResult:
    """What `publish_report` did.

    `operation` is one of "created" | "updated" | "unchanged" | "discussion" | "none" (see the module docstring);
    `message` is one human sentence; `plan` is what was (or, on a dry run, would be) pushed.
    """

    operation: str  # "created" | "updated" | "unchanged" | "discussion" | "none"
    pr_url: str | None = None
    pr_num: int | None = None
    discussion_url: str | None = None
    commit: str | None = None
    message: str = ""  # one human sentence: what happened
    plan: PublishPlan | None = field(default=None, repr=False, compare=False)


# ── Reading the run ───────────────────────────────────────────────────────────


def load_report(out_dir: Path) -> tuple[dict[str, Any], str]:
    """`OUT/report.json` and `OUT/report.md`, as `run_pipeline` wrote them."""
    out_dir = Path(out_dir)
    try:
        report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
        markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise PublishError(
            f"{err.filename} is missing: run the export first (`hf-export run MODEL --out {out_dir}`)"
        ) from None
    except ValueError as err:
        raise PublishError(f"{out_dir / 'report.json'} is not valid JSON ({err}): run the export again") from None
    for key in ("status", "targets", "recipe", "versions", "source"):
        if key not in report:
            raise PublishError(f"{out_dir / 'report.json'} has no {key!r}: it was not written by `hf-export run`")
    return report, markdown


def recipe_identity(report: dict[str, Any]) -> str:
    """`repo` for the model's own recipe, else the recipe file's name (a separate PR slot)."""
    name = str(report["recipe"].get("file") or "")
    return "repo" if name in OWN_RECIPE_FILES else name


def short_sha(report: dict[str, Any]) -> str:
    """The source commit, 7 characters (`local` for a run on a local folder)."""
    revision = report["source"].get("revision")
    return revision[:7] if revision else "local"


def _target_files(report: dict[str, Any], out_dir: Path, name: str) -> list[PlannedFile]:
    target = next(t for t in report["targets"] if t["name"] == name)
    files = []
    for entry in target.get("files") or []:
        relative = PurePosixPath(Path(entry["path"]).as_posix())
        if relative.parts[:1] != (name,) or ".." in relative.parts:
            raise PublishError(f"report.json lists {entry['path']!r} for target {name!r}: run the export again")
        local = out_dir / Path(*relative.parts)
        if not local.is_file() or local.stat().st_size != entry["size"]:
            raise PublishError(
                f"{local} is missing or changed since it was validated: run the export again before publishing"
            )
        files.append(PlannedFile(f"{EXPORTS_DIR}/{relative}", entry["size"], local, entry.get("sha256")))
    if not files:
        raise PublishError(f"target {name!r} passed but report.json lists no files for it: run the export again")
    return files


def plan_publish(repo_id: str, out_dir: Path, *, publish_failed: bool = False, revision: str = "main") -> PublishPlan:
    """The plan for publishing `out_dir`'s run to `repo_id`: computed from the report alone, nothing is sent.

    Example:
        >>> plan = plan_publish("org/model", Path("out"))  # doctest: +SKIP
        >>> [f.path_in_repo for f in plan.files][:2]  # doctest: +SKIP
        ['exports/dynamo/config.json', 'exports/dynamo/decode.pt2']
    """
    out_dir = Path(out_dir)
    report, markdown = load_report(out_dir)
    passing = [t["name"] for t in report["targets"] if t["status"] == "passed"]
    failed = [t["name"] for t in report["targets"] if t["status"] != "passed"]
    as_pr = bool(passing) and (not failed or publish_failed)
    published = passing if as_pr else []
    files: list[PlannedFile] = []
    for name in published:
        files += _target_files(report, out_dir, name)
    if as_pr:
        for name in ("report.json", "report.md"):
            local = out_dir / name
            files.append(PlannedFile(f"{EXPORTS_DIR}/{name}", local.stat().st_size, local, note="validation report"))
    kind = KIND_EXPORTS if as_pr else KIND_FAILURE
    marker = {
        "v": MARKER_VERSION, "kind": kind, "recipe": recipe_identity(report), "base": revision,
        "source_sha": report["source"].get("revision"), "weights_sha256": report["source"].get("weights_sha256"),
        "recipe_sha256": report["recipe"].get("sha256"), "versions": report["versions"],
        "cache_keys": {t["name"]: t.get("cache_key") for t in report["targets"]},
        "published": published, "failed": failed,
    }
    plan = PublishPlan(
        repo_id=repo_id, kind=kind, base=revision, title="", report=report, markdown=markdown,
        published=published, failed=failed, files=files, marker=marker,
    )
    plan.title = pr_title(plan) if as_pr else failure_title(plan)
    if as_pr:
        plan.card_section = card_section(plan)
    return plan


# ── Texts: marker, titles, descriptions, model card ───────────────────────────


def render_marker(marker: dict[str, Any]) -> str:
    """The hidden marker: an HTML comment holding JSON (`>` escaped, so it can never close the comment).

    Example:
        >>> render_marker({"kind": "exports"})
        '<!-- export-action:publish {"kind": "exports"} -->'
    """
    payload = json.dumps(marker, sort_keys=True).replace(">", "\\u003e")
    return f"<!-- {MARKER_TAG} {payload} -->"


def parse_marker(text: str) -> dict[str, Any] | None:
    """The last marker in `text`, or None.

    Example:
        >>> parse_marker('report... <!-- export-action:publish {"kind": "exports"} -->')
        {'kind': 'exports'}
    """
    found = None
    for match in _MARKER_RE.finditer(text or ""):
        try:
            value = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(value, dict):
            found = value
    return found


def same_slot(marker: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two markers name the same slot (kind, recipe, base branch)."""
    return all(marker.get(key) == other.get(key) for key in ("kind", "recipe", "base"))


def same_fingerprint(marker: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two markers describe the same inputs and outcome (so publishing again would change nothing)."""
    return all(marker.get(key) == other.get(key) for key in FINGERPRINT_KEYS)


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} +{len(names) - 3}"


def pr_title(plan: PublishPlan) -> str:
    """E.g. `Add exports: dynamo, onnx (source 1a2b3c4)`, plus `; failed: x` when failed targets are left out."""
    title = f"Add exports: {_names(plan.published)} (source {short_sha(plan.report)}"
    if plan.failed:
        title += f"; failed: {_names(plan.failed)}"
    return (title + ")")[:200]


def failure_title(plan: PublishPlan) -> str:
    """E.g. `Export failed: onnx (source 1a2b3c4)`."""
    return f"Export failed: {_names(plan.failed) or 'no target'} (source {short_sha(plan.report)})"[:200]


def load_snippet(repo_id: str, target: str, export_format: str, revision: str | None = None) -> str:
    """Python that loads one published target with `transformers.exporters`.

    Example:
        >>> load_snippet("org/model", "onnx", "onnx").splitlines()[-1]
        'model = ExportedModel.from_pretrained("org/model", subfolder="exports/onnx")'
    """
    arguments = [json.dumps(repo_id)]
    if revision:
        arguments.append(f"revision={json.dumps(revision)}")
    arguments.append(f"subfolder={json.dumps(f'{EXPORTS_DIR}/{target}')}")
    if export_format in _NEEDS_TRUST:
        arguments.append("trust_remote_code=True")
    return ("from transformers.exporters import ExportedModel\n\n"
            f"model = ExportedModel.from_pretrained({', '.join(arguments)})")


def _published_targets(plan: PublishPlan) -> list[dict[str, Any]]:
    return [t for t in plan.report["targets"] if t["name"] in plan.published]


def _target_line(target: dict[str, Any]) -> str:
    components = ", ".join(c["name"] for c in target.get("components") or []) or "–"
    return f"{target['export_format']}, {target['mode']} mode: {components}"


def card_section(plan: PublishPlan) -> str:
    """The model card's Exports section, markers included (no dates: the same run gives the same text)."""
    report = plan.report
    lines = [
        CARD_START,
        "## Exports",
        "",
        f"Validated exports of this model, made by export-action from its recipe `{report['recipe']['file']}` "
        f"(source revision `{short_sha(report)}`). Every artifact was checked against the eager model; the "
        f"report is [`{EXPORTS_DIR}/report.md`]({EXPORTS_DIR}/report.md).",
        "",
        *variants_table(report, names=plan.published),
    ]
    for target in _published_targets(plan):
        lines += [f"### `{target['name']}`", "", _target_line(target), "", "```python",
                  load_snippet(plan.repo_id, target["name"], target["export_format"]), "```", ""]
    if any(t["export_format"] in _NEEDS_TRUST for t in _published_targets(plan)):
        lines += ["`trust_remote_code=True` is needed to load `torch.export` programs (`.pt2`, pickled): pass it "
                  "only for exports you trust.", ""]
    lines.append(CARD_END)
    return "\n".join(lines)


def update_model_card(readme: str | None, section: str, title: str = "") -> str:
    """`readme` with its Exports section replaced by `section` (appended when absent; a new card when `readme` is
    None). YAML front matter and everything outside the markers are kept byte for byte. A start marker without an
    end marker runs to the end of the card.

    Example:
        >>> card = update_model_card("---\\nlicense: mit\\n---\\n# M\\n", "<!-- export-action:exports:start -->\\nX\\n"
        ...                          "<!-- export-action:exports:end -->")
        >>> card.startswith("---\\nlicense: mit\\n---\\n# M\\n")
        True
    """
    if readme is None:
        heading = f"# {title}\n\n" if title else ""
        return f"{heading}{section}\n"
    start = readme.find(CARD_START)
    if start == -1:
        separator = "" if not readme or readme.endswith("\n\n") else ("\n" if readme.endswith("\n") else "\n\n")
        return f"{readme}{separator}{section}\n"
    end = readme.find(CARD_END, start)
    tail = readme[end + len(CARD_END):] if end != -1 else "\n"
    return readme[:start] + section + tail


def _summary(plan: PublishPlan) -> str:
    report = plan.report
    source = report["source"]
    where = f"`{source['model']}` @ `{short_sha(report)}`" if source.get("revision") else f"`{source['model']}`"
    return (f"Exports of {where} made by export-action {report['tool'].get('version', '')} from the recipe "
            f"`{report['recipe']['file']}` (sha256 `{str(report['recipe'].get('sha256'))[:12]}`).")


def pr_description(plan: PublishPlan, pr_num: int | None = None) -> str:
    """The PR text: what it adds, how to try it, failed targets (when published anyway), the report, the marker."""
    lines = [_summary(plan), ""]
    lines.append(f"This PR adds `{EXPORTS_DIR}/<target>/` for {', '.join(f'`{n}`' for n in plan.published)}, the "
                 f"validation report (`{EXPORTS_DIR}/report.md`, `{EXPORTS_DIR}/report.json`) and an *Exports* "
                 "section in the model card.")
    if plan.failed:
        lines += ["", f"> [!WARNING]\n> **Not all targets passed**: {', '.join(f'`{n}`' for n in plan.failed)} "
                      "failed and are **not** included (published with `--publish-failed`); see the report below."]
    if plan.published:
        first = next(t for t in _published_targets(plan))
        revision = f"refs/pr/{pr_num}" if pr_num else "refs/pr/<this PR's number>"
        lines += ["", "Try it before merging:", "", "```python",
                  load_snippet(plan.repo_id, first["name"], first["export_format"], revision), "```"]
    lines += ["", "---", "", _report_excerpt(plan.markdown), "", render_marker(plan.marker)]
    return "\n".join(lines)


def _report_excerpt(markdown: str) -> str:
    """report.md, cut to fit a PR description (the full report is published as a file, or kept in OUT)."""
    text = markdown.strip()
    if len(text) <= DESCRIPTION_REPORT_LIMIT:
        return text
    return text[:DESCRIPTION_REPORT_LIMIT] + f"\n\n_Report cut to fit; the full report is `{EXPORTS_DIR}/report.md`._"


def failure_description(plan: PublishPlan) -> str:
    """The failure discussion's text: what failed, that nothing was published, the report, the marker."""
    failed = ", ".join(f"`{n}`" for n in plan.failed) or "no target"
    lines = [_summary(plan), "",
             f"**The export failed** for {failed}: no artifact was published. Fix the recipe or the model and push "
             "again; this discussion is updated by the next run (and closed once the exports pass).",
             "", "---", "", _report_excerpt(plan.markdown), "", render_marker(plan.marker)]
    return "\n".join(lines)


# ── The Hub side ──────────────────────────────────────────────────────────────


@dataclass
class Thread:
    """One of our PRs or discussions carrying a marker."""

    num: int
    is_pull_request: bool
    status: str
    title: str
    url: str
    marker: dict[str, Any]
    description_id: str | None  # the first comment, when it is ours (editable)

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES


def _hint(err: Exception, what: str) -> str:
    status = getattr(getattr(err, "response", None), "status_code", None)
    if type(err).__name__ == "LocalTokenNotFoundError" or status == 401:
        return "pass a valid token with --token or HF_TOKEN (a write token of the account that publishes)"
    if status == 403:
        return f"the token's account is not allowed to {what}: use a token with write access, or ask the repo owner"
    if status == 404:
        return ("check the repo id (--repo-id), the branch, and that the token can see the repo (publishing opens a "
                "PR on an existing repo: create it first)")
    if status == 412:
        return "the PR moved while publishing: run again"
    return "check the endpoint and the network, then run again"


class HubClient:
    """The few `huggingface_hub` calls publishing needs, with errors turned into `PublishError` (token scrubbed)."""

    def __init__(self, repo_id: str, *, token: str | None, endpoint: str | None):
        from huggingface_hub import HfApi

        self.repo_id = repo_id
        self.token = token
        self.api = HfApi(endpoint=endpoint, token=token)

    def call(self, what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)`; any failure becomes a `PublishError` saying what to do."""
        try:
            return function(*args, **kwargs)
        except PublishError:
            raise
        except Exception as err:  # HTTP, token, network and client-side validation errors alike
            message = scrub(f"{type(err).__name__}: {err}", [self.token] if self.token else []).strip().splitlines()
            detail = " ".join(line.strip() for line in message[:3])
            raise PublishError(f"could not {what} on {self.repo_id}: {detail} — {_hint(err, what)}") from None

    def whoami(self) -> str:
        return self.call("identify the token's account", self.api.whoami)["name"]

    def head(self, revision: str) -> tuple[str, list[str]]:
        """The commit `revision` points to, and the files there."""
        info = self.call(f"read {revision}", self.api.model_info, self.repo_id, revision=revision)
        return info.sha, [s.rfilename for s in info.siblings or []]

    def readme(self, commit: str, files: list[str]) -> str | None:
        if "README.md" not in files:
            return None
        path = self.call("download README.md", self.api.hf_hub_download, self.repo_id, "README.md", revision=commit)
        return Path(path).read_text(encoding="utf-8")

    def threads(self, me: str) -> list[Thread]:
        """Our PRs and discussions that carry a marker, newest first."""
        found = []
        listing = self.call("list discussions", lambda: list(self.api.get_repo_discussions(self.repo_id, author=me)))
        for discussion in sorted(listing, key=lambda d: -d.num):
            if discussion.author != me:
                continue
            details = self.call("read a discussion", self.api.get_discussion_details, self.repo_id, discussion.num)
            comments = [e for e in details.events if e.type == "comment" and e.author == me and not e.hidden]
            markers = [m for m in (parse_marker(c.content) for c in comments) if m]
            if not markers:
                continue
            first = next((e for e in details.events if e.type == "comment"), None)
            editable = first.id if first is not None and first.author == me and not first.hidden else None
            found.append(Thread(discussion.num, discussion.is_pull_request, discussion.status, discussion.title,
                                discussion.url, markers[-1], editable))
        return found

    def refresh(self, thread: Thread, title: str, text: str) -> str:
        """Edit the description (else add `text` as a comment) and the title. Returns how it was refreshed."""
        how = "description edited"
        try:
            if thread.description_id is None:
                raise PublishError("the description is not ours to edit")
            self.call("edit the description", self.api.edit_discussion_comment, self.repo_id, thread.num,
                      thread.description_id, text)
        except PublishError:
            self.comment(thread.num, text)
            how = "report added as a comment"
        if title != thread.title:
            self.call("rename the discussion", self.api.rename_discussion, self.repo_id, thread.num, title)
        return how

    def comment(self, num: int, text: str) -> None:
        self.call("comment", self.api.comment_discussion, self.repo_id, num, text)

    def close(self, num: int, comment: str) -> None:
        self.call("close a discussion", self.api.change_discussion_status, self.repo_id, num, "closed",
                  comment=comment)


def _operations(plan: PublishPlan, card: str) -> list[Any]:
    """Additions (artifacts, reports, README.md) and deletions of stale files under exports/."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    operations: list[Any] = []
    for planned in plan.files:
        operation = CommitOperationAdd(planned.path_in_repo, str(planned.local))
        if planned.sha256 and operation.upload_info.sha256.hex() != planned.sha256:
            raise PublishError(f"{planned.local} changed since it was validated (sha256 differs from report.json): "
                               "run the export again before publishing")
        operations.append(operation)
    operations.append(CommitOperationAdd("README.md", card.encode("utf-8")))
    operations += [CommitOperationDelete(path) for path in plan.deletions]
    return operations


def _stale(plan: PublishPlan, files: list[str]) -> list[str]:
    keep = {f.path_in_repo for f in plan.files}
    return sorted(p for p in files if p.startswith(f"{EXPORTS_DIR}/") and p not in keep)


def _commit_message(plan: PublishPlan, verb: str) -> str:
    return f"{verb} exports: {_names(plan.published)} (source {short_sha(plan.report)})"


def _in_slot(threads: list[Thread], plan: PublishPlan, kind: str) -> list[Thread]:
    slot = {**plan.marker, "kind": kind}
    return [t for t in threads if same_slot(t.marker, slot) and t.is_pull_request == (kind == KIND_EXPORTS)]


def _settled(plan: PublishPlan, threads: list[Thread], noun: str) -> PublishResult | None:
    """`unchanged` when the open thread, or the newest closed one, already holds this fingerprint."""
    open_thread = next((t for t in threads if t.is_open), None)
    latest = open_thread or (threads[0] if threads else None)
    if latest is None or not same_fingerprint(latest.marker, plan.marker):
        return None
    state = "" if latest.is_open else f" ({latest.status}; not reopened for the same inputs)"
    message = f"{noun} #{latest.num}{state} already holds this run (same source, recipe and tools): nothing to do"
    if plan.is_pull_request:
        return PublishResult("unchanged", pr_url=latest.url, pr_num=latest.num, message=message, plan=plan)
    return PublishResult("unchanged", discussion_url=latest.url, message=message, plan=plan)


def _publish_pr(hub: HubClient, plan: PublishPlan, threads: list[Thread]) -> PublishResult:
    mine = _in_slot(threads, plan, KIND_EXPORTS)
    settled = _settled(plan, mine, "PR")
    if settled is not None:
        return settled
    open_pr = next((t for t in mine if t.is_open), None)
    ref = f"refs/pr/{open_pr.num}" if open_pr else plan.base
    head, files = hub.head(ref)
    plan.deletions = _stale(plan, files)
    card = update_model_card(hub.readme(head, files), plan.card_section, plan.repo_id.split("/")[-1])
    operations = _operations(plan, card)
    if open_pr is not None:
        info = hub.call(f"push to {ref}", hub.api.create_commit, plan.repo_id, operations,
                        commit_message=_commit_message(plan, "Update"), revision=ref, parent_commit=head)
        how = hub.refresh(open_pr, plan.title, plan.description(open_pr.num))
        return PublishResult("updated", pr_url=open_pr.url, pr_num=open_pr.num, commit=info.oid, plan=plan,
                             message=f"updated PR #{open_pr.num} with commit {info.oid[:7]} ({how})")
    info = hub.call("open a pull request", hub.api.create_commit, plan.repo_id, operations,
                    commit_message=plan.title, commit_description=plan.description(),  # the PR's title and text
                    revision=plan.base, create_pr=True, parent_commit=head)
    if info.pr_num is None:
        return PublishResult("unchanged", commit=info.oid, plan=plan,
                             message=f"{plan.base} already holds exactly these files: no PR opened")
    created = Thread(info.pr_num, True, "open", plan.title, info.pr_url, plan.marker, None)
    created.description_id = _first_comment_id(hub, info.pr_num)
    if created.description_id is not None:
        hub.refresh(created, plan.title, plan.description(info.pr_num))  # now the snippet names refs/pr/N
    return PublishResult("created", pr_url=info.pr_url, pr_num=info.pr_num, commit=info.oid, plan=plan,
                         message=f"opened PR #{info.pr_num} with {len(plan.files)} files ({_names(plan.published)})")


def _first_comment_id(hub: HubClient, num: int) -> str | None:
    details = hub.call("read the pull request", hub.api.get_discussion_details, hub.repo_id, num)
    first = next((e for e in details.events if e.type == "comment"), None)
    return first.id if first is not None else None


def _resolve_failures(hub: HubClient, plan: PublishPlan, threads: list[Thread], result: PublishResult) -> None:
    """Close our open failure discussions of the slot once every target passed."""
    if plan.failed or result.pr_num is None:
        return
    for thread in _in_slot(threads, plan, KIND_FAILURE):
        if thread.is_open:
            hub.close(thread.num, f"Resolved: the exports of source `{short_sha(plan.report)}` pass; see "
                                  f"#{result.pr_num}.")


def _publish_failure(hub: HubClient, plan: PublishPlan, threads: list[Thread]) -> PublishResult:
    mine = _in_slot(threads, plan, KIND_FAILURE)
    settled = _settled(plan, mine, "discussion")
    if settled is not None:
        return settled
    open_thread = next((t for t in mine if t.is_open), None)
    if open_thread is not None:
        hub.refresh(open_thread, plan.title, plan.description())
        hub.comment(open_thread.num, f"Still failing at source `{short_sha(plan.report)}` "
                                     f"({', '.join(f'`{n}`' for n in plan.failed)}): the report above is updated.")
        num, url, verb = open_thread.num, open_thread.url, "updated"
    else:
        created = hub.call("open a discussion", hub.api.create_discussion, plan.repo_id, plan.title,
                           description=plan.description())
        num, url, verb = created.num, created.url, "opened"
    for pr in _in_slot(threads, plan, KIND_EXPORTS):
        if pr.is_open:
            held = str(pr.marker.get("source_sha") or "local")[:7]
            hub.comment(pr.num, f"The latest run (source `{short_sha(plan.report)}`) failed, see #{num}; this PR "
                                f"still holds the exports of source `{held}`.")
    return PublishResult("discussion", discussion_url=url, plan=plan,
                         message=f"{verb} discussion #{num}: the export failed ({_names(plan.failed)}), "
                                 "so no artifact was published")


def _dry_run(plan: PublishPlan, hub: HubClient) -> PublishResult:
    """Find what would happen, read-only; with no usable token, say what could not be checked."""
    try:
        threads = hub.threads(hub.whoami())
        kind_threads = _in_slot(threads, plan, plan.kind)
        settled = _settled(plan, kind_threads, "PR" if plan.is_pull_request else "discussion")
        open_thread = next((t for t in kind_threads if t.is_open), None)
        if settled is not None:
            plan.action = f"nothing ({settled.message})"
        elif open_thread is not None:
            noun = "PR" if plan.is_pull_request else "discussion"
            plan.action = f"update {noun} #{open_thread.num}"
            if plan.is_pull_request:
                plan.deletions = _stale(plan, hub.head(f"refs/pr/{open_thread.num}")[1])
        else:
            plan.action = "open a new pull request" if plan.is_pull_request else "open a new discussion"
            if plan.is_pull_request:
                plan.deletions = _stale(plan, hub.head(plan.base)[1])
    except PublishError as err:
        plan.action = f"create or update (could not look for an existing one: {err})"
    return PublishResult("none", plan=plan, message=f"dry run: would {plan.action}; nothing was pushed")


def publish_report(repo_id: str, out_dir: Path, *, token: str | None = None, endpoint: str | None = None,
                   publish_failed: bool = False, dry_run: bool = False, revision: str = "main") -> PublishResult:
    """Publish the run in `out_dir` (its report.json, report.md and artifacts) to the Hub repo `repo_id`.

    A passing run becomes a pull request against `revision` (created, updated, or left unchanged: see the module
    docstring); a failing one a discussion with the report, unless `publish_failed` publishes the passing targets
    anyway. `dry_run` writes nothing and returns the plan in `result.plan`. The exports are never re-run.
    `endpoint` defaults to huggingface_hub's (pass it explicitly: `HF_ENDPOINT` is read at import time).

    Raises `PublishError` (what to do; never the token).

    Example:
        >>> result = publish_report("org/model", Path("out"), token=os.environ["HF_TOKEN"])  # doctest: +SKIP
        >>> result.operation, result.pr_url  # doctest: +SKIP
        ('created', 'https://huggingface.co/org/model/discussions/1')
    """
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except Exception as err:
        raise PublishError(f"{repo_id!r} is not a Hub repo id ({err}): pass --repo-id ORG/NAME") from None
    if "/" not in repo_id:
        raise PublishError(f"{repo_id!r} has no namespace: pass --repo-id ORG/NAME")
    plan = plan_publish(repo_id, Path(out_dir), publish_failed=publish_failed, revision=revision)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    if dry_run:
        return _dry_run(plan, hub)
    threads = hub.threads(hub.whoami())
    if not plan.is_pull_request:
        return _publish_failure(hub, plan, threads)
    result = _publish_pr(hub, plan, threads)
    _resolve_failures(hub, plan, threads, result)
    return result


def check_publish_access(repo_id: str, *, token: str | None = None, endpoint: str | None = None) -> str:
    """Fail fast, before a long export: the token works and the repo is visible. Returns the account name.

    Example:
        >>> check_publish_access("org/model", token=os.environ["HF_TOKEN"])  # doctest: +SKIP
        'export-bot'
    """
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    me = hub.whoami()
    hub.call("read the repo", hub.api.model_info, repo_id)
    return me

"""Doing what `decide` said: the commit, the PR or discussion, the duplicate check, the outcome in `OUT/publish.json`.

```
plan_publish ──► HubClient.view ──► merge_plan (what the PR or branch holds) ──► decide ──► do it
                                                                                     │
                        created? re-list: a lower-numbered open PR of the slot wins ─┘ (ours is closed, that one used)
```

A card snippet that loads code or a pickle (a `.pt2`) pins `revision` to the commit that holds the files. A commit
cannot name its own sha, so such a PR gets two commits: the files (the card saying the pinned snippet follows), then
the card alone, its snippets pinned to the first commit's sha (`_pin_card`). The sha stays reachable through the
PR's ref after a merge; a moving ref (`refs/pr/N`, `main`) would load whatever a later commit put there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, get_token

from exporters import fsutil
from exporters.errors import PublishError
from exporters.publish import texts
from exporters.publish.decide import Decision, HubView, ThreadState, decide, duplicates_of, in_slot
from exporters.publish.destination import DEFAULT_MAX_UPLOAD_BYTES, check_repo_id
from exporters.publish.hub import HubClient
from exporters.publish.markers import DUPLICATE_TAG, render_marker
from exporters.publish.plan import KIND_EXPORTS, KIND_FAILURE, Held, PublishPlan, merge_plan, plan_publish
from exporters.report.markdown import human_size, render_markdown
from exporters.status import PublishOperation

OUTCOME_FILE = "publish.json"


@dataclass
class PublishResult:
    """What publishing did. `operation`: created | updated | unchanged | superseded | discussion | none (a dry run)
    | failed (then `retryable` says whether trying again may help); `message`: one human sentence; `plan`: what was
    (or, on a dry run, would be) pushed."""

    operation: PublishOperation
    pr_url: str | None = None
    pr_num: int | None = None
    discussion_url: str | None = None
    commit: str | None = None
    message: str = ""
    retryable: bool = False
    upload_bytes: int = 0
    target_bytes: dict[str, int] = field(default_factory=dict)
    action: str = ""  # a dry run: what would happen
    plan: PublishPlan | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON `OUT/publish.json` holds (everything but the plan)."""
        return {k: v for k, v in asdict(self).items() if k != "plan"} | {"schema_version": 1}


def write_json(out_dir: Path, name: str, data: dict[str, Any]) -> None:
    """`OUT/<name>`, replaced atomically (a link planted there is replaced, not written through); nothing when
    `out_dir` is not a folder."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return
    fsutil.write_file(out_dir / name, json.dumps(data, indent=2) + "\n")


@dataclass(frozen=True)
class PublishOptions:
    """How `publish_report` publishes a run. `publish_failed`: a run where a target did not pass publishes its
    passing targets anyway (`publish_unverified`: its unverified ones too, saying which checks did not run), instead
    of a discussion; `dry_run`: decide without doing (the plan is in `result.plan`); `revision`: the branch the PR is
    against; `max_upload_bytes`: a larger PR is refused before anything is sent (0: no limit).

    Example:
        >>> PublishOptions(dry_run=True).revision
        'main'
    """

    publish_failed: bool = False
    publish_unverified: bool = False
    dry_run: bool = False
    revision: str = "main"
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES


@dataclass(frozen=True)
class Proposal:
    """The PR `publish_files` opens or updates: `marker` names its slot (`kind`, `recipe`) and fingerprint (e.g.
    `fingerprint`: a hash of the files); `description(pr_num)` is the PR text (the marker is appended); `base` the
    branch it is against.

    Example:
        >>> Proposal({"kind": "recipe"}, "Add a recipe", lambda num: "Proposed.", "Add a recipe").base
        'main'
    """

    marker: dict[str, Any]
    title: str
    description: Callable[[int | None], str]
    commit_message: str
    base: str = "main"


def write_outcome(out_dir: Path, result: PublishResult) -> None:
    """`OUT/publish.json`, replaced atomically (a link planted there is replaced, not written through)."""
    write_json(out_dir, OUTCOME_FILE, result.to_dict())


def _result(operation: PublishOperation, plan: PublishPlan | None, message: str, **links: Any) -> PublishResult:
    sizes = plan.target_bytes() if plan is not None and plan.is_pull_request else {}
    upload = plan.upload_bytes if plan is not None and plan.is_pull_request else 0
    return PublishResult(operation, message=message, plan=plan, upload_bytes=upload, target_bytes=sizes, **links)


def _sizes(plan: PublishPlan) -> str:
    per_target = ", ".join(f"{name} {human_size(size)}" for name, size in plan.target_bytes().items())
    return f"{human_size(plan.upload_bytes)} uploaded ({per_target})"


def thread_links(thread: ThreadState) -> dict[str, Any]:
    if thread.is_pull_request:
        return {"pr_url": thread.url, "pr_num": thread.num}
    return {"discussion_url": thread.url}


def _operations(plan: PublishPlan, card: str) -> list[Any]:
    """Additions (artifacts, reports, README.md) and deletions."""

    operations: list[Any] = []
    for planned in plan.files:
        if planned.data is not None:
            operations.append(CommitOperationAdd(planned.path_in_repo, planned.data))
            continue
        if planned.local is None:
            continue
        operation = CommitOperationAdd(planned.path_in_repo, str(planned.local))
        if planned.sha256 and operation.upload_info.sha256.hex() != planned.sha256:
            raise PublishError(f"{planned.local} changed since it was validated (sha256 differs from report.json): "
                               "run the export again before publishing")
        operations.append(operation)
    operations.append(CommitOperationAdd("README.md", card.encode("utf-8")))
    return operations + [CommitOperationDelete(path) for path in plan.deletions]


def _merged(hub: HubClient, plan: PublishPlan, ref: str) -> tuple[str, PublishPlan, list[str]]:
    """The commit at `ref`, the plan merged with what is there, and the file list there."""
    head, held = hub.held(plan, ref)
    return head, merge_plan(plan, held, render=render_markdown), list(held.files)


def settle_duplicate(hub: HubClient, me: str, created: int, marker: dict[str, Any],
                     noun: str) -> ThreadState | None:
    """After opening `created`: when a concurrent run opened a lower-numbered thread of the slot, close ours (the
    lower one wins) and return that one."""
    lowest = duplicates_of(created, marker, HubView(tuple(hub.threads(me))))
    if lowest is not None:
        hub.close(created, f"{DUPLICATE_TAG}\nClosed: another run opened #{lowest.num} for the same {noun} at the "
                           "same time; that one is kept.")
    return lowest


# (PR number, the commit holding the files) -> the PR's head after any follow-up commit (`_pin_card`)
Pin = Callable[[int, str], str]


def _open_pr(hub: HubClient, operations: list[Any], base: str, head: str, title: str,
             text: Callable[[int | None, str | None], str], pin: Pin | None = None) -> tuple[int, str, str] | None:
    """Open a PR with one commit (then `pin`'s, if any); its title and description: `title`, `text(None, None)`,
    then `text(num, commit holding the files)`. Returns the number, the URL and the PR's head."""
    info = hub.call("open a pull request", hub.api.create_commit, hub.repo_id, operations, commit_message=title,
                    commit_description=text(None, None), revision=base, create_pr=True, parent_commit=head)
    if info.pr_num is None:
        return None
    oid = pin(info.pr_num, info.oid) if pin is not None else info.oid
    if hub.first_comment(info.pr_num) is not None:  # refresh: the snippet now names refs/pr/N or the commit
        hub.refresh(ThreadState(info.pr_num, True, "open", {}, info.pr_url, title), title,
                    text(info.pr_num, info.oid))
    return info.pr_num, info.pr_url, oid


def _update_pr(hub: HubClient, thread: ThreadState, operations: list[Any], head: str, message: str, title: str,
               text: Callable[[str], str], pin: Pin | None = None) -> tuple[str, str]:
    """Push a commit (then `pin`'s, if any) to the PR; its description becomes `text(commit holding the files)`.
    Returns the PR's head and how the description was refreshed."""
    ref = f"refs/pr/{thread.num}"
    info = hub.call(f"push to {ref}", hub.api.create_commit, hub.repo_id, operations, commit_message=message,
                    revision=ref, parent_commit=head)
    oid = pin(thread.num, info.oid) if pin is not None else info.oid
    return oid, hub.refresh(thread, title, text(info.oid))


def _card(readme: str | None, plan: PublishPlan, commit: str | None = None) -> str:
    return texts.update_model_card(readme, texts.card_section(plan, commit), plan.repo_id.split("/")[-1],
                                   plan.recipe)


def _pin_card(hub: HubClient, plan: PublishPlan, readme: str | None) -> Pin | None:
    """The follow-up commit of a card whose snippets load code or a pickle: README.md alone, its snippets pinned to
    the commit that holds the files (None when no snippet needs a pin)."""
    if not texts.card_needs_pin(plan):
        return None

    def pin(num: int, commit: str) -> str:
        card = _card(readme, plan, commit)
        info = hub.call("pin the model card's snippets", hub.api.create_commit, hub.repo_id,
                        [CommitOperationAdd("README.md", card.encode("utf-8"))],
                        commit_message=f"Model card: snippets pinned to {commit[:7]}",
                        commit_description=f"The card's snippets load code or a pickle: they download the files at "
                                           f"{commit}, the commit that holds them, not at a moving ref.",
                        revision=f"refs/pr/{num}", parent_commit=commit)
        return info.oid

    return pin


def _publish_pr(hub: HubClient, local: PublishPlan, view: HubView, me: str, dedupe: bool = True) -> PublishResult:
    open_pr = min((t for t in in_slot(view, local.marker) if t.is_open), key=lambda t: t.num, default=None)
    ref = f"refs/pr/{open_pr.num}" if open_pr else local.base
    head, plan, files = _merged(hub, local, ref)
    decision = decide(plan.marker, view)
    if decision.operation in ("superseded", "unchanged"):
        links = thread_links(decision.thread) if decision.thread else {}
        return _result(decision.operation, plan, decision.reason, **links)
    readme = hub.readme(head, files)
    operations = _operations(plan, _card(readme, plan))
    pin = _pin_card(hub, plan, readme)
    title = texts.pr_title(plan)
    if decision.operation == "update" and decision.thread is not None:
        thread = decision.thread
        oid, how = _update_pr(hub, thread, operations, head, f"Update exports: {', '.join(plan.published)} (source "
                              f"{texts.short_sha(plan.report)})", title,
                              lambda commit: texts.pr_description(plan, thread.num, commit), pin)
        return _result("updated", plan, f"updated PR #{thread.num} with commit {oid[:7]} ({how}; {_sizes(plan)})",
                       commit=oid, **thread_links(thread))
    opened = _open_pr(hub, operations, plan.base, head, title,
                      lambda num, commit: texts.pr_description(plan, num, commit), pin)
    if opened is None:
        return _result("unchanged", plan, f"{plan.base} already holds exactly these files: no PR opened")
    num, url, oid = opened
    winner = settle_duplicate(hub, me, num, plan.marker, "exports") if dedupe else None
    if winner is not None:
        again = _publish_pr(hub, local, hub.view(local, me), me, dedupe=False)
        again.message += f" (PR #{num}, opened at the same time as #{winner.num} by a concurrent run, was closed)"
        return again
    return _result("created", plan, f"opened PR #{num} with {len(plan.files)} files ({_sizes(plan)})",
                   pr_url=url, pr_num=num, commit=oid)


def _publish_failure(hub: HubClient, plan: PublishPlan, view: HubView, me: str, dedupe: bool = True) -> PublishResult:
    decision = decide(plan.marker, view)
    if decision.operation in ("superseded", "unchanged"):
        links = thread_links(decision.thread) if decision.thread else {}
        return _result(decision.operation, plan, decision.reason, **links)
    short = texts.short_sha(plan.report)
    if decision.thread is not None:
        thread = decision.thread
        hub.refresh(thread, texts.failure_title(plan), texts.failure_description(plan))
        hub.comment(thread.num, f"Still failing at source `{short}` ({', '.join(f'`{n}`' for n in plan.failed)}): "
                                "the report above is updated.")
        num, url, verb = thread.num, thread.url, "updated"
    else:
        created = hub.call("open a discussion", hub.api.create_discussion, plan.repo_id, texts.failure_title(plan),
                           description=texts.failure_description(plan))
        num, url, verb = created.num, created.url, "opened"
        winner = settle_duplicate(hub, me, num, plan.marker, "failure report") if dedupe else None
        if winner is not None:
            return _publish_failure(hub, plan, hub.view(plan, me), me, dedupe=False)
    for pr in in_slot(view, plan.marker, KIND_EXPORTS):
        if pr.is_open:
            held = str(pr.marker.get("source_sha") or "local")[:7]
            hub.comment(pr.num, f"The latest run (source `{short}`) did not pass, see #{num}; this PR still holds "
                                f"the exports of source `{held}`.")
    return _result("discussion", plan, f"{verb} discussion #{num}: the export did not pass "
                                       f"({', '.join(plan.failed)}), so no artifact was published", discussion_url=url)


def _resolve_failures(hub: HubClient, plan: PublishPlan, view: HubView, result: PublishResult) -> None:
    """Close our open failure discussions of the slot once every target passed (published unverified: not yet)."""
    if plan.failed or plan.unverified or result.pr_num is None or result.operation == "superseded":
        return
    for thread in in_slot(view, plan.marker, KIND_FAILURE):
        if thread.is_open:
            hub.close(thread.num, f"Resolved: the exports of source `{texts.short_sha(plan.report)}` pass; see "
                                  f"#{result.pr_num}.")


def _too_large(plan: PublishPlan, limit: int) -> str | None:
    if not plan.is_pull_request or not limit or plan.upload_bytes <= limit:
        return None
    per_target = ", ".join(f"{name} {human_size(size)}" for name, size in plan.target_bytes().items())
    return (f"the PR would upload {human_size(plan.upload_bytes)} ({per_target}), more than the limit of "
            f"{human_size(limit)}: publish fewer targets, or raise the limit (`max_upload_size`)")


def _dry_run(plan: PublishPlan, hub: HubClient, limit: int) -> PublishResult:
    """Decide without doing, read-only; with no usable token, say what could not be checked."""
    too_large = _too_large(plan, limit)
    try:
        if not (hub.token or get_token()):  # said in a line, never as the client's exception
            raise PublishError("no Hub token here, so an open PR of this export was not looked for; with HF_TOKEN "
                               "set (or a login) the plan says whether it would update one", option="token")
        me = hub.whoami()
        view = hub.view(plan, me)
        if plan.is_pull_request:
            open_pr = min((t for t in in_slot(view, plan.marker) if t.is_open), key=lambda t: t.num, default=None)
            _, plan, _ = _merged(hub, plan, f"refs/pr/{open_pr.num}" if open_pr else plan.base)
        decision: Decision = decide(plan.marker, view)
        quiet = decision.operation in ("unchanged", "superseded")
        action = f"nothing ({decision.reason})" if quiet else decision.reason
    except PublishError as err:
        action = f"create or update ({err})" if err.option == "token" and "no Hub token" in str(err) else \
            f"create or update (could not look for an existing one: {err})"
    if too_large:
        action = f"refuse: {too_large}"
    result = _result("none", plan, f"dry run: would {action}; nothing was pushed")
    result.action = action
    return result


def _publish(repo_id: str, out_dir: Path, *, token: str | None, endpoint: str | None,
             options: PublishOptions) -> PublishResult:
    check_repo_id(repo_id)
    plan = plan_publish(repo_id, Path(out_dir), publish_failed=options.publish_failed,
                        publish_unverified=options.publish_unverified, revision=options.revision)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    if options.dry_run:
        return _dry_run(plan, hub, options.max_upload_bytes)
    too_large = _too_large(plan, options.max_upload_bytes)
    if too_large:
        raise PublishError(too_large, option="max_upload_size")
    me = hub.whoami()
    view = hub.view(plan, me)
    if not plan.is_pull_request:
        return _publish_failure(hub, plan, view, me)
    result = _publish_pr(hub, plan, view, me)
    _resolve_failures(hub, plan, view, result)
    return result


def publish_report(repo_id: str, out_dir: Path, *, token: str | None = None, endpoint: str | None = None,
                   options: PublishOptions | None = None) -> PublishResult:
    """Publish the run in `out_dir` (its report.json, report.md and artifacts) to the Hub repo `repo_id`, and write
    the outcome to `OUT/publish.json`.

    A passing run becomes a pull request against the branch `options.revision` (created, updated, left unchanged, or
    `superseded` when a newer export exists: see `exporters.publish.decide`); a run where a target did not pass
    becomes a discussion with the report, unless `options.publish_failed` publishes the passing targets anyway
    (see [`PublishOptions`]). `endpoint` defaults to huggingface_hub's.

    Raises `PublishError` (what to do, whether a retry may help; never the token).

    Example:
        >>> result = publish_report("org/model", Path("out"), token=os.environ["HF_TOKEN"],
        ...                         options=PublishOptions(revision="dev"))  # doctest: +SKIP
        >>> result.operation, result.pr_url  # doctest: +SKIP
        ('created', 'https://huggingface.co/org/model/discussions/1')
    """
    try:
        result = _publish(repo_id, out_dir, token=token, endpoint=endpoint, options=options or PublishOptions())
    except PublishError as err:
        write_outcome(out_dir, PublishResult("failed", message=str(err), retryable=err.retryable))
        raise
    write_outcome(out_dir, result)
    return result


def publish_files(repo_id: str, files: Mapping[str, bytes | Path], proposal: Proposal, *, token: str | None = None,
                  endpoint: str | None = None) -> PublishResult:
    """Open, update, or leave as is the one PR of `proposal.marker`'s slot that adds `files` (`{path in repo: bytes
    or a local file}`), with the same rules as exports: our PRs only, one per slot (a concurrent duplicate is closed),
    `unchanged` when the open PR (or the newest closed one) has the same fingerprint (see [`Proposal`]).

    Example:
        >>> publish_files("org/model", {"export_config.json": b"{}"},
        ...               Proposal(marker={"kind": "recipe", "recipe": "repo", "fingerprint": "abc"}, title="Add a recipe",
        ...                        description=lambda num: "Proposed.", commit_message="Add a recipe"),
        ...               token=os.environ["HF_TOKEN"])  # doctest: +SKIP
    """

    check_repo_id(repo_id)
    title, description, commit_message, base = (proposal.title, proposal.description, proposal.commit_message,
                                                proposal.base)
    marker = {"v": 1, **proposal.marker, "base": base}
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    me = hub.whoami()

    def text(num: int | None) -> str:
        return f"{description(num)}\n\n{render_marker(marker)}"

    def attempt(dedupe: bool) -> PublishResult:
        view = HubView(tuple(hub.threads(me)))
        decision = decide(marker, view)
        if decision.operation == "unchanged" and decision.thread is not None:
            return PublishResult("unchanged", message=decision.reason, **thread_links(decision.thread))
        operations = [CommitOperationAdd(path, data if isinstance(data, bytes) else str(data))
                      for path, data in files.items()]
        if decision.operation == "update" and decision.thread is not None:
            head, _ = hub.head(f"refs/pr/{decision.thread.num}")
            number = decision.thread.num
            oid, how = _update_pr(hub, decision.thread, operations, head, commit_message, title,
                                  lambda commit: text(number))
            return PublishResult("updated", commit=oid, message=f"updated PR #{decision.thread.num} ({how})",
                                 **thread_links(decision.thread))
        head, _ = hub.head(base)
        opened = _open_pr(hub, operations, base, head, title, lambda num, commit: text(num))
        if opened is None:
            return PublishResult("unchanged", message=f"{base} already holds exactly these files: no PR opened")
        num, url, oid = opened
        if dedupe and settle_duplicate(hub, me, num, marker, str(marker.get("kind"))) is not None:
            return attempt(dedupe=False)
        return PublishResult("created", pr_url=url, pr_num=num, commit=oid, message=f"opened PR #{num}")

    return attempt(dedupe=True)


def check_publish_access(repo_id: str, *, token: str | None = None, endpoint: str | None = None) -> str:
    """Fail fast, before a long export: the token works and the repo is visible. Returns the account name.

    Example:
        >>> check_publish_access("org/model", token=os.environ["HF_TOKEN"])  # doctest: +SKIP
        'export-bot'
    """
    check_repo_id(repo_id)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    me = hub.whoami()
    hub.call("read the repo", hub.api.model_info, repo_id)
    return me


__all__ = ["OUTCOME_FILE", "Held", "Proposal", "PublishOptions", "PublishResult", "check_publish_access", "publish_files", "publish_report",
           "write_outcome"]

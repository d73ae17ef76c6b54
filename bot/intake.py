"""Which webhook deliveries become jobs. Pure functions: no Hub call, no I/O (the request path must stay fast).

Acted on (model repos that opted in only):
- `repo.content` `update` whose `updatedRefs` moves `refs/heads/main` to a new commit -> a `push` job at that commit;
- a new, visible `discussion.comment` that says `@<bot_name> export` -> a `comment` job at the repo's head, forced
  (runs even if the same recipe and weights were already exported).

Refused (the app answers 400, nothing is stored): a repo name that is not a Hub repo id `namespace/name`
(`repo_id_problem`, by `huggingface_hub`'s own validator).

Ignored, with a reason: other repo types and scopes, `refs/pr/*` and other refs (the bot's own PR pushes land
there), a deleted main, comments that do not mention the bot. Whether the new head has a recipe, and whether the
commit is the bot's own, needs the Hub: the worker decides that (and records the job as `skipped`).

Example:
    >>> from huggingface_hub import WebhookPayload
    >>> payload = WebhookPayload.model_validate({
    ...     "event": {"action": "update", "scope": "repo.content"},
    ...     "repo": {"type": "model", "name": "acme/tiny", "id": "1", "private": False,
    ...              "url": {"web": "https://hf.co/acme/tiny"}, "owner": {"id": "2"}},
    ...     "webhook": {"id": "3", "version": 3},
    ...     "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "a" * 40, "newSha": "b" * 40}]})
    >>> decide(payload, {}, bot_name="export-bot").head_sha == "b" * 40
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from huggingface_hub import WebhookPayload

MAIN_REF = "refs/heads/main"
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Decision:
    """What to do with one delivery: `queue` a job (repo, head, trigger) or `ignore` it (with the reason)."""

    action: Literal["queue", "ignore"]
    reason: str
    repo: str | None = None
    head_sha: str = ""
    trigger: str = "push"
    trigger_key: str = ""
    requested_by: str | None = None
    force: bool = False
    private: bool = False


def repo_id_problem(name: str) -> str | None:
    """Why `name` is not a Hub repo id `namespace/name` (None: it is one), by `huggingface_hub`'s own validator.

    Example:
        >>> repo_id_problem("acme/tiny") is None, repo_id_problem("noslash"), repo_id_problem("../../etc/passwd")[:20]
        (True, "repo name 'noslash' has no namespace (expected namespace/name)", "repo name '../../etc")
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    shown = repr(name[:60]) + ("…" if len(name) > 60 else "")
    try:
        validate_repo_id(name)
    except HFValidationError:
        return f"repo name {shown} is not a Hub repo id"
    if name.count("/") != 1:
        return f"repo name {shown} has no namespace (expected namespace/name)"
    return None


def ignore(reason: str, repo: str | None = None) -> Decision:
    return Decision("ignore", reason, repo=repo)


def mention_pattern(bot_name: str) -> re.Pattern[str]:
    """`@export-bot export` (any case, any whitespace between; not `@export-bot-two`).

    Example:
        >>> bool(mention_pattern("export-bot").search("Hi @Export-Bot  export please"))
        True
        >>> bool(mention_pattern("export-bot").search("@export-bot-two export"))
        False
    """
    return re.compile(rf"(?<![\w-])@{re.escape(bot_name)}(?![\w-])\s+export\b", re.IGNORECASE)


def decide(payload: WebhookPayload, raw: dict[str, Any], *, bot_name: str) -> Decision:
    """Classify a parsed delivery (`raw` is the same JSON as a dict, for fields the model drops, e.g. `headSha`)."""
    repo = payload.repo
    if repo.type != "model":
        return ignore(f"{repo.type} repo: only model repos are exported", repo.name)
    scope, action = payload.event.scope, payload.event.action
    if scope == "repo.content":
        return _content_update(payload)
    if scope == "discussion.comment":
        return _comment(payload, raw, bot_name)
    return ignore(f"event {scope}/{action} is not acted on", repo.name)


def _content_update(payload: WebhookPayload) -> Decision:
    name = payload.repo.name
    if payload.event.action != "update":
        return ignore(f"repo.content/{payload.event.action} is not acted on", name)
    refs = payload.updatedRefs or []
    main = [r for r in refs if r.ref == MAIN_REF]
    if not main:
        others = sorted({r.ref for r in refs}) or ["(no updatedRefs)"]
        return ignore(f"no change to {MAIN_REF} (updated: {', '.join(others)})", name)
    new = main[-1].newSha
    if not new or set(new) == {"0"}:
        return ignore(f"{MAIN_REF} was deleted", name)
    if not _SHA.match(new):
        return ignore(f"updatedRefs newSha {new[:64]!r} is not a commit id", name)
    if main[-1].oldSha == new:
        return ignore(f"{MAIN_REF} did not move", name)
    return Decision("queue", f"{MAIN_REF} moved to {new[:8]}", repo=name, head_sha=new, trigger="push",
                    private=payload.repo.private)


def _comment(payload: WebhookPayload, raw: dict[str, Any], bot_name: str) -> Decision:
    name = payload.repo.name
    comment = payload.comment
    if payload.event.action != "create" or comment is None:
        return ignore(f"discussion.comment/{payload.event.action} is not acted on", name)
    if comment.hidden:
        return ignore("hidden comment", name)
    if not mention_pattern(bot_name).search(comment.content or ""):
        return ignore(f"comment does not ask '@{bot_name} export'", name)
    head = (raw.get("repo") or {}).get("headSha") or payload.repo.head_sha or ""
    if head and not _SHA.match(head):
        return ignore(f"repo headSha {head[:64]!r} is not a commit id", name)
    return Decision("queue", f"@{bot_name} export requested in a comment", repo=name, head_sha=head,
                    trigger="comment", trigger_key=f"comment:{comment.id}", requested_by=comment.author.id,
                    force=True, private=payload.repo.private)

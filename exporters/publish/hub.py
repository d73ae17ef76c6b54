"""The thin Hub client publishing uses: the few `huggingface_hub` calls, errors turned into `PublishError` (token
scrubbed, what to do, whether a retry may help), and `view` / `held`, which read what `decide` and `merge_plan` need.

Example:
    >>> hub = HubClient("org/model", token=os.environ["HF_TOKEN"], endpoint=None)  # doctest: +SKIP
    >>> view = hub.view(plan, hub.whoami())  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

from huggingface_hub import HfApi
from huggingface_hub.utils import build_hf_headers, paginate

from exporters.errors import PublishError
from exporters.files import RECIPE_SOURCES
from exporters.hashing import is_weight_file
from exporters.publish.decide import HubView, ThreadState
from exporters.publish.markers import DUPLICATE_TAG, parse_marker
from exporters.publish.plan import Held, PublishPlan, report_paths
from exporters.redact import scrub

T = TypeVar("T")
HISTORY_LIMIT = 2000  # commits of the base branch read at most to place two commits in order
RETRYABLE_STATUSES = (408, 409, 412, 425, 429, 500, 502, 503, 504)


def _status(err: Exception) -> int | None:
    return getattr(getattr(err, "response", None), "status_code", None)


def _hint(err: Exception, what: str) -> tuple[str, str | None]:
    """What to do about `err`, and the option that fixes it."""
    status = _status(err)
    if type(err).__name__ == "LocalTokenNotFoundError" or status == 401:
        return "set a valid write token of the account that publishes (`token`)", "token"
    if status == 403:
        return (f"the token's account is not allowed to {what}: use a token with write access (`token`), or ask the "
                "repo owner", "token")
    if status == 404:
        return ("check the repo id (`repo_id`), the branch, and that the token can see the repo (publishing opens a "
                "PR on an existing repo: create it first)", "repo_id")
    if status in (409, 412):
        return "the PR moved while publishing (another run pushed at the same time): run again", None
    return "check the endpoint and the network, then run again", None


class HubClient:
    """The `huggingface_hub` calls publishing needs, with errors turned into `PublishError`."""

    def __init__(self, repo_id: str, *, token: str | None, endpoint: str | None):

        self.repo_id = repo_id
        self.token = token
        self.api = HfApi(endpoint=endpoint, token=token)
        self.editable: dict[int, str | None] = {}  # thread number -> id of its first comment, when ours

    def call(self, what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)`; any failure becomes a `PublishError` saying what to do."""
        try:
            return function(*args, **kwargs)
        except PublishError:
            raise
        except Exception as err:  # HTTP, token, network and client-side validation errors alike
            message = scrub(f"{type(err).__name__}: {err}", [self.token] if self.token else []).strip().splitlines()
            detail = " ".join(line.strip() for line in message[:3])
            hint, option = _hint(err, what)
            status = _status(err)
            retryable = status in RETRYABLE_STATUSES or (status is None and isinstance(err, OSError))
            raise PublishError(f"could not {what} on {self.repo_id}: {detail} — {hint}", option=option,
                               retryable=retryable, status=status) from None

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

    def download_json(self, path: str, commit: str) -> dict[str, Any] | None:
        local = self.call(f"download {path}", self.api.hf_hub_download, self.repo_id, path, revision=commit)
        try:
            data = json.loads(Path(local).read_text(encoding="utf-8"))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def threads(self, me: str) -> list[ThreadState]:
        """Our PRs and discussions that carry a marker, newest first (duplicates we closed are left out)."""
        found = []
        listing = self.call("list discussions", lambda: list(self.api.get_repo_discussions(self.repo_id, author=me)))
        for discussion in sorted(listing, key=lambda d: -d.num):
            if discussion.author != me:
                continue
            details = self.call("read a discussion", self.api.get_discussion_details, self.repo_id, discussion.num)
            comments = [e for e in details.events if e.type == "comment" and e.author == me and not e.hidden]
            markers = [m for m in (parse_marker(c.content) for c in comments) if m]
            if not markers or any(DUPLICATE_TAG in (c.content or "") for c in comments):
                continue
            first = next((e for e in details.events if e.type == "comment"), None)
            self.editable[discussion.num] = first.id if first is not None and first.author == me and \
                not first.hidden else None
            found.append(ThreadState(discussion.num, discussion.is_pull_request, discussion.status, markers[-1],
                                     discussion.url, discussion.title))
        return found

    def history(self, revision: str, wanted: set[str]) -> tuple[str, ...]:
        """The commits of `revision`, newest first, read page by page until every commit of `wanted` is placed (or
        `HISTORY_LIMIT`)."""

        url = f"{self.api.endpoint}/api/models/{self.repo_id}/commits/{quote(revision, safe='')}"
        headers = build_hf_headers(token=self.token)

        def read() -> tuple[str, ...]:
            commits: list[str] = []
            missing = set(wanted)
            for item in paginate(url, params={}, headers=headers):
                commits.append(item["id"])
                missing.discard(item["id"])
                if not missing or len(commits) >= HISTORY_LIMIT:
                    break
            return tuple(commits)

        return self.call(f"read the history of {revision}", read)

    def inputs(self, revision: str) -> dict[str, str]:
        """`{file: content id}` of the files an export depends on at `revision` (weights, configs, code, recipe)."""
        info = self.call(f"read {revision}", self.api.model_info, self.repo_id, revision=revision,
                         files_metadata=True)
        ids = {}
        for sibling in info.siblings or []:
            if is_weight_file(sibling.rfilename) or sibling.rfilename in RECIPE_SOURCES:
                lfs = getattr(sibling, "lfs", None)
                ids[sibling.rfilename] = (lfs.sha256 if lfs else None) or sibling.blob_id or ""
        return ids

    def view(self, plan: PublishPlan, me: str) -> HubView:
        """Our threads, and (for a run of a Hub commit) the base branch's history and whether its head changed the
        export's inputs since the run's commit."""
        return self.view_at(plan.source_sha, plan.base, me)

    def view_at(self, source: str | None, base: str, me: str) -> HubView:
        """`view` for a run of the commit `source` (None: not a Hub commit) published against `base`."""
        threads = tuple(self.threads(me))
        if not source:
            return HubView(threads)
        held = {t.marker.get("source_sha") for t in threads if t.is_open} - {None}
        history = self.history(base, {source, *held})
        changed = None
        if source in history and history[0] != source:
            changed = self.inputs(source) != self.inputs(history[0])
        return HubView(threads, history, changed)

    def held(self, plan: PublishPlan, ref: str) -> tuple[str, Held]:
        """The commit `ref` points to and what the slot holds there (files, its report)."""
        head, files = self.head(ref)
        json_path = report_paths(plan.recipe)[0]
        report = self.download_json(json_path, head) if json_path in files else None
        return head, Held(tuple(files), report)

    def refresh(self, thread: ThreadState, title: str, text: str) -> str:
        """Edit the description (else add `text` as a comment) and the title. Returns how it was refreshed."""
        how = "description edited"
        try:
            comment_id = self.editable.get(thread.num)
            if comment_id is None:
                raise PublishError("the description is not ours to edit")
            self.call("edit the description", self.api.edit_discussion_comment, self.repo_id, thread.num,
                      comment_id, text)
        except PublishError:
            self.comment(thread.num, text)
            how = "report added as a comment"
        if title != thread.title:
            self.call("rename the discussion", self.api.rename_discussion, self.repo_id, thread.num, title)
        return how

    def first_comment(self, num: int) -> str | None:
        details = self.call("read the pull request", self.api.get_discussion_details, self.repo_id, num)
        first = next((e for e in details.events if e.type == "comment"), None)
        self.editable[num] = first.id if first is not None else None
        return self.editable[num]

    def comment(self, num: int, text: str) -> None:
        self.call("comment", self.api.comment_discussion, self.repo_id, num, text)

    def close(self, num: int, comment: str) -> None:
        self.call("close a discussion", self.api.change_discussion_status, self.repo_id, num, "closed",
                  comment=comment)

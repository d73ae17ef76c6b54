"""A local Hugging Face Hub emulator that the real ``huggingface_hub`` client can talk to.

`HubEmulator` is a real HTTP server (Starlette app served by uvicorn in a background thread) holding an
in-memory, thread-safe Hub: users and tokens, model repos with git-like history, LFS storage and
discussions / pull requests. Nothing is canned: every answer is computed from that state.

Emulated (model repos only; repo ids are ``namespace/name``):

- auth: ``Authorization: Bearer <token>``; an unknown token gets 401 ``Invalid credentials in Authorization
  header``; private repos are only visible to their namespace (the user, or members of an org given at
  construction); a hidden or missing repo answers ``X-Error-Code: RepoNotFound`` (401 anonymous, 404 otherwise).
- ``GET /api/whoami-v2``, ``POST /api/validate-yaml``, ``POST /api/repos/create`` (409 with ``url`` when it
  exists), ``DELETE /api/repos/delete``, ``PUT /api/models/{id}/settings``.
- Users and orgs: ``GET /api/organizations/{org}/members`` (``Link`` pagination; items ``{_id, user, fullname,
  avatarUrl, type, isPro}``), ``GET /api/organizations/{org}/overview``, ``GET /api/users/{name}/overview`` (404 for
  unknown names); a user's ``_id`` is the same id webhook payloads carry as a comment's ``author.id``. Users are
  the tokens' users, org members, and user namespaces that own a repo.
- ``GET /api/models/{id}[/revision/{rev}]`` (``?blobs=true`` adds size/blobId/lfs to siblings).
- ``GET /api/models/{id}/tree/{rev}[/{path}]`` (``recursive``, ``expand``, ``Link`` pagination),
  ``POST .../paths-info/{rev}``, ``GET .../refs``, ``GET .../commits/{rev}``, ``POST|DELETE .../branch/{name}``.
- ``HEAD|GET /{id}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (git blob id), ``X-Linked-Etag`` and
  ``X-Linked-Size`` for LFS files (served directly, no CDN redirect), ``Range`` requests, and
  ``EntryNotFound`` / ``RevisionNotFound`` / ``RepoNotFound`` error codes.
- Uploads: ``POST .../preupload/{rev}`` decides ``lfs`` for files matched by the repo's ``.gitattributes`` LFS
  patterns, files larger than ``lfs_threshold`` (1 KiB by default) or with a NUL byte in their 512-byte sample,
  ``regular`` otherwise; ``POST /{id}.git/info/lfs/objects/batch`` hands out one-shot upload URLs that take an
  unauthenticated ``PUT`` (content checked against oid and size), then ``.../objects/verify``.
- ``POST .../commit/{rev}`` (NDJSON: header, file, lfsFile, deletedFile, deletedFolder) with ``create_pr=1``
  (opens discussion N as a PR on ``refs/pr/N``), commits to ``refs/pr/N``, ``parentCommit`` (412 when stale),
  refusal of LFS oids never uploaded or with a wrong size, 10 MiB limit for regular files.
- Discussions: list (``type``, ``status``, ``author``, ``p``), create (discussion or PR), details (``?diff=1``
  gives a git-style diff, ``filesWithConflicts``), comment, edit/hide comment, status, title, merge.
- ``xet-*-token`` routes answer 400: Xet is not supported (run the client with ``HF_HUB_DISABLE_XET=1``).

Commit ids are sha1 hashes of the parents, the file tree, title, message and author; history is append-only.
`HubEmulator.delay` slows chosen routes (an ``asyncio`` sleep before the request is handled, so other requests go
on meanwhile): how tests open a race window, e.g. between listing discussions and opening a PR.
Every state change is also logged as a webhook payload (`HubEmulator.events`) shaped like
``huggingface_hub.WebhookPayload``. The server never answers 5xx (the client retries those with long sleeps);
an emulator bug answers 400 with the traceback in the body.

Run standalone: ``python -m tests.servers.hub --port 8000 --token hf_test_token=alice``.
"""

from __future__ import annotations

import argparse
import base64
import copy
import difflib
import fnmatch
import hashlib
import html
import json
import re
import secrets
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import formatdate
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

DEFAULT_TOKENS: dict[str, str] = {"hf_test_token": "alice", "hf_bot_token": "export-bot"}
LFS_THRESHOLD = 1024  # bytes; bigger files are uploaded through LFS
MAX_REGULAR_FILE_SIZE = 10 * 1024 * 1024  # the Hub refuses bigger non-LFS files
LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.mlmodel *.model *.msgpack *.npy *.npz *.onnx"
    " *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pte *.pth *.rar *.safetensors *.tar *.tflite *.tgz *.wasm *.xz"
    " *.zip *.zst *tfevents*"
).split()
DEFAULT_GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()
_HEX40 = re.compile(r"[0-9a-f]{40}")
_SHORT_SHA = re.compile(r"[0-9a-f]{7,40}")
_REPO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def _now() -> str:
    """Current time in the Hub's format (``2024-01-01T00:00:00.000Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _object_id() -> str:
    """A fresh 24-hex id, like the Hub's (lower-case: the client lower-cases comment ids)."""
    return secrets.token_hex(12)


def _stable_id(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:24]


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob holding ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file stored in git in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class HubError(Exception):
    """An error answered to the client as JSON ``{"error": message}`` plus ``X-Error-*`` headers."""

    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra

    def response(self) -> Response:
        headers = {"X-Error-Message": self.message.encode("ascii", "replace").decode()}
        if self.code:
            headers["X-Error-Code"] = self.code
        headers.update({k: str(v) for k, v in self.extra.pop("headers", {}).items()})
        return JSONResponse({"error": self.message, **self.extra}, self.status, headers=headers)


def _not_found(what: str, code: str, commit: str | None = None) -> HubError:
    return HubError(404, what, code, headers={"X-Repo-Commit": commit} if commit else {})


@dataclass(frozen=True)
class Blob:
    """A file in a tree. Regular files carry their bytes; LFS files name their content by sha256."""

    oid: str  # git blob id (of the pointer for LFS files)
    size: int  # size of the file content
    sha256: str | None = None
    data: bytes | None = None

    @classmethod
    def regular(cls, data: bytes) -> Blob:
        return cls(oid=git_blob_id(data), size=len(data), data=data)

    @classmethod
    def lfs(cls, sha256: str, size: int) -> Blob:
        return cls(oid=git_blob_id(lfs_pointer(sha256, size)), size=size, sha256=sha256)

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size)) if self.sha256 else 0

    @property
    def content_oid(self) -> str:
        """What the client compares to decide a file is unchanged: sha256 for LFS, git blob id otherwise."""
        return self.sha256 or self.oid


@dataclass(frozen=True)
class Commit:
    """An immutable commit; ``id`` is the sha1 of everything else but the date."""

    id: str
    parents: tuple[str, ...]
    tree: Mapping[str, Blob]
    title: str
    message: str
    author: str
    date: str


@dataclass
class Discussion:
    """A discussion or pull request; ``events`` are kept in wire format."""

    num: int
    title: str
    author: str
    is_pull_request: bool
    created_at: str
    object_id: str = field(default_factory=_object_id)
    status: str = "open"  # open | closed | merged
    events: list[dict[str, Any]] = field(default_factory=list)
    base_ref: str | None = None  # PRs: the branch they target, e.g. refs/heads/main
    fork_point: str | None = None  # PRs: the commit refs/pr/N started from
    merge_commit_id: str | None = None


@dataclass
class Repo:
    """A model repo: refs, every commit ever made (append-only), LFS objects and discussions."""

    repo_id: str
    private: bool
    created_at: str
    gated: bool | str = False  # "auto" / "manual" on a gated repo (model_info says so; downloads are not gated here)
    object_id: str = field(default_factory=_object_id)
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)
    discussions: dict[int, Discussion] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.repo_id.split("/")[0]

    def ref_name(self, rev: str) -> str | None:
        """The full ref a revision names (``main`` -> ``refs/heads/main``), or None."""
        if rev.startswith("refs/"):
            return rev if rev in self.refs else None
        for candidate in (f"refs/heads/{rev}", f"refs/tags/{rev}"):
            if candidate in self.refs:
                return candidate
        return None

    def resolve(self, rev: str) -> Commit:
        """The commit a ref name or (short) commit id points to; 404 ``RevisionNotFound`` otherwise."""
        ref = self.ref_name(rev)
        if ref is not None:
            return self.commits[self.refs[ref]]
        if _SHORT_SHA.fullmatch(rev):
            matches = [c for cid, c in self.commits.items() if cid.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
        raise _not_found(f"Invalid rev id: {rev}", "RevisionNotFound")

    def content(self, blob: Blob) -> bytes:
        return blob.data if blob.data is not None else self.lfs[blob.sha256 or ""]

    def pull_request(self, ref: str) -> Discussion | None:
        match = re.fullmatch(r"refs/pr/(\d+)", ref)
        return self.discussions.get(int(match.group(1))) if match else None


def make_commit(parents: Iterable[str], tree: Mapping[str, Blob], title: str, message: str, author: str) -> Commit:
    """Build a commit whose id is the sha1 of a canonical serialization of its content."""
    parents = tuple(parents)
    canonical = json.dumps(
        {"parents": parents, "tree": sorted([p, b.oid] for p, b in tree.items()), "title": title,
         "message": message, "author": author},
        sort_keys=True, separators=(",", ":"),
    ).encode()
    commit_id = hashlib.sha1(b"commit %d\0" % len(canonical) + canonical).hexdigest()
    return Commit(commit_id, parents, dict(tree), title, message, author, _now())


def _directories(tree: Mapping[str, Blob]) -> set[str]:
    return {"/".join(p.split("/")[:i]) for p in tree for i in range(1, p.count("/") + 1)}


def _tree_oid(tree: Mapping[str, Blob], folder: str) -> str:
    prefix = folder + "/"
    listing = "\n".join(f"{p} {b.oid}" for p, b in sorted(tree.items()) if p.startswith(prefix))
    return hashlib.sha1(f"tree {folder}\n{listing}".encode()).hexdigest()


def _changed_paths(old: Mapping[str, Blob], new: Mapping[str, Blob]) -> set[str]:
    return {p for p in set(old) | set(new) if (old.get(p) and old[p].oid) != (new.get(p) and new[p].oid)}


def _git_text(blob: Blob | None) -> bytes:
    """What git stores for a file: its content, or its pointer for LFS files."""
    if blob is None:
        return b""
    return lfs_pointer(blob.sha256, blob.size) if blob.sha256 else blob.data or b""


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _gitattributes_lfs_patterns(text: str) -> list[str]:
    patterns = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            patterns.append(parts[0])
    return patterns


def _matches(path: str, patterns: Iterable[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name if "/" not in p.strip("/") else path, p.strip("/")) for p in patterns)


def _clean_path(path: Any) -> str:
    if not isinstance(path, str):
        raise HubError(400, "Invalid path")
    clean = path.strip("/")
    if not clean or any(part in ("", ".", "..") for part in clean.split("/")) or clean.startswith(".git/"):
        raise HubError(400, f"Invalid path: {path!r}")
    return clean


@dataclass
class _Call:
    """One HTTP request, with its path parameters, body and authenticated user."""

    request: Request
    body: bytes
    args: dict[str, str]
    user: str | None
    base: str  # scheme://host:port, from the request's Host header

    @property
    def query(self) -> Mapping[str, str]:
        return self.request.query_params

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError:
            raise HubError(400, "Request body is not valid JSON") from None

    def require_user(self) -> str:
        if self.user is None:
            raise HubError(401, "You must be authenticated to perform this action (Authorization: Bearer <token>)")
        return self.user


Handler = Callable[[_Call], Response]
_REPO = "/api/models/{ns}/{name}"


class HubEmulator:
    """In-memory Hub served over HTTP. Use as a context manager, or `start`/`stop`."""

    def __init__(
        self,
        tokens: Mapping[str, str] | None = None,
        *,
        orgs: Mapping[str, Iterable[str]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        lfs_threshold: int = LFS_THRESHOLD,
        tree_page_size: int = 1000,
        discussions_page_size: int = 50,
    ) -> None:
        self.host, self._port = host, port
        self._initial_tokens = dict(DEFAULT_TOKENS if tokens is None else tokens)
        self._initial_orgs = {org: set(members) for org, members in (orgs or {}).items()}
        self._orgs = {org: set(members) for org, members in self._initial_orgs.items()}
        self._defaults = (lfs_threshold, tree_page_size, discussions_page_size)
        self._lock = threading.RLock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._register_routes()
        self.reset()

    # ----------------------------------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:40123``."""
        if self._socket is None:
            raise RuntimeError("HubEmulator is not started")
        return f"http://{self.host}:{self._socket.getsockname()[1]}"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def _make_server(self) -> uvicorn.Server:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP lets asyncio set TCP_NODELAY on accepted connections (Nagle + delayed ACK would
        # otherwise add 40 ms to every keep-alive request).
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.bind((self.host, self._port))
        # date_header=False: uvicorn's Date is refreshed once a second by its main loop, seconds late when the loop
        # is busy; every answer gets the time it was sent instead (`__call__`): a client that stops reading a log
        # stream at the server's Date (`fetch_job_logs`) would otherwise miss the lines of the last seconds.
        config = uvicorn.Config(self, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1, date_header=False)
        return uvicorn.Server(config)

    def start(self) -> HubEmulator:
        """Serve in a daemon thread; returns once the server accepts connections."""
        if self._thread is not None:
            return self
        self._server = self._make_server()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="hub-emulator", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("Hub emulator failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (state is kept)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (used by the command line)."""
        self._server = self._make_server()
        print(f"Hub emulator serving on {self.url} (Ctrl+C to stop)", file=sys.stderr, flush=True)
        self._server.run(sockets=[self._socket])

    def __enter__(self) -> HubEmulator:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------------------- Python API for tests
    def reset(self) -> None:
        """Forget every repo, upload and event; restore the tokens and settings given at construction."""
        with self._lock:
            self._orgs = {org: set(members) for org, members in self._initial_orgs.items()}
            self._delays: list[tuple[str, re.Pattern[str], float]] = []
            self.tokens: dict[str, str] = dict(self._initial_tokens)
            self.lfs_threshold, self.tree_page_size, self.discussions_page_size = self._defaults
            self._repos: dict[str, Repo] = {}
            self._uploads: dict[str, tuple[str, str, int]] = {}
            self._events: list[dict[str, Any]] = []

    def add_token(self, token: str, user: str) -> None:
        with self._lock:
            self.tokens[token] = user

    def add_org_member(self, org: str, user: str) -> None:
        """Make `user` a member of the organization `org` (created when new; `reset` forgets it)."""
        with self._lock:
            self._orgs.setdefault(org, set()).add(user)

    def user_id(self, user: str) -> str:
        """The Hub id of `user` (what webhook payloads carry as a comment's ``author.id``)."""
        return _stable_id(user)

    def delay(self, method: str, path_pattern: str, seconds: float) -> None:
        """Hold every request whose method is `method` and whose path matches `path_pattern` (a regex, searched)
        for `seconds` before handling it; other requests are served meanwhile. `reset` removes the delays."""
        with self._lock:
            self._delays.append((method.upper(), re.compile(path_pattern), seconds))

    def create_model_repo(self, repo_id: str, files: Mapping[str, bytes] | None = None, *, private: bool = False,
                          author: str | None = None, message: str = "Upload files",
                          gitattributes: bool = True) -> str:
        """Create a repo as the Hub does (initial commit with ``.gitattributes`` unless disabled), commit
        ``files`` on main (LFS by the same rule as preupload) and return the head commit id."""
        with self._lock:
            repo = self._create_repo(repo_id, private, author or repo_id.split("/")[0], self._base(), gitattributes)
            if files:
                tree = dict(repo.commits[repo.refs["refs/heads/main"]].tree)
                for path, data in files.items():
                    path = _clean_path(path)
                    if self._upload_mode(repo, tree, path, len(data), data[:512]) == "lfs":
                        sha = hashlib.sha256(data).hexdigest()
                        repo.lfs[sha] = bytes(data)
                        tree[path] = Blob.lfs(sha, len(data))
                    else:
                        tree[path] = Blob.regular(bytes(data))
                self._commit(repo, "refs/heads/main", tree, message, "", author or repo.namespace, self._base())
            return repo.refs["refs/heads/main"]

    def _get(self, repo_id: str) -> Repo:
        try:
            return self._repos[repo_id]
        except KeyError:
            raise KeyError(f"no repo {repo_id!r}") from None

    def head(self, repo_id: str, ref: str = "main") -> str:
        """Commit id ``ref`` (branch, ``refs/pr/N``, or commit id) points to."""
        with self._lock:
            return self._get(repo_id).resolve(ref).id

    def files(self, repo_id: str, ref: str = "main") -> dict[str, bytes]:
        """Every file of the tree at ``ref``, with its content."""
        with self._lock:
            repo = self._get(repo_id)
            return {p: repo.content(b) for p, b in repo.resolve(ref).tree.items()}

    def file(self, repo_id: str, path: str, ref: str = "main") -> bytes:
        """Content of one file at ``ref`` (KeyError when missing)."""
        return self.files(repo_id, ref)[path]

    def is_lfs(self, repo_id: str, path: str, ref: str = "main") -> bool:
        with self._lock:
            return self._get(repo_id).resolve(ref).tree[path].sha256 is not None

    def refs(self, repo_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._get(repo_id).refs)

    def set_gated(self, repo_id: str, gated: bool | str = "auto") -> None:
        """Mark a repo gated (``"auto"`` or ``"manual"``), as its owner does in its settings."""
        with self._lock:
            self._get(repo_id).gated = gated

    def commits(self, repo_id: str, ref: str = "main") -> list[dict[str, Any]]:
        """First-parent history of ``ref``, newest first: id, parents, title, message, author, date, files."""
        with self._lock:
            repo = self._get(repo_id)
            return [{"id": c.id, "parents": list(c.parents), "title": c.title, "message": c.message,
                     "author": c.author, "date": c.date, "files": sorted(c.tree)}
                    for c in self._history(repo, repo.resolve(ref))]

    def discussions(self, repo_id: str) -> list[dict[str, Any]]:
        """Discussions and PRs, oldest first, as plain data (events in wire format)."""
        with self._lock:
            repo = self._get(repo_id)
            return [{"num": d.num, "title": d.title, "author": d.author, "isPullRequest": d.is_pull_request,
                     "status": d.status, "ref": f"refs/pr/{d.num}" if d.is_pull_request else None,
                     "base": d.base_ref, "mergeCommitId": d.merge_commit_id, "events": copy.deepcopy(d.events)}
                    for d in sorted(repo.discussions.values(), key=lambda d: d.num)]

    def events(self) -> list[dict[str, Any]]:
        """Every state change so far as a webhook payload (``WebhookPayload.model_validate`` accepts them)."""
        with self._lock:
            return copy.deepcopy(self._events)

    # ------------------------------------------------------------------------------------ ASGI + routing
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            body = await request.body()
            await self._maybe_delay(request)
            response = self._dispatch(request, body)
        except HubError as err:
            response = err.response()
        except Exception as exc:  # an emulator bug: say so, but never 5xx (the client would retry and sleep)
            traceback.print_exc()
            response = HubError(400, f"Hub emulator bug: {exc!r}", trace=traceback.format_exc()).response()
        response.headers["date"] = formatdate(time.time(), usegmt=True)
        await response(scope, receive, send)

    async def _maybe_delay(self, request: Request) -> None:
        import asyncio

        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1").split("?", 1)[0]
        with self._lock:
            wait = sum(seconds for method, pattern, seconds in self._delays
                       if method == request.method and pattern.search(raw))
        if wait:
            await asyncio.sleep(wait)

    def add_route(self, methods: str, template: str, handler: Handler) -> None:
        """Serve another API on this server (the client calls it on the Hub's endpoint: `tests.servers.jobs`), with
        the Hub's tokens; ``handler`` gets the request as a `_Call` and may answer a streaming response."""
        with self._lock:
            self._route(methods, template, handler)

    def acts_for(self, user: str | None, namespace: str) -> bool:
        """Whether ``user`` may act in ``namespace`` (it is the user, or a member of the org)."""
        with self._lock:
            return user is not None and user in self._members(namespace)

    def _route(self, methods: str, template: str, handler: Handler) -> None:
        """Register ``handler``; ``{x}`` in ``template`` matches one path segment, ``{x*}`` the rest."""
        parts, position = [], 0
        for match in re.finditer(r"\{(\w+)(\*?)\}", template):
            parts.append(re.escape(template[position:match.start()]))
            parts.append(f"(?P<{match.group(1)}>{'.*' if match.group(2) else '[^/]+'})")
            position = match.end()
        pattern = re.compile("".join(parts) + re.escape(template[position:]))
        for method in methods.split("|"):
            self._routes.append((method, pattern, handler))

    def _dispatch(self, request: Request, body: bytes) -> Response:
        # Route on the raw path: revisions arrive quoted with safe="" (refs%2Fpr%2F1), paths with "/" kept.
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        path = raw_path.decode("latin-1").split("?", 1)[0]
        method = "GET" if request.method == "HEAD" else request.method
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                with self._lock:
                    user = self._authenticate(request)
                    args = {k: unquote(v) for k, v in match.groupdict().items()}
                    return handler(_Call(request, body, args, user, self._base(request)))
        raise HubError(404, f"Hub emulator has no route for {request.method} {path}")

    def _authenticate(self, request: Request) -> str | None:
        header = request.headers.get("authorization")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token.strip()]

    def _base(self, request: Request | None = None) -> str:
        if request is not None and request.headers.get("host"):
            return f"{request.url.scheme}://{request.headers['host']}"
        return self.url if self._socket is not None else f"http://{self.host}:{self._port}"

    def _register_routes(self) -> None:
        r = self._route
        r("GET", "/api/whoami-v2", self._whoami)
        r("GET", "/api/organizations/{org}/members", self._org_members)
        r("GET", "/api/organizations/{org}/overview", self._org_overview)
        r("GET", "/api/users/{user}/overview", self._user_overview)
        r("POST", "/api/validate-yaml", self._validate_yaml)
        r("POST", "/api/repos/create", self._create_repo_route)
        r("DELETE", "/api/repos/delete", self._delete_repo_route)
        r("PUT", "/api/emulator/lfs-upload/{ticket}", self._lfs_put)
        r("GET|POST", _REPO + "/xet-{kind}-token/{rev*}", self._xet_token)
        r("GET|POST", _REPO + "/xet-{kind}-token", self._xet_token)
        r("GET", _REPO, self._model_info)
        r("GET", _REPO + "/revision/{rev}", self._model_info)
        r("PUT", _REPO + "/settings", self._settings)
        r("GET", _REPO + "/tree/{rev}", self._tree)
        r("GET", _REPO + "/tree/{rev}/{path*}", self._tree)
        r("POST", _REPO + "/paths-info/{rev}", self._paths_info)
        r("GET", _REPO + "/refs", self._refs)
        r("GET", _REPO + "/commits/{rev}", self._commits)
        r("POST|DELETE", _REPO + "/branch/{branch*}", self._branch)
        r("POST", _REPO + "/preupload/{rev}", self._preupload)
        r("POST", _REPO + "/commit/{rev}", self._commit_route)
        r("GET|POST", _REPO + "/discussions", self._discussions_route)
        r("GET", _REPO + "/discussions/{num}", self._discussion_details)
        r("POST", _REPO + "/discussions/{num}/comment", self._comment)
        r("POST", _REPO + "/discussions/{num}/comment/{cid}/{action}", self._edit_comment)
        r("POST", _REPO + "/discussions/{num}/status", self._change_status)
        r("POST", _REPO + "/discussions/{num}/title", self._change_title)
        r("POST", _REPO + "/discussions/{num}/merge", self._merge)
        r("POST", "/{ns}/{name}.git/info/lfs/objects/batch", self._lfs_batch)
        r("POST", "/{ns}/{name}.git/info/lfs/objects/verify", self._lfs_verify)
        r("GET", "/{ns}/{name}/resolve/{rev}/{path*}", self._resolve)

    # -------------------------------------------------------------------------------------- permissions
    def _members(self, namespace: str) -> set[str]:
        return {namespace} | self._orgs.get(namespace, set())

    def _can_write(self, user: str | None, repo: Repo) -> bool:
        return user is not None and user in self._members(repo.namespace)

    def _readable_repo(self, call: _Call) -> Repo:
        repo_id = f"{call.args['ns']}/{call.args['name']}"
        repo = self._repos.get(repo_id)
        if repo is None or (repo.private and not self._can_write(call.user, repo)):
            raise HubError(401 if call.user is None else 404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _writable_repo(self, call: _Call) -> Repo:
        repo = self._readable_repo(call)
        user = call.require_user()
        if not self._can_write(user, repo):
            raise HubError(403, f"You don't have write access to {repo.repo_id}")
        return repo

    # ---------------------------------------------------------------------------------------- state ops
    def _create_repo(self, repo_id: str, private: bool, author: str, base: str, gitattributes: bool = True) -> Repo:
        if repo_id in self._repos:
            raise HubError(409, "You already created this model repo", url=f"{base}/{repo_id}")
        repo = self._repos[repo_id] = Repo(repo_id, private, _now())
        tree = {".gitattributes": Blob.regular(DEFAULT_GITATTRIBUTES)} if gitattributes else {}
        commit = make_commit((), tree, "initial commit", "", author)
        repo.commits[commit.id] = commit
        repo.refs["refs/heads/main"] = commit.id
        self._log(base, repo, "create", "repo")
        return repo

    def _commit(self, repo: Repo, ref: str, tree: Mapping[str, Blob], title: str, message: str, author: str,
                base: str, parent: str | None = None) -> Commit:
        """Create a commit on top of ``parent`` (default: the ref's head), move the ref, log the push."""
        old = repo.refs.get(ref)
        parent = parent or old
        commit = make_commit([parent] if parent else [], tree, title, message, author)
        repo.commits.setdefault(commit.id, commit)
        repo.refs[ref] = commit.id
        pr = repo.pull_request(ref)
        if pr is not None:
            pr.events.append(self._event(author, "commit", {"subject": title, "oid": commit.id}))
        self._log(base, repo, "update", "repo.content", updatedRefs=[{"ref": ref, "oldSha": old, "newSha": commit.id}])
        return repo.commits[commit.id]

    def _history(self, repo: Repo, commit: Commit) -> Iterator[Commit]:
        current: Commit | None = commit
        while current is not None:
            yield current
            current = repo.commits[current.parents[0]] if current.parents else None

    def _upload_mode(self, repo: Repo, tree: Mapping[str, Blob], path: str, size: int, sample: bytes) -> str:
        attributes = tree.get(".gitattributes")
        patterns = _gitattributes_lfs_patterns(repo.content(attributes).decode(errors="replace")) if attributes else []
        if size > 0 and (size > self.lfs_threshold or b"\0" in sample or _matches(path, patterns)):
            return "lfs"
        return "regular"

    def _event(self, user: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"id": _object_id(), "type": kind, "createdAt": _now(), "author": self._user_json(user), "data": data}

    def _user_json(self, user: str) -> dict[str, Any]:
        return {"_id": _stable_id(user), "name": user, "fullname": user, "type": "user", "avatarUrl": "",
                "isPro": False, "isHf": False, "isMod": False}

    def _log(self, base: str, repo: Repo, action: str, scope: str, *, discussion: Discussion | None = None,
             comment: dict[str, Any] | None = None, updatedRefs: list[dict[str, Any]] | None = None) -> None:
        """Record a webhook payload for a state change."""
        url = f"{base}/{repo.repo_id}"
        payload: dict[str, Any] = {
            "event": {"action": action, "scope": scope},
            "repo": {"type": "model", "name": repo.repo_id, "id": repo.object_id, "private": repo.private,
                     "url": {"web": url, "api": f"{base}/api/models/{repo.repo_id}"},
                     "owner": {"id": _stable_id(repo.namespace)}, "headSha": repo.refs.get("refs/heads/main")},
            "webhook": {"id": "hub-emulator", "version": 3},
        }
        if discussion is not None:
            payload["discussion"] = self._discussion_json(base, repo, discussion, webhook=True)
        if comment is not None:
            payload["comment"] = {"id": comment["id"], "author": {"id": comment["author"]["_id"]},
                                  "hidden": comment["data"]["hidden"], "content": comment["data"]["latest"]["raw"],
                                  "url": {"web": f"{url}/discussions/{discussion.num}#{comment['id']}"
                                          if discussion else url}}
        if updatedRefs is not None:
            payload["updatedRefs"] = updatedRefs
        self._events.append(payload)

    # -------------------------------------------------------------------------------- account + repos
    def _whoami(self, call: _Call) -> Response:
        user = call.require_user()
        orgs = [{"name": org, "type": "org", "roleInOrg": "write"} for org, m in self._orgs.items() if user in m]
        return JSONResponse({"type": "user", "id": _stable_id(user), "name": user, "fullname": user,
                             "email": f"{user}@example.com", "emailVerified": True, "canPay": False,
                             "isPro": False, "orgs": orgs,
                             "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}}})

    def _known_users(self) -> set[str]:
        users = set(self.tokens.values()) | {u for members in self._orgs.values() for u in members}
        return (users | {repo.namespace for repo in self._repos.values()}) - set(self._orgs)

    def _org_members(self, call: _Call) -> Response:
        org = call.args["org"]
        if org not in self._orgs:
            raise HubError(404, f"Organization {org} not found")
        members = [{"_id": _stable_id(user), "user": user, "fullname": user, "avatarUrl": "", "type": "user",
                    "isPro": False} for user in sorted(self._orgs[org])]
        page, headers = self._paginated(call, members, 500)
        return JSONResponse(page, headers=headers)

    def _org_overview(self, call: _Call) -> Response:
        org = call.args["org"]
        if org not in self._orgs:
            raise HubError(404, f"Organization {org} not found")
        return JSONResponse({"_id": _stable_id(org), "name": org, "fullname": org, "avatarUrl": "", "type": "org",
                             "isVerified": False, "numUsers": len(self._orgs[org]),
                             "numModels": sum(r.namespace == org for r in self._repos.values())})

    def _user_overview(self, call: _Call) -> Response:
        user = call.args["user"]
        if user not in self._known_users():
            raise HubError(404, f"User {user} not found")
        orgs = [{"name": org, "fullname": org, "avatarUrl": ""} for org, m in self._orgs.items() if user in m]
        return JSONResponse({"_id": _stable_id(user), "user": user, "fullname": user, "avatarUrl": "",
                             "type": "user", "isPro": False, "createdAt": "2024-01-01T00:00:00.000Z",
                             "numModels": sum(r.namespace == user for r in self._repos.values()), "orgs": orgs})

    def _validate_yaml(self, call: _Call) -> Response:
        content = str(call.json().get("content", ""))
        match = re.match(r"\A---\r?\n(.*?)\r?\n---\s*(\r?\n|\Z)", content, re.S)
        errors: list[dict[str, str]] = []
        if match:
            try:
                import yaml

                if not isinstance(yaml.safe_load(match.group(1)) or {}, dict):
                    errors.append({"message": "Metadata must be a YAML mapping"})
            except ImportError:
                pass
            except Exception as exc:  # yaml.YAMLError
                errors.append({"message": f"Invalid YAML metadata: {exc}"})
        return JSONResponse({"errors": errors, "warnings": []}, 400 if errors else 200)

    def _create_repo_route(self, call: _Call) -> Response:
        user = call.require_user()
        body = call.json()
        name, namespace = body.get("name"), body.get("organization") or user
        if body.get("type", "model") != "model":
            raise HubError(400, "The Hub emulator only hosts model repos")
        if not isinstance(name, str) or not _REPO_NAME.fullmatch(name):
            raise HubError(400, f"Invalid repo name: {name!r}")
        if user not in self._members(namespace):
            raise HubError(403, f"You don't have the rights to create a model under the namespace {namespace!r}")
        private = body.get("visibility") == "private" or body.get("private") is True
        repo = self._create_repo(f"{namespace}/{name}", private, user, call.base)
        return JSONResponse({"url": f"{call.base}/{repo.repo_id}", "name": repo.repo_id, "id": repo.object_id})

    def _delete_repo_route(self, call: _Call) -> Response:
        body = call.json()
        call.args.update(ns=body.get("organization") or call.require_user(), name=str(body.get("name")))
        repo = self._writable_repo(call)
        del self._repos[repo.repo_id]
        self._log(call.base, repo, "delete", "repo")
        return Response(status_code=200)

    def _settings(self, call: _Call) -> Response:
        repo = self._writable_repo(call)
        body = call.json()
        if "visibility" in body or "private" in body:
            repo.private = body.get("visibility") == "private" or body.get("private") is True
            self._log(call.base, repo, "update", "repo.config")
        return JSONResponse({})

    def _xet_token(self, call: _Call) -> Response:
        raise HubError(400, "Xet storage is not supported by the Hub emulator: set HF_HUB_DISABLE_XET=1")

    # ---------------------------------------------------------------------------------------- reading
    def _model_info(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        commit = repo.resolve(call.args.get("rev", "main"))
        blobs = _flag(call.query.get("blobs"))
        siblings = []
        for path, blob in sorted(commit.tree.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=blob.size, blobId=blob.oid)
                if blob.sha256:
                    sibling["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": blob.pointer_size}
            siblings.append(sibling)
        info: dict[str, Any] = {
            "_id": repo.object_id, "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.namespace,
            "sha": commit.id, "lastModified": commit.date, "createdAt": repo.created_at, "private": repo.private,
            "gated": repo.gated, "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "spaces": [], "usedStorage": sum(b.size for b in commit.tree.values()),
        }
        expand = call.request.query_params.getlist("expand") + call.request.query_params.getlist("expand[]")
        if expand:
            info = {k: v for k, v in info.items() if k in {"_id", "id", *expand}}
        return JSONResponse(info)

    def _entry_json(self, repo: Repo, commit: Commit, path: str, expand: bool) -> dict[str, Any]:
        blob = commit.tree.get(path)
        entry: dict[str, Any]
        if blob is None:
            entry = {"type": "directory", "oid": _tree_oid(commit.tree, path), "size": 0, "path": path}
        else:
            entry = {"type": "file", "oid": blob.oid, "size": blob.size, "path": path}
            if blob.sha256:
                entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
        if expand:
            last = self._last_commit(repo, commit, path)
            entry["lastCommit"] = {"id": last.id, "title": last.title, "date": last.date}
        return entry

    def _last_commit(self, repo: Repo, commit: Commit, path: str) -> Commit:
        """Newest first-parent ancestor that changed ``path`` (a file or a folder)."""
        def state(c: Commit) -> str | None:
            blob = c.tree.get(path)
            return blob.oid if blob else (_tree_oid(c.tree, path) if path in _directories(c.tree) else None)

        last = commit
        for current in self._history(repo, commit):
            parent = repo.commits[current.parents[0]] if current.parents else None
            last = current
            if parent is None or state(parent) != state(current):
                break
        return last

    def _paginated(self, call: _Call, items: list[Any], page_size: int) -> tuple[list[Any], dict[str, str]]:
        """Cursor pagination with a GitHub-style ``Link: <...>; rel="next"`` header."""
        try:
            offset = int(call.query.get("cursor") or 0)
        except ValueError:
            raise HubError(400, "Invalid cursor") from None
        headers = {}
        if offset + page_size < len(items):
            params = {k: v for k, v in call.query.items() if k != "cursor"} | {"cursor": str(offset + page_size)}
            path = call.request.scope.get("raw_path", b"").decode("latin-1") or call.request.url.path
            headers["Link"] = f'<{call.base}{path}?{urlencode(params)}>; rel="next"'
        return items[offset:offset + page_size], headers

    def _tree(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        commit = repo.resolve(call.args["rev"])
        folder = call.args.get("path", "").strip("/")
        directories = _directories(commit.tree)
        if folder and folder not in directories:
            raise _not_found(f"{folder} does not exist on {call.args['rev']}", "EntryNotFound", commit.id)
        prefix = folder + "/" if folder else ""
        recursive, expand = _flag(call.query.get("recursive")), _flag(call.query.get("expand"))
        paths = sorted(p for p in set(commit.tree) | directories
                       if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):]))
        page, headers = self._paginated(call, paths, 50 if expand else self.tree_page_size)
        return JSONResponse([self._entry_json(repo, commit, p, expand) for p in page], headers=headers)

    def _paths_info(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        commit = repo.resolve(call.args["rev"])
        if call.request.headers.get("content-type", "").startswith("application/json"):
            form = call.json()
            paths, expand = form.get("paths", []), bool(form.get("expand"))
        else:
            form = parse_qs(call.body.decode())
            paths, expand = form.get("paths", []), _flag((form.get("expand") or [""])[0])
        existing = set(commit.tree) | _directories(commit.tree)
        found = [p.strip("/") for p in paths if p.strip("/") in existing]
        return JSONResponse([self._entry_json(repo, commit, p, expand) for p in found])

    def _refs(self, call: _Call) -> Response:
        repo = self._readable_repo(call)

        def refs(prefix: str) -> list[dict[str, str]]:
            return [{"name": ref[len(prefix):], "ref": ref, "targetCommit": target}
                    for ref, target in sorted(repo.refs.items()) if ref.startswith(prefix)]

        answer = {"branches": refs("refs/heads/"), "tags": refs("refs/tags/"), "converts": []}
        if _flag(call.query.get("include_prs")):
            answer["pullRequests"] = refs("refs/pr/")
        return JSONResponse(answer)

    def _commits(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        history = [{"id": c.id, "title": c.title, "message": c.message, "date": c.date,
                    "authors": [{"user": c.author, "avatar": ""}]}
                   for c in self._history(repo, repo.resolve(call.args["rev"]))]
        page, headers = self._paginated(call, history, 50)
        return JSONResponse(page, headers=headers)

    def _branch(self, call: _Call) -> Response:
        repo = self._writable_repo(call)
        ref = f"refs/heads/{call.args['branch']}"
        if call.request.method == "DELETE":
            if ref not in repo.refs or ref == "refs/heads/main":
                raise _not_found(f"Cannot delete branch {call.args['branch']}", "RevisionNotFound")
            old = repo.refs.pop(ref)
            self._log(call.base, repo, "update", "repo.content", updatedRefs=[{"ref": ref, "oldSha": old}])
            return JSONResponse({})
        if ref in repo.refs:
            raise HubError(409, f"Branch {call.args['branch']} already exists")
        start = repo.resolve(call.json().get("startingPoint") or "main")
        repo.refs[ref] = start.id
        self._log(call.base, repo, "update", "repo.content", updatedRefs=[{"ref": ref, "newSha": start.id}])
        return JSONResponse({})

    def _resolve(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        commit = repo.resolve(call.args["rev"])
        blob = commit.tree.get(call.args["path"])
        if blob is None:
            raise _not_found(f"Entry {call.args['path']} not found at {call.args['rev']}", "EntryNotFound", commit.id)
        data = repo.content(blob)
        headers = {"X-Repo-Commit": commit.id, "ETag": f'"{blob.oid}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream",
                   "Content-Disposition": f'inline; filename="{call.args["path"].rsplit("/", 1)[-1]}"'}
        if blob.sha256:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
        status, body = 200, data
        range_header = call.request.headers.get("range")
        if range_header:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header.strip())
            if not match or not any(match.groups()):
                raise HubError(416, f"Invalid range {range_header}", headers={"Content-Range": f"bytes */{len(data)}"})
            start_s, end_s = match.groups()
            start = int(start_s) if start_s else max(len(data) - int(end_s), 0)
            end = min(int(end_s), len(data) - 1) if start_s and end_s else len(data) - 1
            if start >= len(data) and len(data) > 0:
                raise HubError(416, "Range not satisfiable", headers={"Content-Range": f"bytes */{len(data)}"})
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        headers["Content-Length"] = str(len(body))
        return Response(b"" if call.request.method == "HEAD" else body, status, headers=headers)

    # ----------------------------------------------------------------------------------------- uploads
    def _preupload(self, call: _Call) -> Response:
        call.require_user()
        repo = self._readable_repo(call)
        commit = repo.resolve(call.args["rev"])
        body = call.json()
        ignore = body.get("gitIgnore")
        if ignore is None and ".gitignore" in commit.tree:
            ignore = repo.content(commit.tree[".gitignore"]).decode(errors="replace")
        ignored = [line.strip() for line in (ignore or "").splitlines() if line.strip() and line[0] != "#"]
        answers = []
        for item in body.get("files", []):
            path = _clean_path(item.get("path"))
            sample = base64.b64decode(item.get("sample") or "")
            existing = commit.tree.get(path)
            answers.append({"path": item["path"], "shouldIgnore": _matches(path, ignored),
                            "uploadMode": self._upload_mode(repo, commit.tree, path, int(item.get("size", 0)), sample),
                            "oid": existing.content_oid if existing else None})
        return JSONResponse({"files": answers, "commitOid": commit.id})

    def _lfs_batch(self, call: _Call) -> Response:
        call.require_user()
        repo = self._readable_repo(call)
        body = call.json()
        if body.get("operation") != "upload":
            raise HubError(422, "The Hub emulator only supports the LFS 'upload' operation")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not isinstance(oid, str) or not re.fullmatch(r"[0-9a-f]{64}", oid) or not isinstance(size, int):
                raise HubError(422, f"Invalid LFS object {obj!r}")
            if oid in repo.lfs:
                if len(repo.lfs[oid]) == size:
                    objects.append({"oid": oid, "size": size})  # already stored: no actions
                else:
                    objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "Size mismatch"}})
                continue
            ticket = secrets.token_urlsafe(16)
            self._uploads[ticket] = (repo.repo_id, oid, size)
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{call.base}/api/emulator/lfs-upload/{ticket}"},
                "verify": {"href": f"{call.base}/{repo.repo_id}.git/info/lfs/objects/verify"}}})
        return JSONResponse({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                            media_type="application/vnd.git-lfs+json")

    def _lfs_put(self, call: _Call) -> Response:
        """Plays the storage bucket behind a signed URL: no auth, content checked against oid and size."""
        ticket = self._uploads.get(call.args["ticket"])
        if ticket is None or ticket[0] not in self._repos:
            raise HubError(403, "Unknown or expired upload URL")
        repo_id, oid, size = ticket
        if len(call.body) != size or hashlib.sha256(call.body).hexdigest() != oid:
            raise HubError(400, f"Uploaded content does not match oid {oid} and size {size}")
        self._repos[repo_id].lfs[oid] = call.body
        del self._uploads[call.args["ticket"]]
        return Response(status_code=200, headers={"ETag": f'"{hashlib.md5(call.body).hexdigest()}"'})

    def _lfs_verify(self, call: _Call) -> Response:
        call.require_user()
        repo = self._readable_repo(call)
        body = call.json()
        stored = repo.lfs.get(str(body.get("oid")))
        if stored is None or len(stored) != body.get("size"):
            raise HubError(404, f"LFS object {body.get('oid')} not found with size {body.get('size')}")
        return JSONResponse({"success": True})

    def _apply(self, repo: Repo, tree: Mapping[str, Blob], operations: list[dict[str, Any]]) -> dict[str, Blob]:
        """Apply NDJSON operations to a copy of ``tree``; every check happens before anything is stored."""
        new = dict(tree)
        for operation in operations:
            key, value = operation.get("key"), operation.get("value") or {}
            path = _clean_path(value.get("path"))
            if key == "file":
                content = value.get("content", "")
                data = base64.b64decode(content) if value.get("encoding") == "base64" else str(content).encode()
                if len(data) > MAX_REGULAR_FILE_SIZE:
                    raise HubError(400, f"{path} is larger than 10 MiB: upload it with LFS")
                new[path] = Blob.regular(data)
            elif key == "lfsFile":
                oid = value.get("oid")
                if value.get("algo", "sha256") != "sha256" or oid not in repo.lfs:
                    raise HubError(400, f"LFS object {oid} for {path} was never uploaded")
                size = value.get("size", len(repo.lfs[oid]))
                if size != len(repo.lfs[oid]):
                    raise HubError(400, f"LFS object {oid} for {path} has size {len(repo.lfs[oid])}, not {size}")
                new[path] = Blob.lfs(oid, size)
            elif key == "deletedFile":
                if path not in new:
                    raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del new[path]
            elif key == "deletedFolder":
                doomed = [p for p in new if p.startswith(path + "/")]
                if not doomed:
                    raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in doomed:
                    del new[p]
            else:
                raise HubError(400, f"Unknown commit operation {key!r}")
        clashes = sorted(set(new) & _directories(new))
        if clashes:
            raise HubError(400, f"{clashes[0]} cannot be both a file and a folder")
        return new

    def _commit_route(self, call: _Call) -> Response:
        user = call.require_user()
        repo = self._readable_repo(call)
        try:
            lines = [json.loads(line) for line in call.body.splitlines() if line.strip()]
        except ValueError:
            raise HubError(400, "Commit payload is not valid NDJSON") from None
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "Commit payload must start with a header line")
        header, operations = lines[0].get("value") or {}, lines[1:]
        title, message = str(header.get("summary") or "").strip(), str(header.get("description") or "")
        if not title:
            raise HubError(400, "Commit summary cannot be empty")
        parent_commit, rev = header.get("parentCommit"), call.args["rev"]
        if _flag(call.query.get("create_pr")):
            base_ref = repo.ref_name(rev)
            if base_ref is None:
                raise _not_found(f"Invalid rev id: {rev}", "RevisionNotFound")
            if not base_ref.startswith("refs/heads/"):
                raise HubError(400, f"Pull requests must target a branch, not {rev}")
            start = repo.resolve(parent_commit) if parent_commit else repo.commits[repo.refs[base_ref]]
            tree = self._apply(repo, start.tree, operations)
            pr = self._open_discussion(repo, user, title, message, True, base_ref, start.id, call.base)
            ref = f"refs/pr/{pr.num}"
            del repo.refs[ref]  # created by the commit below (so the push reads as a new ref)
        else:
            ref = repo.ref_name(rev)
            if ref is None:
                repo.resolve(rev)  # 404 RevisionNotFound unless it names a commit
                raise HubError(400, f"Cannot commit to {rev}: it is not a branch")
            pr = repo.pull_request(ref)
            if pr is not None:
                if not (self._can_write(user, repo) or user == pr.author):
                    raise HubError(403, f"Only {pr.author} or {repo.namespace} can push to {ref}")
                if pr.status != "open":
                    raise HubError(403, f"Pull request #{pr.num} is {pr.status}")
            elif not ref.startswith("refs/heads/") or not self._can_write(user, repo):
                raise HubError(403, f"You cannot push to {ref} of {repo.repo_id}")
            head = repo.refs[ref]
            if parent_commit and not (len(parent_commit) >= 7 and head.startswith(parent_commit)):
                raise HubError(412, f"A commit has happened since {parent_commit}: {ref} is now at {head}. "
                                    "Please refresh and try again.")
            tree = self._apply(repo, repo.commits[head].tree, operations)
            start = repo.commits[head]
        commit = self._commit(repo, ref, tree, title, message, user, call.base, parent=start.id)
        answer = {"success": True, "commitOid": commit.id, "commitMessage": title, "hookOutput": "",
                  "commitUrl": f"{call.base}/{repo.repo_id}/commit/{commit.id}"}
        if pr is not None:
            answer["pullRequestUrl"] = f"{call.base}/{repo.repo_id}/discussions/{pr.num}"
        return JSONResponse(answer)

    # ------------------------------------------------------------------------------------- discussions
    def _open_discussion(self, repo: Repo, user: str, title: str, description: str, is_pr: bool,
                         base_ref: str | None, fork_point: str | None, base: str) -> Discussion:
        num = max(repo.discussions, default=0) + 1
        discussion = Discussion(num, title, user, is_pr, _now(), base_ref=base_ref, fork_point=fork_point)
        discussion.events.append(self._comment_event(user, description or f"{title}"))
        repo.discussions[num] = discussion
        if is_pr and fork_point:
            repo.refs[f"refs/pr/{num}"] = fork_point
        self._log(base, repo, "create", "discussion", discussion=discussion)
        return discussion

    def _comment_event(self, user: str, text: str) -> dict[str, Any]:
        now = _now()
        latest = {"raw": text, "html": f"<p>{html.escape(text)}</p>", "updatedAt": now,
                  "author": self._user_json(user)}
        return self._event(user, "comment", {"edited": False, "hidden": False, "latest": latest, "numEdits": 0,
                                             "editors": [user], "history": [dict(latest)], "reactions": [],
                                             "identifiedLanguage": {"language": "en", "probability": 1.0}})

    def _discussion(self, repo: Repo, call: _Call) -> Discussion:
        try:
            return repo.discussions[int(call.args["num"])]
        except (KeyError, ValueError):
            raise HubError(404, f"Discussion {call.args['num']} not found on {repo.repo_id}") from None

    def _discussion_json(self, base: str, repo: Repo, d: Discussion, webhook: bool = False) -> dict[str, Any]:
        url = f"{base}/{repo.repo_id}/discussions/{d.num}"
        answer: dict[str, Any] = {"num": d.num, "title": d.title, "status": d.status,
                                  "isPullRequest": d.is_pull_request, "pinned": False}
        if webhook:
            answer.update(id=d.object_id, author={"id": _stable_id(d.author)},
                          url={"web": url, "api": f"{base}/api/models/{repo.repo_id}/discussions/{d.num}"})
        else:
            answer.update(createdAt=d.created_at, author=self._user_json(d.author), url=url,
                          repo={"name": repo.repo_id, "type": "model"},
                          numComments=sum(e["type"] == "comment" for e in d.events), topReactions=[])
        if d.is_pull_request:
            answer["changes"] = {"base": d.base_ref}
            if d.merge_commit_id:
                answer["changes"]["mergeCommitId"] = d.merge_commit_id
        return answer

    def _discussions_route(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        if call.request.method == "POST":
            user = call.require_user()
            body = call.json()
            title = str(body.get("title") or "").strip()
            if not title:
                raise HubError(400, "Discussion title cannot be empty")
            is_pr = bool(body.get("pullRequest"))
            head = repo.refs["refs/heads/main"] if is_pr else None
            d = self._open_discussion(repo, user, title, str(body.get("description") or ""), is_pr,
                                      "refs/heads/main" if is_pr else None, head, call.base)
            return JSONResponse(self._discussion_json(call.base, repo, d))
        kind, status, author = (call.query.get(k) for k in ("type", "status", "author"))
        selected = [
            d for d in sorted(repo.discussions.values(), key=lambda d: -d.num)
            if (kind in (None, "all") or d.is_pull_request == (kind == "pull_request"))
            and (status in (None, "all") or (d.status == "open") == (status == "open"))
            and (author is None or d.author == author)
        ]
        page_index = int(call.query.get("p") or 0)
        start = page_index * self.discussions_page_size
        page = selected[start:start + self.discussions_page_size]
        return JSONResponse({"discussions": [self._discussion_json(call.base, repo, d) for d in page],
                             "count": len(selected), "start": start,
                             "numClosedDiscussions": sum(d.status != "open" for d in repo.discussions.values())})

    def _pr_diff(self, repo: Repo, d: Discussion) -> tuple[str, list[str]]:
        """A git-style diff of the PR against its fork point, and the files that conflict with its base."""
        fork = repo.commits[d.fork_point or ""].tree
        head = repo.commits[repo.refs[f"refs/pr/{d.num}"]].tree
        base = repo.commits[repo.refs[d.base_ref or "refs/heads/main"]].tree
        changed = _changed_paths(fork, head)
        conflicts = sorted(p for p in changed & _changed_paths(fork, base)
                           if (head.get(p) and head[p].oid) != (base.get(p) and base[p].oid))
        chunks = []
        for path in sorted(changed):
            old, new = fork.get(path), head.get(path)
            try:
                before, after = _git_text(old).decode(), _git_text(new).decode()
            except UnicodeDecodeError:
                chunks.append(f"diff --git a/{path} b/{path}\nBinary files a/{path} and b/{path} differ\n")
                continue
            lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                         f"a/{path}" if old else "/dev/null", f"b/{path}" if new else "/dev/null")
            chunks.append(f"diff --git a/{path} b/{path}\n" + "".join(
                line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines))
        return "".join(chunks), conflicts

    def _discussion_details(self, call: _Call) -> Response:
        repo = self._readable_repo(call)
        d = self._discussion(repo, call)
        answer = self._discussion_json(call.base, repo, d) | {"events": copy.deepcopy(d.events)}
        answer["filesWithConflicts"] = []
        if d.is_pull_request and d.status != "merged" and d.fork_point:
            diff, answer["filesWithConflicts"] = self._pr_diff(repo, d)
            if _flag(call.query.get("diff")):
                answer["diff"] = diff
        return JSONResponse(answer)

    def _comment(self, call: _Call) -> Response:
        user = call.require_user()
        repo = self._readable_repo(call)
        d = self._discussion(repo, call)
        text = str(call.json().get("comment") or "")
        if not text.strip():
            raise HubError(400, "Comment cannot be empty")
        event = self._comment_event(user, text)
        d.events.append(event)
        self._log(call.base, repo, "create", "discussion.comment", discussion=d, comment=event)
        return JSONResponse({"newMessage": event})

    def _edit_comment(self, call: _Call) -> Response:
        user = call.require_user()
        repo = self._readable_repo(call)
        d = self._discussion(repo, call)
        event = next((e for e in d.events if e["id"] == call.args["cid"] and e["type"] == "comment"), None)
        if event is None:
            raise HubError(404, f"Comment {call.args['cid']} not found")
        data = event["data"]
        if call.args["action"] == "edit":
            if event["author"]["name"] != user:
                raise HubError(403, "Only the author of a comment can edit it")
            if data["hidden"]:
                raise HubError(403, "A hidden comment cannot be edited")
            data["latest"] = {"raw": str(call.json().get("content") or ""), "updatedAt": _now(),
                              "author": self._user_json(user)}
            data["latest"]["html"] = f"<p>{html.escape(data['latest']['raw'])}</p>"
            data.update(edited=True, numEdits=data["numEdits"] + 1)
            data["history"].insert(0, dict(data["latest"]))
        elif call.args["action"] == "hide":
            if event["author"]["name"] != user and not self._can_write(user, repo):
                raise HubError(403, "Only the author or the repo owner can hide a comment")
            data.update(hidden=True)
            data["latest"] = {"raw": "", "html": "", "updatedAt": _now(), "author": self._user_json(user)}
        else:
            raise HubError(404, f"Unknown comment action {call.args['action']}")
        self._log(call.base, repo, "update", "discussion.comment", discussion=d, comment=event)
        return JSONResponse({"updatedComment": event})

    def _moderated(self, call: _Call) -> tuple[Repo, Discussion, str]:
        user = call.require_user()
        repo = self._readable_repo(call)
        d = self._discussion(repo, call)
        if user != d.author and not self._can_write(user, repo):
            raise HubError(403, f"Only {d.author} or {repo.namespace} can change discussion #{d.num}")
        return repo, d, user

    def _change_status(self, call: _Call) -> Response:
        repo, d, user = self._moderated(call)
        body = call.json()
        status = body.get("status")
        if status not in ("open", "closed"):
            raise HubError(400, "Status must be 'open' or 'closed'")
        if d.status == "merged":
            raise HubError(400, f"Pull request #{d.num} is merged")
        if body.get("comment"):
            d.events.append(self._comment_event(user, str(body["comment"])))
        d.status = status
        event = self._event(user, "status-change", {"status": status})
        d.events.append(event)
        self._log(call.base, repo, "update", "discussion", discussion=d)
        return JSONResponse({"newStatus": event})

    def _change_title(self, call: _Call) -> Response:
        repo, d, user = self._moderated(call)
        title = str(call.json().get("title") or "").strip()
        if not title:
            raise HubError(400, "Title cannot be empty")
        event = self._event(user, "title-change", {"from": d.title, "to": title})
        d.title = title
        d.events.append(event)
        self._log(call.base, repo, "update", "discussion", discussion=d)
        return JSONResponse({"newTitle": event})

    def _merge(self, call: _Call) -> Response:
        user = call.require_user()
        repo = self._writable_repo(call)
        d = self._discussion(repo, call)
        if not d.is_pull_request or d.status != "open" or d.base_ref not in repo.refs:
            raise HubError(400, f"#{d.num} is not an open pull request")
        _, conflicts = self._pr_diff(repo, d)
        if conflicts:
            raise HubError(409, f"Pull request #{d.num} has conflicts: {', '.join(conflicts)}")
        fork = repo.commits[d.fork_point or ""].tree
        head = repo.commits[repo.refs[f"refs/pr/{d.num}"]].tree
        tree = dict(repo.commits[repo.refs[d.base_ref]].tree)
        for path in _changed_paths(fork, head):
            if path in head:
                tree[path] = head[path]
            else:
                tree.pop(path, None)
        body = call.json() if call.body else {}
        if body.get("comment"):
            d.events.append(self._comment_event(user, str(body["comment"])))
        commit = self._commit(repo, d.base_ref, tree, f"{d.title} (#{d.num})", "", user, call.base)
        d.status, d.merge_commit_id = "merged", commit.id
        d.events.append(self._event(user, "status-change", {"status": "merged"}))
        self._log(call.base, repo, "update", "discussion", discussion=d)
        return JSONResponse({"mergeCommitId": commit.id})


def main(argv: list[str] | None = None) -> None:
    """Command line: serve a Hub emulator until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m tests.servers.hub", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN=USER",
                        help="accept TOKEN as USER (repeatable; default: %s)" % ", ".join(
                            f"{t}={u}" for t, u in DEFAULT_TOKENS.items()))
    parser.add_argument("--org", action="append", default=[], metavar="ORG=USER[,USER...]",
                        help="make users members of an organization (repeatable)")
    args = parser.parse_args(argv)
    try:
        tokens = dict(item.split("=", 1) for item in args.token) or None
        orgs = {org: members.split(",") for org, members in (item.split("=", 1) for item in args.org)}
    except ValueError:
        parser.error("--token and --org take NAME=VALUE")
    HubEmulator(tokens, orgs=orgs, host=args.host, port=args.port).serve_forever()


if __name__ == "__main__":
    main()

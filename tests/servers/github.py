"""A local emulator of the GitHub REST API, good enough for the real PyGithub client.

The emulator is a FastAPI app served by uvicorn on a loopback port in a background
thread. State lives in memory behind one lock; tests arrange it and read it back
through the Python API of :class:`GitHubEmulator` and talk to it over HTTP with
PyGithub (``Github(base_url=emulator.url, auth=Auth.Token(...), retry=None,
seconds_between_requests=0, seconds_between_writes=0)``).

Emulated routes (all JSON, GitHub-style error bodies ``{"message": ...}``):

======  =====================================================  ==========================
verb    path                                                   notes
======  =====================================================  ==========================
GET     /user                                                  token's login; ``type`` Bot
                                                               for logins ending ``[bot]``
GET     /users/{login}
GET     /repos/{o}/{r}
GET     /repos/{o}/{r}/pulls/{n}
GET     /repos/{o}/{r}/issues/{n}                              PRs are issues too
GET     /repos/{o}/{r}/issues/{n}/comments                     ``per_page``/``page``/``since``,
                                                               ``Link`` header
POST    /repos/{o}/{r}/issues/{n}/comments                     ``{body}`` → 201
GET     /repos/{o}/{r}/issues/comments/{id}
PATCH   /repos/{o}/{r}/issues/comments/{id}                    ``{body}``
DELETE  /repos/{o}/{r}/issues/comments/{id}                    204
POST    /repos/{o}/{r}/check-runs                              ``{name, head_sha, ...}`` → 201
GET     /repos/{o}/{r}/check-runs/{id}
PATCH   /repos/{o}/{r}/check-runs/{id}
GET     /repos/{o}/{r}/actions/workflows/{id_or_file}
POST    /repos/{o}/{r}/actions/workflows/{id_or_file}/dispatches  ``{ref, inputs}`` → 204
                                                               (200 with ``return_run_details``);
                                                               creates a workflow run
GET     /repos/{o}/{r}/actions/runs/{run_id}                   the run: ``status`` queued →
                                                               completed, ``conclusion``
GET     /repos/{o}/{r}/actions/workflows/{id_or_file}/runs     ``{total_count, workflow_runs}``,
                                                               newest first; ``event``,
                                                               ``created`` (``>=``/``<=``/``>``/
                                                               ``<`` a time), paged
POST    /repos/{o}/{r}/dispatches                              ``{event_type, client_payload}``
                                                               → 204
======  =====================================================  ==========================

Behaviour kept honest:

* Auth: ``Authorization: token <t>`` or ``Bearer <t>``. An unknown token is answered
  401 ``Bad credentials`` on every route; no header means anonymous: reads of public
  repositories work, writes and ``/user`` are 401 ``Requires authentication``.
* Missing resources and unknown routes are 404 ``Not Found``; bodies are validated
  (400 for unparsable JSON, 422 for missing or mistyped fields, GitHub's limits on
  comment length, dispatch payloads and check-run output).
* Check runs can only be written by GitHub Apps: logins not ending ``[bot]`` get 403
  ``You must authenticate via a GitHub App.`` (switch off with
  ``check_runs_require_app=False``). ``head_sha`` must be a commit the repository knows.
* Workflow dispatches need an existing branch or tag as ``ref`` and, when the
  workflow declares inputs, only those inputs (and all required ones).
* Absolute URLs in answers are built from the request's scheme and ``Host`` header,
  so PyGithub follows them back to this server.
* ``GET /user`` with a GitHub App installation token (``GITHUB_TOKEN``) is 403
  ``Resource not accessible by integration`` on real GitHub. The emulator answers it
  with the bot's login unless built with ``bot_user_forbidden=True``.

* A run's ``display_title`` is the workflow's ``run-name`` (``add_workflow(run_name=...)``)
  rendered with the dispatch's inputs: ``${{ a || b || 'text' }}`` expressions over
  ``inputs.X``, ``github.event.client_payload.X`` and ``github.run_id``; without one it
  is the workflow's name, as on GitHub.
* ``hold_dispatch_answers`` (a ``threading.Event``): a dispatch creates its run, then
  waits for the event before answering, so a test can kill the client while the answer
  is in flight.
* A dispatched workflow run stays ``queued`` until the test concludes it
  (:meth:`GitHubEmulator.complete_run`), or concludes at once with ``run_conclusion`` when
  that is set (``success``, ``failure``, ``cancelled``...).

Everything each request did is recorded for assertions (``requests``, ``comments()``,
``dispatches()``, ``check_runs()``, ``runs()``); token values are never stored.

Run standalone: ``python -m tests.servers.github --port 8765 --token ghs_x=github-actions[bot]
--repo acme/widgets --pull acme/widgets#1:<sha> --workflow acme/widgets:export.yml``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import itertools
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "CheckRun",
    "Comment",
    "Dispatch",
    "GitHubEmulator",
    "Pull",
    "RequestRecord",
    "Workflow",
    "WorkflowRun",
    "main",
]

DOCS_URL = "https://docs.github.com/rest"
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
MAX_COMMENT_LENGTH = 65536
MAX_CHECK_TEXT_LENGTH = 65535
MAX_ANNOTATIONS_PER_REQUEST = 50
MAX_CHECK_ACTIONS = 3
MAX_EVENT_TYPE_LENGTH = 100
MAX_CLIENT_PAYLOAD_PROPERTIES = 10
MAX_WORKFLOW_INPUTS = 25
CHECK_STATUSES = frozenset({"queued", "in_progress", "completed", "waiting", "requested", "pending"})
CHECK_CONCLUSIONS = frozenset(
    {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "stale", "timed_out"}
)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request the emulator answered. ``login`` is None for anonymous or bad tokens."""

    method: str
    path: str
    params: dict[str, str]
    login: str | None
    status: int


@dataclass
class Comment:
    """An issue (or pull-request conversation) comment."""

    id: int
    repo: str
    number: int
    body: str
    login: str
    created_at: datetime
    updated_at: datetime


@dataclass
class CheckRun:
    """A check run; ``updates`` holds the body of every PATCH in order."""

    id: int
    repo: str
    name: str
    head_sha: str
    status: str
    conclusion: str | None
    details_url: str | None
    external_id: str | None
    output: dict[str, Any]
    actions: list[dict[str, Any]]
    started_at: datetime | None
    completed_at: datetime | None
    login: str
    check_suite_id: int
    updates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Dispatch:
    """A workflow dispatch (``kind="workflow"``) or a repository dispatch (``kind="repository"``)."""

    kind: Literal["workflow", "repository"]
    repo: str
    login: str
    created_at: datetime
    workflow: str | None = None  # workflow file name, for kind="workflow"
    ref: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    event_type: str | None = None
    client_payload: dict[str, Any] = field(default_factory=dict)
    run_id: int | None = None


@dataclass
class WorkflowRun:
    """A run of a workflow, created by a dispatch; ``conclusion`` is set once ``status`` is ``completed``."""

    id: int
    repo: str
    workflow_id: int
    workflow: str
    ref: str
    event: str
    login: str
    created_at: datetime
    updated_at: datetime
    status: str = "queued"
    conclusion: str | None = None
    display_title: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pull:
    """A pull request (and the issue that carries its conversation)."""

    number: int
    id: int
    title: str
    body: str
    head_sha: str
    head_ref: str
    base: str
    state: str
    login: str
    created_at: datetime
    updated_at: datetime


@dataclass
class Workflow:
    """A workflow file under ``.github/workflows``; ``inputs`` is None when undeclared."""

    id: int
    file: str
    name: str
    dispatchable: bool
    inputs: tuple[str, ...] | None
    required_inputs: tuple[str, ...]
    created_at: datetime
    run_name: str | None = None


@dataclass
class _Repo:
    full_name: str
    id: int
    default_branch: str
    private: bool
    created_at: datetime
    branches: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    commits: set[str] = field(default_factory=set)
    pulls: dict[int, Pull] = field(default_factory=dict)
    comments: dict[int, Comment] = field(default_factory=dict)
    check_runs: dict[int, CheckRun] = field(default_factory=dict)
    check_suites: dict[tuple[str, str], int] = field(default_factory=dict)
    workflows: dict[int, Workflow] = field(default_factory=dict)
    dispatches: list[Dispatch] = field(default_factory=list)
    runs: dict[int, WorkflowRun] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        return self.full_name.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.full_name.split("/", 1)[1]


class ApiError(Exception):
    """An error answered to the client as ``{"message": ...}`` with an HTTP status."""

    def __init__(self, status: int, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def _not_found() -> ApiError:
    return ApiError(404, "Not Found")


def _invalid(detail: str) -> ApiError:
    return ApiError(422, f"Invalid request.\n\n{detail}")


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(value: str) -> datetime:
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}")


def render_run_name(template: str, inputs: Mapping[str, Any], run_id: int) -> str:
    """A ``run-name`` with its ``${{ a || b || 'text' }}`` expressions evaluated for a dispatch.

    Terms: ``inputs.X`` and ``github.event.inputs.X`` (the dispatch's inputs), ``github.event.client_payload.X``
    (empty for a workflow dispatch), ``github.run_id``, quoted strings; ``||`` takes the first non-empty one.
    """

    def term(text: str) -> str:
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] == "'":
            return text[1:-1]
        for prefix in ("inputs.", "github.event.inputs."):
            if text.startswith(prefix):
                return str(inputs.get(text[len(prefix):], "") or "")
        if text == "github.run_id":
            return str(run_id)
        return ""  # github.event.client_payload.*, anything else: empty for a workflow dispatch

    def expression(match: Any) -> str:
        return next((v for v in (term(t) for t in match.group(1).split("||")) if v), "")

    return _EXPRESSION.sub(expression, template)


def _fake_sha(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def _error_response(status: int, message: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    content: dict[str, Any] = {"message": message, "documentation_url": DOCS_URL, "status": str(status)}
    if errors:
        content["errors"] = errors
    return JSONResponse(content, status_code=status)


def _require_str(body: Mapping[str, Any], key: str, *, optional: bool = False) -> str | None:
    """Return ``body[key]`` as a string, or raise the 422 GitHub answers."""
    if key not in body or body[key] is None:
        if optional:
            return None
        raise _invalid(f'"{key}" wasn\'t supplied.')
    value = body[key]
    if not isinstance(value, str):
        raise _invalid(f"For 'properties/{key}', {json.dumps(value)} is not a string.")
    return value


def _require_object(body: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(f"For 'properties/{key}', {json.dumps(value)} is not an object.")
    return value


def _optional_time(body: Mapping[str, Any], key: str) -> datetime | None:
    raw = _require_str(body, key, optional=True)
    if raw is None:
        return None
    try:
        return _parse_iso(raw)
    except ValueError:
        raise _invalid(f"For 'properties/{key}', {json.dumps(raw)} is not a valid date-time.") from None


# --------------------------------------------------------------------------- emulator


class GitHubEmulator:
    """In-memory GitHub REST API served over HTTP on a loopback port.

    Arrange state with :meth:`create_repo`, :meth:`create_pull`, :meth:`add_workflow`
    (and friends), start it (:meth:`start` or ``with``), point PyGithub at :attr:`url`,
    then assert on :meth:`comments`, :meth:`dispatches`, :meth:`check_runs` and
    :attr:`requests`. All methods are thread-safe.
    """

    def __init__(
        self,
        tokens: Mapping[str, str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        check_runs_require_app: bool = True,
        bot_user_forbidden: bool = False,
    ) -> None:
        """``tokens`` maps token values to logins; ``port=0`` picks a free port."""
        self._lock = threading.RLock()
        self._initial = (dict(tokens or {}), check_runs_require_app, bot_user_forbidden)
        self._tokens: dict[str, str] = dict(tokens or {})
        self._host = host
        self._port = port
        self.check_runs_require_app = check_runs_require_app
        """403 for check-run writes by logins that are not GitHub Apps (``[bot]``), as on GitHub."""
        self.bot_user_forbidden = bot_user_forbidden
        """403 for ``GET /user`` with a ``[bot]`` token, as GitHub answers installation tokens."""
        self.run_conclusion: str | None = None
        """When set, a dispatched workflow run is created already ``completed`` with this conclusion."""
        self.hold_dispatch_answers: threading.Event | None = None
        """When set, a dispatch creates its run and then waits (up to 60 s) for this event before answering."""
        self._ids = itertools.count(1)
        self._user_ids: dict[str, int] = {}
        self._repos: dict[str, _Repo] = {}
        self._requests: list[RequestRecord] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.app = self._build_app()

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:54321``."""
        if self._server is None:
            raise RuntimeError("GitHubEmulator is not running; call start() first")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self._port

    def start(self, timeout: float = 10.0) -> GitHubEmulator:
        """Bind the port and serve in a daemon thread; returns once the server accepts requests."""
        if self._server is not None:
            return self
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP; without it every response stalls ~40 ms on Nagle + delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(128)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"github-emulator:{self._port}", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                sock.close()
                raise RuntimeError("GitHub emulator failed to start")
            if time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise TimeoutError(f"GitHub emulator did not start within {timeout} s")
            time.sleep(0.005)
        self._server, self._thread, self._socket = server, thread, sock
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the server down and release the port. State is kept."""
        server, thread, sock = self._server, self._thread, self._socket
        if server is None:
            return
        server.should_exit = True
        if thread is not None:
            thread.join(timeout)
        if sock is not None:
            sock.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> GitHubEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Back to the state right after construction, keeping the server running.

        Forgets repositories and recorded requests, restores the construction-time
        tokens and switches. Ids keep increasing, so nothing is ever reused.
        """
        tokens, require_app, bot_user_forbidden = self._initial
        with self._lock:
            self._repos.clear()
            self._requests.clear()
            self._tokens = dict(tokens)
            self.check_runs_require_app = require_app
            self.bot_user_forbidden = bot_user_forbidden
            self.run_conclusion = None
            self.hold_dispatch_answers = None

    # ----------------------------------------------------------------- arrange

    def add_token(self, token: str, login: str) -> None:
        """Accept ``token`` as ``login`` from now on."""
        with self._lock:
            self._tokens[token] = login

    def create_repo(
        self,
        full_name: str,
        default_branch: str = "main",
        *,
        private: bool = False,
        branches: Mapping[str, str] | None = None,
    ) -> None:
        """Create ``owner/name`` with ``default_branch`` (plus ``branches``: name → head SHA)."""
        owner, sep, name = full_name.partition("/")
        if not (owner and sep and name) or "/" in name:
            raise ValueError(f"expected 'owner/name', got {full_name!r}")
        with self._lock:
            if full_name.lower() in self._repos:
                raise ValueError(f"repository {full_name} already exists")
            heads = {default_branch: _fake_sha(full_name, default_branch)}
            heads.update(branches or {})
            self._repos[full_name.lower()] = _Repo(
                full_name=full_name,
                id=next(self._ids),
                default_branch=default_branch,
                private=private,
                created_at=_now(),
                branches=heads,
                commits=set(heads.values()),
            )

    def add_branch(self, repo: str, name: str, sha: str | None = None) -> str:
        """Create or move branch ``name`` to ``sha`` (made up when None); returns the SHA."""
        with self._lock:
            state = self._get_repo(repo)
            head = sha or _fake_sha(state.full_name, name, str(len(state.commits)))
            state.branches[name] = head
            state.commits.add(head)
            return head

    def add_tag(self, repo: str, name: str, sha: str | None = None) -> str:
        """Create tag ``name`` at ``sha`` (the default branch head when None); returns the SHA."""
        with self._lock:
            state = self._get_repo(repo)
            target = sha or state.branches[state.default_branch]
            state.tags[name] = target
            state.commits.add(target)
            return target

    def create_pull(
        self,
        repo: str,
        number: int,
        title: str,
        head_sha: str,
        base: str = "main",
        *,
        head_ref: str | None = None,
        author: str = "octocat",
        body: str = "",
        state: Literal["open", "closed"] = "open",
    ) -> None:
        """Open pull request ``number`` from ``head_ref`` (default ``pr-{number}``) at ``head_sha``."""
        with self._lock:
            repo_state = self._get_repo(repo)
            if number in repo_state.pulls:
                raise ValueError(f"{repo}#{number} already exists")
            if base not in repo_state.branches:
                repo_state.branches[base] = _fake_sha(repo_state.full_name, base)
                repo_state.commits.add(repo_state.branches[base])
            ref = head_ref or f"pr-{number}"
            repo_state.branches[ref] = head_sha
            repo_state.commits.add(head_sha)
            now = _now()
            repo_state.pulls[number] = Pull(
                number=number,
                id=next(self._ids),
                title=title,
                body=body,
                head_sha=head_sha,
                head_ref=ref,
                base=base,
                state=state,
                login=author,
                created_at=now,
                updated_at=now,
            )

    def update_pull(
        self,
        repo: str,
        number: int,
        *,
        head_sha: str | None = None,
        state: Literal["open", "closed"] | None = None,
        title: str | None = None,
    ) -> None:
        """Push a new head commit, close/reopen or retitle a pull request."""
        with self._lock:
            repo_state = self._get_repo(repo)
            pull = self._get_pull(repo_state, number)
            if head_sha is not None:
                pull.head_sha = head_sha
                repo_state.branches[pull.head_ref] = head_sha
                repo_state.commits.add(head_sha)
            if state is not None:
                pull.state = state
            if title is not None:
                pull.title = title
            pull.updated_at = _now()

    def add_workflow(
        self,
        repo: str,
        file: str = "export.yml",
        name: str | None = None,
        *,
        inputs: Iterable[str] | None = None,
        required_inputs: Iterable[str] = (),
        dispatchable: bool = True,
        run_name: str | None = None,
    ) -> int:
        """Add ``.github/workflows/{file}``; returns its numeric id.

        ``inputs`` declares the ``workflow_dispatch`` inputs (None: accept any);
        ``dispatchable=False`` models a workflow without a ``workflow_dispatch`` trigger;
        ``run_name`` is its ``run-name`` (each run's ``display_title``, rendered with the inputs).
        """
        with self._lock:
            repo_state = self._get_repo(repo)
            if any(w.file == file for w in repo_state.workflows.values()):
                raise ValueError(f"workflow {file} already exists in {repo}")
            required = tuple(required_inputs)
            declared = None if inputs is None else tuple(dict.fromkeys([*inputs, *required]))
            workflow = Workflow(
                id=next(self._ids),
                file=file,
                name=name or file.rsplit(".", 1)[0],
                dispatchable=dispatchable,
                inputs=declared,
                required_inputs=required,
                created_at=_now(),
                run_name=run_name,
            )
            repo_state.workflows[workflow.id] = workflow
            return workflow.id

    def add_comment(self, repo: str, number: int, body: str, login: str) -> int:
        """Seed a comment by ``login`` on issue/PR ``number``; returns its id."""
        with self._lock:
            repo_state = self._get_repo(repo)
            self._get_pull(repo_state, number)
            return self._new_comment(repo_state, number, body, login).id

    # ----------------------------------------------------------------- assert

    def comments(self, repo: str, number: int) -> list[Comment]:
        """Current (not deleted) comments on issue/PR ``number``, oldest first (copies)."""
        with self._lock:
            repo_state = self._get_repo(repo)
            return [copy.deepcopy(c) for c in self._issue_comments(repo_state, number)]

    def dispatches(self, repo: str) -> list[Dispatch]:
        """Workflow and repository dispatches received for ``repo``, in order (copies)."""
        with self._lock:
            return copy.deepcopy(self._get_repo(repo).dispatches)

    def runs(self, repo: str) -> list[WorkflowRun]:
        """Workflow runs of ``repo`` (one per workflow dispatch), in creation order (copies)."""
        with self._lock:
            return copy.deepcopy(list(self._get_repo(repo).runs.values()))

    def complete_run(self, repo: str, run_id: int, conclusion: str = "success") -> None:
        """Conclude a workflow run (``success``, ``failure``, ``cancelled``, ``timed_out``...)."""
        if conclusion not in CHECK_CONCLUSIONS:
            raise ValueError(f"unknown conclusion {conclusion!r}")
        with self._lock:
            run = self._get_repo(repo).runs[run_id]
            run.status, run.conclusion, run.updated_at = "completed", conclusion, _now()

    def check_runs(self, repo: str) -> list[CheckRun]:
        """Check runs created in ``repo``, in creation order (copies)."""
        with self._lock:
            return copy.deepcopy(list(self._get_repo(repo).check_runs.values()))

    def pull(self, repo: str, number: int) -> Pull:
        """A copy of pull request ``number``."""
        with self._lock:
            return copy.deepcopy(self._get_pull(self._get_repo(repo), number))

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far (method, path, params, login, status)."""
        with self._lock:
            return list(self._requests)

    # ----------------------------------------------------------------- state helpers (lock held)

    def _get_repo(self, full_name: str) -> _Repo:
        try:
            return self._repos[full_name.lower()]
        except KeyError:
            raise KeyError(f"no repository {full_name!r}") from None

    @staticmethod
    def _get_pull(repo: _Repo, number: int) -> Pull:
        try:
            return repo.pulls[number]
        except KeyError:
            raise KeyError(f"no pull request {repo.full_name}#{number}") from None

    def _user_id(self, login: str) -> int:
        if login not in self._user_ids:
            self._user_ids[login] = 10_000 + len(self._user_ids)
        return self._user_ids[login]

    def _new_comment(self, repo: _Repo, number: int, body: str, login: str) -> Comment:
        now = _now()
        comment = Comment(
            id=next(self._ids), repo=repo.full_name, number=number, body=body, login=login,
            created_at=now, updated_at=now,
        )
        repo.comments[comment.id] = comment
        repo.pulls[number].updated_at = now
        return comment

    @staticmethod
    def _issue_comments(repo: _Repo, number: int) -> list[Comment]:
        return sorted((c for c in repo.comments.values() if c.number == number), key=lambda c: c.id)

    def _api_repo(self, owner: str, name: str, login: str | None) -> _Repo:
        repo = self._repos.get(f"{owner}/{name}".lower())
        if repo is None or (repo.private and login is None):
            raise _not_found()
        return repo

    @staticmethod
    def _api_pull(repo: _Repo, number: str) -> Pull:
        if not number.isdigit() or int(number) not in repo.pulls:
            raise _not_found()
        return repo.pulls[int(number)]

    @staticmethod
    def _api_comment(repo: _Repo, comment_id: str) -> Comment:
        if not comment_id.isdigit() or int(comment_id) not in repo.comments:
            raise _not_found()
        return repo.comments[int(comment_id)]

    @staticmethod
    def _api_workflow(repo: _Repo, id_or_file: str) -> Workflow:
        key = urllib.parse.unquote(id_or_file)
        for workflow in repo.workflows.values():
            if str(workflow.id) == key or workflow.file == key:
                return workflow
        raise _not_found()

    @staticmethod
    def _api_check_run(repo: _Repo, run_id: str) -> CheckRun:
        if not run_id.isdigit() or int(run_id) not in repo.check_runs:
            raise _not_found()
        return repo.check_runs[int(run_id)]

    # ----------------------------------------------------------------- JSON shapes (lock held)

    def _user_json(self, base: str, login: str) -> dict[str, Any]:
        is_bot = login.endswith("[bot]")
        quoted = urllib.parse.quote(login)
        html_path = f"apps/{urllib.parse.quote(login.removesuffix('[bot]'))}" if is_bot else quoted
        return {
            "login": login,
            "id": self._user_id(login),
            "node_id": f"U_{self._user_id(login)}",
            "type": "Bot" if is_bot else "User",
            "site_admin": False,
            "url": f"{base}/users/{quoted}",
            "html_url": f"{base}/{html_path}",
            "avatar_url": f"{base}/avatars/{quoted}",
        }

    def _repo_json(self, base: str, repo: _Repo) -> dict[str, Any]:
        owner = self._user_json(base, repo.owner)
        return {
            "id": repo.id,
            "node_id": f"R_{repo.id}",
            "name": repo.name,
            "full_name": repo.full_name,
            "owner": owner,
            "private": repo.private,
            "visibility": "private" if repo.private else "public",
            "fork": False,
            "archived": False,
            "disabled": False,
            "default_branch": repo.default_branch,
            "created_at": _iso(repo.created_at),
            "updated_at": _iso(repo.created_at),
            "url": f"{base}/repos/{repo.full_name}",
            "html_url": f"{base}/{repo.full_name}",
            "issues_url": f"{base}/repos/{repo.full_name}/issues{{/number}}",
            "pulls_url": f"{base}/repos/{repo.full_name}/pulls{{/number}}",
        }

    def _pull_json(self, base: str, repo: _Repo, pull: Pull) -> dict[str, Any]:
        api = f"{base}/repos/{repo.full_name}"
        repo_json = self._repo_json(base, repo)

        def part(ref: str, sha: str) -> dict[str, Any]:
            return {
                "label": f"{repo.owner}:{ref}",
                "ref": ref,
                "sha": sha,
                "user": repo_json["owner"],
                "repo": repo_json,
            }

        return {
            "id": pull.id,
            "node_id": f"PR_{pull.id}",
            "number": pull.number,
            "state": pull.state,
            "locked": False,
            "title": pull.title,
            "body": pull.body,
            "user": self._user_json(base, pull.login),
            "draft": False,
            "merged": False,
            "mergeable": None,
            "created_at": _iso(pull.created_at),
            "updated_at": _iso(pull.updated_at),
            "closed_at": None,
            "merged_at": None,
            "comments": len(self._issue_comments(repo, pull.number)),
            "url": f"{api}/pulls/{pull.number}",
            "html_url": f"{base}/{repo.full_name}/pull/{pull.number}",
            "issue_url": f"{api}/issues/{pull.number}",
            "comments_url": f"{api}/issues/{pull.number}/comments",
            "statuses_url": f"{api}/statuses/{pull.head_sha}",
            "head": part(pull.head_ref, pull.head_sha),
            "base": part(pull.base, repo.branches.get(pull.base, "")),
        }

    def _issue_json(self, base: str, repo: _Repo, pull: Pull) -> dict[str, Any]:
        api = f"{base}/repos/{repo.full_name}"
        return {
            "id": pull.id,
            "node_id": f"I_{pull.id}",
            "number": pull.number,
            "state": pull.state,
            "locked": False,
            "title": pull.title,
            "body": pull.body,
            "user": self._user_json(base, pull.login),
            "labels": [],
            "assignees": [],
            "comments": len(self._issue_comments(repo, pull.number)),
            "created_at": _iso(pull.created_at),
            "updated_at": _iso(pull.updated_at),
            "closed_at": None,
            "url": f"{api}/issues/{pull.number}",
            "html_url": f"{base}/{repo.full_name}/pull/{pull.number}",
            "comments_url": f"{api}/issues/{pull.number}/comments",
            "repository_url": api,
            "pull_request": {
                "url": f"{api}/pulls/{pull.number}",
                "html_url": f"{base}/{repo.full_name}/pull/{pull.number}",
            },
        }

    def _comment_json(self, base: str, repo: _Repo, comment: Comment) -> dict[str, Any]:
        api = f"{base}/repos/{repo.full_name}"
        return {
            "id": comment.id,
            "node_id": f"IC_{comment.id}",
            "body": comment.body,
            "user": self._user_json(base, comment.login),
            "author_association": "NONE",
            "created_at": _iso(comment.created_at),
            "updated_at": _iso(comment.updated_at),
            "url": f"{api}/issues/comments/{comment.id}",
            "html_url": f"{base}/{repo.full_name}/pull/{comment.number}#issuecomment-{comment.id}",
            "issue_url": f"{api}/issues/{comment.number}",
        }

    def _check_run_json(self, base: str, repo: _Repo, run: CheckRun) -> dict[str, Any]:
        api = f"{base}/repos/{repo.full_name}"
        slug = run.login.removesuffix("[bot]")
        output = {
            "title": run.output.get("title"),
            "summary": run.output.get("summary"),
            "text": run.output.get("text"),
            "annotations_count": run.output.get("annotations_count", 0),
            "annotations_url": f"{api}/check-runs/{run.id}/annotations",
        }
        pulls = [p for p in repo.pulls.values() if p.state == "open" and p.head_sha == run.head_sha]
        return {
            "id": run.id,
            "node_id": f"CR_{run.id}",
            "name": run.name,
            "head_sha": run.head_sha,
            "external_id": run.external_id or "",
            "details_url": run.details_url,
            "status": run.status,
            "conclusion": run.conclusion,
            "started_at": _iso(run.started_at),
            "completed_at": _iso(run.completed_at),
            "output": output,
            "url": f"{api}/check-runs/{run.id}",
            "html_url": f"{base}/{repo.full_name}/runs/{run.id}",
            "check_suite": {"id": run.check_suite_id},
            "app": {"id": self._user_id(run.login), "slug": slug, "name": slug},
            "pull_requests": [
                {
                    "id": p.id,
                    "number": p.number,
                    "url": f"{api}/pulls/{p.number}",
                    "head": {"ref": p.head_ref, "sha": p.head_sha},
                    "base": {"ref": p.base, "sha": repo.branches.get(p.base, "")},
                }
                for p in pulls
            ],
        }

    def _run_json(self, base: str, repo: _Repo, run: WorkflowRun) -> dict[str, Any]:
        api = f"{base}/repos/{repo.full_name}"
        sha = repo.branches.get(run.ref.removeprefix("refs/heads/")) or repo.tags.get(run.ref.removeprefix("refs/tags/"))
        return {
            "id": run.id, "node_id": f"WFR_{run.id}", "name": run.workflow.rsplit(".", 1)[0],
            "path": f".github/workflows/{run.workflow}", "head_branch": run.ref.removeprefix("refs/heads/"),
            "head_sha": sha or "", "run_number": run.id, "run_attempt": 1, "event": run.event,
            "status": run.status, "conclusion": run.conclusion, "workflow_id": run.workflow_id,
            "url": f"{api}/actions/runs/{run.id}", "html_url": f"{base}/{repo.full_name}/actions/runs/{run.id}",
            "jobs_url": f"{api}/actions/runs/{run.id}/jobs", "logs_url": f"{api}/actions/runs/{run.id}/logs",
            "workflow_url": f"{api}/actions/workflows/{run.workflow_id}",
            "created_at": _iso(run.created_at), "updated_at": _iso(run.updated_at),
            "display_title": run.display_title, "run_started_at": _iso(run.created_at),
            "actor": self._user_json(base, run.login),
            "triggering_actor": self._user_json(base, run.login), "pull_requests": [],
        }

    def _workflow_json(self, base: str, repo: _Repo, workflow: Workflow) -> dict[str, Any]:
        path = f".github/workflows/{workflow.file}"
        return {
            "id": workflow.id,
            "node_id": f"W_{workflow.id}",
            "name": workflow.name,
            "path": path,
            "state": "active",
            "created_at": _iso(workflow.created_at),
            "updated_at": _iso(workflow.created_at),
            "url": f"{base}/repos/{repo.full_name}/actions/workflows/{workflow.id}",
            "html_url": f"{base}/{repo.full_name}/blob/{repo.default_branch}/{path}",
            "badge_url": f"{base}/{repo.full_name}/workflows/{urllib.parse.quote(workflow.name)}/badge.svg",
        }

    # ----------------------------------------------------------------- HTTP app

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="GitHub REST emulator", docs_url=None, redoc_url=None, openapi_url=None)
        emu = self

        @app.exception_handler(ApiError)
        async def api_error(_: Request, exc: ApiError) -> JSONResponse:
            return _error_response(exc.status, exc.message, exc.errors)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
            # GitHub answers unknown routes and unsupported verbs alike with 404.
            if exc.status_code in (404, 405):
                return _error_response(404, "Not Found")
            return _error_response(exc.status_code, str(exc.detail))

        @app.middleware("http")
        async def authenticate_and_record(request: Request, call_next: Any) -> Response:
            """Resolve the token to a login (401 for unknown ones) and log the exchange."""
            header = request.headers.get("authorization")
            login: str | None = None
            if header is not None:
                scheme, _, token = header.partition(" ")
                with emu._lock:
                    login = emu._tokens.get(token.strip()) if scheme.lower() in ("token", "bearer") else None
            response: Response
            if header is not None and login is None:
                response = _error_response(401, "Bad credentials")
            else:
                request.state.login = login
                response = await call_next(request)
            params = {k: v for k, v in request.query_params.items() if "token" not in k.lower()}
            with emu._lock:
                emu._requests.append(
                    RequestRecord(request.method, request.url.path, params, login, response.status_code)
                )
            return response

        def base_of(request: Request) -> str:
            return str(request.base_url).rstrip("/")

        def caller(request: Request, *, required: bool = True) -> str | None:
            login: str | None = getattr(request.state, "login", None)
            if login is None and required:
                raise ApiError(401, "Requires authentication")
            return login

        async def json_body(request: Request) -> dict[str, Any]:
            raw = await request.body()
            if not raw.strip():
                return {}
            try:
                body = json.loads(raw)
            except ValueError:
                raise ApiError(400, "Problems parsing JSON") from None
            if not isinstance(body, dict):
                raise _invalid(f"For 'links/0/schema', {json.dumps(body)} is not an object.")
            return body

        def paginated(request: Request, items: list[dict[str, Any]], key: str | None = None) -> JSONResponse:
            def as_int(name: str, default: int) -> int:
                try:
                    return int(request.query_params.get(name, default))
                except ValueError:
                    return default

            per_page = min(max(as_int("per_page", DEFAULT_PER_PAGE), 1), MAX_PER_PAGE)
            page = max(as_int("page", 1), 1)
            last = max((len(items) + per_page - 1) // per_page, 1)
            chunk = items[(page - 1) * per_page : page * per_page]

            def link(target: int) -> str:
                query = dict(request.query_params)
                query["page"] = str(target)
                return f"{base_of(request)}{request.url.path}?{urllib.parse.urlencode(query)}"

            rels: list[tuple[str, int]] = []
            if page > 1:
                rels.append(("prev", min(page - 1, last)))
            if page < last:
                rels += [("next", page + 1), ("last", last)]
            if page > 1:
                rels.append(("first", 1))
            headers = {"Link": ", ".join(f'<{link(n)}>; rel="{rel}"' for rel, n in rels)} if rels else {}
            if key is not None:  # e.g. {"total_count": N, "workflow_runs": [...]}
                return JSONResponse({"total_count": len(items), key: chunk}, headers=headers)
            return JSONResponse(chunk, headers=headers)

        # ------------------------------------------------------------- users

        @app.get("/user")
        def get_authenticated_user(request: Request) -> dict[str, Any]:
            login = caller(request)
            assert login is not None
            if emu.bot_user_forbidden and login.endswith("[bot]"):
                raise ApiError(403, "Resource not accessible by integration")
            with emu._lock:
                return {**emu._user_json(base_of(request), login), "name": None}

        @app.get("/users/{login}")
        def get_user(request: Request, login: str) -> dict[str, Any]:
            with emu._lock:
                known = set(emu._tokens.values()) | set(emu._user_ids) | {r.owner for r in emu._repos.values()}
                if login not in known:
                    raise _not_found()
                return emu._user_json(base_of(request), login)

        # ------------------------------------------------------------- repos, pulls, issues

        @app.get("/repos/{owner}/{name}")
        def get_repo(request: Request, owner: str, name: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._repo_json(base_of(request), repo)

        @app.get("/repos/{owner}/{name}/pulls/{number}")
        def get_pull(request: Request, owner: str, name: str, number: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._pull_json(base_of(request), repo, emu._api_pull(repo, number))

        @app.get("/repos/{owner}/{name}/issues/{number}")
        def get_issue(request: Request, owner: str, name: str, number: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._issue_json(base_of(request), repo, emu._api_pull(repo, number))

        # ------------------------------------------------------------- issue comments

        @app.get("/repos/{owner}/{name}/issues/comments/{comment_id}")
        def get_comment(request: Request, owner: str, name: str, comment_id: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._comment_json(base_of(request), repo, emu._api_comment(repo, comment_id))

        @app.patch("/repos/{owner}/{name}/issues/comments/{comment_id}")
        async def edit_comment(request: Request, owner: str, name: str, comment_id: str) -> dict[str, Any]:
            login = caller(request)
            body = await json_body(request)
            text = _require_str(body, "body")
            assert text is not None
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                comment = emu._api_comment(repo, comment_id)
                if len(text) > MAX_COMMENT_LENGTH:
                    raise _invalid(f"Body is too long (maximum is {MAX_COMMENT_LENGTH} characters)")
                comment.body = text
                comment.updated_at = _now()
                return emu._comment_json(base_of(request), repo, comment)

        @app.delete("/repos/{owner}/{name}/issues/comments/{comment_id}", status_code=204)
        def delete_comment(request: Request, owner: str, name: str, comment_id: str) -> Response:
            login = caller(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                del repo.comments[emu._api_comment(repo, comment_id).id]
            return Response(status_code=204)

        @app.get("/repos/{owner}/{name}/issues/{number}/comments")
        def list_comments(request: Request, owner: str, name: str, number: str) -> JSONResponse:
            since_raw = request.query_params.get("since")
            try:
                since = _parse_iso(since_raw) if since_raw else None
            except ValueError:
                raise _invalid(f"For 'since', {json.dumps(since_raw)} is not a valid date-time.") from None
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                pull = emu._api_pull(repo, number)
                items = [
                    emu._comment_json(base_of(request), repo, c)
                    for c in emu._issue_comments(repo, pull.number)
                    if since is None or c.updated_at >= since
                ]
            return paginated(request, items)

        @app.post("/repos/{owner}/{name}/issues/{number}/comments", status_code=201)
        async def create_comment(request: Request, owner: str, name: str, number: str) -> JSONResponse:
            login = caller(request)
            assert login is not None
            body = await json_body(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                pull = emu._api_pull(repo, number)
                text = _require_str(body, "body")
                assert text is not None
                if len(text) > MAX_COMMENT_LENGTH:
                    raise _invalid(f"Body is too long (maximum is {MAX_COMMENT_LENGTH} characters)")
                comment = emu._new_comment(repo, pull.number, text, login)
                data = emu._comment_json(base_of(request), repo, comment)
            return JSONResponse(data, status_code=201, headers={"Location": data["url"]})

        # ------------------------------------------------------------- check runs

        def validate_check_fields(repo: _Repo, body: dict[str, Any], *, creating: bool) -> dict[str, Any]:
            """Validate a check-run create/update body; returns the normalised fields given."""
            fields: dict[str, Any] = {}
            for key in ("name", "head_sha", "details_url", "external_id", "status", "conclusion"):
                required = creating and key in ("name", "head_sha")
                value = _require_str(body, key, optional=not required)
                if value is not None:
                    fields[key] = value
            if "head_sha" in fields and fields["head_sha"] not in repo.commits:
                raise ApiError(422, f"No commit found for SHA: {fields['head_sha']}")
            if fields.get("status") is not None and fields["status"] not in CHECK_STATUSES:
                raise _invalid(f"For 'properties/status', {json.dumps(fields['status'])} is not a member of enum.")
            if fields.get("conclusion") is not None and fields["conclusion"] not in CHECK_CONCLUSIONS:
                raise _invalid(
                    f"For 'properties/conclusion', {json.dumps(fields['conclusion'])} is not a member of enum."
                )
            for key in ("started_at", "completed_at"):
                if (moment := _optional_time(body, key)) is not None:
                    fields[key] = moment
            output = _require_object(body, "output")
            if output is not None:
                for key in ("title", "summary"):
                    _require_str(output, key)
                for key in ("summary", "text"):
                    value = _require_str(output, key, optional=True)
                    if value is not None and len(value) > MAX_CHECK_TEXT_LENGTH:
                        raise _invalid(f"Output {key} is too long (maximum is {MAX_CHECK_TEXT_LENGTH} characters)")
                annotations = output.get("annotations", [])
                if not isinstance(annotations, list) or len(annotations) > MAX_ANNOTATIONS_PER_REQUEST:
                    raise _invalid(f"Only {MAX_ANNOTATIONS_PER_REQUEST} annotations are allowed per request.")
                fields["output"] = output
            actions = body.get("actions")
            if actions is not None:
                if not isinstance(actions, list) or len(actions) > MAX_CHECK_ACTIONS:
                    raise _invalid(f"No more than {MAX_CHECK_ACTIONS} actions are allowed.")
                for action in actions:
                    if not isinstance(action, dict):
                        raise _invalid("For 'properties/actions', items must be objects.")
                    for key in ("label", "description", "identifier"):
                        _require_str(action, key)
                fields["actions"] = actions
            if fields.get("conclusion") is not None:
                fields["status"] = "completed"  # giving a conclusion completes the run
            return fields

        def require_app(login: str) -> None:
            if emu.check_runs_require_app and not login.endswith("[bot]"):
                raise ApiError(403, "You must authenticate via a GitHub App.")

        def merged_output(run: CheckRun, output: dict[str, Any] | None) -> dict[str, Any]:
            if output is None:
                return run.output
            count = run.output.get("annotations_count", 0) + len(output.get("annotations", []))
            merged = {k: output.get(k) for k in ("title", "summary", "text")}
            return {**merged, "annotations_count": count}

        @app.post("/repos/{owner}/{name}/check-runs", status_code=201)
        async def create_check_run(request: Request, owner: str, name: str) -> JSONResponse:
            login = caller(request)
            assert login is not None
            body = await json_body(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                require_app(login)
                fields = validate_check_fields(repo, body, creating=True)
                status = fields.get("status", "queued")
                if status == "completed" and fields.get("conclusion") is None:
                    raise _invalid("'conclusion' wasn't supplied. It is required when 'status' is 'completed'.")
                now = _now()
                suite_key = (login, fields["head_sha"])
                if suite_key not in repo.check_suites:
                    repo.check_suites[suite_key] = next(emu._ids)
                run = CheckRun(
                    id=next(emu._ids),
                    repo=repo.full_name,
                    name=fields["name"],
                    head_sha=fields["head_sha"],
                    status=status,
                    conclusion=fields.get("conclusion"),
                    details_url=fields.get("details_url"),
                    external_id=fields.get("external_id"),
                    output={},
                    actions=fields.get("actions", []),
                    started_at=fields.get("started_at", now),
                    completed_at=fields.get("completed_at", now if status == "completed" else None),
                    login=login,
                    check_suite_id=repo.check_suites[suite_key],
                )
                run.output = merged_output(run, fields.get("output"))
                repo.check_runs[run.id] = run
                data = emu._check_run_json(base_of(request), repo, run)
            return JSONResponse(data, status_code=201)

        @app.get("/repos/{owner}/{name}/check-runs/{run_id}")
        def get_check_run(request: Request, owner: str, name: str, run_id: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._check_run_json(base_of(request), repo, emu._api_check_run(repo, run_id))

        @app.patch("/repos/{owner}/{name}/check-runs/{run_id}")
        async def update_check_run(request: Request, owner: str, name: str, run_id: str) -> dict[str, Any]:
            login = caller(request)
            assert login is not None
            body = await json_body(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                require_app(login)
                run = emu._api_check_run(repo, run_id)
                if run.login != login:
                    raise ApiError(
                        403,
                        f"Invalid app_id `{emu._user_id(login)}` - check run can only be modified by the "
                        "GitHub App that created it.",
                    )
                fields = validate_check_fields(repo, body, creating=False)
                status = fields.get("status", run.status)
                conclusion = fields.get("conclusion", run.conclusion)
                if status == "completed" and conclusion is None:
                    raise _invalid("'conclusion' wasn't supplied. It is required when 'status' is 'completed'.")
                for key in ("name", "head_sha", "details_url", "external_id", "actions", "started_at"):
                    if key in fields:
                        setattr(run, key, fields[key])
                if status == "completed" and run.status != "completed":
                    run.completed_at = fields.get("completed_at", _now())
                elif "completed_at" in fields:
                    run.completed_at = fields["completed_at"]
                run.status, run.conclusion = status, conclusion
                run.output = merged_output(run, fields.get("output"))
                run.updates.append(copy.deepcopy(body))
                return emu._check_run_json(base_of(request), repo, run)

        # ------------------------------------------------------------- actions and dispatches

        @app.get("/repos/{owner}/{name}/actions/workflows/{id_or_file}")
        def get_workflow(request: Request, owner: str, name: str, id_or_file: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                return emu._workflow_json(base_of(request), repo, emu._api_workflow(repo, id_or_file))

        @app.post("/repos/{owner}/{name}/actions/workflows/{id_or_file}/dispatches")
        async def dispatch_workflow(request: Request, owner: str, name: str, id_or_file: str) -> Response:
            login = caller(request)
            assert login is not None
            body = await json_body(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                workflow = emu._api_workflow(repo, id_or_file)
                ref = _require_str(body, "ref")
                assert ref is not None
                inputs = _require_object(body, "inputs") or {}
                short = ref.removeprefix("refs/heads/").removeprefix("refs/tags/")
                if short not in repo.branches and short not in repo.tags:
                    raise ApiError(422, f"No ref found for: {ref}")
                if not workflow.dispatchable:
                    raise ApiError(422, "Workflow does not have 'workflow_dispatch' trigger")
                if len(inputs) > MAX_WORKFLOW_INPUTS:
                    raise _invalid(f"inputs are too large: the maximum number of properties is {MAX_WORKFLOW_INPUTS}.")
                if workflow.inputs is not None:
                    unexpected = sorted(set(inputs) - set(workflow.inputs))
                    if unexpected:
                        raise ApiError(422, f"Unexpected inputs provided: {json.dumps(unexpected)}")
                    for required in workflow.required_inputs:
                        if required not in inputs:
                            raise ApiError(422, f"Required input '{required}' not provided")
                run_id = next(emu._ids)
                now = _now()
                run = WorkflowRun(run_id, repo.full_name, workflow.id, workflow.file, ref, "workflow_dispatch", login,
                                  now, now, inputs=copy.deepcopy(inputs),
                                  display_title=render_run_name(workflow.run_name, inputs, run_id)
                                  if workflow.run_name else workflow.name)
                if emu.run_conclusion is not None:
                    run.status, run.conclusion = "completed", emu.run_conclusion
                repo.runs[run_id] = run
                repo.dispatches.append(
                    Dispatch(
                        kind="workflow", repo=repo.full_name, login=login, created_at=_now(),
                        workflow=workflow.file, ref=ref, inputs=copy.deepcopy(inputs), run_id=run_id,
                    )
                )
                base = base_of(request)
                full_name = repo.full_name
                gate = emu.hold_dispatch_answers
            if gate is not None:  # the run exists; its answer waits (the client may be killed meanwhile)
                await asyncio.to_thread(gate.wait, 60)
            if body.get("return_run_details") is True:
                return JSONResponse(
                    {
                        "workflow_run_id": run_id,
                        "run_url": f"{base}/repos/{full_name}/actions/runs/{run_id}",
                        "html_url": f"{base}/{full_name}/actions/runs/{run_id}",
                    }
                )
            return Response(status_code=204)

        @app.get("/repos/{owner}/{name}/actions/workflows/{id_or_file}/runs")
        def list_workflow_runs(request: Request, owner: str, name: str, id_or_file: str) -> JSONResponse:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                workflow = emu._api_workflow(repo, id_or_file)
                runs = [r for r in repo.runs.values() if r.workflow_id == workflow.id]
                event = request.query_params.get("event")
                if event:
                    runs = [r for r in runs if r.event == event]
                created = request.query_params.get("created")
                if created:
                    operator = next((op for op in (">=", "<=", ">", "<") if created.startswith(op)), "")
                    try:
                        when = _parse_iso(created[len(operator):])
                    except ValueError:
                        raise _invalid(f"created {created!r} is not a date-time filter") from None
                    test = {">=": lambda t: t >= when, "<=": lambda t: t <= when, ">": lambda t: t > when,
                            "<": lambda t: t < when, "": lambda t: t.date() == when.date()}[operator]
                    runs = [r for r in runs if test(r.created_at)]
                runs.sort(key=lambda r: r.id, reverse=True)  # newest first
                items = [emu._run_json(base_of(request), repo, r) for r in runs]
            return paginated(request, items, key="workflow_runs")

        @app.get("/repos/{owner}/{name}/actions/runs/{run_id}")
        def get_run(request: Request, owner: str, name: str, run_id: str) -> dict[str, Any]:
            with emu._lock:
                repo = emu._api_repo(owner, name, caller(request, required=False))
                run = repo.runs.get(int(run_id)) if run_id.isdigit() else None
                if run is None:
                    raise _not_found()
                return emu._run_json(base_of(request), repo, run)

        @app.post("/repos/{owner}/{name}/dispatches")
        async def repository_dispatch(request: Request, owner: str, name: str) -> Response:
            login = caller(request)
            assert login is not None
            body = await json_body(request)
            with emu._lock:
                repo = emu._api_repo(owner, name, login)
                event_type = _require_str(body, "event_type")
                assert event_type is not None
                if not 1 <= len(event_type) <= MAX_EVENT_TYPE_LENGTH:
                    raise _invalid(f"event_type must be 1 to {MAX_EVENT_TYPE_LENGTH} characters long.")
                payload = _require_object(body, "client_payload") or {}
                if len(payload) > MAX_CLIENT_PAYLOAD_PROPERTIES:
                    raise _invalid(
                        f"For 'properties/client_payload', No more than {MAX_CLIENT_PAYLOAD_PROPERTIES} "
                        f"properties are allowed; {len(payload)} were supplied."
                    )
                repo.dispatches.append(
                    Dispatch(
                        kind="repository", repo=repo.full_name, login=login, created_at=_now(),
                        event_type=event_type, client_payload=copy.deepcopy(payload),
                    )
                )
            return Response(status_code=204)

        return app


# --------------------------------------------------------------------------- command line


def _split(spec: str, sep: str, what: str) -> tuple[str, str]:
    left, found, right = spec.partition(sep)
    if not (found and left and right):
        raise argparse.ArgumentTypeError(f"bad {what} {spec!r}")
    return left, right


def main(argv: Sequence[str] | None = None) -> None:
    """Serve an emulator in the foreground until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m tests.servers.github", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN=LOGIN")
    parser.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME[@BRANCH]")
    parser.add_argument("--pull", action="append", default=[], metavar="OWNER/NAME#N:HEAD_SHA")
    parser.add_argument("--workflow", action="append", default=[], metavar="OWNER/NAME:FILE")
    parser.add_argument("--no-app-check", action="store_true", help="let any login write check runs")
    args = parser.parse_args(argv)

    tokens = dict(_split(spec, "=", "--token") for spec in args.token)
    emulator = GitHubEmulator(
        tokens, host=args.host, port=args.port, check_runs_require_app=not args.no_app_check
    )
    for spec in args.repo:
        full_name, _, branch = spec.partition("@")
        emulator.create_repo(full_name, default_branch=branch or "main")
    for spec in args.pull:
        repo, rest = _split(spec, "#", "--pull")
        number, head_sha = _split(rest, ":", "--pull")
        emulator.create_pull(repo, int(number), f"Pull request #{number}", head_sha,
                             base=emulator._get_repo(repo).default_branch)
    for spec in args.workflow:
        repo, file = _split(spec, ":", "--workflow")
        emulator.add_workflow(repo, file)

    emulator.start()
    print(f"GitHub emulator listening on {emulator.url}", flush=True)
    try:
        while emulator._thread is not None and emulator._thread.is_alive():
            emulator._thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()

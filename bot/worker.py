"""Workers: claim jobs from the store, decide on the Hub whether they need running, run them on the backend.

One `Worker` runs `concurrency` threads. For each claimed job:

1. skip a push job when a newer push of the same repo is queued, running or done (superseded: the newer commit is
   exported instead); (backends that need it) read the repo at the job's commit (`hubcheck.inspect_repo`) and
   record the recipe hash, the weights key and whether the repo is private now (on every job of the repo: privacy
   is the repo's current state); then skip, with the reason on the
   job and nothing said on the Hub, when: the repo opted out (`bot.texts.OPT_OUT_FILE`), the commit is the bot's
   own, the comment that asked is the bot's own, there is no recipe, or (unless forced by a comment) the same recipe
   and weights were already exported successfully (a failure discussion left open by a later run is then closed).
   An invalid recipe fails the job without exporting. When the head has a recipe of its own, the bot's open PR
   proposing one (`propose_recipes`) is closed with a comment saying why. The bot's own identity (`whoami`) is asked again after a
   failure, never cached as unknown.
2. run the backend, renewing the lease every `lease_seconds / 3`; a lost lease cancels the run. A backend that
   follows a remote run (`hf-jobs`) asks `JobContext.superseded` at every poll and cancels that run once a newer
   push supersedes the job; a job superseded before its retry starts has the run its earlier attempt launched
   cancelled (`backend.abandon`).
3. record the outcome: succeeded / failed, or queued again with exponential backoff on a transient failure.

A job that could not export at all (an invalid recipe, a model that cannot be loaded, refused remote code) tells the
repo: `exporters.publish.report_problem` opens the one failure discussion or updates it; the texts are the
library's, the bot adds how to stop it (`bot.texts`). A run that passes closes it (publishing does).

Example:
    >>> from bot.settings import BotSettings
    >>> from bot.store import JobStore
    >>> store = JobStore(":memory:")
    >>> _ = store.enqueue("acme/tiny", "a" * 40)
    >>> worker = Worker(BotSettings(backend="dry"), store)
    >>> worker.run_once().status
    'succeeded'
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
import traceback
import uuid
from pathlib import Path

from exporters.errors import PublishError
from exporters.publish import HubClient, Problem, close_failure_discussions, report_problem
from exporters.publish.decide import in_slot
from exporters.recipe.load import where_a_recipe_goes
from exporters.redact import scrub, tail

from .backends import Backend, JobContext, get_backend
from .hubcheck import HubCheckError, RepoState, inspect_repo, whoami_id
from .settings import BotSettings
from .store import FAILED, SKIPPED, Job, JobStore
from .texts import OPT_OUT_FILE, OPT_OUT_NOTE, OPTION_NAMES

log = logging.getLogger("bot.worker")
IDENTITY_RETRY_SECONDS = 60.0
# Recorded as the recipe hash of jobs that proposed a recipe (no recipe to hash): one proposal per weights.
PROPOSAL_KEY = "proposal"


class Worker:
    """Claims and runs jobs; `run(stop)` until `stop` is set, or `run_once()` for one job."""

    def __init__(self, settings: BotSettings, store: JobStore | None = None, backend: Backend | None = None,
                 worker_id: str | None = None) -> None:
        self.settings = settings
        self.store = store or JobStore(settings.db_path)
        self.backend = backend or get_backend(settings.backend, settings)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._identity: tuple[str, str] | None = None
        self._identity_known = False
        self._identity_retry_at = 0.0  # after a failed whoami: when to ask the Hub again
        self._lock = threading.Lock()
        self._running: dict[int, threading.Event] = {}

    # ------------------------------------------------------------------------------------------ loops
    def run(self, stop: threading.Event) -> None:
        """Run `concurrency` worker threads until `stop` is set; running jobs are then cancelled and given back."""
        log.info("worker %s: backend %s, %d thread(s), lease %.0fs", self.worker_id, self.backend.name,
                 self.settings.concurrency, self.settings.lease_seconds)
        threads = [threading.Thread(target=self._loop, args=(stop, f"{self.worker_id}/{n}"), daemon=True,
                                    name=f"export-worker-{n}") for n in range(self.settings.concurrency)]
        for thread in threads:
            thread.start()
        stop.wait()
        with self._lock:
            for cancelled in self._running.values():
                cancelled.set()
        for thread in threads:
            thread.join(timeout=30)

    def _loop(self, stop: threading.Event, lease_owner: str) -> None:
        while not stop.is_set():
            try:
                job = self.store.claim(lease_owner, self.settings.lease_seconds)
            except sqlite3.Error as err:
                log.error("worker %s: could not claim a job: %s", lease_owner, err)
                job = None
            if job is None:
                stop.wait(self.settings.poll_seconds)
                continue
            self.process(job, lease_owner, stop=stop)

    def run_once(self) -> Job | None:
        """Claim one due job and run it to the end; the job as stored afterwards (None: nothing was due)."""
        job = self.store.claim(self.worker_id, self.settings.lease_seconds)
        if job is None:
            return None
        self.process(job, self.worker_id)
        return self.store.get(job.id)

    # ------------------------------------------------------------------------------------------ one job
    def process(self, job: Job, lease_owner: str, stop: threading.Event | None = None) -> None:
        """Run one claimed job to a recorded end (never raises)."""
        cancelled = threading.Event()
        with self._lock:
            self._running[job.id] = cancelled
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(job.id, lease_owner, cancelled, done), daemon=True,
                                name=f"heartbeat-{job.id}")
        beat.start()
        log.info("job %d: %s@%s (%s), attempt %d/%d", job.id, job.repo, job.head_sha[:8] or "main", job.trigger,
                 job.attempts, job.max_attempts)
        try:
            self._process(job, lease_owner, cancelled, stop)
        except Exception as err:  # a bug or an unexpected failure: retry with backoff, keep the worker alive
            detail = scrub(tail(traceback.format_exc(), lines=15), self.settings.secrets())
            log.error("job %d: unexpected %s: %s", job.id, type(err).__name__, scrub(str(err), self.settings.secrets()))
            self._retry(job, lease_owner, f"{type(err).__name__}: {detail}")
        finally:
            done.set()
            beat.join(timeout=5)
            with self._lock:
                self._running.pop(job.id, None)

    def _process(self, job: Job, owner: str, cancelled: threading.Event, stop: threading.Event | None) -> None:
        state: RepoState | None = None
        newer = self.store.newer_push(job) if job.trigger == "push" else None
        if newer is not None:
            why = f"superseded by job #{newer.id} (a newer push, {newer.head_sha[:8]})"
            abandon = getattr(self.backend, "abandon", None)  # a remote run an earlier attempt started is cancelled
            self._end(job, owner, SKIPPED, operation="superseded",
                      reason=why + (abandon(job.dispatch, why) if abandon and job.dispatch else ""))
            return
        if self.backend.needs_hub_check:
            try:
                state = inspect_repo(job.repo, job.head_sha or "main", token=self._token(),
                                     endpoint=self.settings.hf_endpoint, with_authors=job.trigger == "push")
            except HubCheckError as err:
                if err.permanent:  # a repo the bot cannot see is treated as private: its name is not shown
                    if err.hidden:
                        self.store.set_private(job.repo, True)
                    self._end(job, owner, SKIPPED, reason=str(err), **({"private": True} if err.hidden else {}))
                else:
                    self._retry(job, owner, str(err))
                return
            recipe_key = state.recipe_sha256 or (PROPOSAL_KEY if self._proposes(state) else None)
            fields = {"recipe_sha256": recipe_key, "weights_key": state.weights_key}
            if state.private is not None:  # the repo's state now, for every job of it (old ones too)
                fields["private"] = state.private
                self.store.set_private(job.repo, state.private)
            if not job.head_sha:
                fields["head_sha"] = state.head_sha
            try:
                self.store.record(job.id, owner, **fields)
            except sqlite3.IntegrityError:  # that head already has a job with this trigger: keep ours as is
                fields.pop("head_sha", None)
                self.store.record(job.id, owner, **fields)
            if state.has_recipe and not state.opted_out:
                self._close_stale_proposal(job, owner, state)
            skip, exported = self._skip_reason(job, state)
            if skip:
                if exported is not None:
                    skip += self._close_stale_discussion(job, state, exported)
                self._end(job, owner, SKIPPED, reason=skip)
                return
            if state.recipe_problem is not None:
                self._blocked(job, owner, state.recipe_problem, state.head_sha, f"invalid recipe in {state.recipe_file}")
                return
        ctx = JobContext(job=job, state=state, settings=self.settings,
                         job_dir=Path(self.settings.work_dir) / f"job-{job.id}", cancelled=cancelled,
                         save=lambda **fields: self.store.record(job.id, owner, **fields),
                         superseded=lambda: self._superseded(job))
        self.store.record(job.id, owner, backend=self.backend.name)
        outcome = self.backend.run(ctx)
        if outcome.status in ("failed", "skipped") and outcome.problem is not None:
            commit = state.head_sha if state else job.head_sha
            fields = outcome.fields()
            self._blocked(job, owner, outcome.problem, commit, fields.pop("reason"), status=outcome.status, **fields)
            return
        if outcome.status == "succeeded" and outcome.operation == "superseded":  # exported, but nothing published
            self._end(job, owner, SKIPPED, **outcome.fields())
            return
        if outcome.status == "retry":
            if stop is not None and stop.is_set():
                self.store.record(job.id, owner, **outcome.fields())
                self.store.release(job.id, owner, "worker stopping")
                log.info("job %d: given back (worker stopping)", job.id)
                return
            self.store.record(job.id, owner, **{k: v for k, v in outcome.fields().items() if k != "error"})
            self._retry(job, owner, f"{outcome.reason}\n{outcome.error or ''}".strip())
            return
        self._end(job, owner, outcome.status, **outcome.fields())

    def _proposes(self, state: RepoState) -> bool:
        """Whether this job proposes a recipe (`hf-export init --push`) rather than exporting one."""
        return (not state.has_recipe and self.settings.propose_recipes
                and getattr(self.backend, "proposes_recipes", False))

    def _skip_reason(self, job: Job, state: RepoState) -> tuple[str | None, Job | None]:
        """Why the job needs no run (None: it does), and the job that exported the same inputs, if that is why."""
        if state.opted_out:
            return (f"the repo opted out of the bot ({OPT_OUT_FILE} at {state.head_sha[:8]}): nothing is exported or "
                    "said on the Hub until the file is removed"), None
        identity = self._bot_identity()
        names = {self.settings.bot_name} | ({identity[1]} if identity else set())
        if job.trigger == "push" and state.head_authors and set(state.head_authors) <= names:
            return f"commit {state.head_sha[:8]} is the bot's own", None
        if job.trigger == "comment" and job.requested_by and identity and job.requested_by == identity[0]:
            return "the comment asking for an export is the bot's own", None
        if not state.has_recipe:
            if not self._proposes(state):
                return f"no export recipe at {state.head_sha[:8]}: {where_a_recipe_goes()}", None
            previous = self.store.find_exported(job.repo, PROPOSAL_KEY, state.weights_key, exclude=job.id)
            if previous is not None and not job.force:
                return f"a recipe was already proposed by job #{previous.id} for these weights", None
        if not job.force and state.recipe_sha256 and not state.recipe_error:
            previous = self.store.find_exported(job.repo, state.recipe_sha256, state.weights_key, exclude=job.id)
            if previous is not None:
                return (f"nothing changed: already exported by job #{previous.id} (same recipe and weights"
                        f"{', ' + _thread(previous.pr_url) if previous.pr_url else ''})"), previous
        return None, None

    def _superseded(self, job: Job) -> str:
        """Why `job` is superseded now ('' while it is not): a newer push of its repo."""
        newer = self.store.newer_push(job) if job.trigger == "push" else None
        return f"superseded by job #{newer.id} (a newer push, {newer.head_sha[:8]})" if newer else ""

    def _blocked(self, job: Job, owner: str, problem: Problem, commit: str, reason: str, status: str = FAILED,
                 **fields) -> None:
        """The job could not export at all: tell the repo (the library's discussion), then end the job (`status`:
        failed, or skipped by policy) with the problem's lines as its error. A Hub failure that may pass is retried;
        another one is noted on the job."""
        problem = problem.scrubbed(self.settings.secrets())
        fields["error"] = "\n".join(problem.lines(OPTION_NAMES))
        try:
            told = report_problem(job.repo, problem, source_sha=commit, token=self._token(),
                                  endpoint=self.settings.hf_endpoint, names=OPTION_NAMES, notes=[OPT_OUT_NOTE])
        except PublishError as err:
            message = scrub(str(err), self.settings.secrets())
            if err.retryable:
                self._retry(job, owner, f"{reason}; could not tell the repo: {message}")
            else:
                self._end(job, owner, status, reason=f"{reason}; could not tell the repo: {message}", **fields)
            return
        fields.update(operation=told.operation, discussion_url=told.discussion_url or fields.get("discussion_url"))
        self._end(job, owner, status, reason=f"{reason}; {told.message}",
                  **{k: v for k, v in fields.items() if v is not None})

    def _close_stale_discussion(self, job: Job, state: RepoState, exported: Job) -> str:
        """The repo is back to inputs exported before: close the failure discussion a later run left open (only
        when the repo's last run ended with one). What was done, for the job's reason."""
        last = self.store.last_outcome(job.repo, exclude=job.id)
        if last is None or last.status != FAILED or not last.discussion_url:
            return ""
        where = _thread(exported.pr_url) if exported.pr_url else f"job #{exported.id}"
        comment = (f"Resolved: `main` is now at `{state.head_sha[:7]}`, whose recipe and weights were exported "
                   f"already ({where}); nothing here needs fixing any more.")
        try:
            closed = close_failure_discussions(job.repo, comment=comment, token=self._token(),
                                               endpoint=self.settings.hf_endpoint)
        except PublishError as err:
            return f"; could not close the failure discussion: {scrub(str(err), self.settings.secrets())}"
        return f"; closed discussion {', '.join(f'#{n}' for n in closed)}" if closed else ""

    def _close_stale_proposal(self, job: Job, owner: str, state: RepoState) -> None:
        """`main` has a recipe of its own: close the bot's open PR proposing one (`hf-export init --push`), with a
        comment saying why. Looked for only when the bot proposes recipes or once proposed one for this repo; what
        was done goes into the job's notes (a Hub failure too: the job goes on)."""
        if not (self._proposes_at_all() or self.store.proposed(job.repo, PROPOSAL_KEY)):
            return
        from exporters.init.push import KIND_RECIPE  # exporters.init loads torch (its probes): rarely needed here
        comment = (f"Closing: `main` now has a recipe of its own (`{state.recipe_file}` at `{state.head_sha[:7]}`), "
                   "so this proposal is no longer needed; the bot exports `main`'s recipe from now on.")
        try:
            hub = HubClient(job.repo, token=self._token(), endpoint=self.settings.hf_endpoint)
            view = hub.view_at(None, "main", hub.whoami())
            closed = []
            for thread in in_slot(view, {"kind": KIND_RECIPE, "recipe": "repo", "base": "main"}):
                if thread.is_open:
                    hub.close(thread.num, comment)
                    closed.append(thread.num)
        except PublishError as err:
            self.store.note(job.id, owner, "could not close the recipe proposal: "
                                           f"{scrub(str(err), self.settings.secrets())}")
            return
        if closed:
            log.info("job %d: closed recipe proposal %s (main has its own recipe)", job.id, closed)
            self.store.note(job.id, owner, f"closed recipe proposal {', '.join(f'#{n}' for n in closed)}: main has "
                                           f"its own recipe ({state.recipe_file})")

    def _proposes_at_all(self) -> bool:
        return self.settings.propose_recipes and getattr(self.backend, "proposes_recipes", False)

    # ------------------------------------------------------------------------------------------ helpers
    def _end(self, job: Job, owner: str, status: str, **fields) -> None:
        if self.store.finish(job.id, owner, status, **fields):
            log.info("job %d: %s (%s)", job.id, status, fields.get("reason", ""))
        else:
            log.warning("job %d: lease lost before recording %s; another worker owns it now", job.id, status)

    def _retry(self, job: Job, owner: str, error: str) -> None:
        status = self.store.retry_later(job.id, owner, scrub(error, self.settings.secrets())[-4000:],
                                        backoff_seconds=self.settings.retry_backoff_seconds)
        log.info("job %d: attempt %d failed; now %s", job.id, job.attempts, status or "owned by another worker")

    def _heartbeat(self, job_id: int, owner: str, cancelled: threading.Event, done: threading.Event) -> None:
        interval = max(self.settings.lease_seconds / 3, 0.05)
        while not done.wait(interval):
            try:
                if not self.store.heartbeat(job_id, owner, self.settings.lease_seconds):
                    log.warning("job %d: lease lost; cancelling the run", job_id)
                    cancelled.set()
                    return
            except sqlite3.Error as err:  # keep trying: the lease is long enough to ride out a busy database
                log.warning("job %d: heartbeat failed: %s", job_id, err)

    def _token(self) -> str | None:
        return self.settings.hf_token.get_secret_value() if self.settings.hf_token else None

    def _bot_identity(self) -> tuple[str, str] | None:
        """The bot's own `(id, name)`: asked once and kept; after a failure, asked again after a minute (None
        meanwhile: the bot's name from the settings still applies)."""
        if self._identity_known or time.monotonic() < self._identity_retry_at:
            return self._identity
        try:
            self._identity = whoami_id(token=self._token(), endpoint=self.settings.hf_endpoint)
            self._identity_known = True
        except HubCheckError as err:
            log.warning("%s; asking again in %.0fs", err, IDENTITY_RETRY_SECONDS)
            self._identity_retry_at = time.monotonic() + IDENTITY_RETRY_SECONDS
        return self._identity


def _thread(url: str) -> str:
    """`PR #3` from a Hub discussion URL."""
    return f"PR #{url.rstrip('/').rsplit('/', 1)[-1]}"

"""Workers: claim jobs from the store, decide on the Hub whether they need running, run them on the backend.

One `Worker` runs `concurrency` threads. For each claimed job:

1. (backends that need it) read the repo at the job's commit (`hubcheck.inspect_repo`) and record the recipe hash
   and weights key; then skip, with the reason on the job, when: the commit is the bot's own, the comment that asked
   is the bot's own, there is no recipe, or (unless forced by a comment) the same recipe and weights were already
   exported successfully. An invalid recipe fails the job without exporting.
2. run the backend, renewing the lease every `lease_seconds / 3`; a lost lease cancels the run.
3. record the outcome: succeeded / failed, or queued again with exponential backoff on a transient failure.

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
import traceback
import uuid
from pathlib import Path

from .backends import Backend, JobContext, get_backend
from .hubcheck import HubCheckError, RepoState, inspect_repo, whoami_id
from exporters.redact import scrub, tail
from .settings import BotSettings
from .store import FAILED, SKIPPED, Job, JobStore

log = logging.getLogger("bot.worker")


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
        if self.backend.needs_hub_check:
            try:
                state = inspect_repo(job.repo, job.head_sha or "main", token=self._token(),
                                     endpoint=self.settings.hf_endpoint, with_authors=job.trigger == "push")
            except HubCheckError as err:
                if err.permanent:
                    self._end(job, owner, SKIPPED, reason=str(err))
                else:
                    self._retry(job, owner, str(err))
                return
            fields = {"recipe_sha256": state.recipe_sha256, "weights_key": state.weights_key}
            if not job.head_sha:
                fields["head_sha"] = state.head_sha
            try:
                self.store.record(job.id, owner, **fields)
            except sqlite3.IntegrityError:  # that head already has a job with this trigger: keep ours as is
                self.store.record(job.id, owner, recipe_sha256=state.recipe_sha256, weights_key=state.weights_key)
            skip = self._skip_reason(job, state)
            if skip:
                self._end(job, owner, SKIPPED, reason=skip)
                return
            if state.recipe_error:
                self._end(job, owner, FAILED, reason=f"invalid recipe in {state.recipe_file}",
                          error=scrub(state.recipe_error, self.settings.secrets()))
                return
        ctx = JobContext(job=job, state=state, settings=self.settings,
                         job_dir=Path(self.settings.work_dir) / f"job-{job.id}", cancelled=cancelled)
        self.store.record(job.id, owner, backend=self.backend.name)
        outcome = self.backend.run(ctx)
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

    def _skip_reason(self, job: Job, state: RepoState) -> str | None:
        identity = self._bot_identity()
        names = {self.settings.bot_name} | ({identity[1]} if identity else set())
        if job.trigger == "push" and state.head_authors and set(state.head_authors) <= names:
            return f"commit {state.head_sha[:8]} is the bot's own"
        if job.trigger == "comment" and job.requested_by and identity and job.requested_by == identity[0]:
            return "the comment asking for an export is the bot's own"
        if not state.has_recipe:
            return (f"no recipe at {state.head_sha[:8]} (no export_config.json, no 'export_config' in config.json)")
        if not job.force and state.recipe_sha256 and not state.recipe_error:
            previous = self.store.find_exported(job.repo, state.recipe_sha256, state.weights_key, exclude=job.id)
            if previous is not None:
                return f"already exported by job #{previous.id} (same recipe and weights)"
        return None

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
        if not self._identity_known:
            self._identity = whoami_id(token=self._token(), endpoint=self.settings.hf_endpoint)
            self._identity_known = True
        return self._identity

"""The job store: one SQLite file in WAL mode, shared by the web process and any number of workers.

A job is one (repo, head commit, trigger) to export. Its life:

```
queued ──claim──► running ──finish──► succeeded | failed | skipped
   ▲                 │
   └── retry later ──┤ (crash, Hub error: attempts left, exponential backoff)
   └── lease expired ┘ (the worker died: another worker claims it again)
```

- Intake dedupes on `UNIQUE(repo, head_sha, trigger_key)` with `INSERT ... ON CONFLICT DO NOTHING` inside a
  `BEGIN IMMEDIATE` transaction, so 50 concurrent deliveries of one event make one job (and count 50 deliveries).
- Limits are per trigger kind: a push over its repo's daily limit is stored and *delayed* (due when the 24-hour
  window has room again), never dropped: the Hub does not redeliver a 202. Comment requests over the repo's or the
  requester's daily limit are refused (`rate_limited`); the person can ask again later.
- At most one job per repo runs at a time: `claim` skips a repo while another job of it holds a live lease, so two
  workers never publish to one repo at once (publishing converges on one PR anyway, see `exporters.publish`).
- A worker holds a lease (`lease_owner`, `lease_expires_at`) renewed by heartbeats. A worker killed mid-job stops
  renewing; once the lease expires the job is claimable again (its attempt counted). `finish` only applies while
  the caller still holds the lease, so a late, stale worker cannot overwrite a newer attempt.
- Privacy is the repo's current state, applied to all its jobs: a job queued as private, a delivery saying the repo
  is private, or a worker reading it private on the Hub hides every job of the repo (`set_private`); only the Hub's
  answer to a worker makes them public again.
- Everything is in the database: a restarted process picks up where the last one stopped.

Example:
    >>> store = JobStore(":memory:")
    >>> first = store.enqueue("acme/tiny", "a" * 40)
    >>> again = store.enqueue("acme/tiny", "a" * 40)
    >>> (first.outcome, again.outcome, first.job_id == again.job_id)
    ('queued', 'duplicate', True)
    >>> job = store.claim("worker-1", lease_seconds=60)
    >>> job.status, job.attempts
    ('running', 1)
    >>> store.finish(job.id, "worker-1", "succeeded", pr_url="https://hf.co/acme/tiny/discussions/1")
    True
    >>> store.get(job.id).status
    'succeeded'
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .job import Job, iso

QUEUED, RUNNING, SUCCEEDED, FAILED, SKIPPED = "queued", "running", "succeeded", "failed", "skipped"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, SKIPPED)
TERMINAL = (SUCCEEDED, FAILED, SKIPPED)
DAY_SECONDS = 86400.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    repo             TEXT    NOT NULL,
    head_sha         TEXT    NOT NULL,
    trigger          TEXT    NOT NULL,              -- push | comment | manual
    trigger_key      TEXT    NOT NULL DEFAULT '',   -- '' for pushes, 'comment:<id>' for a comment
    requested_by     TEXT,                          -- Hub user id of a comment's author
    force            INTEGER NOT NULL DEFAULT 0,    -- run even when the same recipe + weights were exported
    private          INTEGER NOT NULL DEFAULT 0,
    status           TEXT    NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'skipped')),
    deliveries       INTEGER NOT NULL DEFAULT 1,    -- webhook deliveries folded into this job
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 3,
    next_attempt_at  REAL    NOT NULL,
    lease_owner      TEXT,
    lease_expires_at REAL,
    heartbeat_at     REAL,
    backend          TEXT,
    recipe_sha256    TEXT,
    weights_key      TEXT,
    exit_code        INTEGER,
    operation        TEXT,                          -- created | updated | unchanged | discussion | none | dispatched
    pr_url           TEXT,
    discussion_url   TEXT,
    report_path      TEXT,
    log_path         TEXT,
    dispatch         TEXT,                          -- JSON: what the github or hf-jobs backend sent
    reason           TEXT,                          -- why skipped / what happened, one line
    error            TEXT,                          -- excerpt of what went wrong (secrets scrubbed)
    notes            TEXT    NOT NULL DEFAULT '',   -- one line per notable event (recoveries, retries)
    UNIQUE (repo, head_sha, trigger_key)
);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS jobs_repo_created ON jobs (repo, created_at);
CREATE INDEX IF NOT EXISTS jobs_exported ON jobs (repo, recipe_sha256, weights_key, status);
"""

# Columns a worker may set on its job (everything else is managed by the store).
RESULT_FIELDS = frozenset({
    "head_sha", "backend", "recipe_sha256", "weights_key", "exit_code", "operation", "pr_url", "discussion_url",
    "report_path", "log_path", "dispatch", "reason", "error", "private",
})
PUSH = "push"
__all__ = ["Delivery", "Job", "JobStore", "EnqueueResult", "Limits", "iso"]


@dataclass
class EnqueueResult:
    """What intake did with a delivery: `queued` a new job, folded a `duplicate`, or hit the daily limit."""

    outcome: Literal["queued", "duplicate", "rate_limited", "delayed"]
    job_id: int | None
    detail: str = ""


@dataclass(frozen=True)
class Limits:
    """Daily limits (rolling 24 h; 0: none). `push`: push jobs per repo (above it a push is delayed, not dropped);
    `comment`: comment jobs per repo; `requester`: comment jobs per requester, across repos (above them: refused)."""

    push: int = 0
    comment: int = 0
    requester: int = 0


@dataclass(frozen=True)
class Delivery:
    """What a delivery asks to queue beside its repo and commit: its `trigger` kind (push, comment, manual), its
    `trigger_key` (two deliveries with one key are one job), who asked, `force`, and whether the repo is `private`.

    Example:
        >>> Delivery(trigger="comment", trigger_key="comment:1", requested_by="alice").force
        False
    """

    trigger: str = "push"
    trigger_key: str = ""
    requested_by: str | None = None
    force: bool = False
    private: bool = False


class JobStore:
    """Thread- and process-safe job queue on SQLite (one connection per thread, WAL, `BEGIN IMMEDIATE` writes).

    `path` is a file (created with its folder) or `":memory:"` (one thread only, for doctests).
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        # Writers of this process queue here instead of in SQLite's busy handler, which sleeps in steps of up to
        # 100 ms: that alone made the intake's p99 latency hundreds of ms under concurrent deliveries.
        self._write_lock = threading.Lock()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn().execute("PRAGMA journal_mode=WAL")
        with self._tx() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    # ------------------------------------------------------------------------------------------ plumbing
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_ms / 1000,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no deadlock on upgrade)."""
        conn = self._conn()
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------------------------------------- intake
    def enqueue(self, repo: str, head_sha: str, delivery: Delivery | None = None, *, limits: Limits | None = None,
                max_attempts: int = 3, now: float | None = None) -> EnqueueResult:
        """Queue a job for `repo` at `head_sha` as `delivery` asks (see `Delivery`; a push by default), or count one
        more delivery of the same one.

        `limits` (see `Limits`) apply per trigger kind; duplicates never count. A push over its limit is stored with
        a later due time (`delayed`); a comment over a limit is refused (`rate_limited`).
        """
        delivery = delivery or Delivery()
        trigger, trigger_key, private = delivery.trigger, delivery.trigger_key, delivery.private
        now = time.time() if now is None else now
        limits = limits or Limits()
        due = now
        with self._tx() as conn:
            if private:  # privacy is the repo's, not a job's: every job of it is hidden at once
                conn.execute("UPDATE jobs SET private = 1 WHERE repo = ? AND private = 0", (repo,))
            else:  # a repo known to be private stays so until the Hub says otherwise (`set_private`)
                private = conn.execute("SELECT 1 FROM jobs WHERE repo = ? AND private = 1 LIMIT 1",
                                       (repo,)).fetchone() is not None
            row = conn.execute(
                "UPDATE jobs SET deliveries = deliveries + 1, updated_at = ? "
                "WHERE repo = ? AND head_sha = ? AND trigger_key = ? RETURNING id",
                (now, repo, head_sha, trigger_key)).fetchone()
            if row is not None:
                return EnqueueResult("duplicate", row["id"])
            since = now - DAY_SECONDS
            if trigger == PUSH and limits.push:
                recent = conn.execute("SELECT created_at FROM jobs WHERE repo = ? AND trigger = ? AND created_at > ? "
                                      "ORDER BY created_at DESC LIMIT ?", (repo, PUSH, since, limits.push)).fetchall()
                if len(recent) >= limits.push:  # the window frees a slot when the oldest of the last `push` ages out
                    due = recent[-1]["created_at"] + DAY_SECONDS
            elif trigger != PUSH:
                refusal = self._over_limit(conn, repo, delivery.requested_by, since, limits)
                if refusal:
                    return EnqueueResult("rate_limited", None, refusal)
            row = conn.execute(
                "INSERT INTO jobs (repo, head_sha, trigger, trigger_key, requested_by, force, private, created_at, "
                "updated_at, next_attempt_at, max_attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (repo, head_sha, trigger_key) DO NOTHING RETURNING id",
                (repo, head_sha, trigger, trigger_key, delivery.requested_by, int(delivery.force), int(private), now,
                 now, due, max_attempts)).fetchone()
            if row is None:  # only possible if another writer slipped in: fold it like a duplicate
                row = conn.execute(
                    "UPDATE jobs SET deliveries = deliveries + 1 WHERE repo = ? AND head_sha = ? AND trigger_key = ? "
                    "RETURNING id", (repo, head_sha, trigger_key)).fetchone()
                return EnqueueResult("duplicate", row["id"])
            if due > now:
                return EnqueueResult("delayed", row["id"], f"{repo} had {limits.push} pushes in the last 24 h (limit "
                                                           f"{limits.push}): stored, runs after {iso(due)}")
            return EnqueueResult("queued", row["id"])

    @staticmethod
    def _over_limit(conn: sqlite3.Connection, repo: str, requester: str | None, since: float,
                    limits: Limits) -> str:
        if limits.comment:
            (count,) = conn.execute("SELECT COUNT(*) FROM jobs WHERE repo = ? AND trigger != ? AND created_at > ?",
                                    (repo, PUSH, since)).fetchone()
            if count >= limits.comment:
                return f"{repo} already had {count} requested exports in the last 24 h (limit {limits.comment})"
        if limits.requester and requester:
            (count,) = conn.execute("SELECT COUNT(*) FROM jobs WHERE requested_by = ? AND created_at > ?",
                                    (requester, since)).fetchone()
            if count >= limits.requester:
                return f"this requester already asked for {count} exports in the last 24 h (limit {limits.requester})"
        return ""

    def set_private(self, repo: str, private: bool) -> int:
        """Record whether `repo` is private now, on every job of it (privacy is the repo's current state, not what
        it was when a job was queued). The number of jobs changed."""
        with self._tx() as conn:
            return conn.execute("UPDATE jobs SET private = ? WHERE repo = ? AND private != ?",
                                (int(private), repo, int(private))).rowcount

    # ------------------------------------------------------------------------------------------ workers
    def claim(self, worker_id: str, lease_seconds: float, *, now: float | None = None) -> Job | None:
        """Take the next due job (queued and due, or running with an expired lease) and lease it to `worker_id`.

        A job whose lease expired on its last allowed attempt is failed instead of claimed.
        """
        now = time.time() if now is None else now
        with self._tx() as conn:
            conn.execute(
                "UPDATE jobs SET status = 'failed', finished_at = ?, updated_at = ?, lease_owner = NULL, "
                "lease_expires_at = NULL, error = 'the worker running it stopped (lease expired) on the last "
                "attempt', notes = notes || ? WHERE status = 'running' AND lease_expires_at < ? "
                "AND attempts >= max_attempts",
                (now, now, f"{iso(now)} lease expired on the last attempt\n", now))
            row = conn.execute(
                "SELECT id, status, lease_owner FROM jobs WHERE ((status = 'queued' AND next_attempt_at <= ?) "
                "OR (status = 'running' AND lease_expires_at < ?)) AND repo NOT IN (SELECT repo FROM jobs WHERE "
                "status = 'running' AND lease_expires_at >= ?) ORDER BY next_attempt_at, id LIMIT 1",
                (now, now, now)).fetchone()
            if row is None:
                return None
            note = ""
            if row["status"] == RUNNING:
                note = f"{iso(now)} lease of {row['lease_owner']} expired: recovered by {worker_id}\n"
            job = conn.execute(
                "UPDATE jobs SET status = 'running', attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?, "
                "heartbeat_at = ?, started_at = ?, finished_at = NULL, updated_at = ?, notes = notes || ? "
                "WHERE id = ? RETURNING *",
                (worker_id, now + lease_seconds, now, now, now, note, row["id"])).fetchone()
            return Job.from_row(job)

    def heartbeat(self, job_id: int, worker_id: str, lease_seconds: float) -> bool:
        """Renew the lease; False when `worker_id` no longer holds it (the job was taken over or finished)."""
        now = time.time()
        with self._tx() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET lease_expires_at = ?, heartbeat_at = ?, updated_at = ? "
                "WHERE id = ? AND lease_owner = ? AND status = 'running'",
                (now + lease_seconds, now, now, job_id, worker_id))
            return cursor.rowcount == 1

    def record(self, job_id: int, worker_id: str, **fields: Any) -> bool:
        """Set result fields (see `RESULT_FIELDS`) while holding the lease."""
        return self._update_leased(job_id, worker_id, None, fields)

    def finish(self, job_id: int, worker_id: str, status: str, **fields: Any) -> bool:
        """End the attempt with a terminal `status` and result fields; False when the lease was lost."""
        if status not in TERMINAL:
            raise ValueError(f"finish() takes one of {TERMINAL}, got {status!r}")
        return self._update_leased(job_id, worker_id, status, fields)

    def retry_later(self, job_id: int, worker_id: str, error: str, *, backoff_seconds: float,
                    now: float | None = None) -> str:
        """Give the job back after a transient failure: queued again after `backoff_seconds * 2**(attempts-1)`,
        or failed when no attempts are left. Returns the new status ('' when the lease was lost)."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = conn.execute("SELECT attempts, max_attempts FROM jobs WHERE id = ? AND lease_owner = ? "
                               "AND status = 'running'", (job_id, worker_id)).fetchone()
            if row is None:
                return ""
            if row["attempts"] >= row["max_attempts"]:
                conn.execute(
                    "UPDATE jobs SET status = 'failed', error = ?, finished_at = ?, updated_at = ?, "
                    "lease_owner = NULL, lease_expires_at = NULL, reason = ? WHERE id = ?",
                    (error, now, now, f"gave up after {row['attempts']} attempt(s)", job_id))
                return FAILED
            delay = backoff_seconds * 2 ** (row["attempts"] - 1)
            conn.execute(
                "UPDATE jobs SET status = 'queued', error = ?, next_attempt_at = ?, finished_at = ?, updated_at = ?, "
                "lease_owner = NULL, lease_expires_at = NULL, notes = notes || ? WHERE id = ?",
                (error, now + delay, now, now, f"{iso(now)} attempt {row['attempts']} failed; retry in {delay:.0f}s\n",
                 job_id))
            return QUEUED

    def release(self, job_id: int, worker_id: str, why: str) -> bool:
        """Give a job back untouched (worker shutting down): queued, due now, this attempt not counted."""
        now = time.time()
        with self._tx() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET status = 'queued', attempts = MAX(attempts - 1, 0), next_attempt_at = ?, "
                "updated_at = ?, lease_owner = NULL, lease_expires_at = NULL, notes = notes || ? "
                "WHERE id = ? AND lease_owner = ? AND status = 'running'",
                (now, now, f"{iso(now)} released by {worker_id}: {why}\n", job_id, worker_id))
            return cursor.rowcount == 1

    def note(self, job_id: int, worker_id: str, text: str) -> bool:
        """Append one line to the job's `notes` while holding the lease."""
        now = time.time()
        with self._tx() as conn:
            return conn.execute(
                "UPDATE jobs SET notes = notes || ?, updated_at = ? WHERE id = ? AND lease_owner = ? "
                "AND status = 'running'", (f"{iso(now)} {text}\n", now, job_id, worker_id)).rowcount == 1

    def _update_leased(self, job_id: int, worker_id: str, status: str | None, fields: dict[str, Any]) -> bool:
        unknown = set(fields) - RESULT_FIELDS
        if unknown:
            raise ValueError(f"unknown job field(s) {sorted(unknown)}; settable: {sorted(RESULT_FIELDS)}")
        now = time.time()
        values = {k: (json.dumps(v) if k == "dispatch" and v is not None else v) for k, v in fields.items()}
        values["updated_at"] = now
        if status is not None:
            values.update(status=status, finished_at=now, lease_owner=None, lease_expires_at=None)
        assignments = ", ".join(f"{k} = ?" for k in values)
        with self._tx() as conn:
            cursor = conn.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND lease_owner = ? AND status = 'running'",
                (*values.values(), job_id, worker_id))
            return cursor.rowcount == 1

    # ------------------------------------------------------------------------------------------ queries
    def get(self, job_id: int) -> Job | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return Job.from_row(row) if row else None

    def list(self, *, limit: int = 50, offset: int = 0, status: str | None = None, repo: str | None = None,
             before: int | None = None, after: int | None = None) -> list[Job]:
        """Newest first. Pages by id (cheap at any depth): `before` lists the jobs older than that id, `after` the
        `limit` jobs just newer than it (still newest first)."""
        where, args = [], []
        for column, operator, value in (("status", "=", status), ("repo", "=", repo), ("id", "<", before),
                                        ("id", ">", after)):
            if value is not None and value != "":
                where.append(f"{column} {operator} ?")
                args.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = "ASC" if after is not None and before is None else "DESC"  # the page just above `after`
        rows = self._conn().execute(f"SELECT * FROM jobs {clause} ORDER BY id {order} LIMIT ? OFFSET ?",
                                    (*args, limit, offset)).fetchall()
        jobs = [Job.from_row(r) for r in rows]
        return jobs[::-1] if order == "ASC" else jobs

    def last_outcome(self, repo: str, *, exclude: int | None = None) -> Job | None:
        """The latest job of `repo` that ran to an end (succeeded or failed; skipped ones said nothing)."""
        row = self._conn().execute(
            "SELECT * FROM jobs WHERE repo = ? AND id != ? AND status IN ('succeeded', 'failed') ORDER BY id DESC "
            "LIMIT 1", (repo, exclude or -1)).fetchone()
        return Job.from_row(row) if row else None

    def proposed(self, repo: str, recipe_key: str) -> Job | None:
        """The latest job that proposed a recipe for `repo` (recorded with the recipe hash `recipe_key`) and opened
        or updated its PR."""
        row = self._conn().execute(
            "SELECT * FROM jobs WHERE repo = ? AND recipe_sha256 = ? AND status = 'succeeded' AND pr_url IS NOT NULL "
            "ORDER BY id DESC LIMIT 1", (repo, recipe_key)).fetchone()
        return Job.from_row(row) if row else None

    def counts(self) -> dict[str, int]:
        """Jobs per status, plus `deliveries` (webhook deliveries folded into jobs)."""
        rows = self._conn().execute("SELECT status, COUNT(*), SUM(deliveries) FROM jobs GROUP BY status").fetchall()
        counts = {s: 0 for s in STATES}
        deliveries = 0
        for status, count, folded in rows:
            counts[status] = count
            deliveries += folded or 0
        counts["deliveries"] = deliveries
        return counts

    def newer_push(self, job: Job) -> Job | None:
        """A push job of the same repo queued after `job` (a newer commit), not yet ended as skipped or failed."""
        row = self._conn().execute(
            "SELECT * FROM jobs WHERE repo = ? AND trigger = ? AND id > ? AND head_sha != ? AND status IN "
            "('queued', 'running', 'succeeded') ORDER BY id DESC LIMIT 1",
            (job.repo, PUSH, job.id, job.head_sha)).fetchone()
        return Job.from_row(row) if row else None

    def find_exported(self, repo: str, recipe_sha256: str, weights_key: str, *, exclude: int | None = None) -> Job | None:
        """The latest job that already exported `repo` with this recipe and these weights successfully (a job
        succeeds only when its export passed and was published, or its GitHub run concluded `success`)."""
        row = self._conn().execute(
            "SELECT * FROM jobs WHERE repo = ? AND recipe_sha256 = ? AND weights_key = ? AND status = 'succeeded' "
            "AND id != ? ORDER BY id DESC LIMIT 1", (repo, recipe_sha256, weights_key, exclude or -1)).fetchone()
        return Job.from_row(row) if row else None

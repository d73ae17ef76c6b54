"""A job of the store (one row), as workers, the API and the status page see it.

Example:
    >>> iso(1700000000.0)
    '2023-11-14T22:13:20Z'
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass
class Job:
    """One row of the store."""

    id: int
    repo: str
    head_sha: str
    trigger: str
    trigger_key: str
    status: str
    created_at: float
    updated_at: float
    next_attempt_at: float
    requested_by: str | None = None
    force: bool = False
    private: bool = False
    deliveries: int = 1
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    max_attempts: int = 3
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    heartbeat_at: float | None = None
    backend: str | None = None
    recipe_sha256: str | None = None
    weights_key: str | None = None
    exit_code: int | None = None
    operation: str | None = None
    pr_url: str | None = None
    discussion_url: str | None = None
    report_path: str | None = None
    log_path: str | None = None
    dispatch: dict[str, Any] | None = None
    reason: str | None = None
    error: str | None = None
    notes: str = ""

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        data = dict(row)
        data["force"], data["private"] = bool(data["force"]), bool(data["private"])
        data["dispatch"] = json.loads(data["dispatch"]) if data["dispatch"] else None
        return cls(**data)

    @property
    def duration_s(self) -> float | None:
        """Seconds of the last attempt (so far, while running)."""
        if self.started_at is None:
            return None
        end = self.finished_at if self.finished_at is not None else time.time()
        return round(end - self.started_at, 3)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ISO 8601 times and the duration added."""
        data = asdict(self)
        for key in ("created_at", "updated_at", "started_at", "finished_at", "next_attempt_at", "lease_expires_at",
                    "heartbeat_at"):
            data[key] = iso(data[key])
        data["duration_s"] = self.duration_s
        return data


def iso(ts: float | None) -> str | None:
    """`1700000000.0` -> `'2023-11-14T22:13:20Z'` (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

"""Where a job runs: a registry of backends with lazy imports (only the backend in use is imported).

| name     | what it does                                                                                   |
|----------|------------------------------------------------------------------------------------------------|
| `local`  | `python -m bot.export_run run REPO --revision SHA --out DIR --push` (hf-export) per job       |
| `github` | `workflow_dispatch` of the export workflow on GitHub's runners (PyGithub), recorded on the job  |
| `hf-jobs`| a Hugging Face Job per job (`HfApi.run_job`), on the flavor its work needs, recorded on the job   |
| `dry`    | nothing: marks the job succeeded (benchmarks, smoke tests of the intake)                        |

Modules: `local`, `github`, `hf_jobs` (the `hf-jobs` backend),
`flavors` (the Jobs hardware table and the choice of a flavor from the work), `dry`.

A backend gets a `JobContext` and returns an `Outcome`; it never touches the store itself: what must be durable
before the run ends (the GitHub backend's dispatch, before it is sent) goes through `JobContext.save`, which the
worker binds to the store under the job's lease.

Example:
    >>> from bot.settings import BotSettings
    >>> backend = get_backend("dry", BotSettings())
    >>> backend.name, backend.needs_hub_check
    ('dry', False)
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from exporters.publish.problem import Problem

    from ..hubcheck import RepoState
    from ..settings import BotSettings
    from ..store import Job

# name -> (module, class): imported on first use.
BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("bot.backends.local", "LocalBackend"),
    "github": ("bot.backends.github", "GitHubBackend"),
    "hf-jobs": ("bot.backends.hf_jobs", "HfJobsBackend"),
    "dry": ("bot.backends.dry", "DryBackend"),
}


@dataclass
class JobContext:
    """What a backend may use to run one job."""

    job: Job
    state: RepoState | None
    settings: BotSettings
    job_dir: Path
    cancelled: threading.Event = field(default_factory=threading.Event)  # set when the lease was lost / shutdown
    # Record job fields now, under the lease (`JobStore.record`); False when the lease is lost (nothing recorded).
    save: Callable[..., bool] = field(default=lambda **_: True)
    # Why the job is superseded now (a newer push of the repo), '' while it is not: a backend following a remote run
    # cancels it then.
    superseded: Callable[[], str] = field(default=lambda: "")

    def find_started(self, lookup: Callable[[], Any], requested_at: float, settle_s: float,
                     interval_s: float) -> tuple[Any, bool]:
        """What an earlier attempt started and never recorded (a run, a job): ask `lookup()` until it finds it or
        the remote listing has had `settle_s` since the request to show it. Returns `(found, stopped)`: `found`
        None when nothing was started, `stopped` True when the lease was lost while looking.

        Example:
            >>> ctx = JobContext(job=None, state=None, settings=None, job_dir=Path("."))
            >>> ctx.find_started(lambda: None, requested_at=0.0, settle_s=0.0, interval_s=0.1)
            (None, False)
        """
        while True:
            found = lookup()
            if found is not None:
                return found, False
            left = requested_at + settle_s - time.time()
            if left <= 0:
                return None, False
            if self.cancelled.wait(min(left, interval_s)):
                return None, True


@dataclass
class Outcome:
    """How a run ended. `retry`: a transient failure (the worker queues it again with backoff). `skipped`: not run,
    by policy (the reason says why; nothing is said on the Hub). `problem`: what
    stopped the run before any export (an invalid recipe, a model that cannot be loaded, refused remote code): the
    worker tells the repo."""

    status: Literal["succeeded", "failed", "retry", "skipped"]
    reason: str
    exit_code: int | None = None
    operation: str | None = None
    pr_url: str | None = None
    discussion_url: str | None = None
    report_path: str | None = None
    log_path: str | None = None
    dispatch: dict[str, Any] | None = None
    error: str | None = None
    problem: Problem | None = None

    def fields(self) -> dict[str, Any]:
        """The job columns this outcome sets."""
        return {k: v for k, v in self.__dict__.items() if k not in ("status", "problem") and v is not None}


class Backend(Protocol):
    """What every backend implements."""

    name: str
    needs_hub_check: bool  # False: the worker runs it without reading the repo first

    def run(self, ctx: JobContext) -> Outcome: ...


class UnknownBackendError(ValueError):
    """No backend of that name."""


def get_backend(name: str, settings: BotSettings) -> Backend:
    """Import and build the backend called `name`."""
    try:
        module_name, class_name = BACKENDS[name]
    except KeyError:
        raise UnknownBackendError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    module = importlib.import_module(module_name)
    return getattr(module, class_name)(settings)

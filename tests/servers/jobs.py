"""A local Hugging Face Jobs API that the real ``huggingface_hub`` client drives (`HfApi.run_job`, `list_jobs`,
`inspect_job`, `fetch_job_logs`, `cancel_job`).

The client calls the Jobs API on the Hub's own endpoint (``{endpoint}/api/jobs/...``), so `JobsEmulator` serves it
on a running `tests.servers.hub.HubEmulator` (`HubEmulator.add_route`), with the Hub's tokens and organizations:

- ``POST /api/jobs/{ns}`` (the spec `huggingface_hub._jobs_api._create_job_spec` sends: ``dockerImage``, ``command``,
  ``arguments``, ``environment``, ``secrets``, ``flavor``, ``timeoutSeconds``, ``labels``): 401 without a token,
  403 when the token's user cannot act in ``ns``, 400 for an unknown flavor or a missing image; the job's JSON.
- ``GET /api/jobs/{ns}`` (``stage=`` and ``label=key=value`` filters, repeatable), ``GET /api/jobs/{ns}/{id}``,
  ``POST /api/jobs/{ns}/{id}/cancel``.
- ``GET /api/jobs/{ns}/{id}/logs``: server-sent events ``data: {"timestamp", "data"}``, a ``===== Job started``
  event first; the events so far, then new ones as the job writes them. The stream ends when the job has ended, or
  after ``log_idle_close_seconds`` without a new line (a following client connects again, as it does with the Hub's
  streams, and skips what it has seen; a client that does not follow stops at the end of the replay at once instead
  of after its 5 s read timeout). ``None`` keeps it open until the job ends, as the Hub's stream is: a following
  `fetch_job_logs` whose stream ended early sleeps 2 s and stops without reading again when the job has ended
  meanwhile, so a test of following must not see early ends.

A job's secrets are never answered (their names only). The stages: ``SCHEDULING`` (``queue_seconds``, the queue),
``RUNNING``, then ``COMPLETED`` (exit 0), ``ERROR`` (another exit, the timeout, an image that is not known) or
``CANCELED``. With ``run_commands`` a job runs its command as a local subprocess: ``python`` is this interpreter, the
image's code is ``image_root`` (``PYTHONPATH``), its environment is ``base_env`` + the job's environment + its
secrets (nothing of the caller's), and its ``/tmp`` is a folder of its own (arguments under ``/tmp/`` are moved
there). Without it, jobs stay ``RUNNING`` and the test drives them (`log`, `finish`). `hold_launch_answers` keeps the
answer to a launch until set (the job is created: a worker killed meanwhile never learns its id), `launch_status`
refuses launches, `received` keeps every spec as sent (secrets included, for tests to check where they went).

Example:
    >>> with HubEmulator() as hub:  # doctest: +SKIP
    ...     jobs = JobsEmulator(hub, image_root=Path("."), images={"ghcr.io/x/y@sha256:..."})
    ...     HfApi(endpoint=hub.url, token="hf_test_token").run_job(image="ghcr.io/x/y@sha256:...", command=["true"])
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets as random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.servers.hub import HubEmulator, HubError, _Call, _now

TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
FLAVORS = {"cpu-basic", "cpu-upgrade", "cpu-performance", "cpu-xl", "t4-small", "t4-medium", "l4x1", "l4x4",
           "l40sx1", "l40sx4", "l40sx8", "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large",
           "a100x4", "a100x8", "h200", "h200x2", "h200x4", "h200x8", "rtx-pro-6000", "rtx-pro-6000x2",
           "rtx-pro-6000x4", "rtx-pro-6000x8"}


@dataclass
class EmulatedJob:
    """One job: its spec as sent, its stage, its log events and its process."""

    id: str
    namespace: str
    spec: dict[str, Any]
    stage: str = "SCHEDULING"
    message: str | None = None
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    finished_at: str | None = None
    events: list[dict[str, str]] = field(default_factory=list)
    process: subprocess.Popen | None = None
    changed: threading.Event = field(default_factory=threading.Event)


class _HeldJSON(JSONResponse):
    """A JSON answer sent only once `release` is set (the request was handled: its effects are done)."""

    def __init__(self, content: Any, release: threading.Event) -> None:
        super().__init__(content)
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        while not self.release.is_set():
            await asyncio.sleep(0.05)
        await super().__call__(scope, receive, send)


class JobsEmulator:
    """The Jobs API on `hub`'s server; `reset` before each test."""

    def __init__(self, hub: HubEmulator, *, image_root: Path, images: set[str] | None = None,
                 base_env: dict[str, str] | None = None) -> None:
        self.hub, self.image_root, self.images = hub, Path(image_root), set(images or ())
        self.base_env = dict(base_env or {})
        self._lock = threading.RLock()
        self._folder = Path(tempfile.mkdtemp(prefix="jobs-emulator-"))
        self.reset()
        for methods, template, handler in (
                ("POST", "/api/jobs/{ns}", self._create), ("GET", "/api/jobs/{ns}", self._list),
                ("GET", "/api/jobs/{ns}/{job}", self._inspect), ("POST", "/api/jobs/{ns}/{job}/cancel", self._cancel),
                ("GET", "/api/jobs/{ns}/{job}/logs", self._logs)):
            hub.add_route(methods, template, handler)

    # ------------------------------------------------------------------------------------------ test API
    def reset(self) -> None:
        """Stop every job and forget them; the default behaviour back."""
        with self._lock:
            for job in getattr(self, "_jobs", {}).values():
                self._kill(job)
            self._jobs: dict[str, EmulatedJob] = {}
            self.received: list[dict[str, Any]] = []
            self.requests: list[tuple[str, str]] = []
            self.run_commands = True
            self.queue_seconds = 0.0
            self.log_idle_close_seconds: float | None = 0.5
            self.hold_launch_answers: threading.Event | None = None
            self.launch_status: int | None = None

    def jobs(self) -> list[EmulatedJob]:
        with self._lock:
            return list(self._jobs.values())

    def job(self, job_id: str) -> EmulatedJob:
        with self._lock:
            return self._jobs[job_id]

    def log(self, job_id: str, line: str) -> None:
        """Append one line to the job's log."""
        job = self.job(job_id)
        with self._lock:
            job.events.append({"timestamp": _now(), "data": line})
        job.changed.set()

    def finish(self, job_id: str, stage: str, message: str | None = None) -> None:
        """End a job the test drives (`COMPLETED`, `ERROR`, `CANCELED`, `DELETED`)."""
        job = self.job(job_id)
        with self._lock:
            if job.stage not in TERMINAL:
                job.stage, job.message, job.finished_at = stage, message, _now()
        self._kill(job)
        job.changed.set()

    # ------------------------------------------------------------------------------------------ routes
    def _create(self, call: _Call) -> Response:
        namespace = call.args["ns"]
        self._check(call, namespace)
        with self._lock:
            self.requests.append(("POST", f"/api/jobs/{namespace}"))
            spec = call.json()
            self.received.append(json.loads(json.dumps(spec)))
            if self.launch_status is not None:
                raise HubError(self.launch_status, "the Jobs emulator refuses launches (launch_status)")
            if not spec.get("dockerImage") and not spec.get("spaceId"):
                raise HubError(400, "a job needs dockerImage or spaceId")
            if spec.get("flavor") not in FLAVORS:
                raise HubError(400, f"unknown flavor {spec.get('flavor')!r}")
            job = EmulatedJob(random.token_hex(12), namespace, spec)
            self._jobs[job.id] = job
            hold = self.hold_launch_answers
        threading.Thread(target=self._run, args=(job,), daemon=True, name=f"job-{job.id}").start()
        body = self._json(job)
        return _HeldJSON(body, hold) if hold is not None else JSONResponse(body)

    def _list(self, call: _Call) -> Response:
        namespace = call.args["ns"]
        self._check(call, namespace)
        stages = [s.upper() for s in call.query.getlist("stage")]
        labels = [tuple(item.split("=", 1)) for item in call.query.getlist("label") if "=" in item]
        with self._lock:
            self.requests.append(("GET", f"/api/jobs/{namespace}"))
            found = [self._json(job) for job in self._jobs.values() if job.namespace == namespace
                     and (not stages or job.stage in stages)
                     and all((job.spec.get("labels") or {}).get(k) == v for k, v in labels)]
        return JSONResponse(found)

    def _found(self, call: _Call) -> EmulatedJob:
        self._check(call, call.args["ns"])
        job = self._jobs.get(call.args["job"])
        if job is None or job.namespace != call.args["ns"]:
            raise HubError(404, f"job {call.args['job']} not found")
        return job

    def _inspect(self, call: _Call) -> Response:
        with self._lock:
            job = self._found(call)
            self.requests.append(("GET", f"/api/jobs/{job.namespace}/{job.id}"))
            return JSONResponse(self._json(job))

    def _cancel(self, call: _Call) -> Response:
        with self._lock:
            job = self._found(call)
            self.requests.append(("POST", f"/api/jobs/{job.namespace}/{job.id}/cancel"))
        self.finish(job.id, "CANCELED", "cancelled by the API")
        return Response(status_code=200)

    def _logs(self, call: _Call) -> Response:
        with self._lock:
            job = self._found(call)
            self.requests.append(("GET", f"/api/jobs/{job.namespace}/{job.id}/logs"))
        idle = self.log_idle_close_seconds

        async def stream():
            sent, quiet_since = 0, time.monotonic()
            while True:
                with self._lock:
                    events, ended = list(job.events), job.stage in TERMINAL
                for event in events[sent:]:
                    yield f"data: {json.dumps(event)}\n\n".encode()
                    quiet_since = time.monotonic()
                sent = len(events)
                if ended or (idle is not None and time.monotonic() - quiet_since > idle):
                    return
                await asyncio.sleep(0.05)

        return StreamingResponse(stream(), media_type="text/event-stream")

    # ------------------------------------------------------------------------------------------ running
    def _check(self, call: _Call, namespace: str) -> None:
        user = call.require_user()
        if not self.hub.acts_for(user, namespace):
            raise HubError(403, f"{user} cannot run or read jobs in {namespace}")

    def _json(self, job: EmulatedJob) -> dict[str, Any]:
        spec = job.spec
        owner_type = "org" if job.namespace in getattr(self.hub, "_orgs", {}) else "user"
        return {"id": job.id, "createdAt": job.created_at, "startedAt": job.started_at, "finishedAt": job.finished_at,
                "dockerImage": spec.get("dockerImage"), "spaceId": spec.get("spaceId"), "command": spec.get("command"),
                "arguments": spec.get("arguments"), "environment": spec.get("environment"),
                "secrets": {name: None for name in spec.get("secrets") or {}}, "flavor": spec.get("flavor"),
                "labels": spec.get("labels"), "status": {"stage": job.stage, "message": job.message},
                "owner": {"id": self.hub.user_id(job.namespace), "name": job.namespace, "type": owner_type}}

    def _set(self, job: EmulatedJob, stage: str, message: str | None = None) -> bool:
        with self._lock:
            if job.stage in TERMINAL:
                return False
            job.stage, job.message = stage, message
            if stage == "RUNNING":
                job.started_at = _now()
                job.events.append({"timestamp": _now(), "data": "===== Job started at " + job.started_at + " ====="})
            if stage in TERMINAL:
                job.finished_at = _now()
        job.changed.set()
        return True

    def _run(self, job: EmulatedJob) -> None:
        deadline = time.monotonic() + self.queue_seconds
        while time.monotonic() < deadline:
            if job.stage in TERMINAL:
                return
            time.sleep(0.05)
        if self.images and job.spec.get("dockerImage") not in self.images:
            self._set(job, "ERROR", f"image {job.spec.get('dockerImage')} not found")
            return
        if not self._set(job, "RUNNING") or not self.run_commands:
            return
        folder = self._folder / job.id
        (folder / "tmp").mkdir(parents=True)
        argv = [*(job.spec.get("command") or []), *(job.spec.get("arguments") or [])]
        argv = [sys.executable if i == 0 and a in ("python", "python3") else
                str(folder / "tmp" / a[len("/tmp/"):]) if a.startswith("/tmp/") else a for i, a in enumerate(argv)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
               "PYTHONPATH": str(self.image_root), "HF_HOME": str(folder / "hf-home"), "TMPDIR": str(folder / "tmp"),
               **self.base_env, **(job.spec.get("environment") or {}), **(job.spec.get("secrets") or {})}
        with self._lock:
            if job.stage in TERMINAL:
                return
            job.process = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        timeout = job.spec.get("timeoutSeconds")
        timer = threading.Timer(timeout, self.finish, (job.id, "ERROR", "Job timeout")) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        assert job.process.stdout is not None
        for raw in job.process.stdout:
            self.log(job.id, raw.decode(errors="replace").rstrip("\r\n"))
        code = job.process.wait()
        if timer:
            timer.cancel()
        self._set(job, "COMPLETED" if code == 0 else "ERROR", None if code == 0 else f"exit code {code}")

    @staticmethod
    def _kill(job: EmulatedJob) -> None:
        if job.process is not None and job.process.poll() is None:
            try:
                os.killpg(job.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

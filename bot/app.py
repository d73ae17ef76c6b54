"""The web app: Hub webhook intake, job API, status page. FastAPI, served by uvicorn (`hf-export-bot serve`).

| route                     | what                                                                                  |
|---------------------------|---------------------------------------------------------------------------------------|
| `POST /webhooks/hub`      | a delivery: 202 `{"status": queued|delayed|duplicate|ignored|rate_limited}`          |
| `GET /healthz`            | 200 `{"status": "ok"}` when the job store answers (503 otherwise)                     |
| `GET /jobs`, `/jobs/{id}` | jobs as JSON (newest first; `?status=`, `?repo=`, `?limit=`, `?before=` a job id)     |
| `GET /jobs/{id}/report`   | the run's report.md (local backend); `/jobs/{id}/log`: its log, secrets scrubbed       |
| `GET /`                   | the HTML status page: jobs newest first, paged (`?before=`/`?after=` a job id, `?status=`) |

The intake answers at once and never exports: it checks the secret (constant time; missing 401, wrong 403), the
content type (415), the size (413, from Content-Length and from the bytes actually read), parses the payload with
`huggingface_hub.WebhookPayload` (400, also for bodies nested too deep to parse, and for a repo name that is not a
Hub repo id `namespace/name`), applies `bot.intake.decide` and the
opt-in list, counts a `@bot export` comment only from the repo's owner or a member of its org (`bot.members`: one
cached Hub lookup per namespace; 503 when the Hub cannot say), and inserts the job (deduplicated on repo + head
commit; a push over the daily limit is stored and delayed, never dropped). Everything else happens in a worker.

A private repo's jobs are hidden from the API and the status page (unless `show_private`): `/jobs?repo=` answers as
if the repo had no jobs, so an anonymous caller cannot learn that it exists. Privacy is the repo's current state,
applied to all its jobs: any delivery saying the repo is private (a `repo.config` update when it turns private)
hides every job of it at once, and so does a worker that reads it private on the Hub.

Example:
    >>> from bot.settings import BotSettings
    >>> app = create_app(BotSettings(webhook_secret="s3cret", db_path=":memory:", allowed=["acme"]))
    >>> sorted(r.path for r in app.routes if r.path.startswith("/jobs"))
    ['/jobs', '/jobs/{job_id}', '/jobs/{job_id}/log', '/jobs/{job_id}/report']
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from huggingface_hub import WebhookPayload
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from exporters.redact import scrub

from . import __version__
from .intake import Decision, decide, repo_id_problem
from .members import Members, MembershipError
from .page import PAGE_SIZE, PageNav, public_view, render_status_page
from .settings import BotSettings, SettingsError
from .store import STATES, Delivery, JobStore
from .worker import Worker

log = logging.getLogger("bot.app")
SECRET_HEADER = "x-webhook-secret"


class _TooLarge(Exception):
    pass


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(settings: BotSettings, store: JobStore | None = None, *, embedded_worker: bool = False) -> FastAPI:
    """The ASGI app. `embedded_worker`: also run a `Worker` in a background thread for the app's lifetime."""
    if settings.webhook_secret is None or not settings.webhook_secret.get_secret_value():
        raise SettingsError("webhook_secret is not set (WEBHOOK_SECRET): refusing to accept unauthenticated webhooks")
    secret = settings.webhook_secret.get_secret_value().encode()
    store = store or JobStore(settings.db_path)
    secrets = settings.secrets()
    members = Members(token=settings.hf_token.get_secret_value() if settings.hf_token else None,
                      endpoint=settings.hf_endpoint, ttl=settings.membership_cache_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if embedded_worker:
            worker = Worker(settings, store)
            thread = threading.Thread(target=worker.run, args=(stop,), name="export-worker", daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                await run_in_threadpool(thread.join, 60)

    app = FastAPI(title="export-action bot", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.settings, app.state.store = settings, store

    @app.post("/webhooks/hub", status_code=202)
    async def hub_webhook(request: Request) -> Response:
        given = request.headers.get(SECRET_HEADER)
        if given is None:
            return _error(401, f"missing {SECRET_HEADER} header")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret):
            return _error(403, f"wrong {SECRET_HEADER}")
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            return _error(415, f"content type must be application/json, got {content_type[:60] or 'none'!r}")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return _error(413, f"body larger than {settings.max_body_bytes} bytes")
        try:
            body = await _read_limited(request, settings.max_body_bytes)
        except _TooLarge:
            return _error(413, f"body larger than {settings.max_body_bytes} bytes")
        try:
            raw = json.loads(body)
            payload = WebhookPayload.model_validate(raw)
        except ValueError as err:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
            return _error(400, f"not a Hub webhook payload: {_describe(err)}")
        except RecursionError:  # nested deeper than the parser goes: junk, not a server error
            return _error(400, "not a Hub webhook payload: nested too deeply")
        problem = repo_id_problem(payload.repo.name)
        if problem is not None:  # the Hub only sends real repo ids: refuse before anything is stored
            return _error(400, f"not a Hub webhook payload: {problem}")
        if payload.repo.private:  # e.g. a `repo.config` update: the repo turned private. Hide its jobs at once (only
            try:                  # the Hub's answer to a worker makes them public again)
                await run_in_threadpool(store.set_private, payload.repo.name, True)
            except Exception as err:
                log.error("could not record %s as private: %s", payload.repo.name, scrub(str(err), secrets))
                return _error(503, "job store unavailable; deliver again later")
        decision = decide(payload, raw, bot_name=settings.bot_name)
        if decision.action == "queue" and not settings.is_allowed(decision.repo or ""):
            decision = Decision("ignore", f"{decision.repo} has not opted in (not in the bot's allowed list)",
                                repo=decision.repo)
        if decision.action == "queue" and decision.trigger == "comment":
            try:
                entitled = await run_in_threadpool(members.entitled, decision.repo or "", decision.requested_by)
            except MembershipError as err:
                log.warning("could not check a comment's author on %s: %s", decision.repo, err)
                return _error(503, "could not check who asked (the Hub did not answer); deliver again later")
            if not entitled:
                namespace = (decision.repo or "").split("/", 1)[0]
                decision = Decision("ignore", f"the comment's author is neither {namespace} nor a member of it: only "
                                              "the repo's owner or its org's members can ask for an export",
                                    repo=decision.repo)
        if decision.action == "ignore":
            log.debug("ignored %s: %s", payload.repo.name, decision.reason)
            return JSONResponse({"status": "ignored", "reason": decision.reason}, status_code=202)
        try:
            result = await run_in_threadpool(
                store.enqueue, decision.repo, decision.head_sha,
                Delivery(trigger=decision.trigger, trigger_key=decision.trigger_key,
                         requested_by=decision.requested_by, force=decision.force, private=decision.private),
                limits=settings.limits(), max_attempts=settings.max_attempts)
        except Exception as err:  # the store is unavailable: make the Hub deliver again later
            log.error("could not store a delivery for %s: %s", decision.repo, scrub(str(err), secrets))
            return _error(503, "job store unavailable; deliver again later")
        if result.outcome in ("queued", "delayed"):
            log.info("job %s %s: %s@%s (%s)", result.job_id, result.outcome, decision.repo,
                     decision.head_sha[:8] or "main", result.detail or decision.reason)
        body_out: dict[str, Any] = {"status": result.outcome, "job": result.job_id}
        if result.detail:
            body_out["reason"] = result.detail
        return JSONResponse(body_out, status_code=202)

    @app.get("/healthz")
    def healthz() -> Response:
        try:
            counts = store.counts()
        except Exception as err:
            return _error(503, f"job store unavailable: {type(err).__name__}")
        return JSONResponse({"status": "ok", "version": __version__, "backend": settings.backend, "jobs": counts})

    @app.get("/jobs")
    def list_jobs(limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0), status: str | None = None,
                  repo: str | None = None, before: int | None = Query(None, ge=1)) -> Response:
        if status is not None and status not in STATES:
            return _error(400, f"status must be one of {list(STATES)}")
        jobs = store.list(limit=limit, offset=offset, status=status, repo=repo, before=before)
        if repo is not None and not settings.show_private:
            jobs = [j for j in jobs if not j.private]  # a private repo answers like one without jobs
        return JSONResponse({"jobs": [public_view(j, settings) for j in jobs], "counts": store.counts()})

    @app.get("/jobs/{job_id}")
    def get_job(job_id: int) -> Response:
        job = store.get(job_id)
        if job is None:
            return _error(404, f"no job {job_id}")
        return JSONResponse(public_view(job, settings))

    def _job_file(job_id: int, attribute: str) -> Response:
        job = store.get(job_id)
        if job is None or (job.private and not settings.show_private):
            return _error(404, f"no job {job_id}")
        value = getattr(job, attribute)
        path = Path(value).resolve() if value else None
        root = Path(settings.work_dir).resolve()
        if path is None or not path.is_file() or root not in path.parents:
            return _error(404, f"job {job_id} has no {attribute.removesuffix('_path')}")
        return PlainTextResponse(scrub(path.read_text(errors="replace"), secrets))

    @app.get("/jobs/{job_id}/report")
    def job_report(job_id: int) -> Response:
        return _job_file(job_id, "report_path")

    @app.get("/jobs/{job_id}/log")
    def job_log(job_id: int) -> Response:
        return _job_file(job_id, "log_path")

    @app.get("/", response_class=HTMLResponse)
    def status_page(limit: int = Query(PAGE_SIZE, ge=1, le=500), before: int | None = Query(None, ge=1),
                    after: int | None = Query(None, ge=0), status: str | None = None) -> Response:
        status = status or None
        if status is not None and status not in STATES:
            return _error(400, f"status must be one of {list(STATES)}")
        jobs = store.list(limit=limit, status=status, before=before, after=None if before else after)
        if not jobs and after is not None:  # nothing newer: the newest page
            jobs = store.list(limit=limit, status=status)
        older = jobs and store.list(limit=1, status=status, before=jobs[-1].id)
        newer = jobs and store.list(limit=1, status=status, after=jobs[0].id)
        nav = PageNav(status, limit, older_than=jobs[-1].id if older else None,
                      newer_than=jobs[0].id if newer else None)
        return HTMLResponse(render_status_page([public_view(j, settings) for j in jobs], store.counts(), settings,
                                               nav))

    return app


async def _read_limited(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


def _describe(err: Exception) -> str:
    if isinstance(err, ValidationError):
        parts = [f"{'.'.join(map(str, e['loc'])) or '$'}: {e['msg']}" for e in err.errors()[:3]]
        more = f" (+{err.error_count() - 3} more)" if err.error_count() > 3 else ""
        return "; ".join(parts) + more
    return f"invalid JSON ({str(err)[:120]})"

"""The web app: Hub webhook intake, job API, status page. FastAPI, served by uvicorn (`hf-export-bot serve`).

| route                     | what                                                                                  |
|---------------------------|---------------------------------------------------------------------------------------|
| `POST /webhooks/hub`      | a Hub webhook delivery: 202 with `{"status": queued|duplicate|ignored|rate_limited}`  |
| `GET /healthz`            | 200 `{"status": "ok"}` when the job store answers (503 otherwise)                     |
| `GET /jobs`, `/jobs/{id}` | jobs as JSON (newest first; `?status=`, `?repo=`, `?limit=`)                         |
| `GET /jobs/{id}/report`   | the run's report.md (local backend); `/jobs/{id}/log`: its log, secrets scrubbed       |
| `GET /`                   | an HTML status page of recent jobs                                                    |

The intake answers at once and never calls the Hub or exports: it checks the secret (constant time; missing 401,
wrong 403), the content type (415), the size (413, from Content-Length and from the bytes actually read), parses the
payload with `huggingface_hub.WebhookPayload` (400), applies `bot.intake.decide` and the opt-in list, and inserts the
job (deduplicated on repo + head commit). Everything else happens in a worker.

Example:
    >>> from bot.settings import BotSettings
    >>> app = create_app(BotSettings(webhook_secret="s3cret", db_path=":memory:", allowed=["acme"]))
    >>> sorted(r.path for r in app.routes if r.path.startswith("/jobs"))
    ['/jobs', '/jobs/{job_id}', '/jobs/{job_id}/log', '/jobs/{job_id}/report']
"""

from __future__ import annotations

import contextlib
import hmac
import html
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from huggingface_hub import WebhookPayload
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from . import __version__
from .intake import Decision, decide
from exporters.redact import scrub
from .settings import BotSettings, SettingsError
from .store import STATES, Job, JobStore

log = logging.getLogger("bot.app")
SECRET_HEADER = "x-webhook-secret"


class _TooLarge(Exception):
    pass


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def public_view(job: Job, settings: BotSettings) -> dict[str, Any]:
    """A job as the API and the status page show it (a private repo's details hidden unless `show_private`)."""
    data = job.to_dict()
    data.pop("requested_by", None)
    data["links"] = _links(job)
    if job.private and not settings.show_private:
        for key in ("repo", "head_sha", "pr_url", "discussion_url", "report_path", "log_path", "dispatch", "error",
                    "reason", "notes", "recipe_sha256", "weights_key"):
            data[key] = None
        data["repo"], data["links"] = "(private repo)", {}
    return data


def _links(job: Job) -> dict[str, str]:
    links = {}
    if job.pr_url:
        links["pr"] = job.pr_url
    if job.discussion_url:
        links["discussion"] = job.discussion_url
    if job.report_path:
        links["report"] = f"/jobs/{job.id}/report"
    if job.log_path:
        links["log"] = f"/jobs/{job.id}/log"
    if job.dispatch and job.dispatch.get("run_url"):
        links["run"] = job.dispatch["run_url"]
    return links


def create_app(settings: BotSettings, store: JobStore | None = None, *, embedded_worker: bool = False) -> FastAPI:
    """The ASGI app. `embedded_worker`: also run a `Worker` in a background thread for the app's lifetime."""
    if settings.webhook_secret is None or not settings.webhook_secret.get_secret_value():
        raise SettingsError("webhook_secret is not set (WEBHOOK_SECRET): refusing to accept unauthenticated webhooks")
    secret = settings.webhook_secret.get_secret_value().encode()
    store = store or JobStore(settings.db_path)
    secrets = settings.secrets()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if embedded_worker:
            from .worker import Worker

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
        decision = decide(payload, raw, bot_name=settings.bot_name)
        if decision.action == "queue" and not settings.is_allowed(decision.repo or ""):
            decision = Decision("ignore", f"{decision.repo} has not opted in (not in the bot's allowed list)",
                                repo=decision.repo)
        if decision.action == "ignore":
            log.debug("ignored %s: %s", payload.repo.name, decision.reason)
            return JSONResponse({"status": "ignored", "reason": decision.reason}, status_code=202)
        try:
            result = await run_in_threadpool(
                store.enqueue, decision.repo, decision.head_sha, trigger=decision.trigger,
                trigger_key=decision.trigger_key, requested_by=decision.requested_by, force=decision.force,
                private=decision.private, daily_limit=settings.daily_limit, max_attempts=settings.max_attempts)
        except Exception as err:  # the store is unavailable: make the Hub deliver again later
            log.error("could not store a delivery for %s: %s", decision.repo, scrub(str(err), secrets))
            return _error(503, "job store unavailable; deliver again later")
        if result.outcome == "queued":
            log.info("job %s queued: %s@%s (%s)", result.job_id, decision.repo, decision.head_sha[:8] or "main",
                     decision.reason)
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
                  repo: str | None = None) -> Response:
        if status is not None and status not in STATES:
            return _error(400, f"status must be one of {list(STATES)}")
        jobs = store.list(limit=limit, offset=offset, status=status, repo=repo)
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
    def status_page(limit: int = Query(50, ge=1, le=500)) -> HTMLResponse:
        jobs = [public_view(j, settings) for j in store.list(limit=limit)]
        return HTMLResponse(render_status_page(jobs, store.counts(), settings))

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


_LINK_LABELS = {"pr": "PR", "discussion": "discussion", "report": "report", "log": "log", "run": "Actions run"}
_STATUS_COLOURS = {"queued": "#6b7280", "running": "#2563eb", "succeeded": "#16a34a", "failed": "#dc2626",
                   "skipped": "#a16207"}


def render_status_page(jobs: list[dict[str, Any]], counts: dict[str, int], settings: BotSettings) -> str:
    """The HTML status page: counts per status, then one row per job (every value escaped)."""
    e = html.escape
    rows = []
    for job in jobs:
        links = " ".join(f'<a class="link" href="{e(url)}">{e(_LINK_LABELS.get(name, name))}</a>'
                         for name, url in job["links"].items())
        colour = _STATUS_COLOURS.get(job["status"], "#000")
        duration = f"{job['duration_s']:.1f}s" if job["duration_s"] is not None else ""
        rows.append(
            f'<tr class="job" data-job-id="{job["id"]}" data-status="{e(job["status"])}">'
            f'<td>{job["id"]}</td><td class="repo">{e(job["repo"] or "")}</td>'
            f'<td><code>{e((job["head_sha"] or "")[:8])}</code></td><td>{e(job["trigger"])}</td>'
            f'<td><span class="status" style="background:{colour}">{e(job["status"])}</span></td>'
            f'<td>{job["attempts"]}/{job["max_attempts"]}</td><td>{e(job["created_at"] or "")}</td>'
            f'<td>{e(duration)}</td><td>{links}</td><td class="reason">{e(job["reason"] or "")}</td></tr>')
    summary = " · ".join(f"{e(k)}: {v}" for k, v in counts.items())
    empty = '<tr><td colspan="10">No jobs yet.</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="15">
<title>export-action bot</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #111; }}
table {{ border-collapse: collapse; width: 100%; font-size: 14px; }}
th, td {{ border-bottom: 1px solid #e5e7eb; padding: 6px 8px; text-align: left; vertical-align: top; }}
.status {{ color: #fff; border-radius: 4px; padding: 1px 6px; }}
.reason {{ color: #4b5563; max-width: 32rem; }}
.link {{ margin-right: .5rem; }}
</style></head>
<body>
<h1>export-action bot</h1>
<p id="summary">backend <b>{e(settings.backend)}</b> · {summary} · rendered {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>
<table id="jobs"><thead><tr><th>#</th><th>repo</th><th>commit</th><th>trigger</th><th>status</th><th>attempts</th>
<th>created (UTC)</th><th>took</th><th>links</th><th>reason</th></tr></thead>
<tbody>
{chr(10).join(rows) or empty}
</tbody></table>
<p><a href="/jobs">jobs as JSON</a> · <a href="/healthz">health</a></p>
</body></html>
"""

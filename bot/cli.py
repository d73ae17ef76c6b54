"""`hf-export-bot`: serve the webhook app, run workers, list jobs.

```
hf-export-bot serve  [--config bot.toml] [--host 127.0.0.1] [--port 8080] [--no-worker]
hf-export-bot worker [--config bot.toml]
hf-export-bot jobs   [--config bot.toml] [--status failed] [--limit 20]
hf-export-bot health [--port 8080]       # exit 0 when the served bot answers GET /healthz with ok (HEALTHCHECK)
```

`--host` and `--port` also come from `EXPORT_BOT_HOST` / `EXPORT_BOT_PORT` (the container sets them, and the health
check reads the same port).

Configuration: `--config` (TOML) and environment variables; see `bot/settings.py` and `docs/bot.md`.
Exit codes: 0 ok, 2 bad configuration.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

from exporters.quiet import mute_import_chatter
from exporters.redact import scrub

from .secrecy import withhold_secrets
from .settings import BotSettings, SettingsError, load_settings
from .store import JobStore

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The export-action Hub webhook bot: queue exports on repo updates, open Hub PRs.")
EXIT_USAGE = 2

ConfigOption = typer.Option(None, "--config", help="TOML settings file (environment variables win over it).")
LogLevelOption = typer.Option("info", "--log-level", help="debug, info, warning or error.")


class SecretFilter(logging.Filter):
    """Scrubs the bot's secrets (and anything shaped like a token) from every log record."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info:
            import traceback

            record.msg = scrub(f"{record.msg}\n{''.join(traceback.format_exception(*record.exc_info))}",
                               self.secrets)
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def setup_logging(level: str, settings: BotSettings) -> None:
    """Log to stderr, through `SecretFilter`; uvicorn's loggers too."""
    mute_import_chatter()  # the stack's import chatter, muted as in the CLI and the Action (exporters/quiet.py)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter(settings.secrets()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def _settings(config: Optional[Path], **overrides) -> BotSettings:
    try:
        return load_settings(config, **{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


def _serving_settings(config: Optional[Path], **overrides) -> BotSettings:
    """The settings of a process that runs jobs or serves: its secrets then leave its environment, and it is not
    dumpable (`bot.secrecy`): nothing it starts can read them through `/proc`."""
    settings = _settings(config, **overrides)
    withhold_secrets()
    return settings


@app.command()
def serve(
    config: Optional[Path] = ConfigOption,
    host: str = typer.Option("127.0.0.1", "--host", envvar="EXPORT_BOT_HOST", help="Interface to listen on."),
    port: int = typer.Option(8080, "--port", envvar="EXPORT_BOT_PORT", help="Port to listen on."),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Run a worker thread in this process."),
    access_log: bool = typer.Option(False, "--access-log/--no-access-log", help="Log every HTTP request."),
    log_level: str = LogLevelOption,
) -> None:
    """Serve POST /webhooks/hub, the job API and the status page (with an embedded worker unless --no-worker)."""
    import uvicorn

    from .app import create_app  # the web app (FastAPI): only `serve` pays for it

    settings = _serving_settings(config)
    setup_logging(log_level, settings)
    try:
        application = create_app(settings, embedded_worker=worker)
    except SettingsError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    logging.getLogger("bot").info("serving on http://%s:%d (backend %s, worker %s, store %s)", host, port,
                                  settings.backend, "embedded" if worker else "separate", settings.db_path)
    uvicorn.run(application, host=host, port=port, log_config=None, access_log=access_log,
                log_level=log_level.lower(), timeout_graceful_shutdown=5)


@app.command("worker")
def worker_command(
    config: Optional[Path] = ConfigOption,
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Jobs at once (default: settings)."),
    log_level: str = LogLevelOption,
) -> None:
    """Run workers apart from the web process, until SIGTERM / Ctrl+C (running jobs are given back)."""
    from .worker import Worker  # the worker and its backends: only `worker` pays for them

    settings = _serving_settings(config, concurrency=concurrency)
    setup_logging(log_level, settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    Worker(settings).run(stop)


@app.command()
def jobs(
    config: Optional[Path] = ConfigOption,
    status: Optional[str] = typer.Option(None, "--status", help="Only jobs in this state."),
    limit: int = typer.Option(20, "--limit", help="How many (newest first)."),
) -> None:
    """List recent jobs from the store."""
    settings = _settings(config)
    for job in JobStore(settings.db_path).list(limit=limit, status=status):
        link = job.pr_url or job.discussion_url or ""
        typer.echo(f"#{job.id:<5} {job.status:<9} {job.repo}@{job.head_sha[:8]:<8} {job.trigger:<7} "
                   f"{job.attempts}/{job.max_attempts} {link} {job.reason or ''}".rstrip())


@app.command()
def health(
    port: int = typer.Option(8080, "--port", envvar="EXPORT_BOT_PORT", help="Port the bot serves on."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the answer."),
) -> None:
    """Exit 0 when the bot on this machine answers GET /healthz with status ok, 1 otherwise (a container's health
    check: no curl needed, no secret read)."""
    import httpx

    url = f"http://127.0.0.1:{port}/healthz"
    try:
        answer = httpx.get(url, timeout=timeout)
        healthy = answer.status_code == 200 and answer.json().get("status") == "ok"
        detail = f"{answer.status_code} {answer.text[:200]}"
    except (httpx.HTTPError, ValueError) as err:
        healthy, detail = False, f"{type(err).__name__}: {err}"
    typer.echo(f"{url}: {'ok' if healthy else 'unhealthy'} ({detail})", err=not healthy)
    raise typer.Exit(0 if healthy else 1)


def main() -> None:
    """Console entry point (`hf-export-bot`)."""
    app()


if __name__ == "__main__":
    main()

"""The `local` backend: the same pipeline as the CLI, one subprocess per job.

```
python -m exporters.cli run REPO --revision SHA --out JOB_DIR/out --push --quiet [--publish-failed]
                                 [--trust-remote-code (allowlisted repos only)]
```

- The Hub token reaches the subprocess as `HF_TOKEN` in its environment, never in argv (argv is visible to every
  user of the machine in `ps`). The bot's other secrets (webhook secret, GitHub token) are removed from it.
- Limits: a wall-clock timeout (`job_timeout_seconds`; the whole process group is killed) and an address-space limit
  (`memory_limit_mb`, `RLIMIT_AS` set in `preexec_fn`). The child also gets `PR_SET_PDEATHSIG`, so a worker killed
  with SIGKILL does not leave an orphan export pushing behind the back of the job's next attempt.
- Output (stdout and stderr) goes to `JOB_DIR/run.log`; the job records an excerpt, scrubbed of secrets.

Exit codes of `hf-export run`: 0 all targets passed (PR opened, updated or unchanged), 1 a target failed (the report
is posted as a discussion; with `--publish-failed` the passing targets still go to the PR), 2 bad recipe or usage
(failed, not retried) or a publish error (`publish failed:` / `cannot publish:`, retried). Anything else (a signal, an
exit 1 without a failed report: a crash) is retried. What `--push` did is read from the lines the CLI prints
(`publish: <operation> — <message>`, then the PR or discussion URL).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from exporters.redact import scrub, tail
from ..settings import BotSettings
from . import JobContext, Outcome

PR_SET_PDEATHSIG = 1
# Environment variables the export subprocess must not see.
WITHHELD_ENV = ("WEBHOOK_SECRET", "GITHUB_TOKEN", "EXPORT_BOT_GITHUB_TOKEN", "GH_TOKEN")
_PUBLISH_LINE = re.compile(r"^publish: (\w+) \S (.*)$", re.M)
_URL_LINE = re.compile(r"^(https?://\S+)\s*$", re.M)
_PUBLISH_ERROR = re.compile(r"^(publish failed|cannot publish):", re.M)


def _project_root() -> Path | None:
    spec = importlib.util.find_spec("exporters")
    return Path(spec.origin).resolve().parent.parent if spec and spec.origin else None


def make_preexec(memory_limit_mb: int):
    """The child-side set-up: address-space limit and death signal. Everything is bound before the fork."""
    limit = memory_limit_mb * 1024 * 1024 if memory_limit_mb else None
    setrlimit, rlimit_as = resource.setrlimit, resource.RLIMIT_AS
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        prctl = None
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        if limit is not None:
            setrlimit(rlimit_as, (limit, limit))
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0)

    return preexec


class LocalBackend:
    """Runs `hf-export run --push` in a subprocess per job.

    Example:
        >>> backend = LocalBackend(BotSettings(hf_token="hf_xxx"))
        >>> argv = backend.command("acme/tiny", "a" * 40, Path("/tmp/out"))
        >>> argv[1:5], "hf_xxx" in " ".join(argv)
        (['-m', 'exporters.cli', 'run', 'acme/tiny'], False)
    """

    name = "local"
    needs_hub_check = True

    def __init__(self, settings: BotSettings) -> None:
        self.settings = settings

    def command(self, repo: str, revision: str, out_dir: Path) -> list[str]:
        """argv of the export run (no secrets in it)."""
        argv = [self.settings.python or sys.executable, "-m", "exporters.cli", "run", repo, "--revision", revision,
                "--out", str(out_dir), "--push", "--quiet"]
        if self.settings.publish_failed:
            argv.append("--publish-failed")
        if self.settings.trusts_remote_code(repo):
            argv.append("--trust-remote-code")
        return argv

    def environment(self) -> dict[str, str]:
        """The subprocess environment: ours, minus the bot's other secrets, plus the Hub token and endpoint."""
        env = {k: v for k, v in os.environ.items() if k not in WITHHELD_ENV}
        env.pop("HF_TOKEN", None)
        if self.settings.hf_token is not None:
            env["HF_TOKEN"] = self.settings.hf_token.get_secret_value()
        if self.settings.hf_endpoint:
            env["HF_ENDPOINT"] = self.settings.hf_endpoint
        root = _project_root()
        if root is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["COLUMNS"] = "1000"  # rich wraps at 80 columns without a terminal: keep URLs on one line
        return env

    def run(self, ctx: JobContext) -> Outcome:
        job, settings = ctx.job, self.settings
        revision = ctx.state.head_sha if ctx.state else job.head_sha
        out_dir = ctx.job_dir / "out"
        log_path = ctx.job_dir / "run.log"
        ctx.job_dir.mkdir(parents=True, exist_ok=True)
        argv = self.command(job.repo, revision, out_dir)
        started = time.monotonic()
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                cwd=str(ctx.job_dir), preexec_fn=make_preexec(settings.memory_limit_mb), start_new_session=True,
            )
            stopped = ""
            while True:
                try:
                    returncode = process.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - started > settings.job_timeout_seconds:
                    stopped = f"timed out after {settings.job_timeout_seconds:.0f}s"
                elif ctx.cancelled.is_set():
                    stopped = "cancelled (lease lost or worker stopping)"
                if stopped:
                    _kill_group(process)
                    returncode = process.wait()
                    break
        log_text = scrub(log_path.read_text(errors="replace"), settings.secrets())
        log_path.write_text(log_text)  # the CLI never prints tokens; scrub anyway before anyone reads the log
        excerpt = tail(log_text)
        fields: dict[str, Any] = {"exit_code": returncode, "log_path": str(log_path)}
        if (out_dir / "report.md").is_file():
            fields["report_path"] = str(out_dir / "report.md")
        published = _publish_info(log_text)
        published_reason = published.pop("reason", "")
        fields.update(published)
        report = _read_json(out_dir / "report.json")
        if stopped.startswith("timed out"):
            return Outcome("failed", stopped, error=excerpt, **fields)
        if stopped:
            return Outcome("retry", stopped, error=excerpt, **fields)
        if returncode == 0:
            return Outcome("succeeded", published_reason or "all targets passed", **fields)
        if returncode == 2 and _PUBLISH_ERROR.search(log_text):  # token, permissions or the Hub: maybe transient
            return Outcome("retry", "publishing to the Hub failed (exit 2)", error=excerpt, **fields)
        if returncode == 2:
            return Outcome("failed", "bad recipe, model or usage (exit 2)", error=excerpt, **fields)
        if returncode == 1 and report is not None and report.get("status") == "failed":
            failed = [str(t.get("name")) for t in report.get("targets", []) if t.get("status") != "passed"]
            reason = f"target(s) failed: {', '.join(failed)}" + (f"; {published_reason}" if published_reason else "")
            return Outcome("failed", reason, error=excerpt, **fields)
        what = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        if returncode < 0 and settings.memory_limit_mb:
            what += f" (memory limit {settings.memory_limit_mb} MiB?)"
        return Outcome("retry", f"export run crashed ({what})", error=excerpt, **fields)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _publish_info(log_text: str) -> dict[str, Any]:
    """What `--push` did, from the lines the CLI prints: `publish: <operation> — <message>` then the URL."""
    operations = _PUBLISH_LINE.findall(log_text)
    if not operations:
        return {}
    operation, message = operations[-1]
    info: dict[str, Any] = {"operation": operation, "reason": f"publish: {operation}: {message.strip()}"}
    urls = _URL_LINE.findall(log_text)
    if urls:
        info["discussion_url" if operation == "discussion" else "pr_url"] = urls[-1]
    return info

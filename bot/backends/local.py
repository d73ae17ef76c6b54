"""The `local` backend: the same pipeline as the CLI, one subprocess per job.

```
python -m bot.reaper --parent WORKER_PID -- \
python -m bot.export_run run REPO --revision SHA --out JOB_DIR/attempt-N/out --push --quiet --max-upload-size SIZE
                                  [--publish-failed] [--publish-unverified]
                                  [--trust-remote-code (allowlisted repos only)]
python -m bot.export_run init REPO --revision SHA --push ...   # a repo without a recipe (`propose_recipes`)
```

`bot.export_run` is `hf-export` itself, with the bot's note (how to stop it for a repo) added to the texts it
publishes.

- The Hub token reaches the subprocess as `HF_TOKEN` in its environment, never in argv (argv is visible to every
  user of the machine in `ps`). No other secret does: the bot's own (webhook secret, GitHub token) are not in the
  worker's environment any more (`bot.secrecy`), and every variable whose name says token, secret, key or password
  is left out. The export's runtime proofs run with none at all (`exporters.validate.runtimes.child_environment`).
- Limits: a wall-clock timeout (`job_timeout_seconds`) and an address-space limit (`memory_limit_mb`, `RLIMIT_AS`
  set in `preexec_fn`).
- The whole process tree dies with the worker: the run is started under `bot.reaper`, a subreaper that gets
  `PR_SET_PDEATHSIG` (SIGTERM) from the worker and then kills every process the export forked (the target exports
  forked by `exporters.run.isolation`, anything that left the process group), so a worker killed with SIGKILL leaves no
  export writing or pushing behind the back of the job's next attempt. A timeout or a cancellation stops the run the
  same way (SIGTERM to the reaper; SIGKILL to its process group if it has not ended within
  `STOP_GRACE_SECONDS`).
- Every attempt has its own folder, `JOB_DIR/attempt-N/` (created atomically: never one an earlier attempt used),
  with the output folder `out/` and the log `run.log`: a new attempt never shares an output folder with a live or a
  dead one. The job records the log's excerpt, scrubbed of secrets.

What `--push` did is read from `OUT/publish.json` (`exporters.publish.PublishResult`: the operation, the PR or
discussion URL, the message, and whether a failure is retryable), and what stopped a run before any export from
`OUT/problem.json` (`exporters.publish.Problem`, for the worker to tell the repo), never from the lines the CLI prints.

| exit | `hf-export run`                                        | job                                                  |
|------|--------------------------------------------------------|------------------------------------------------------|
| 0    | every target passed and was published                  | succeeded (`superseded`: skipped, nothing published) |
| 1    | a target failed or is unverified (report posted)       | failed                                               |
| 2    | bad recipe, model or usage (`OUT/problem.json`)        | failed; the worker tells the repo the problem        |
| 3    | publishing failed                                      | retried when `publish.json` says `retryable` (the Hub or the network failed, a concurrent push), else failed (401, 403, 404, a PR over the size limit) |
| else | a signal, a crash                                      | retried                                              |
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

from exporters import fsutil
from exporters.publish import read_problem
from exporters.redact import scrub, secret_name, tail
from exporters.report.markdown import reason

from ..settings import BotSettings
from . import JobContext, Outcome

PR_SET_PDEATHSIG = 1
STOP_GRACE_SECONDS = 10.0  # how long the reaper may take to kill the run's tree before its group is SIGKILLed
# Environment variables the export subprocess must not see.
WITHHELD_ENV = ("WEBHOOK_SECRET", "GITHUB_TOKEN", "EXPORT_BOT_GITHUB_TOKEN", "GH_TOKEN")
EXIT_PUBLISH = 3


def _project_root() -> Path | None:
    spec = importlib.util.find_spec("exporters")
    return Path(spec.origin).resolve().parent.parent if spec and spec.origin else None


def make_preexec(memory_limit_mb: int, death_signal: int = signal.SIGTERM):
    """The child-side set-up: address-space limit and the signal it gets when the worker (thread) that started it
    dies (SIGTERM: `bot.reaper` then kills the run's whole tree). Everything is bound before the fork."""
    limit = memory_limit_mb * 1024 * 1024 if memory_limit_mb else None
    setrlimit, rlimit_as = resource.setrlimit, resource.RLIMIT_AS
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        prctl = None
    signum = int(death_signal)

    def preexec() -> None:
        if limit is not None:
            setrlimit(rlimit_as, (limit, limit))
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)

    return preexec


def attempt_dir(job_dir: Path, attempt: int) -> Path:
    """A new folder for this attempt, `job_dir/attempt-N` (`attempt-N.2`, ... when taken: a released attempt keeps
    its number). `mkdir` is atomic: two attempts never get the same folder."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = job_dir / (f"attempt-{attempt}" + (f".{n}" if n > 1 else ""))
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RuntimeError(f"{job_dir} holds 1000 folders for attempt {attempt}")


class LocalBackend:
    """Runs `hf-export run --push` in a subprocess per job.

    Example:
        >>> backend = LocalBackend(BotSettings(hf_token="hf_xxx"))
        >>> argv = backend.command("acme/tiny", "a" * 40, Path("/tmp/out"))
        >>> argv[1:5], "hf_xxx" in " ".join(argv)
        (['-m', 'bot.export_run', 'run', 'acme/tiny'], False)
    """

    name = "local"
    needs_hub_check = True
    proposes_recipes = True  # a repo without a recipe gets `hf-export init --push` (setting `propose_recipes`)

    def __init__(self, settings: BotSettings) -> None:
        self.settings = settings

    def command(self, repo: str, revision: str, out_dir: Path) -> list[str]:
        """argv of the export run (no secrets in it)."""
        argv = [self.settings.python or sys.executable, "-m", "bot.export_run", "run", repo, "--revision", revision,
                "--out", str(out_dir), "--push", "--quiet", "--max-upload-size", self.settings.max_upload_size]
        if self.settings.publish_failed:
            argv.append("--publish-failed")
        if not self.settings.benchmark:
            argv.append("--no-bench")
        if self.settings.publish_unverified:
            argv.append("--publish-unverified")
        if self.settings.trusts_remote_code(repo):
            argv.append("--trust-remote-code")
        return argv

    def init_command(self, repo: str, revision: str, out_dir: Path) -> list[str]:
        """argv of a recipe proposal (`hf-export init --push`) for a repo without a recipe; it stops itself before
        the job's timeout."""
        budget = max(self.settings.job_timeout_seconds * 0.9 - 60, 60)
        argv = [self.settings.python or sys.executable, "-m", "bot.export_run", "init", repo, "--revision", revision,
                "--out", str(out_dir / "export_config.json"), "--summary", str(out_dir / "report.md"),
                "--work-dir", str(out_dir / "work"), "--max-seconds", f"{budget:.0f}", "--push", "--quiet",
                "--no-hand-over"]  # the recipe goes to a PR for review: no `run` of it follows on this machine
        if self.settings.trusts_remote_code(repo):
            argv.append("--trust-remote-code")
        return argv

    def environment(self) -> dict[str, str]:
        """The subprocess environment: ours without any secret (a withheld name, or a name that says token, secret,
        key or password), plus the Hub token and endpoint."""
        env = {k: v for k, v in os.environ.items() if k not in WITHHELD_ENV and not secret_name(k)}
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
        attempt = attempt_dir(ctx.job_dir, job.attempts)  # never an earlier attempt's: its outcome files are not ours
        out_dir = attempt / "out"
        log_path = attempt / "run.log"
        proposing = ctx.state is not None and not ctx.state.has_recipe
        argv = (self.init_command if proposing else self.command)(job.repo, revision, out_dir)
        started = time.monotonic()
        with log_path.open("xb") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                [sys.executable, "-m", "bot.reaper", "--parent", str(os.getpid()), "--", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                cwd=str(attempt), preexec_fn=make_preexec(settings.memory_limit_mb), start_new_session=True,
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
                    returncode = _stop(process)
                    break
        log_text = scrub(log_path.read_text(errors="replace"), settings.secrets())
        fsutil.write_file(log_path, log_text)  # the CLI never prints tokens; scrub anyway before anyone reads the log
        fields: dict[str, Any] = {"exit_code": returncode, "log_path": str(log_path)}
        if (out_dir / "report.md").is_file():
            fields["report_path"] = str(out_dir / "report.md")
        published = _publish_info(out_dir / "publish.json") if not stopped else {}
        published_reason = published.pop("reason", "")
        retryable = published.pop("retryable", False)
        fields.update(published)
        report = _read_json(out_dir / "report.json")
        excerpt = scrub(job_error(report, log_text, attempt), settings.secrets())
        if stopped.startswith("timed out"):
            return Outcome("failed", stopped, error=excerpt, **fields)
        if stopped:
            return Outcome("retry", stopped, error=excerpt, **fields)
        if returncode == 0:
            done = "recipe proposed" if proposing else "all targets passed"
            return Outcome("succeeded", published_reason or done, **fields)
        if returncode == 1 and proposing:
            return Outcome("failed", "no format could be exported: no recipe proposed", error=excerpt, **fields)
        if returncode == EXIT_PUBLISH:
            what = f"publishing to the Hub failed: {published_reason or 'see the log'}"
            return Outcome("retry" if retryable else "failed", what, error=excerpt, **fields)
        if returncode == 2:
            problem = read_problem(out_dir)
            if problem is not None:
                return Outcome("failed", f"{problem.headline} (exit 2)", error=excerpt, problem=problem, **fields)
            return Outcome("failed", "bad recipe, model or usage (exit 2)", error=excerpt, **fields)
        if returncode == 1 and report is not None and report.get("status") in ("failed", "unverified"):
            failed = [f"{t.get('name')} ({t.get('status')})" for t in report.get("targets", [])
                      if t.get("status") != "passed"]
            reason = f"target(s) did not pass: {', '.join(failed)}" + (
                f"; {published_reason}" if published_reason else "")
            return Outcome("failed", reason, error=excerpt, **fields)
        what = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        if returncode < 0 and settings.memory_limit_mb:
            what += f" (memory limit {settings.memory_limit_mb} MiB?)"
        return Outcome("retry", f"export run crashed ({what})", error=excerpt, **fields)


_PROGRESS_BAR = re.compile(r"[^\r\n\]]*?\d+%\|[^|\n]*\|[^\]\n]*\]")  # tqdm's `Loading weights: 40%|██  | 8/20 [...]`


def job_error(report: dict[str, Any] | None, log_text: str, attempt: Path) -> str:
    """What the status page shows as a job's error: each target that did not pass with the line that says what to
    change (the report's); without one, the log's end with its progress bars left out and the job's folder written
    `<job>` (no server path).

    Example:
        >>> job_error({"targets": [{"name": "onnx", "status": "failed", "error": {"type": "ValueError",
        ...            "message": "bad `top_p`"}}]}, "", Path("/srv/jobs/1"))
        'onnx: ValueError: bad `top_p`'
        >>> job_error(None, "Fetching 8 files: 100%|██| 8/8 [00:00<00:00]Killed\\n", Path("/srv/jobs/1"))
        'Killed'
    """
    failed = [t for t in (report or {}).get("targets") or [] if isinstance(t, dict) and t.get("status") != "passed"]
    if failed:
        return "\n".join(f"{t.get('name')}: {reason(t)}" for t in failed)
    lines = [" ".join(_PROGRESS_BAR.sub("", line).split("\r")[-1:]).strip() for line in log_text.splitlines()]
    return tail("\n".join(line for line in lines if line)).replace(str(attempt), "<job>")


def _stop(process: subprocess.Popen) -> int:
    """Stop a run: SIGTERM to its reaper (which kills the whole tree, then itself), SIGKILL to the process group if
    it has not ended within `STOP_GRACE_SECONDS`. Its return code."""
    try:
        process.send_signal(signal.SIGTERM)
        return process.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    return process.wait()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _publish_info(path: Path) -> dict[str, Any]:
    """What `--push` did, from `OUT/publish.json` (the typed outcome the library writes)."""
    outcome = _read_json(path)
    if not outcome or not isinstance(outcome.get("operation"), str):
        return {}
    operation = outcome["operation"]
    info: dict[str, Any] = {"operation": operation, "retryable": bool(outcome.get("retryable")),
                            "reason": f"publish: {operation}: {str(outcome.get('message') or '').strip()}"[:1000]}
    for key in ("pr_url", "discussion_url"):
        if isinstance(outcome.get(key), str):
            info[key] = outcome[key]
    return info

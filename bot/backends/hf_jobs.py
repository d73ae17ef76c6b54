"""The `hf-jobs` backend: each job runs as a Hugging Face Job, on the machine its work needs, where the model lives.

The job runs the released image by digest (`hf_jobs_image`; `hf_jobs_cuda_image` for a recipe with a `cuda` target)
with the bot's own export run, the entrypoint the `local` backend runs:

```
python -m bot.export_run run REPO --revision SHA --recipe-sha256 HASH --out /tmp/export-bot/out --push --quiet
                         --max-upload-size SIZE --outcome-line [--publish-failed] [--no-bench] [--publish-unverified]
                         [--trust-remote-code (allowlisted repos only)]
```

through `huggingface_hub` (`HfApi.run_job`, `list_jobs`, `inspect_job`, `fetch_job_logs`, `cancel_job`). The Hub
token reaches the job as a job *secret* (`HF_TOKEN`), never in the command, the environment or the job's record.
The flavor comes from the work (`bot.backends.flavors.choose`): the run's memory estimate from the checkpoint's
safetensors headers, read from the Hub in byte ranges (`get_safetensors_metadata`: no weight is downloaded) and the
recipe's targets; a job no allowed flavor can run is skipped and the repo told what it would need.

Never two jobs for one bot job, whatever dies when:

```
record {launch_id, state: launching} ──save──► POST /api/jobs/{ns} (label export-bot-launch=launch_id)
   (durable, under the lease: no lease, no launch)   │ refused (4xx): state refused, may launch anew
                                                     │ no answer (network, the worker killed): stays launching
record {job_id, state: launched} ──save──► follow: inspect every hf_jobs_poll_seconds until a terminal stage
next attempt: job_id known ──► follow it
              launching    ──► list_jobs(labels={export-bot-launch: launch_id}) ──► follow the one found
                               none (after LAUNCH_LISTING_SETTLE_SECONDS): the request started no job ──► launch
```

While it follows, a newer push of the repo (the job is superseded) cancels the Hugging Face job (`cancel_job`); so
does the job running past its own timeout (`job_timeout_seconds`, from its start) plus `hf_jobs_timeout_margin_seconds`.
A worker that stops following (its lease lost, or shutting down) leaves the job running for the next attempt. The
job's log is fetched at every poll into the attempt's `run.log` (the status page serves it), scrubbed of secrets,
and its last line (`export-bot-outcome: {...}`, `bot.export_run`) says what `--push` did.

Private repos run only in their owner's namespace, and only for owners in `hf_jobs_private_namespaces` (the job, its
command with the repo id and commit, and its logs are then visible to that namespace, which can read the repo
anyway); other private repos are skipped.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import datetime, timezone
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, NotASafetensorsRepoError, SafetensorsParsingError

from exporters.capture.dtypes import default_dtype
from exporters.publish.problem import Problem
from exporters.redact import scrub

from ..settings import BotSettings
from . import JobContext, Outcome
from .flavors import Choice, Work, choose
from .local import attempt_dir, job_error

LAUNCHING, LAUNCHED, REFUSED, ENDED = "launching", "launched", "refused", "ended"
LAUNCH_LABEL = "export-bot-launch"
LAUNCH_LISTING_SETTLE_SECONDS = 10.0  # how long after a launch whose answer was lost the Hub may take to list the job
TERMINAL_STAGES = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
OUT_DIR = "/tmp/export-bot/out"
OUTCOME_MARKER = "export-bot-outcome: "  # bot.export_run's, not imported: that module loads the whole CLI


def size_work(repo: str, revision: str, specs: list[tuple[str, str | None, str]], *, token: str | None,
              endpoint: str | None) -> Work:
    """What exporting `specs` (format, dtype, device per target) of `repo` at `revision` needs, from the checkpoint's
    safetensors headers on the Hub (`exporters.run.memory_plan.estimate`, one export at a time)."""
    # deferred: exporters.run imports torch, which the bot's processes never load otherwise
    from exporters.run.memory_plan import counts_from_headers, estimate

    cuda = any(device == "cuda" for _, _, device in specs)
    try:
        metadata = HfApi(endpoint=endpoint, token=token).get_safetensors_metadata(repo, revision=revision)
    except (NotASafetensorsRepoError, SafetensorsParsingError):
        return Work(None, None, cuda, "no safetensors checkpoint to size")
    headers = [{name: {"dtype": t.dtype, "shape": list(t.shape)} for name, t in file.tensors.items()}
               for file in metadata.files_metadata.values()]
    counts = counts_from_headers(headers)
    if counts is None or not specs:
        return Work(None, None, cuda, "no safetensors checkpoint to size")
    checkpoint = counts.stored_dtype
    targets = [(fmt, dtype or default_dtype(fmt, checkpoint)) for fmt, dtype, _ in specs]
    memory = estimate(counts, targets, checkpoint, 1)
    disk = counts.bytes_in(None) + sum(counts.bytes_in(dtype or checkpoint) for _, dtype in targets)
    return Work(memory, disk, cuda, f"{counts.bytes_in(None) / 1e9:.2f} GB of {checkpoint or 'unknown-dtype'} "
                                    f"weights, {len(targets)} target(s), one export at a time")


class HfJobsBackend:
    """Runs each export as a Hugging Face Job.

    Example:
        >>> image = "ghcr.io/hf/export-action@sha256:" + "0" * 64
        >>> backend = HfJobsBackend(BotSettings(hf_token="hf_xxx", hf_jobs_image=image))
        >>> argv = backend.command("acme/tiny", "a" * 40, "f" * 64)
        >>> argv[:4], "hf_xxx" in " ".join(argv)
        (['python', '-m', 'bot.export_run', 'run'], False)
    """

    name = "hf-jobs"
    needs_hub_check = True

    def __init__(self, settings: BotSettings) -> None:
        if not settings.hf_jobs_image:
            raise ValueError("the hf-jobs backend needs hf_jobs_image (EXPORT_BOT_HF_JOBS_IMAGE): the released "
                             "image by digest, e.g. 'ghcr.io/hf/export-action@sha256:...'")
        if settings.hf_token is None:
            raise ValueError("the hf-jobs backend needs hf_token (HF_TOKEN): the job pushes with it")
        self.settings = settings

    # ------------------------------------------------------------------------------------------ what is sent
    def command(self, repo: str, revision: str, recipe_sha256: str) -> list[str]:
        """The job's command (no secret in it)."""
        settings = self.settings
        argv = ["python", "-m", "bot.export_run", "run", repo, "--revision", revision, "--recipe-sha256",
                recipe_sha256, "--out", OUT_DIR, "--push", "--quiet", "--max-upload-size", settings.max_upload_size,
                "--outcome-line"]
        argv += ["--publish-failed"] if settings.publish_failed else []
        argv += [] if settings.benchmark else ["--no-bench"]
        argv += ["--publish-unverified"] if settings.publish_unverified else []
        argv += ["--trust-remote-code"] if settings.trusts_remote_code(repo) else []
        return argv

    def environment(self) -> dict[str, str]:
        """The job's plain environment: no secret (the token is a job secret)."""
        env = {"PYTHONUNBUFFERED": "1", "COLUMNS": "1000", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        if self.settings.hf_endpoint:
            env["HF_ENDPOINT"] = self.settings.hf_endpoint
        return env

    def _token(self) -> str:
        assert self.settings.hf_token is not None
        return self.settings.hf_token.get_secret_value()

    def _api(self) -> HfApi:
        return HfApi(endpoint=self.settings.hf_endpoint, token=self._token())

    def _namespace(self, ctx: JobContext) -> tuple[str | None, str]:
        """Where the job runs, or None and why it may not run at all."""
        owner = ctx.job.repo.split("/", 1)[0]
        if ctx.state is None or ctx.state.private is not False:
            if owner in self.settings.hf_jobs_private_namespaces:
                return owner, ""
            return None, ("private repo: not run on Hugging Face Jobs (its name, commit and logs would be visible to "
                          "the namespace running the job); the operator can run its owner's private repos in the "
                          "owner's own namespace with the `hf_jobs_private_namespaces` setting")
        return self.settings.hf_jobs_namespace or self._api().whoami()["name"], ""

    # ------------------------------------------------------------------------------------------ the run
    def run(self, ctx: JobContext) -> Outcome:
        record: dict[str, Any] = dict(ctx.job.dispatch or {})
        try:
            if record.get("job_id") and record.get("state") == LAUNCHED:  # never launch twice: follow that one
                return self.follow(ctx, record)
            if record.get("launch_id") and record.get("state") == LAUNCHING:
                found = self._find_lost_job(ctx, record)
                if found is not None:
                    return found
            return self._launch(ctx, record)
        except HfHubHTTPError as err:
            return self._refused("the Hub's Jobs API refused", err, record)
        except OSError as err:
            return Outcome("retry", "could not reach the Hub's Jobs API",
                           error=scrub(str(err), self.settings.secrets()), dispatch=record or None)

    def _choice(self, ctx: JobContext) -> tuple[Choice, Work]:
        state = ctx.state
        revision = state.head_sha if state else ctx.job.head_sha
        work = size_work(ctx.job.repo, revision, state.target_specs if state else [], token=self._token(),
                         endpoint=self.settings.hf_endpoint)
        settings = self.settings
        return choose(work, settings.hf_jobs_flavors, settings.hf_jobs_max_flavor,
                      settings.hf_jobs_max_usd_per_hour), work

    def _launch(self, ctx: JobContext, previous: dict[str, Any]) -> Outcome:
        settings, job = self.settings, ctx.job
        namespace, refusal = self._namespace(ctx)
        if namespace is None:
            return Outcome("skipped", refusal)
        if ctx.state is None or not ctx.state.recipe_sha256:
            return Outcome("skipped", "no valid recipe to export (the hf-jobs backend does not propose recipes)")
        choice, work = self._choice(ctx)
        if choice.flavor is None:
            problem = Problem("resources", f"This export cannot run on the machines the bot may use: {choice.reason}.")
            return Outcome("skipped", f"no allowed Jobs flavor: {choice.reason}", problem=problem)
        image = settings.hf_jobs_cuda_image if work.cuda else settings.hf_jobs_image
        if not image:
            return Outcome("skipped", "a target runs on CUDA and no CUDA image is set (`hf_jobs_cuda_image`)")
        revision = ctx.state.head_sha
        launch_id = f"job-{job.id}-{secrets.token_hex(6)}"
        timeout = int(settings.job_timeout_seconds)
        record: dict[str, Any] = {
            "backend": self.name, "launch_id": launch_id, "state": LAUNCHING, "requested_at": time.time(),
            "namespace": namespace, "image": image, "flavor": choice.flavor.name, "flavor_reason": choice.reason,
            "worst_cost_usd": round(choice.worst_cost_usd(timeout + settings.hf_jobs_timeout_margin_seconds), 2),
            "command": self.command(job.repo, revision, ctx.state.recipe_sha256), "env": self.environment(),
            "secrets": ["HF_TOKEN"], "timeout": timeout}
        if previous.get("launch_id"):
            record["replaces"] = previous.get("job_id") or previous["launch_id"]
        if not ctx.save(dispatch=record):  # durable before it is sent, or not sent at all
            return Outcome("retry", "lease lost before launching: nothing launched")
        try:
            info = self._api().run_job(
                image=image, command=record["command"], env=record["env"], secrets={"HF_TOKEN": self._token()},
                flavor=choice.flavor.name, timeout=timeout, namespace=namespace, name=f"export-bot-job-{job.id}",
                labels={LAUNCH_LABEL: launch_id, "export-bot-job": str(job.id)})
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else 500
            if status < 500:  # refused: nothing started. A 5xx may have started one: the next attempt looks first
                record["state"] = REFUSED
                ctx.save(dispatch=record)
            return self._refused("the job was refused", err, record)
        except OSError as err:
            return Outcome("retry", "could not reach the Hub (the launch may have started a job: the next attempt "
                                    "looks for it first)", error=scrub(str(err), settings.secrets()), dispatch=record)
        record.update(job_id=info.id, run_url=info.url, state=LAUNCHED, stage=str(info.status.stage))
        ctx.save(dispatch=record)  # lost lease: the next attempt finds the job by its launch label
        return self.follow(ctx, record)

    def _find_lost_job(self, ctx: JobContext, record: dict[str, Any]) -> Outcome | None:
        """An earlier attempt sent the launch and never stored the answer: follow the job it started (found by its
        launch label), or None when the Hub lists none (the request never started one: launch anew)."""
        api = self._api()
        found, stopped = ctx.find_started(
            lambda: next(iter(api.list_jobs(labels={LAUNCH_LABEL: record["launch_id"]}, namespace=record["namespace"])),
                         None),
            float(record.get("requested_at") or 0), LAUNCH_LISTING_SETTLE_SECONDS, 1.0)
        if stopped:
            return Outcome("retry", f"stopped looking for the job of launch {record['launch_id']}", dispatch=record)
        if found is None:
            return None
        record.update(job_id=found.id, run_url=found.url, state=LAUNCHED,
                      found=f"job {found.id} of launch {record['launch_id']} found by its label")
        ctx.save(dispatch=record)
        return self.follow(ctx, record)

    def follow(self, ctx: JobContext, record: dict[str, Any]) -> Outcome:
        """Inspect the job until it ends; cancel it when superseded or overdue."""
        settings, job_id, namespace = self.settings, record["job_id"], record["namespace"]
        api, log_path = self._api(), attempt_dir(ctx.job_dir, ctx.job.attempts) / "run.log"
        ctx.save(log_path=str(log_path))
        allowed = float(record.get("timeout") or settings.job_timeout_seconds) + settings.hf_jobs_timeout_margin_seconds
        while True:
            newer = ctx.superseded()
            if newer:
                self._cancel(api, record)
                self._fetch_log(api, record, log_path)
                record["state"] = ENDED
                return Outcome("succeeded", f"{newer}: Hugging Face job {job_id} cancelled", operation="superseded",
                               dispatch=record, log_path=str(log_path))
            try:
                info = api.inspect_job(job_id=job_id, namespace=namespace)
            except HfHubHTTPError as err:
                if err.response is not None and err.response.status_code == 404:
                    record["state"] = ENDED
                    return self._refused(f"Hugging Face job {job_id} is gone", err, record)
                info = None  # transient: ask again at the next poll
            except OSError:
                info = None
            log_text = self._fetch_log(api, record, log_path)
            if info is not None:
                record["stage"] = stage = str(info.status.stage)
                if stage in TERMINAL_STAGES:
                    record["state"] = ENDED
                    return self._ended(ctx, record, stage, info.status.message, log_text, str(log_path))
                began = info.started_at or info.created_at
                if began is not None and (datetime.now(timezone.utc) - began).total_seconds() > allowed:
                    self._cancel(api, record)
                    record["state"] = ENDED
                    return Outcome("failed", f"Hugging Face job {job_id} did not end within {allowed:.0f}s (its "
                                             f"timeout and the margin): cancelled", operation="dispatched",
                                   dispatch=record, log_path=str(log_path))
            if ctx.cancelled.wait(settings.hf_jobs_poll_seconds):  # the job goes on: the next attempt follows it
                return Outcome("retry", f"stopped following Hugging Face job {job_id}", dispatch=record)

    def _fetch_log(self, api: HfApi, record: dict[str, Any], log_path) -> str:
        """The job's log so far, scrubbed of secrets, written to `log_path` (what the status page serves)."""
        try:
            lines = list(api.fetch_job_logs(job_id=record["job_id"], namespace=record["namespace"], follow=False))
        except Exception:  # noqa: BLE001 - a log that cannot be read now is read at the next poll
            return log_path.read_text(errors="replace") if log_path.exists() else ""
        text = scrub("\n".join(lines) + ("\n" if lines else ""), self.settings.secrets())
        log_path.write_text(text, encoding="utf-8")
        return text

    def _cancel(self, api: HfApi, record: dict[str, Any]) -> None:
        try:
            api.cancel_job(job_id=record["job_id"], namespace=record["namespace"])
            record["cancelled"] = True
        except Exception as err:  # noqa: BLE001 - said on the job; the Hub's own timeout still ends the job
            record["cancel_error"] = scrub(f"{type(err).__name__}: {err}", self.settings.secrets())[:500]

    def abandon(self, record: dict[str, Any] | None, why: str) -> str:
        """Cancel the Hugging Face job an earlier attempt launched (its bot job ended without following it: a newer
        push superseded it). What was done, for the job's reason ('' when there was no job to cancel)."""
        if not record or record.get("backend") != self.name or record.get("state") != LAUNCHED:
            return ""
        self._cancel(self._api(), record)
        return f"; Hugging Face job {record['job_id']} " + ("cancelled" if record.get("cancelled") else
                                                            f"could not be cancelled ({record.get('cancel_error')})")

    def _ended(self, ctx: JobContext, record: dict[str, Any], stage: str, message: str | None, log_text: str,
               log_path: str) -> Outcome:
        """The job's outcome from its stage and its log's outcome line."""
        outcome = _outcome_line(log_text)
        publish = outcome.get("publish") if isinstance(outcome.get("publish"), dict) else {}
        what = f"Hugging Face job {record['job_id']} ended {stage}"
        published = f"publish: {publish.get('operation')}: {str(publish.get('message') or '').strip()}"[:1000]
        fields: dict[str, Any] = {"dispatch": record, "log_path": log_path, "operation": publish.get("operation")}
        for key in ("pr_url", "discussion_url"):
            if isinstance(publish.get(key), str):
                fields[key] = publish[key]
        failed = {"targets": outcome.get("failed") or []}
        excerpt = scrub(job_error(failed, log_text, ctx.job_dir), self.settings.secrets())
        if stage == "COMPLETED":
            return Outcome("succeeded", published if publish else "all targets passed", **fields)
        if stage in ("CANCELED", "DELETED"):
            return Outcome("failed", f"{what} (not by the bot): not exported", error=excerpt, **fields)
        if outcome.get("stopped"):
            return Outcome("failed", f"{what}: {outcome['stopped']}", error=excerpt, **fields)
        if isinstance(outcome.get("problem"), dict):
            try:
                problem = Problem.from_dict(outcome["problem"])
            except ValueError:
                problem = None
            if problem is not None:
                return Outcome("failed", f"{problem.headline} ({what})", error=excerpt, problem=problem, **fields)
        if publish and publish.get("operation") == "failed":
            return Outcome("retry" if publish.get("retryable") else "failed",
                           f"publishing to the Hub failed: {published}", error=excerpt, **fields)
        if outcome.get("failed"):
            names = ", ".join(f"{t.get('name')} ({t.get('status')})" for t in outcome["failed"])
            return Outcome("failed", f"target(s) did not pass: {names}" + (f"; {published}" if publish else ""),
                           error=excerpt, **fields)
        # no outcome line: the run crashed (out of memory, a signal): a new job may pass
        return Outcome("retry", f"{what} without an outcome ({message or 'no message'})", error=excerpt, **fields)

    def _refused(self, what: str, err: Any, record: dict[str, Any]) -> Outcome:
        status = err.response.status_code if getattr(err, "response", None) is not None else 0
        error = scrub(f"the Hub answered {status}: {err}", self.settings.secrets())[:2000]
        transient = status >= 500 or status == 429 or status == 0
        return Outcome("retry" if transient else "failed", what, error=error, dispatch=record or None)


def _outcome_line(log_text: str) -> dict[str, Any]:
    """The last `export-bot-outcome: {...}` line of the log ({} when none reads)."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(OUTCOME_MARKER):
            try:
                value = json.loads(line[len(OUTCOME_MARKER):])
            except ValueError:
                continue
            return value if isinstance(value, dict) else {}
    return {}

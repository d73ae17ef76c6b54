"""The `github` backend: dispatch the export workflow on GitHub's runners instead of exporting here.

`POST /repos/{github_repo}/actions/workflows/{github_workflow}/dispatches` with `ref = github_ref` and inputs
`{model, revision, targets, dispatch_id}` (strings, as `workflow_dispatch` requires), through PyGithub, asking GitHub
for the run it starts (`return_run_details`). The workflow runs the Action, which opens/updates the Hub PR itself.

Never twice for one job, whatever dies when:

```
record {dispatch_id, state: dispatching} ──save──► POST dispatches ──► record {run_id, state: dispatched} ──save──► follow
   (durable, under the lease: no lease, no dispatch)      │ refused (GitHub answered): state refused, may dispatch anew
                                                          │ no answer (network, or the worker was killed): stays dispatching
next attempt: run_id known ──► follow it
              dispatching  ──► find the run whose name carries dispatch_id (the workflow's `run-name` shows it) ──► follow
                               none (after RUN_LISTING_SETTLE_SECONDS): the request never started a run ──► dispatch anew
```

A dispatched job is not an exported one: the backend follows the run (`GET /repos/{repo}/actions/runs/{id}` every
`github_poll_seconds`) and records its conclusion on the job; the job succeeds only when the run concludes
`success` (so only then does it count as "already exported"), and fails otherwise.

Private Hub repos are skipped unless the operator opts in (`github_private_repos`), and then only go to a private
`github_repo`: the inputs (repo name, commit), the run's logs and summary, and the weights on the runner are
GitHub's to keep.

Example workflow trigger (see `examples/workflows/bot-dispatch.yml` and `docs/bot.md`):

```yaml
run-name: Export ${{ inputs.dispatch_id }}   # how a retry finds the run; shows no repo name
on:
  workflow_dispatch:
    inputs:
      model: {required: true}
      revision: {required: true}
      targets: {required: false, default: ""}
      dispatch_id: {required: false, default: ""}
```
"""

from __future__ import annotations

import itertools
import secrets
import time
from datetime import datetime, timezone
from typing import Any

from exporters.redact import scrub

from ..settings import BotSettings
from . import JobContext, Outcome

DISPATCHING, DISPATCHED, REFUSED = "dispatching", "dispatched", "refused"
# How long after a dispatch whose answer was lost GitHub may take to list its run; a retry looks again until then.
RUN_LISTING_SETTLE_SECONDS = 15.0
RUNS_SCANNED = 300  # the newest runs of the workflow looked through for a dispatch id


class GitHubBackend:
    """Sends a `workflow_dispatch` per job.

    Example:
        >>> backend = GitHubBackend(BotSettings(github_repo="acme/exports", github_token="ghs_x"))
        >>> backend.inputs("acme/tiny", "a" * 40, "job-1-0a1b2c")["model"]
        'acme/tiny'
    """

    name = "github"
    needs_hub_check = True

    def __init__(self, settings: BotSettings) -> None:
        if not settings.github_repo:
            raise ValueError("the github backend needs github_repo (EXPORT_BOT_GITHUB_REPO), e.g. 'acme/exports'")
        if settings.github_token is None:
            raise ValueError("the github backend needs github_token (EXPORT_BOT_GITHUB_TOKEN or GITHUB_TOKEN)")
        self.settings = settings

    def inputs(self, repo: str, revision: str, dispatch_id: str = "") -> dict[str, str]:
        """The workflow inputs for one job."""
        return {"model": repo, "revision": revision, "targets": self.settings.github_targets,
                "dispatch_id": dispatch_id}

    def _client(self):
        from github import Auth, Github

        assert self.settings.github_token is not None
        return Github(base_url=self.settings.github_api_url.rstrip("/"),
                      auth=Auth.Token(self.settings.github_token.get_secret_value()),
                      seconds_between_requests=0, seconds_between_writes=0, retry=None, timeout=30)

    def _workflow(self):
        return self._client().get_repo(self.settings.github_repo).get_workflow(self.settings.github_workflow)

    def run(self, ctx: JobContext) -> Outcome:
        from github import GithubException

        record: dict[str, Any] = dict(ctx.job.dispatch or {})
        try:
            refusal = self._private_refusal(ctx)
            if refusal:
                return Outcome("skipped", refusal)
            if record.get("run_id"):  # dispatched by an earlier attempt: follow that run, never dispatch twice
                return self.follow(ctx, record)
            if record.get("dispatch_id") and record.get("state") == DISPATCHING:
                found = self._find_lost_run(ctx, record)
                if found is not None:
                    return found
        except GithubException as err:
            return self._refused("could not ask GitHub", err, record)
        except OSError as err:
            return Outcome("retry", "could not reach GitHub", error=scrub(str(err), self.settings.secrets()),
                           dispatch=record or None)
        return self._dispatch(ctx, previous=record)

    def _private_refusal(self, ctx: JobContext) -> str:
        """Why this job's repo is not sent to GitHub ('' when it may be): private (or not known to be public)
        without `github_private_repos`, or with it but to a public `github_repo`."""
        if ctx.state is not None and ctx.state.private is False:
            return ""
        if not self.settings.github_private_repos:
            return ("private repo: not sent to the GitHub backend (its name, commit and weights would go to GitHub's "
                    "runners); the operator can allow it with the `github_private_repos` setting")
        if not self._client().get_repo(self.settings.github_repo).private:
            return (f"private repo: not sent to {self.settings.github_repo}, which is public (anyone could read the "
                    "run's inputs, logs and summary there); use a private github_repo")
        return ""

    def _find_lost_run(self, ctx: JobContext, record: dict[str, Any]) -> Outcome | None:
        """An earlier attempt sent the dispatch and never stored the answer: follow the run it started (found by
        its dispatch id), or None when GitHub lists none (the request never started a run: dispatch anew)."""
        run, stopped = ctx.find_started(lambda: self._find_run(record), float(record.get("requested_at") or 0),
                                        RUN_LISTING_SETTLE_SECONDS, self.settings.github_poll_seconds * 3 + 1)
        if stopped:
            return Outcome("retry", f"stopped looking for the run of dispatch {record['dispatch_id']}",
                           dispatch=record)
        if run is None:
            return None
        record.update(run_id=run.id, run_url=run.html_url, state=DISPATCHED,
                      found=f"run {run.id} of dispatch {record['dispatch_id']} found by its name")
        ctx.save(dispatch=record)
        return self.follow(ctx, record)

    def _find_run(self, record: dict[str, Any]):
        """The workflow run whose name (`display_title`, the workflow's `run-name`) carries the dispatch id."""
        since = datetime.fromtimestamp(float(record.get("requested_at") or 0) - 600, tz=timezone.utc)
        runs = self._workflow().get_runs(event="workflow_dispatch", created=f">={since:%Y-%m-%dT%H:%M:%SZ}")
        for run in itertools.islice(runs, RUNS_SCANNED):
            if record["dispatch_id"] in (run.display_title or "").split():
                return run
        return None

    def _dispatch(self, ctx: JobContext, previous: dict[str, Any]) -> Outcome:
        from github import GithubException

        settings = self.settings
        revision = ctx.state.head_sha if ctx.state else ctx.job.head_sha
        dispatch_id = f"job-{ctx.job.id}-{secrets.token_hex(6)}"
        inputs = self.inputs(ctx.job.repo, revision, dispatch_id)
        record: dict[str, Any] = {"repo": settings.github_repo, "workflow": settings.github_workflow,
                                  "ref": settings.github_ref, "inputs": inputs, "dispatch_id": dispatch_id,
                                  "state": DISPATCHING, "requested_at": time.time()}
        if previous.get("dispatch_id"):
            record["replaces"] = previous["dispatch_id"]  # refused, or never started a run
        if not ctx.save(dispatch=record):  # durable before it is sent, or not sent at all
            return Outcome("retry", "lease lost before dispatching: nothing dispatched")
        try:
            result = self._workflow().create_dispatch(settings.github_ref, inputs, throw=True,
                                                      return_run_details=True)
        except GithubException as err:
            if err.status < 500:  # GitHub refused it: no run was started. A 5xx may have started one: look first
                record["state"] = REFUSED
                ctx.save(dispatch=record)
            return self._refused("workflow dispatch refused", err, record)
        except OSError as err:  # no answer: the next attempt looks for the run before dispatching again
            return Outcome("retry", "could not reach GitHub (the dispatch may have started a run: the next attempt "
                                    "looks for it first)", error=scrub(str(err), settings.secrets()), dispatch=record)
        if result is True or not getattr(result, "id", None):
            return Outcome("failed", "dispatched, but GitHub returned no run to follow: not counted as exported",
                           operation="dispatched", dispatch=record)
        record.update(run_id=result.id, run_url=result.html_url, state=DISPATCHED)
        ctx.save(dispatch=record)  # lost lease: the next attempt finds the run by its dispatch id
        return self.follow(ctx, record)

    def follow(self, ctx: JobContext, record: dict[str, Any]) -> Outcome:
        """Poll the run until it concludes: `succeeded` only on `success`."""
        from github import GithubException

        settings = self.settings
        deadline = time.monotonic() + settings.job_timeout_seconds
        while True:
            try:
                run = self._client().get_repo(settings.github_repo).get_workflow_run(int(record["run_id"]))
                status, conclusion = run.status, run.conclusion
            except GithubException as err:
                if err.status == 404:
                    return self._refused(f"workflow run {record['run_id']} is gone", err, record)
                status, conclusion = "unknown", None  # transient: ask again at the next poll
            except OSError:
                status, conclusion = "unknown", None
            record["status"] = status
            if status == "completed":
                record["conclusion"] = conclusion
                what = f"workflow run {record['run_id']} concluded {conclusion}"
                if conclusion == "success":
                    return Outcome("succeeded", what, operation="dispatched", dispatch=record)
                return Outcome("failed", f"{what}: not exported (see the run)", operation="dispatched",
                               dispatch=record)
            if time.monotonic() > deadline:
                return Outcome("failed", f"workflow run {record['run_id']} did not conclude within "
                                         f"{settings.job_timeout_seconds:.0f}s (last status {status})",
                               operation="dispatched", dispatch=record)
            if ctx.cancelled.wait(settings.github_poll_seconds):
                return Outcome("retry", f"stopped following workflow run {record['run_id']}", dispatch=record)

    def _refused(self, what: str, err: Any, record: dict[str, Any]) -> Outcome:
        message = err.data.get("message") if isinstance(err.data, dict) else str(err.data)
        error = scrub(f"GitHub answered {err.status}: {message}", self.settings.secrets())
        # 4xx (bad workflow, ref or inputs; no permission) will not fix itself; 5xx and rate limits might
        transient = err.status >= 500 or err.status == 429 or (err.status == 403 and "rate limit" in str(message))
        return Outcome("retry" if transient else "failed", what, error=error, dispatch=record)

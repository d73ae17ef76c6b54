"""The `github` backend: dispatch the export workflow on GitHub's runners instead of exporting here.

`POST /repos/{github_repo}/actions/workflows/{github_workflow}/dispatches` with `ref = github_ref` and inputs
`{model, revision, targets}` (strings, as `workflow_dispatch` requires), through PyGithub, asking GitHub for the run
it starts (`return_run_details`). The workflow runs the Action, which opens/updates the Hub PR itself.

A dispatched job is not an exported one: the backend follows the run (`GET /repos/{repo}/actions/runs/{id}` every
`github_poll_seconds`) and records its conclusion on the job; the job succeeds only when the run concludes
`success` (so only then does it count as "already exported"), and fails otherwise. A job given back while following
(worker stopping, lease lost) resumes following the same run on its next attempt instead of dispatching again.

Example workflow trigger (see `examples/` and `docs/bot.md`):

```yaml
on:
  workflow_dispatch:
    inputs:
      model: {required: true}
      revision: {required: true}
      targets: {required: false, default: ""}
```
"""

from __future__ import annotations

import time
from typing import Any

from exporters.redact import scrub

from ..settings import BotSettings
from . import JobContext, Outcome


class GitHubBackend:
    """Sends a `workflow_dispatch` per job.

    Example:
        >>> backend = GitHubBackend(BotSettings(github_repo="acme/exports", github_token="ghs_x"))
        >>> backend.inputs("acme/tiny", "a" * 40)["model"]
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

    def inputs(self, repo: str, revision: str) -> dict[str, str]:
        """The workflow inputs for one job."""
        return {"model": repo, "revision": revision, "targets": self.settings.github_targets}

    def _client(self):
        from github import Auth, Github

        assert self.settings.github_token is not None
        return Github(base_url=self.settings.github_api_url.rstrip("/"),
                      auth=Auth.Token(self.settings.github_token.get_secret_value()),
                      seconds_between_requests=0, seconds_between_writes=0, retry=None, timeout=30)

    def run(self, ctx: JobContext) -> Outcome:
        from github import GithubException

        settings = self.settings
        previous = ctx.job.dispatch or {}
        if previous.get("run_id"):  # dispatched by an earlier attempt: follow that run, never dispatch twice
            return self.follow(ctx, dict(previous))
        revision = ctx.state.head_sha if ctx.state else ctx.job.head_sha
        inputs = self.inputs(ctx.job.repo, revision)
        record: dict[str, Any] = {"repo": settings.github_repo, "workflow": settings.github_workflow,
                                  "ref": settings.github_ref, "inputs": inputs}
        try:
            workflow = self._client().get_repo(settings.github_repo).get_workflow(settings.github_workflow)
            result = workflow.create_dispatch(settings.github_ref, inputs, throw=True, return_run_details=True)
        except GithubException as err:
            return self._refused("workflow dispatch refused", err, record)
        except OSError as err:
            return Outcome("retry", "could not reach GitHub", error=scrub(str(err), settings.secrets()),
                           dispatch=record)
        if result is True or not getattr(result, "id", None):
            return Outcome("failed", "dispatched, but GitHub returned no run to follow: not counted as exported",
                           operation="dispatched", dispatch=record)
        record["run_id"], record["run_url"] = result.id, result.html_url
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

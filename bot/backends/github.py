"""The `github` backend: dispatch the export workflow on GitHub's runners instead of exporting here.

`POST /repos/{github_repo}/actions/workflows/{github_workflow}/dispatches` with `ref = github_ref` and inputs
`{model, revision, targets}` (strings, as `workflow_dispatch` requires), through PyGithub. The workflow runs the
Action, which opens/updates the Hub PR itself; the bot records what it dispatched (and the run URL when GitHub
returns it) and marks the job succeeded once GitHub accepted the dispatch.

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
        revision = ctx.state.head_sha if ctx.state else ctx.job.head_sha
        inputs = self.inputs(ctx.job.repo, revision)
        record: dict[str, Any] = {"repo": settings.github_repo, "workflow": settings.github_workflow,
                                  "ref": settings.github_ref, "inputs": inputs}
        try:
            workflow = self._client().get_repo(settings.github_repo).get_workflow(settings.github_workflow)
            result = workflow.create_dispatch(settings.github_ref, inputs, throw=True, return_run_details=True)
        except GithubException as err:
            message = err.data.get("message") if isinstance(err.data, dict) else str(err.data)
            error = scrub(f"GitHub answered {err.status}: {message}", settings.secrets())
            # 4xx (bad workflow, ref or inputs; no permission) will not fix itself; 5xx and rate limits might
            transient = err.status >= 500 or err.status == 429 or (err.status == 403 and "rate limit" in str(message))
            return Outcome("retry" if transient else "failed", "workflow dispatch refused", error=error,
                           dispatch=record)
        except OSError as err:
            return Outcome("retry", "could not reach GitHub", error=scrub(str(err), settings.secrets()),
                           dispatch=record)
        if result is not True and getattr(result, "html_url", None):
            record["run_id"], record["run_url"] = result.id, result.html_url
        return Outcome("succeeded", f"dispatched {settings.github_workflow} on {settings.github_repo}@"
                       f"{settings.github_ref}", operation="dispatched", dispatch=record)

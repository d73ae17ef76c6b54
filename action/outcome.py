"""What an Action run ends with, shared by every mode: exit codes, the sticky PR comment, a failure told in
annotations and the summary, paths relative to the workspace, and the library's errors worded in the Action's
inputs.

Example:
    >>> EXIT_OK, EXIT_FAILED, EXIT_USAGE
    (0, 1, 2)
    >>> NoPublish().operation
    'none'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from action.commands import emit, error, set_outputs, warning, write_summary
from action.github import GitHubClient
from action.settings import Settings
from action.summary import comment_marker, error_markdown, problem_markdown
from exporters.errors import ExportActionError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# How the Action spells the library's options in messages: its inputs.
OPTION_NAMES = {"trust_remote_code": "the input `trust-remote-code: true`", "target": "the input `targets`",
                "config": "the input `config`", "token": "the input `hf-token`", "revision": "the input `revision`",
                "repo_id": "the input `model` (an org/name Hub repo id)", "device": "the input `device`",
                "max_upload_size": "the input `max-upload-size`",
                "publish_unverified": "the input `publish-unverified: true`", "jobs": "the input `jobs`"}


@dataclass
class NoPublish:
    """Stands in for `exporters.publish.PublishResult` when nothing was sent to the Hub."""

    operation: str = "none"
    message: str = ""
    pr_url: str | None = None
    pr_num: int | None = None
    discussion_url: str | None = None
    commit: str | None = None
    failed: bool = False


def relative(settings: Settings, path: Path | str | None) -> str | None:
    """`path` relative to the workspace (what later steps and annotations understand), None when outside it."""
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(settings.github.workspace.resolve()).as_posix()
    except ValueError:
        return None


def comment(settings: Settings, body: str) -> str | None:
    """Create or edit the sticky comment on the pull request this run is for; its URL, or None."""
    github = settings.github
    if not settings.comment or github.pr_number is None:
        return None
    if not settings.github_token:
        warning("no github-token: the PR comment is skipped (the default is ${{ github.token }})",
                title="PR comment skipped")
        return None
    if not github.repository:
        warning("GITHUB_REPOSITORY is not set: the PR comment is skipped", title="PR comment skipped")
        return None
    from github import GithubException

    try:
        client = GitHubClient(settings.github_token, api_url=github.api_url)
        sticky = client.upsert_comment(github.repository, github.pr_number, comment_marker(settings.model), body)
    except GithubException as err:
        reason = (err.data or {}).get("message") if isinstance(err.data, dict) else None
        warning(f"could not write the PR comment ({err.status} {reason or ''}): give the workflow "
                "'permissions: pull-requests: write' (pull requests from forks get a read-only token)",
                title="PR comment failed")
        return None
    except Exception as err:  # the comment is a courtesy: never fail the export over it
        warning(f"could not write the PR comment: {type(err).__name__}: {err}", title="PR comment failed")
        return None
    emit(f"PR comment {sticky.operation}: {sticky.url}")
    return sticky.url


def fail(settings: Settings, title: str, problems: list[tuple[str | None, int | None, str]], *,
          problem: Any = None, file_url: str | None = None) -> int:
    """A run that could not start: annotations, `status=error`, summary, comment; exit 2 (0 without fail-on-error).
    A `problem` (bad recipe, model, remote code) is told in the summary by the library's words, as the bot tells a
    Hub repo (`exporters.publish.problem.problem_body`): each recipe line linked at `file_url`, what to do."""
    for file, line, message in problems:
        error(message, file=file, line=line, title=title)
    if problem is not None:
        markdown = problem_markdown(settings.model or "?", title, problem, file_url=file_url, names=OPTION_NAMES,
                                    run_url=settings.github.run_url)
    else:
        lines = [(f"`{file}`" + (f" line {line}" if line else "") + ": " if file else "") + message
                 for file, line, message in problems]
        markdown = error_markdown(settings.model or "?", title, lines, run_url=settings.github.run_url)
    write_summary(settings.github.summary_file, markdown)
    set_outputs(settings.github.output_file, {"status": "error", "pr-operation": "none", "pr-url": ""})
    comment(settings, markdown)
    return EXIT_USAGE if settings.fail_on_error else EXIT_OK


def worded(err: ExportActionError) -> str:
    return err.worded(OPTION_NAMES)

"""What the Action shows people: the job summary and the sticky PR comment, both around the library's report.md.

The report itself (its tables, verdicts, truncation) is `exporters.report`'s; this module only adds the lines that
belong to the run: the Hub PR outcome, the failed targets, a link to the workflow run. Text that came from elsewhere
(error messages, the Hub's answers) goes in as one inline line with `<` escaped, so it cannot open an HTML comment or
a tag that hides the rest; report.md goes in with any code fence it leaves open closed.

Example:
    >>> inline("boom <!-- hidden\\n``` x")
    'boom &lt;!-- hidden ``` x'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from exporters.publish.problem import Problem, line_url, problem_body
from exporters.report.markdown import ICONS, cell, close_fences, reason, variants_table

DEFAULT_HUB = "https://huggingface.co"

MARKER_PREFIX = "<!-- hf-export-action"
OPERATION_WORDS = {"created": "opened", "updated": "updated", "unchanged": "unchanged"}


def inline(text: str, limit: int = 600) -> str:
    """`text` as one line of Markdown that cannot open an HTML comment or tag."""
    flat = " ".join(str(text).split())
    return (flat if len(flat) <= limit else flat[: limit - 1] + "…").replace("<", "&lt;")


def comment_marker(model: str) -> str:
    """The hidden marker of this model's sticky comment (one comment per model per PR)."""
    return f"{MARKER_PREFIX} model={model.replace('--', '-')} -->"


def publish_line(publish: Any | None, *, dry_run: bool = False) -> str:
    """One line on the Hub PR: opened/updated/unchanged with its link, or why there is none."""
    if publish is None:
        return "**Hub PR:** not requested (`open-pr: false`)."
    operation = getattr(publish, "operation", "none")
    message = inline(getattr(publish, "message", "") or "")
    prefix = "**Hub PR (dry run):**" if dry_run else "**Hub PR:**"
    pr_url, pr_num = getattr(publish, "pr_url", None), getattr(publish, "pr_num", None)
    if operation in OPERATION_WORDS:
        link = f" [#{pr_num}]({pr_url})" if pr_url and pr_num else (f" {pr_url}" if pr_url else "")
        return f"{prefix} {OPERATION_WORDS[operation]}{link}" + (f" — {message}" if message else "")
    text = f"{prefix} not opened — {message or 'nothing to publish'}"
    discussion = getattr(publish, "discussion_url", None)
    if discussion:
        text += f"; the report is in [this discussion]({discussion})"
    return text


def failed_lines(report: dict[str, Any]) -> list[str]:
    """One line per target that did not pass (failed or unverified), with its reason."""
    return [f"- {ICONS.get(t['status'], '')} `{t['name']}` {t['status']}: {inline(cell(reason(t), 300))}"
            for t in report.get("targets", []) if t.get("status") != "passed"]


def headline(report: dict[str, Any]) -> str:
    targets = report.get("targets", [])
    passed = sum(t.get("status") == "passed" for t in targets)
    status = report.get("status", "failed")
    model = (report.get("source") or {}).get("model", "?")
    return f"{ICONS.get(status, '')} Export of `{model}`: **{status}** ({passed}/{len(targets)} targets passed)"


def run_markdown(report: dict[str, Any], report_md: str, publish: Any | None, *, run_url: str | None = None,
                 dry_run: bool = False, extra: list[str] | None = None, collapse_report: bool = True) -> str:
    """The body of the job summary (report shown) and of the PR comment (report folded)."""
    lines = [f"### {headline(report)}", "", publish_line(publish, dry_run=dry_run), ""]
    failed = failed_lines(report)
    if failed:
        lines += ["Targets that did not pass:", "", *failed, ""]
    lines += list(extra or [])
    if run_url:
        lines += [f"<sub>[Workflow run]({run_url})</sub>", ""]
    report_md = close_fences(report_md.strip())
    if collapse_report:
        lines += variants_table(report)  # the table stays visible above the folded report
        lines += ["<details><summary>Full report</summary>", "", report_md, "", "</details>", ""]
    else:
        lines += [report_md, ""]
    return "\n".join(lines)


def error_markdown(model: str, title: str, problems: list[str], *, run_url: str | None = None) -> str:
    """The summary/comment for a run that could not start (bad recipe, unknown model...)."""
    lines = [f"### ❌ Export of `{model}`: **error**", "", f"**{title}**", ""]
    lines += [f"- {inline(p)}" for p in problems]
    lines += ["", "No export ran, so no Hub PR was opened."]
    if run_url:
        lines += ["", f"<sub>[Workflow run]({run_url})</sub>"]
    return "\n".join(lines) + "\n"


def problem_markdown(model: str, title: str, problem: Problem, *, file_url: str | None = None,
                     names: Mapping[str, str] | None = None, run_url: str | None = None) -> str:
    """The summary/comment for a run stopped by a `problem` (bad recipe, model, remote code): the library's words,
    the same the bot posts in a Hub repo's discussion (each recipe line linked at `file_url`, what to do)."""
    lines = [f"### ❌ Export of `{model}`: **error**", "",
             f"**{title}**: {problem.headline}. No export ran, so no Hub PR was opened.", "",
             *problem_body(problem, file_url=file_url, base=None, names=names)]
    if run_url:
        lines += ["", f"<sub>[Workflow run]({run_url})</sub>"]
    return "\n".join(lines) + "\n"


def recipe_url(settings: Any, file: str | None, name: str) -> str | None:
    """Where the recipe is shown: this repository's `file` at the workflow's commit, else the Hub repo's recipe
    `name` at the run's revision (None: neither has an address)."""
    github = settings.github
    if file is not None:
        if not (github.repository and github.sha):
            return None
        return f"{github.server_url.rstrip('/')}/{github.repository}/blob/{github.sha}/{quote(file)}"
    if settings.model_path is None and settings.model:
        return line_url(settings.hf_endpoint or DEFAULT_HUB, settings.model, settings.revision or "main", name, None)
    return None


def targets_markdown(model: str, targets: list[dict[str, Any]]) -> str:
    lines = [f"### Export plan for `{model}`", "", "| target | format | mode | device |", "|---|---|---|---|"]
    for t in targets:
        lines.append(f"| `{t['name']}` | {t['export_format']} | {t.get('mode') or 'auto'} | {t.get('device', 'cpu')} |")
    return "\n".join(lines) + "\n"

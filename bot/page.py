"""What people see of the jobs: the public view of a job (the API's JSON) and the HTML status page.

The status page lists jobs newest first, `limit` per page, paged by job id (`?before=ID`: older, `?after=ID`: newer;
cheap at any depth, so it keeps working with thousands of jobs), optionally one status only (`?status=failed`). Each
row links the repo, the commit, the PR or discussion, the report and the log, says why the job ended as it did, and
shows its error (a recipe problem: its line and JSON path). A private repo's details are hidden unless
`show_private`. Every value is escaped.

Example:
    >>> from bot.settings import BotSettings
    >>> hub_url(BotSettings()), hub_url(BotSettings(hf_endpoint="http://127.0.0.1:8000/"))
    ('https://huggingface.co', 'http://127.0.0.1:8000')
    >>> error_excerpt("a\\n" * 3 + "b", lines=2)
    ['…', 'a', 'b']
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from .job import Job
from .settings import BotSettings

DEFAULT_HUB = "https://huggingface.co"
PAGE_SIZE = 50
_LINK_LABELS = {"repo": "repo", "commit": "commit", "pr": "PR", "discussion": "discussion", "report": "report",
                "log": "log", "run": "Actions run"}
_STATUS_COLOURS = {"queued": "#6b7280", "running": "#2563eb", "succeeded": "#16a34a", "failed": "#dc2626",
                   "skipped": "#a16207"}
_HIDDEN = ("repo", "head_sha", "pr_url", "discussion_url", "report_path", "log_path", "dispatch", "error", "reason",
           "notes", "recipe_sha256", "weights_key")


def hub_url(settings: BotSettings) -> str:
    """The Hub's web address (where repos, commits and discussions are shown)."""
    return (settings.hf_endpoint or DEFAULT_HUB).rstrip("/")


def job_links(job: Job, settings: BotSettings) -> dict[str, str]:
    """The repo, the commit, the PR or discussion, the report, the log, the Actions run (those the job has)."""
    hub = hub_url(settings)
    links = {}
    if job.repo:
        links["repo"] = f"{hub}/{job.repo}"
    if job.repo and job.head_sha:
        links["commit"] = f"{hub}/{job.repo}/commit/{job.head_sha}"
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


def public_view(job: Job, settings: BotSettings) -> dict[str, Any]:
    """A job as the API and the status page show it (a private repo's details hidden unless `show_private`)."""
    data = job.to_dict()
    data.pop("requested_by", None)
    data["links"] = job_links(job, settings)
    if job.private and not settings.show_private:
        for key in _HIDDEN:
            data[key] = None
        data["repo"], data["links"] = "(private repo)", {}
    return data


def error_excerpt(error: str, lines: int = 8, width: int = 300) -> list[str]:
    """The lines of a job's error worth showing in a row: all of a short one (a recipe's problems), else its last
    `lines` (a log's end says what happened), each cut to `width` characters."""
    rows = [row[:width] for row in error.rstrip("\n").splitlines()]
    return rows if len(rows) <= lines else ["…", *rows[-lines:]]


@dataclass(frozen=True)
class PageNav:
    """Where this page sits: its filter and size, and the pages around it (None: there is none)."""

    status: str | None = None
    limit: int = PAGE_SIZE
    older_than: int | None = None  # `?before=` of the next (older) page
    newer_than: int | None = None  # `?after=` of the previous (newer) page

    def url(self, **query: Any) -> str:
        params = {"status": self.status, "limit": None if self.limit == PAGE_SIZE else self.limit, **query}
        text = urlencode({k: v for k, v in params.items() if v is not None})
        return f"/?{text}" if text else "/"


def _row(job: dict[str, Any]) -> str:
    e = html.escape
    links = " ".join(f'<a class="link" rel="noopener" data-kind="{e(name)}" href="{e(url)}">'
                     f'{e(_LINK_LABELS.get(name, name))}</a>' for name, url in job["links"].items())
    colour = _STATUS_COLOURS.get(job["status"], "#000")
    duration = f"{job['duration_s']:.1f}s" if job["duration_s"] is not None else ""
    repo = e(job["repo"] or "")
    if "repo" in job["links"]:
        repo = f'<a href="{e(job["links"]["repo"])}">{repo}</a>'
    commit = e((job["head_sha"] or "")[:8])
    if "commit" in job["links"]:
        commit = f'<a href="{e(job["links"]["commit"])}">{commit}</a>'
    error = ""
    if job["error"]:
        error = f'<pre class="error">{e(chr(10).join(error_excerpt(job["error"])))}</pre>'
    return (f'<tr class="job" data-job-id="{job["id"]}" data-status="{e(job["status"])}">'
            f'<td>{job["id"]}</td><td class="repo">{repo}</td><td><code>{commit}</code></td>'
            f'<td>{e(job["trigger"])}</td><td><span class="status" style="background:{colour}">{e(job["status"])}'
            f'</span></td><td>{job["attempts"]}/{job["max_attempts"]}</td><td>{e(job["created_at"] or "")}</td>'
            f'<td>{e(duration)}</td><td>{links}</td>'
            f'<td class="reason"><div>{e(job["reason"] or "")}</div>{error}</td></tr>')


def render_status_page(jobs: list[dict[str, Any]], counts: dict[str, int], settings: BotSettings,
                       nav: PageNav | None = None) -> str:
    """The HTML status page: counts per status (each a filter), one row per job of this page, links to the pages
    around it."""
    e = html.escape
    nav = nav or PageNav()
    states = [k for k in counts if k != "deliveries"]
    total = sum(counts[k] for k in states)
    filters = [f'<a href="{e(PageNav(None, nav.limit).url())}">all: {total}</a>']
    filters += [f'<a href="{e(PageNav(s, nav.limit).url())}">{e(s)}: {counts[s]}</a>' for s in states]
    pages = []
    if nav.newer_than is not None:
        pages += [f'<a rel="first" href="{e(nav.url())}">newest</a>',
                  f'<a rel="prev" href="{e(nav.url(after=nav.newer_than))}">newer</a>']
    if nav.older_than is not None:
        pages.append(f'<a rel="next" href="{e(nav.url(before=nav.older_than))}">older</a>')
    shown = f"jobs #{jobs[0]['id']}–#{jobs[-1]['id']}" if jobs else "no jobs"
    showing = f"{shown}{' (' + e(nav.status) + ')' if nav.status else ''}, newest first"
    empty = '<tr><td colspan="10">No jobs here.</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="15">
<title>export-action bot</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #111; }}
table {{ border-collapse: collapse; width: 100%; font-size: 14px; }}
th, td {{ border-bottom: 1px solid #e5e7eb; padding: 6px 8px; text-align: left; vertical-align: top; }}
.status {{ color: #fff; border-radius: 4px; padding: 1px 6px; }}
.reason {{ color: #4b5563; max-width: 40rem; }}
.error {{ color: #991b1b; background: #fef2f2; white-space: pre-wrap; margin: 4px 0 0; padding: 4px 6px; }}
.link {{ margin-right: .5rem; }}
nav a {{ margin-right: .75rem; }}
</style></head>
<body>
<h1>export-action bot</h1>
<p id="summary">backend <b>{e(settings.backend)}</b> · {" · ".join(filters)} · deliveries: {counts.get("deliveries", 0)}
· rendered {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>
<p id="showing">{showing}</p>
<table id="jobs"><thead><tr><th>#</th><th>repo</th><th>commit</th><th>trigger</th><th>status</th><th>attempts</th>
<th>created (UTC)</th><th>took</th><th>links</th><th>why / error</th></tr></thead>
<tbody>
{chr(10).join(_row(job) for job in jobs) or empty}
</tbody></table>
<nav id="pages">{" ".join(pages)}</nav>
<p><a href="/jobs">jobs as JSON</a> · <a href="/healthz">health</a></p>
</body></html>
"""

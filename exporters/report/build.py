"""The export report: `report.json` (the contract other tools read) and `report.md` (what maintainers review in the
PR; it renders on GitHub and on the Hub and stays under 60 KB)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Protocol

from exporters import fsutil
from exporters.errors import error_line, without_ansi
from exporters.recipe.model import Recipe
from exporters.report.markdown import ICONS, MARKDOWN_LIMIT, human_size, render_markdown, variants_table
from exporters.report.results import TargetResult
from exporters.status import overall_status


class RunFacts(Protocol):
    """What a report says about the run that made it (`exporters.run.context.RunContext` has these): the report
    reads them and never reaches back into the run."""

    source: Any
    warnings: list[str]
    eager_cache: Any
    versions: dict[str, str]
    weights: str
    weights_files: list[dict[str, Any]]
    recipe: Recipe
    recipe_file: Path
    family: str | None
    model_dtype: str | None
    started: float
    load_s: float | None
    jobs: int | None
    machine: dict[str, Any] | None

REPORT_SCHEMA_VERSION = 1
__all__ = ["ICONS", "MARKDOWN_LIMIT", "build_report", "human_size", "render_markdown", "run_findings", "variants_table",
           "write_report"]


def build_report(results: list[TargetResult], context: RunFacts) -> dict[str, Any]:
    """The report dict (what report.json holds) from the target results and the run's context."""
    source = context.source
    targets = [r.to_dict() for r in results]
    findings = list(context.warnings) + run_findings(targets)
    eager = context.eager_cache
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "export-action", "version": context.versions.get("export-action")},
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {"model": source.model_id, "revision": source.revision, "is_hub": source.is_hub,
                   "weights_sha256": context.weights, "weights_files": context.weights_files},
        "recipe": {"file": Path(context.recipe_file).name, "sha256": context.recipe.sha256(),
                   "targets": [t.name for t in context.recipe.exports]},  # all of them, whichever ran
        "versions": context.versions,
        "status": overall_status([t["status"] for t in targets]),
        "family": context.family,
        "model_dtype": context.model_dtype,
        "checkpoint_dtype": getattr(context, "checkpoint_dtype", None),  # what the repo's weights are stored in
        "load_dtype": context.model_dtype,  # what they were loaded in (once)
        "timings": {"total_s": round(dt.datetime.now().timestamp() - context.started, 3), "load_s": context.load_s},
        "jobs": context.jobs,
        # the plan made before loading (exporters.run.memory_plan): compare with a measured peak
        "memory": {**context.memory, "jobs": context.jobs or context.memory.get("jobs")}
        if getattr(context, "memory", None) else None,
        "eager_cache": {"hits": eager.hits, "misses": eager.misses} if eager is not None else None,
        "machine": context.machine,
        "targets": targets,
        "findings": findings,
    }


def run_findings(targets: list[dict[str, Any]]) -> list[str]:
    """The targets' findings for the report's top-level list, each said once: one that every target has word for
    word concerns the model and is listed bare; one that some targets share names them (`dynamo, onnx: ...`); the
    rest name their target. Each target's own list keeps all of its findings.

    Example:
        >>> run_findings([{"name": "a", "findings": ["model note", "only a"]}, {"name": "b", "findings": ["model note"]}])
        ['model note', 'a: only a']
    """
    holders: dict[str, list[str]] = {}
    for target in targets:
        for finding in target.get("findings") or []:
            names = holders.setdefault(finding, [])
            if target["name"] not in names:
                names.append(target["name"])
    everyone = len(targets) > 1
    return [finding if everyone and len(names) == len(targets) else f"{', '.join(names)}: {finding}"
            for finding, names in holders.items()]


def summary_lines(report: dict[str, Any], out_dir: Path) -> list[str]:
    """A line per target (its verdict; for a failure, the line that says what to change and its log), then where
    the report is: what a front end prints at the end of a run."""
    lines = []
    for target in report["targets"]:
        extra = " (cached)" if target.get("cached") else " (init's export, checked again)" if target.get(
            "handed_over") else ""
        line = f"{ICONS.get(target['status'], '')} {target['name']:<20} {target['export_format']:<11} " \
               f"{target['status']}{extra}"
        if target.get("error"):  # the whole message and traceback: the log
            line += f" — {error_line(target['error'])}" + (f" (log: {out_dir / target['log']})"
                                                           if target.get("log") else "")
        lines.append(line)
    return [*lines, f"report: {out_dir / 'report.md'}  ({out_dir / 'report.json'})"]


def write_report(report: dict[str, Any], out_dir: Path) -> None:
    """Write report.json and report.md atomically (a reader never sees half a report), never through a link planted
    in the folder (`exporters.fsutil.write_file`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = _without_ansi(report)  # a runtime's coloured text reaches no report
    for name, text in (("report.json", json.dumps(report, indent=2, default=str) + "\n"),
                       ("report.md", render_markdown(report))):
        fsutil.write_file(out_dir / name, text)


def _without_ansi(value: Any) -> Any:
    """`value` (report data) with terminal codes removed from every string in it."""
    if isinstance(value, str):
        return without_ansi(value)
    if isinstance(value, dict):
        return {key: _without_ansi(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_ansi(item) for item in value]
    return value

"""The export report: `report.json` (the contract other tools read) and `report.md` (what maintainers review in the
PR; it renders on GitHub and on the Hub and stays under 60 KB)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .status import overall_status

if TYPE_CHECKING:
    from .context import RunContext
    from .results import TargetResult

REPORT_SCHEMA_VERSION = 1
MARKDOWN_LIMIT = 60_000


def build_report(results: list[TargetResult], context: RunContext) -> dict[str, Any]:
    """The report dict (what report.json holds) from the target results and the run's context."""
    source = context.source
    targets = [r.to_dict() for r in results]
    findings = list(context.warnings)
    for target in targets:
        findings += [f"{target['name']}: {f}" for f in target.get("findings", [])]
    eager = context.eager_cache
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "export-action", "version": context.versions.get("export-action")},
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {"model": source.model_id, "revision": source.revision, "is_hub": source.is_hub,
                   "weights_sha256": context.weights, "weights_files": context.weights_files},
        "recipe": {"file": Path(context.recipe_file).name, "sha256": context.recipe.sha256()},
        "versions": context.versions,
        "status": overall_status([t["status"] for t in targets]),
        "family": context.family,
        "model_dtype": context.model_dtype,
        "timings": {"total_s": round(dt.datetime.now().timestamp() - context.started, 3), "load_s": context.load_s},
        "eager_cache": {"hits": eager.hits, "misses": eager.misses} if eager is not None else None,
        "targets": targets,
        "findings": findings,
    }


def write_report(report: dict[str, Any], out_dir: Path) -> None:
    """Write report.json and report.md atomically (a reader never sees half a report)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("report.json", json.dumps(report, indent=2, default=str) + "\n"),
                       ("report.md", render_markdown(report))):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out_dir / name)


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if value == 0:
        return "0"
    return f"{value:.2e}"


def human_size(n: float) -> str:
    """`1536` as `1.5 KB`."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


ICONS = {"passed": "✅", "failed": "❌", "unverified": "⚠️", "crashed": "💥", "timed_out": "⏱️", "skipped": "⏭️"}


def _worst(check: dict[str, Any]) -> tuple[str, str]:
    outputs = check.get("outputs") or []
    if not outputs:
        return "–", "–"
    worst = max(outputs, key=lambda o: (o["max_abs_diff"] is None, o["max_abs_diff"] or 0))
    return (f"{_fmt(worst['max_abs_diff'])} (`{worst['name']}`)", f"atol {worst['atol']:g}, rtol {worst['rtol']:g}")


def render_target(target: dict[str, Any]) -> list[str]:
    icon = ICONS.get(target["status"], "")
    cached = " (cached: inputs unchanged)" if target.get("cached") else ""
    lines = [f"### {icon} `{target['name']}` — {target['export_format']}, {target['mode']} mode: "
             f"**{target['status']}**{cached}", ""]
    if target.get("error"):
        message = str(target["error"].get("message") or "")[:1500]
        lines += [f"> **{target['error'].get('type')}**: {message}", ""]
    if target.get("unverified"):
        lines += ["> **Not verified**: these checks did not run, so this target is not a pass:", ">"]
        lines += [f"> - {reason[:300]}" for reason in target["unverified"][:20]] + [""]
    if target.get("components"):
        lines += ["| component | probe | worst abs diff | tolerance | verdict |", "|---|---|---|---|---|"]
        for component in target["components"]:
            for check in component["checks"]:
                if check.get("skipped"):
                    verdict = f"⏭️ skipped: {(check.get('error') or '')[:120]}"
                elif check.get("error"):
                    verdict = f"❌ {check['error'][:160]}"
                else:
                    verdict = "✅" if check["passed"] else "❌"
                diff, tol = _worst(check)
                lines.append(f"| `{component['name']}` | `{check['probe']}` | {diff} | {tol} | {verdict} |")
        lines.append("")
    generation = target.get("generation")
    if generation:
        icon = ICONS.get(generation["status"], "")
        text = f"**Generation parity** {icon} {generation['status']}: greedy {generation['max_new_tokens']} tokens"
        if generation.get("first_divergence"):
            text += f"; first divergence {generation['first_divergence']}"
        if generation.get("reason"):
            text += f" — {generation['reason'][:300]}"
        lines += [text, ""]
    timings = target.get("timings") or {}
    files = target.get("files") or []
    if timings or files:
        total = sum(f["size"] for f in files)
        parts = [f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items()]
        stored, parameters = target.get("weights_stored_bytes"), target.get("parameter_bytes")
        weights = f" · weights stored {stored / parameters:.2f}x the parameters" if stored and parameters else ""
        lines += [f"Timings: {', '.join(parts) or '–'} · {len(files)} files, {human_size(total)}{weights}", ""]
    if files:
        lines += ["<details><summary>Files</summary>", "", "| file | size | sha256 |", "|---|---|---|"]
        lines += [f"| `{f['path']}` | {human_size(f['size'])} | `{f['sha256'][:16]}…` |" for f in files]
        lines += ["", "</details>", ""]
    if target["status"] != "passed":
        if target.get("reproduce"):
            lines += [f"Reproduce: `{target['reproduce']}`", ""]
        excerpt = (target.get("error") or {}).get("log_excerpt")
        if excerpt:
            lines += ["<details><summary>Log excerpt</summary>", "", "```", excerpt[-4000:], "```", "",
                      "</details>", ""]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The report as GitHub/Hub-flavoured Markdown, under 60 KB."""
    targets = report["targets"]
    passed = sum(t["status"] == "passed" for t in targets)
    source = report["source"]
    revision = f" @ `{source['revision'][:12]}`" if source.get("revision") else ""
    lines = [
        "## Export report",
        "",
        f"{ICONS.get(report['status'], '')} **{report['status']}**: {passed}/{len(targets)} targets passed for "
        f"`{source['model']}`{revision} (recipe `{report['recipe']['file']}`, sha256 `{report['recipe']['sha256'][:12]}`)",
        "",
    ]
    for target in targets:
        lines += render_target(target)
    if report.get("findings"):
        lines += ["### Findings", ""] + [f"- {f}" for f in report["findings"]] + [""]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines += [f"<sub>{versions}</sub>", ""]
    text = "\n".join(lines)
    if len(text.encode()) > MARKDOWN_LIMIT:
        note = "\n\n_Report truncated to fit a PR description; the full report is `report.json`._\n"
        text = text.encode()[: MARKDOWN_LIMIT - len(note.encode())].decode(errors="ignore") + note
    return text

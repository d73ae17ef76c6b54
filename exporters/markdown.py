"""report.md: what maintainers read in the PR, the discussion, the job summary and the sticky comment.

It opens with one summary table (a row per target: verdict, worst difference against its tolerance, generation
parity, size, export time), failed and unverified targets first with their reason in the row; then each target's
details, its per-probe table folded in `<details>`. It renders on GitHub and on the Hub and stays under 60 KB.

Example:
    >>> code_block("a ``` fence inside")
    '````\\na ``` fence inside\\n````'
    >>> cell("a | b\\nc")
    'a \\\\| b c'
    >>> cell("upstream said <!-- x")
    'upstream said &lt;!-- x'
"""

from __future__ import annotations

import re
from typing import Any

MARKDOWN_LIMIT = 60_000
ICONS = {"passed": "✅", "failed": "❌", "unverified": "⚠️", "crashed": "💥", "timed_out": "⏱️", "skipped": "⏭️"}
# Failed and unverified targets come first: they are what a reviewer must read.
ORDER = {"crashed": 0, "timed_out": 0, "failed": 0, "unverified": 1, "passed": 2}


def human_size(n: float) -> str:
    """`1536` as `1.5 KB`.

    Example:
        >>> human_size(1536), human_size(3 * 1024 ** 3)
        ('1.5 KB', '3.0 GB')
    """
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def code_block(text: str, info: str = "") -> str:
    """`text` in a fenced block that nothing inside it can close (the fence is longer than any backtick run in it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def cell(text: str, limit: int = 300) -> str:
    """`text` fit for one table cell: one line, pipes escaped, `<` escaped (an upstream message holding `<!--` or a
    tag would otherwise hide the rest of the report), cut to `limit` characters."""
    flat = " ".join(str(text).split())
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    return flat.replace("|", "\\|").replace("<", "&lt;")


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return "0" if value == 0 else f"{value:.2e}"


def _outputs(target: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for c in target.get("components") or [] for check in c.get("checks") or []
            for o in check.get("outputs") or []]


def worst_diff(target: dict[str, Any]) -> str:
    """The largest absolute difference of any output at any probe, against its tolerance."""
    outputs = [o for o in _outputs(target) if o.get("max_abs_diff") is not None]
    if not outputs:
        return "–"
    worst = max(outputs, key=lambda o: o["max_abs_diff"])
    return f"{_fmt(worst['max_abs_diff'])} / atol {worst['atol']:g}"


def parity_cell(target: dict[str, Any]) -> str:
    """Generation parity in a few words: tokens matched, where it diverged, or that it did not run."""
    generation = target.get("generation")
    if not generation:
        return "–"
    steps = generation.get("max_new_tokens")
    tokens = generation.get("eager_tokens") or []
    if generation["status"] == "passed":
        ties = len(generation.get("near_ties") or [])
        return f"✅ {len(tokens[0]) if tokens else steps}/{steps} tokens" + (f" ({ties} near tie(s))" if ties else "")
    if generation["status"] == "failed":
        step = (generation.get("first_divergence") or {}).get("step")
        return f"❌ diverged at token {step}" if step is not None else "❌ failed"
    return "⏭️ not run"


def reason(target: dict[str, Any]) -> str:
    """Why a target did not pass, in one line ('' when it passed)."""
    if target["status"] == "passed":
        return ""
    if target.get("unverified"):
        return f"not verified: {target['unverified'][0]}" + (
            f" (+{len(target['unverified']) - 1} more)" if len(target["unverified"]) > 1 else "")
    error = target.get("error") or {}
    return f"{error.get('type') or 'Error'}: {str(error.get('message') or 'see the log').splitlines()[0]}"


def summary_table(targets: list[dict[str, Any]]) -> list[str]:
    """One row per target, failed and unverified first, with the reason in the verdict cell."""
    lines = ["| target | format | mode | verdict | worst diff / tolerance | generation parity | size | export time |",
             "|---|---|---|---|---|---|---|---|"]
    for target in sorted(targets, key=lambda t: ORDER.get(t["status"], 0)):
        verdict = f"{ICONS.get(target['status'], '')} {target['status']}"
        why = reason(target)
        if why:
            verdict += f": {cell(why, 160)}"
        if target.get("cached"):
            verdict += " (cached)"
        size = sum(f.get("size", 0) for f in target.get("files") or [])
        export_s = (target.get("timings") or {}).get("export_s")
        lines.append(f"| `{target['name']}` | {target['export_format']} | {target['mode']} | {verdict} | "
                     f"{worst_diff(target)} | {parity_cell(target)} | {human_size(size) if size else '–'} | "
                     f"{f'{export_s:.1f} s' if export_s is not None else '–'} |")
    return lines


def _probe_rows(target: dict[str, Any]) -> list[str]:
    rows = ["| component | probe | shapes | worst abs diff | tolerance | verdict |", "|---|---|---|---|---|---|"]
    for component in target.get("components") or []:
        for check in component.get("checks") or []:
            outputs = check.get("outputs") or []
            worst = max(outputs, key=lambda o: (o["max_abs_diff"] is None, o["max_abs_diff"] or 0), default=None)
            diff = f"{_fmt(worst['max_abs_diff'])} (`{worst['name']}`)" if worst else "–"
            tolerance = f"atol {worst['atol']:g}, rtol {worst['rtol']:g}" if worst else "–"
            verdict = check.get("verdict") or ("skipped" if check.get("skipped") else
                                               "passed" if check.get("passed") else "failed")
            text = ICONS.get(verdict, verdict)
            if check.get("error"):
                text += f" {cell(check['error'], 160)}"
            shapes = ", ".join(f"{k} {v}" for k, v in list((check.get("shapes") or {}).items())[:3])
            rows.append(f"| `{component['name']}` | `{check['probe']}` | {cell(shapes, 80) or '–'} | {diff} | "
                        f"{tolerance} | {text} |")
    return rows


def _generation_details(generation: dict[str, Any]) -> list[str]:
    """How parity selected tokens: the cache driven, eager's logits processors (applied to both sides), near ties."""
    cache = generation.get("cache") or {}
    parts = []
    if cache.get("implementation") == "static":
        parts.append(f"static cache of {cache.get('max_cache_len')} positions")
    processors = generation.get("logits_processors")
    if processors is not None:
        names = ", ".join(f"`{name}`" for name in processors) or "none"
        parts.append(f"eager `generate()`'s logits processors, applied to both sides: {names}")
    lines = [f"Parity: {'; '.join(parts)}.", ""] if parts else []
    for tie in (generation.get("near_ties") or [])[:20]:
        lines.append(f"- near tie at step {tie['step']} (batch {tie['batch']}): eager {tie['eager']}, exported "
                     f"{tie['exported']}, eager score gap {tie['eager_score_gap']:.3g} within tolerance "
                     f"{tie['tolerance']:.3g}; decoding went on with eager's token")
    return lines + [""] if generation.get("near_ties") else lines


def render_target(target: dict[str, Any], details: bool = True) -> list[str]:
    """One target's details: the reason it did not pass, its probes (folded), parity, files, log excerpt
    (`details=False`: without the probe and file tables, to fit the size limit)."""
    icon = ICONS.get(target["status"], "")
    cached = " (cached: inputs unchanged)" if target.get("cached") else ""
    lines = [f"### {icon} `{target['name']}` — {target['export_format']}, {target['mode']} mode: "
             f"**{target['status']}**{cached}", ""]
    if target.get("error"):
        message = cell(target["error"].get("message") or "", 1500)  # one line, `<` escaped (upstream text)
        lines += [f"> **{cell(target['error'].get('type') or 'Error', 100)}**: {message}", ""]
    if target.get("unverified"):
        lines += ["> **Not verified**: these checks did not run, so this target is not a pass:", ">"]
        lines += [f"> - {cell(line, 300)}" for line in target["unverified"][:20]] + [""]
    checks = sum(len(c.get("checks") or []) for c in target.get("components") or [])
    if checks and details:
        lines += [f"<details><summary>{checks} probe(s) of {len(target['components'])} component(s)</summary>", "",
                  *_probe_rows(target), "", "</details>", ""]
    generation = target.get("generation")
    if generation:
        text = (f"**Generation parity** {ICONS.get(generation['status'], '')} {generation['status']}: greedy "
                f"{generation['max_new_tokens']} tokens")
        if generation.get("first_divergence"):
            text += f"; first divergence {generation['first_divergence']}"
        if generation.get("reason"):
            text += f" — {cell(generation['reason'], 300)}"
        lines += [text, ""] + _generation_details(generation)
    files = target.get("files") or []
    timings = target.get("timings") or {}
    if timings or files:
        parts = [f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items() if isinstance(v, (int, float))]
        lines += [f"Timings: {', '.join(parts) or '–'} · {len(files)} files, "
                  f"{human_size(sum(f['size'] for f in files))}", ""]
    if files and details:
        lines += ["<details><summary>Files</summary>", "", "| file | size | sha256 |", "|---|---|---|"]
        lines += [f"| `{cell(f['path'], 200)}` | {human_size(f['size'])} | `{f['sha256'][:16]}…` |" for f in files]
        lines += ["", "</details>", ""]
    if target["status"] != "passed":
        if target.get("reproduce"):
            lines += [f"Reproduce: `{target['reproduce']}`", ""]
        excerpt = (target.get("error") or {}).get("log_excerpt")
        if excerpt:
            lines += ["<details><summary>Log excerpt</summary>", "", code_block(excerpt[-4000:]), "", "</details>",
                      ""]
    return lines


def headline(report: dict[str, Any]) -> str:
    """`⚠️ **unverified**: 1 passed, 1 unverified for `model` @ `sha` (recipe ...)`."""
    targets = report["targets"]
    counts: dict[str, int] = {}
    for target in targets:
        counts[target["status"]] = counts.get(target["status"], 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda i: ORDER.get(i[0], 0)))
    source = report["source"]
    revision = f" @ `{source['revision'][:12]}`" if source.get("revision") else ""
    return (f"{ICONS.get(report['status'], '')} **{report['status']}**: {tally or 'no target'} of {len(targets)} "
            f"for `{source['model']}`{revision} (recipe `{report['recipe']['file']}`, sha256 "
            f"`{report['recipe']['sha256'][:12]}`)")


def render_markdown(report: dict[str, Any], details: bool = True) -> str:
    """The report as GitHub/Hub-flavoured Markdown, under 60 KB: the summary table first, then the details (the
    probe and file tables are left out when the whole would not fit; report.json always has everything)."""
    targets = report["targets"]
    lines = ["## Export report", "", headline(report), "", *summary_table(targets), ""]
    for target in sorted(targets, key=lambda t: ORDER.get(t["status"], 0)):
        lines += render_target(target, details)
    if report.get("findings"):
        lines += ["<details><summary>Findings</summary>", ""]
        lines += [f"- {cell(f, 600)}" for f in report["findings"]] + ["", "</details>", ""]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines += [f"<sub>{versions}</sub>", ""]
    text = "\n".join(lines)
    if len(text.encode()) > MARKDOWN_LIMIT and details:
        return render_markdown(report, details=False)
    if len(text.encode()) > MARKDOWN_LIMIT:
        note = "\n\n_Report truncated to fit a PR description; the full report is `report.json`._\n"
        text = text.encode()[: MARKDOWN_LIMIT - len(note.encode())].decode(errors="ignore") + note
    return text

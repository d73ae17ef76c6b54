"""What `hf-export init` found, for people: a table per target (components, dynamic dims and their bounds,
tolerance, export time) and a note for everything it could not make work. Markdown for the Action's job summary and
the Hub PR, a rich table for the terminal, a dict for tools.

Example:
    >>> print(dims_text([]))
    all static
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from exporters.capture.merged import MERGED
from exporters.init.axes import Dimension
from exporters.init.decide import DYNAMIC_GRAPH, MERGED_GRAPH, METHODS_GRAPH, RUNNER_GRAPH
from exporters.report.markdown import cell
from exporters.status import FAILED, LEFT_OUT, NAMED, PASSED, PENDING

ICONS = {PASSED: "✅", LEFT_OUT: "❌", PENDING: "⏳"}


def dims_text(dims: list[Dimension]) -> str:
    """`prompt 1–256 · past 1–255`; `past auto (decode)` for a component declared `Dim.AUTO`, `image static`."""
    parts = []
    for dimension in dims:
        by_state: dict[str, list[str]] = {}
        for component, state in dimension.state.items():
            by_state.setdefault(state, []).append(component)
        for state, components in by_state.items():
            where = f" ({', '.join(components)})" if len(by_state) > 1 else ""
            if state == NAMED:
                parts.append(f"{dimension.name} {dimension.low}–{dimension.high}{where}")
            else:
                parts.append(f"{dimension.name} {state}{where}")
    return " · ".join(parts) or "all static"


def exported_words(target: dict[str, Any]) -> str:
    """What a round's target really exports, read from it: `onnx (model)`, `executorch (the LLM runner's program)`,
    `dynamo (prefill, decode)`, with its dtype where one is set."""
    if target.get("mode") == "generation" and "expected_components" not in target and target.get("dynamic"):
        graphs = "the plainest dynamic target"
    elif target.get("mode") == "generation" and "expected_components" not in target:
        graphs = "the plain target: a runner's program, else a method per component"
    else:
        graphs = ", ".join(target.get("expected_components") or list(target.get("components") or {}) or [MERGED])
    dtype = f", {target['dtype']}" if target.get("dtype") else ""
    return f"{target['export_format']} ({graphs}{dtype})"


def proposed_components(item, expected: list[str]) -> list[str]:
    """The components a format's proposal exports: one graph (`model`) for the merged graph and the runner program."""
    return [MERGED] if item.graph in (MERGED_GRAPH, RUNNER_GRAPH) else list(expected)


def graph_dims_text(item) -> str:
    """`dims_text` of a format's proposal; the runner program's contract is the runner's own."""
    if item.graph == RUNNER_GRAPH:
        program = item.program or "the ExecuTorch LLM runner's program"
        return f"tokens auto · static cache ({program})"
    if item.graph == METHODS_GRAPH:
        return "tokens auto · static cache (a method per component; not the LLM runner's program: see the notes)"
    if item.graph == DYNAMIC_GRAPH:  # no named range: the axes are run at other sizes by parity and the runtimes
        return "every axis auto (`dynamic: true`: run at other sizes by generation parity, and by runtimes that apply)"
    return dims_text(item.dims)


def tolerance_text(tolerance: dict[str, float] | None, worst: float | None) -> str:
    if not tolerance:
        return "–"
    return f"atol {tolerance['atol']:g} (worst {worst or 0:.1e})"


def rows(result) -> list[dict[str, Any]]:
    """One row per requested format, in the order asked."""
    table = []
    for item in result.formats:
        passed = item.status == PASSED
        table.append({
            "target": item.export_format,
            "status": item.status,
            "components": ", ".join(proposed_components(item, result.components)),
            "dynamic": graph_dims_text(item) if passed else "–",
            "tolerance": tolerance_text(item.tolerance, item.worst_abs_diff) if passed else "–",
            "export_s": item.export_s if passed else None,
            "rounds": item.rounds,
            "reason": item.reason,
            "class": item.failure.label if item.failure and not passed else None,
            "change": item.failure.change if item.failure and not passed else None,
        })
    return table


def failed_lines(result) -> list[str]:
    """One line per format left out: its failure's class, the error's one line, and what to change."""
    lines = []
    for item in result.formats:
        if item.status == PASSED:
            continue
        label = item.failure.label if item.failure else "not settled"
        change = f" → change: {item.failure.change}" if item.failure else ""
        lines.append(f"{item.export_format} [{label}]: {item.reason}{change}")
    return lines


def to_dict(result) -> dict[str, Any]:
    """The result as JSON-ready data (what the Action puts in its outputs)."""
    return {
        "model": result.model, "family": result.family, "mode": result.mode, "components": result.components,
        "status": PASSED if result.passed else FAILED, "rows": rows(result), "notes": result.notes,
        "elapsed_s": result.elapsed_s, "recipe": result.recipe, "versions": result.versions,
    }


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "–"


def render_markdown(result, *, heading: str = "## Proposed export recipe") -> str:
    """The summary as GitHub/Hub Markdown: the table, the notes, how the values were found, the tool versions."""
    passed = [r.export_format for r in result.passed]
    lines = [heading, ""]
    if passed:
        lines.append(f"`hf-export init` exported and validated **{', '.join(passed)}** for `{result.model}` "
                     f"({result.family}, {result.mode} mode) in {result.elapsed_s:.0f} s.")
    else:
        lines.append(f"`hf-export init` could not export and validate any format for `{result.model}`.")
    lines += ["", "| target | components | dynamic dims (bounds) | tolerance | export time | rounds |",
              "|---|---|---|---|---|---|"]
    for row in rows(result):
        icon = ICONS.get(row["status"], "")
        target = f"{icon} `{row['target']}`" + ("" if row["status"] == PASSED else " (left out)")
        lines.append(f"| {target} | {cell(row['components'])} | {cell(row['dynamic'])} | {cell(row['tolerance'])} | "
                     f"{cell(_seconds(row['export_s']))} | {cell(row['rounds'])} |")
    if failed := failed_lines(result):
        lines += ["", "**Left out** (the class of each failure and what to change):", ""]
        lines += [f"- {cell(line, 4000)}" for line in failed]
    if result.notes:
        lines += ["", "**Notes** (what could not be made to work, and why):", ""]
        lines += [f"- {cell(note, 4000)}" for note in result.notes]
    lines += ["", "Each bound is the largest range whose artifact passed validation at its lower bound, middle and "
                  "upper bound (inside the model's own limits); each tolerance is 10× the worst difference measured "
                  "on those probes, rounded up, with rtol 0.", ""]
    lines.append("<sub>" + ", ".join(f"{k} {v}" for k, v in result.versions.items()) + "</sub>")
    return "\n".join(lines) + "\n"


def print_table(result, console) -> None:
    """The summary as a rich table on `console`, then the notes."""

    table = Table(title=f"Proposed recipe for {result.model}", show_lines=False)
    for column in ("target", "components", "dynamic dims (bounds)", "tolerance", "export time", "rounds"):
        table.add_column(column, overflow="fold")
    for row in rows(result):
        target = f"{ICONS.get(row['status'], '')} {row['target']}" + (
            "" if row["status"] == PASSED else " (left out)")
        table.add_row(target, row["components"], row["dynamic"], row["tolerance"], _seconds(row["export_s"]),
                      str(row["rounds"]))
    console.print(table)
    for line in failed_lines(result):
        console.print(f"left out: {line}", markup=False, highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)

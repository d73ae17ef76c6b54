"""How `hf-export init` reads one round of the pipeline and decides the next candidate for a format.

For each target of a round's `report.json`:

- passed, every probe ran and passed: the format is settled;
- otherwise the failure is classified first (`exporters.init.classify`) and only its class's cure is tried:
  configuration, missing files, an operator the format cannot lower: left out at once with what to change;
  dtype/kernel on a CPU runtime: one more round in float32; shape (and unrecognised errors): the steps below;
- the export failed: the dims the error names (else every dynamic dim of the failing component) go one step down,
  named range → `auto` → static; nothing left to demote: the format is left out with the error;
- the artifact does not load, or fails at its traced inputs: its dims go straight to static (then left out);
- a probe at `dim=size` failed or could not run: that end of the dim's range moves halfway back towards the
  largest (smallest) size that passed; a range shrunk to the traced size is declared static;
- outputs off by more than the tolerance but otherwise right: the next round uses a looser atol (at most
  `MAX_ATOL`), which the summary reports;
- generation parity failed, a crash, a timeout, or `max_rounds` spent: the format is left out with the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from exporters.errors import first_line
from exporters.init.axes import Dimension
from exporters.init.classify import DTYPE, NOT_RETRIED, SHAPE, Failure, classify
from exporters.status import (
    AUTO,
    CRASHED,
    FAILED,
    LEFT_OUT,
    NAMED,
    PASSED,
    PENDING,
    SKIPPED,
    STATIC,
    TIMED_OUT,
    UNVERIFIED,
    FormatOutcome,
)

MARGIN = 10  # tolerance = this × the worst measured |diff|, rounded up to one significant digit
MAX_ATOL = 1e-2  # float32 outputs further apart than this are wrong, not imprecise
_PROBE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<size>\d+)$")
_COMPONENT = re.compile(r"exporting component '([^']+)' failed")
# Failure signatures of known upstream gaps (docs/upstream-gaps.md), named in the notes.
KNOWN_GAPS = (
    (re.compile(r'op\.__name__ in \("alloc",\)|check_valid_edge_op'),
     "docs/upstream-gaps.md §4: ExecuTorch edge verification rejects deferred runtime asserts"),
    (re.compile(r"set_inputs\(\) for method '\w+' failed with error 0x10"),
     "docs/upstream-gaps.md, \"ExecuTorch caps every dynamic dimension at max(4 × traced size, 1024)\""),
    (re.compile(r"Constraints violated"), "a guard torch.export cannot prove over the declared range"),
)


# What a format's proposal exports (`FormatResult.graph`): the tool's default graph, weights stored once (the merged
# graph; the ExecuTorch LLM runner's program), or one graph per component with its own contract; "methods": the plain
# ExecuTorch target of a model the runner's program cannot hold, which the tool exports with a method per component;
# "dynamic": the plainest dynamic target (`dynamic: true`: the tool's contract, an encoder-decoder's batch and decoder
# prompt dynamic), a speech model's ONNX generation target: optimum's merged decoder and GenAI's graphs, as loaded
MERGED_GRAPH, RUNNER_GRAPH, COMPONENT_GRAPHS, METHODS_GRAPH, DYNAMIC_GRAPH = (
    "merged", "runner", "components", "methods", "dynamic")
PLAIN_TARGET_GRAPHS = (RUNNER_GRAPH, METHODS_GRAPH, DYNAMIC_GRAPH)  # proposed as the plain target: the tool's layout


@dataclass
class FormatResult:
    """How one format fared: `passed` with its target and tolerance, or `left_out` with the reason."""

    export_format: str
    status: FormatOutcome = PENDING
    dims: list[Dimension] = field(default_factory=list)
    rounds: int = 0
    reason: str | None = None
    export_s: float | None = None
    worst_abs_diff: float | None = None
    probes: int = 0
    tolerance: dict[str, float] | None = None
    tolerance_note: str = ""
    atol_override: float | None = None  # a looser atol the last round needed
    opset_version: int | None = None
    notes: list[str] = field(default_factory=list)
    target: dict[str, Any] | None = None
    graph: str = COMPONENT_GRAPHS  # the default graph first; one per component where that did not validate
    dtype: str | None = None  # "float32" once a dtype/kernel failure was retried in it (`classify`)
    failure: Failure | None = None  # the class of the latest failure, and what to change
    program: str | None = None  # the runner program the plain ExecuTorch target turned out to be, where not the LLM's


@dataclass
class _Reading:
    passed: bool
    export_error: str | None = None
    exported: bool = False  # the export finished (a failure without checks was in loading or validating it)
    detail: str = ""  # the error and the end of the export log: where known upstream gaps are recognised
    failed_component: str | None = None
    hard: dict[str, dict[int, str]] = field(default_factory=dict)  # dim -> size -> why (fails or cannot be checked)
    good: dict[str, set[int]] = field(default_factory=dict)  # dim -> sizes that passed
    traced_failures: dict[str, str] = field(default_factory=dict)  # component -> why
    tolerance_worst: float = 0.0  # worst |diff| among checks that failed on tolerance alone
    worst: float = 0.0
    probes: int = 0
    other_error: str | None = None


def _check_kind(check: dict[str, Any]) -> tuple[str, str, float]:
    """`(kind, why, worst)`: kind is pass, tolerance (numbers off, nothing else wrong), hard or skipped."""
    outputs = check.get("outputs") or []
    worst = max((o["max_abs_diff"] for o in outputs if o.get("max_abs_diff") is not None), default=0.0)
    verdict = check.get("verdict")
    if verdict == SKIPPED or check.get("skipped"):
        return "skipped", check.get("error") or "no output was compared with the eager model", worst
    if check.get("error"):
        return "hard", check["error"], worst
    if verdict == PASSED:
        return "pass", "", worst
    broken = [o for o in outputs if not o.get("passed") and (o.get("note") or o.get("max_abs_diff") is None)]
    if broken:
        return "hard", f"{broken[0]['name']}: {broken[0].get('note') or 'no value'}", worst
    return "tolerance", f"worst |diff| {worst:.2e}", worst


def read_target(target: dict[str, Any]) -> _Reading:
    reading = _Reading(passed=target["status"] == PASSED)
    error = target.get("error") or {}
    if not target.get("components"):
        message = str(error.get("message") or f"the target {target['status']}")
        found = _COMPONENT.search(message)
        reading.export_error, reading.failed_component = message, found.group(1) if found else None
        reading.exported = "validate_s" in (target.get("timings") or {})
        reading.detail = f"{message}\n{error.get('log_excerpt') or ''}"
        return reading
    for component in target["components"]:
        for check in component["checks"]:
            kind, why, worst = _check_kind(check)
            reading.probes += kind != "skipped"
            reading.worst = max(reading.worst, worst) if kind == "pass" else reading.worst
            match = _PROBE.match(check["probe"])
            if kind == "tolerance":
                reading.tolerance_worst = max(reading.tolerance_worst, worst)
            elif kind in ("hard", "skipped") and match is None:
                reading.traced_failures[component["name"]] = why
            elif kind in ("hard", "skipped"):
                reading.hard.setdefault(match["name"], {})[int(match["size"])] = f"{component['name']}: {why}"
            if kind == "pass" and match is not None:
                reading.good.setdefault(match["name"], set()).add(int(match["size"]))
    generation = target.get("generation") or {}
    if generation.get("status") == FAILED:
        reading.other_error = f"generation parity failed: {generation.get('reason') or generation.get('first_divergence')}"
    elif not reading.hard and not reading.traced_failures and not reading.tolerance_worst and error:
        reading.other_error = str(error.get("message"))
    return reading


# ── Deciding the next candidate ───────────────────────────────────────────────


def _demote(dims: list[Dimension], component: str | None, message: str, detail: str = "",
            to_static: bool = False) -> list[str]:
    """One step down (named → auto → static; straight to static with `to_static`: a failure of the exported
    artifact, not of the export) for the dims the failure names, else every dynamic dim of the failing component
    (of the target, when the component is unknown). Returns what changed."""
    candidates = [d for d in dims if (component is None or component in d.state) and
                  any(d.state[c] != STATIC for c in d.state if component in (None, c))]
    named_in_message = [d for d in candidates if re.search(rf"\b{re.escape(d.name)}\b", message)]
    changed = []
    for dimension in named_in_message or candidates:
        for name in [c for c in dimension.state if component in (None, c)]:
            before = dimension.state[name]
            after = STATIC if to_static else {NAMED: AUTO, AUTO: STATIC}.get(before, before)
            if after != before:
                dimension.state[name] = after
                why = _with_gap(_first_line(message), detail or message)
                dimension.reasons.append(f"{dimension.name} in {name}: {before} failed, declared {after} ({why})")
                changed.append(f"{dimension.name}@{name} → {after}")
    return changed


def _narrow(dimension: Dimension, hard: dict[int, str], good: set[int]) -> bool:
    """Move the failing end of the range halfway back towards the largest (smallest) size that passed."""
    changed = False
    above = sorted(s for s in hard if s > dimension.traced)
    below = sorted(s for s in hard if s < dimension.traced)
    if above:
        fail = above[0]
        best = max([s for s in good if dimension.traced <= s < fail] + [dimension.traced])
        new_high = best + (fail - best) // 2 if fail - best > 2 else best
        why = _with_gap(_first_line(hard[fail]), hard[fail])
        dimension.reasons.append(f"{dimension.name}: fails at {fail} ({why}); max {dimension.high} → {new_high}")
        dimension.high, changed = new_high, True
    if below:
        fail = below[-1]
        best = min([s for s in good if fail < s <= dimension.traced] + [dimension.traced])
        new_low = best - (best - fail) // 2 if best - fail > 2 else best
        dimension.reasons.append(f"{dimension.name}: fails at {fail} ({_first_line(hard[fail])}); min {dimension.low}"
                                 f" → {new_low}")
        dimension.low, changed = new_low, True
    if changed and dimension.low == dimension.high == dimension.traced:
        for component, state in dimension.state.items():
            if state == NAMED:
                dimension.state[component] = STATIC
        dimension.reasons.append(f"{dimension.name}: only the traced size {dimension.traced} works: declared static")
    return changed


def decide(result: FormatResult, target: dict[str, Any], max_rounds: int) -> None:
    """Settle `result` from its target's outcome in the latest round, or change its dims for the next one."""
    reading = read_target(target)
    if reading.passed and not reading.hard and not reading.traced_failures:
        result.status, result.worst_abs_diff, result.probes = PASSED, reading.worst, reading.probes
        result.export_s = (target.get("timings") or {}).get("export_s")
        generation = target.get("generation") or {}
        if generation.get("status") == SKIPPED:
            result.notes.append(f"generation parity did not run: {generation.get('reason')}")
        return
    if target["status"] in (CRASHED, TIMED_OUT):
        return _leave_out(result, f"{target['status']}: {(target.get('error') or {}).get('message')}")
    result.failure = failure = classify(target)
    why = reading.export_error or reading.other_error or next(iter(reading.traced_failures.values()), None)
    if failure.kind in NOT_RETRIED:  # no shape, dtype or tolerance init could change cures it: said, not searched
        return _leave_out(result, why or failure.line, reading.detail)
    if failure.kind == DTYPE:
        if result.dtype is None and target.get("device", "cpu") == "cpu":
            result.dtype = "float32"  # the dtype CPU runtimes have every kernel for: one retry
            result.notes.append(f"{failure.line}: retried in float32 (the dtype the CPU runtime runs)")
            return None
        return _leave_out(result, why or failure.line, reading.detail)
    changed: list[str] = []
    if reading.export_error is not None:
        changed = _demote(result.dims, reading.failed_component, reading.export_error, reading.detail,
                          to_static=reading.exported)
        if not changed:
            return _leave_out(result, reading.export_error, reading.detail)
    for component, why in reading.traced_failures.items():
        demoted = _demote(result.dims, component, why, to_static=True)
        if not demoted:
            return _leave_out(result, f"{component} fails at its traced inputs: {why}")
        changed += demoted
    for dimension in result.dims:
        if dimension.name in reading.hard and any(s == NAMED for s in dimension.state.values()):
            changed += [dimension.name] if _narrow(dimension, reading.hard[dimension.name],
                                                   reading.good.get(dimension.name, set())) else []
    if reading.tolerance_worst:
        atol = nice_ceil(reading.tolerance_worst * MARGIN)
        if atol > MAX_ATOL:
            return _leave_out(result, f"outputs differ from the eager model by up to {reading.tolerance_worst:.2e}, "
                                      f"beyond any sensible float32 tolerance ({MAX_ATOL:g})")
        result.atol_override, changed = max(atol, result.atol_override or 0.0), changed + ["tolerance"]
    if reading.other_error and not changed:
        return _leave_out(result, reading.other_error)
    if target["status"] == UNVERIFIED and not changed:  # not a pass: some checks did not run
        return _leave_out(result, "its checks did not all run: " + "; ".join(target.get("unverified") or []))
    if not changed:
        return _leave_out(result, str((target.get("error") or {}).get("message") or "failed"))
    if result.rounds >= max_rounds:
        _leave_out(result, f"no passing configuration within {max_rounds} rounds; last: "
                           f"{_first_line(str((target.get('error') or {}).get('message')))}")


def _leave_out(result: FormatResult, reason: str, detail: str = "") -> None:
    result.status, result.reason = LEFT_OUT, _with_gap(_first_lines(reason), detail or reason)


def _first_line(text: str) -> str:
    return first_line(text, 300)  # whole: a colon's line takes the next one along, a cut falls between words


def _first_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return first_line(" ".join(lines[:count]), 600)


def _with_gap(reason: str, detail: str) -> str:
    """`reason`, naming the known upstream gap whose signature `detail` carries."""
    for pattern, gap in KNOWN_GAPS:
        if pattern.search(detail):
            return f"{reason} [{gap}]"
    return reason


def nice_ceil(value: float) -> float:
    """`value` rounded up to one significant digit: 3.2e-05 → 4e-05.

    Example:
        >>> nice_ceil(3.2e-05), nice_ceil(1e-06)
        (4e-05, 1e-06)
    """
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    mantissa = math.ceil(round(value / 10**exponent, 9))
    return float(f"{mantissa}e{exponent}")

"""What checking and exporting produce: per-output diffs, checks, component and generation reports, target results.

Verdicts are derived here, in one place, by the three-verdict rule: a check ran and passed, ran and failed, or did
not run. A component passes only when every probe ran and compared at least one output leaf with a finite diff
within tolerance; a generation target passes only when generation parity ran and matched. Anything else that did not
fail is `unverified`, with the reason.

Example:
    >>> check = Check("traced", {"x": [1, 4]}, [OutputDiff("logits", 1e-7, 1e-6, 1e-5, 1e-4, True)])
    >>> ComponentReport("model", [check]).verdict
    'passed'
    >>> ComponentReport("model", [Check("x=9", {}, skipped=True, error="too large")]).verdict
    'unverified'
    >>> ComponentReport("model", []).why_unverified()
    ['model: no probe ran']
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from exporters.errors import upstream_cause
from exporters.status import FAILED, PASSED, SKIPPED, UNVERIFIED, CheckStatus, TargetStatus


@dataclass
class OutputDiff:
    """One output leaf compared: worst absolute and relative difference against the tolerance."""

    name: str
    max_abs_diff: float | None
    max_rel_diff: float | None
    atol: float
    rtol: float
    passed: bool
    note: str | None = None


@dataclass
class Check:
    """One comparison of a component at one probe (`skipped`: it did not run, `error` says why)."""

    probe: str
    shapes: dict[str, list[int]]
    outputs: list[OutputDiff] = field(default_factory=list)
    passed: bool = True
    skipped: bool = False
    error: str | None = None
    quality: dict[str, Any] | None = None  # task metrics of a quantized/half target (exporters.validate.quality.measure)
    # a failed float32 check arbitrated against eager in float64 (exporters.validate.arbitration): the artifact vs
    # float64, eager float32 vs float64, and the artifact vs eager float32 where float64 backed a pass
    float64: dict[str, Any] | None = None

    @property
    def verdict(self) -> CheckStatus:
        if self.skipped:
            return SKIPPED
        if not self.passed or any(not o.passed for o in self.outputs):
            return FAILED
        if self.quality is not None:  # judged by the target's budget; here: did a metric get measured (a probe of an
            # image's rows alone ran, its rows left out by design: exporters.validate.judged_rows)
            measured = self.quality["positions"] or self.quality.get("media_positions")
            return PASSED if measured or self.quality["cosine"] is not None else SKIPPED
        compared = [o for o in self.outputs if o.max_abs_diff is not None and math.isfinite(o.max_abs_diff)]
        return PASSED if compared else SKIPPED


@dataclass
class ComponentReport:
    """Every check of one component, and the structural checks of its file."""

    name: str
    checks: list[Check] = field(default_factory=list)
    structural: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> TargetStatus:
        verdicts = [c.verdict for c in self.checks]
        if FAILED in verdicts:
            return FAILED
        if not verdicts or SKIPPED in verdicts:
            return UNVERIFIED
        return PASSED

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    def why_unverified(self) -> list[str]:
        """One line per check that did not run (empty when the component passed or failed)."""
        if not self.checks:
            return [f"{self.name}: no probe ran"]
        reasons = []
        for check in self.checks:
            if check.verdict != SKIPPED:
                continue
            why = check.error or "no output leaf was compared with the eager model"
            reasons.append(f"{self.name}: probe {check.probe} did not run ({why})")
        return reasons


@dataclass
class GenerationReport:
    """Greedy generation through the exported graphs against eager `generate()`: `passed`, `failed` or `skipped`
    (did not run, `reason` says why).

    `near_ties` lists the steps where the artifact chose another token whose eager score was within tolerance of
    eager's choice (decoding went on with eager's token); `logits_processors` are the processors eager `generate()`
    built, which the exported side applied too; `cache` is the cache the graphs were driven with; `other_prompts`:
    the other prompt lengths a stepped prompt was checked at (any failed fails the report).
    """

    status: CheckStatus
    max_new_tokens: int
    prompt_length: int | None = None
    batch_size: int | None = None
    eager_tokens: list[list[int]] | None = None
    exported_tokens: list[list[int]] | None = None
    first_divergence: dict[str, Any] | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    near_ties: list[dict[str, Any]] = field(default_factory=list)
    logits_processors: list[str] | None = None
    cache: dict[str, Any] | None = None
    matched_tokens: int | None = None  # quantized/half targets: greedy tokens equal to eager's, and the budget
    required_tokens: int | None = None
    # a stepped prompt's parity at a shorter and a longer prompt than the sample's (`exporters.validate.parity`):
    # each `{prompt_length, status, eager_tokens, exported_tokens, first_divergence, near_ties, reason}`
    other_prompts: list[dict[str, Any]] = field(default_factory=list)


# torch.export's words for a guard that fixed a size: `Guard failed: input_ids.size()[1] == 8`
_GUARD = re.compile(r"Guard failed: (?P<input>[\w.]+)\.size\(\)\[(?P<axis>\d+)\] == (?P<size>\d+)")


def did_not_run(component: ComponentReport) -> str | None:
    """Why a failed component failed when no output was compared (the artifact refused a probe), else None: a
    declared dynamic axis that the export fixed is named as exactly that (input, axis, size, the guard).

    Example:
        >>> check = Check("input_ids[1]=5", {}, passed=False, error="Guard failed: input_ids.size()[1] == 8")
        >>> did_not_run(ComponentReport("prefill", checks=[check]))
        "prefill: a declared dynamic axis was specialised at export: 'input_ids' axis 1 is fixed at 8 (guard \
`input_ids.size()[1] == 8`), so the artifact does not run at input_ids[1]=5"
    """
    refused = [check for check in component.checks if check.verdict == FAILED and check.error and not check.outputs]
    if not refused or any(check.verdict == FAILED and check.outputs for check in component.checks):
        return None
    check = refused[0]
    guard = _GUARD.search(check.error or "")
    if guard:
        return (f"{component.name}: a declared dynamic axis was specialised at export: '{guard['input']}' axis "
                f"{guard['axis']} is fixed at {guard['size']} (guard `{guard[0].removeprefix('Guard failed: ')}`), "
                f"so the artifact does not run at {check.probe}")
    return f"{component.name}: the artifact does not run at {check.probe}: {(check.error or '')[:300]}"


@dataclass
class ValidationResult:
    """Everything validation found for one target."""

    components: list[ComponentReport]
    generation: GenerationReport | None
    findings: list[str]
    errors: list[str]
    generation_expected: bool = False
    quality: dict[str, Any] | None = None  # a quantized/half target's verdict (exporters.validate.quality.judge)
    # a float32 target's verdict line, computed by validation from the checks (exporters.validate.quality)
    tolerance: dict[str, Any] | None = None
    # what each deployment runtime showed of the folder (exporters.validate.runtimes.RuntimeProof.to_dict)
    runtimes: list[dict[str, Any]] = field(default_factory=list)

    def component_records(self) -> list[dict[str, Any]]:
        """The components as report.json records them (each check with its verdict)."""
        return [
            {"name": c.name, "verdict": c.verdict, "passed": c.passed, "structural": c.structural,
             "checks": [{**dataclasses.asdict(check), "verdict": check.verdict} for check in c.checks]}
            for c in self.components
        ]

    @property
    def verdict(self) -> TargetStatus:
        if self.errors or any(c.verdict == FAILED for c in self.components):
            return FAILED
        if self.generation is not None and self.generation.status == FAILED:
            return FAILED
        if self.quality is not None and self.quality.get("passed") is False:
            return FAILED
        if any(proof["status"] == FAILED for proof in self.runtimes):  # the runtime it is for cannot run it
            return FAILED
        return UNVERIFIED if self.why_unverified() else PASSED

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    def why_unverified(self) -> list[str]:
        """Which checks did not run, and why (empty when every check ran)."""
        reasons = [line for c in self.components for line in c.why_unverified()]
        if not self.components:
            reasons.append("no component was checked")
        if self.quality is not None and self.quality.get("passed") is None:
            reasons.append(f"quality: {self.quality.get('decided_by')}")
        if self.generation_expected and (self.generation is None or self.generation.status == SKIPPED):
            why = self.generation.reason if self.generation is not None else "it was not run"
            reasons.append(f"generation parity did not run ({why})")
        return reasons


@dataclass
class TargetResult:
    """One target's outcome, as it goes into report.json (`to_dict`) and comes back from it (`from_dict`)."""

    name: str
    export_format: str
    mode: str
    status: TargetStatus
    device: str = "cpu"
    dtype: str | None = None
    components: list[dict[str, Any]] = field(default_factory=list)
    expected_components: list[str] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    generation: dict[str, Any] | None = None
    findings: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    log: str | None = None
    reproduce: str | None = None
    cache_key: str | None = None
    cached: bool = False
    signature: str | None = None  # set by `run` for targets it validated itself (see exporters.run.reuse)
    handed_over: dict[str, Any] | None = None  # not exported: init's checked export taken (exporters.run.handover)
    total_bytes: int | None = None  # every file of the target: what a PR uploads
    weights_stored_bytes: int | None = None  # tensor data in the files, a range shared by two graphs once
    parameter_bytes: int | None = None  # the model's parameters in the target's dtype
    artifact_dtype: str | None = None  # the dtype the files hold (exporters.export.footprint.artifact_dtype)
    quantization: dict[str, Any] | None = None  # what was quantized and how (as in export.json)
    quantize_asked: dict[str, Any] | None = None  # the recipe's quantization, exported or not (`method`, `options`)
    quality: dict[str, Any] | None = None  # the metric that decided (exporters.validate.quality)
    runtimes: list[dict[str, Any]] = field(default_factory=list)  # "runs in": exporters.validate.runtimes
    bench: dict[str, Any] | None = None  # size and speed (exporters.validate.benchmark)
    dtype_files: list[dict[str, Any]] | None = None  # transformers.js's, each judged (exporters.validate.dtype_files)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetResult:
        """A result read back from a report.json (unknown keys, written by a newer version, are dropped)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def record_validation(self, validation: ValidationResult) -> None:
        """Take a validation's components, generation, findings and verdict (with its reasons)."""
        self.components = validation.component_records()
        self.generation = dataclasses.asdict(validation.generation) if validation.generation else None
        self.findings += validation.findings
        self.status = validation.verdict
        self.unverified = validation.why_unverified() if self.status == UNVERIFIED else []

        self.quality = validation.quality or validation.tolerance
        self.runtimes = list(validation.runtimes)
        if validation.errors:
            self.error = _validation_error("; ".join(validation.errors))
        elif self.status == FAILED:
            reasons = []
            if validation.quality is not None and validation.quality.get("passed") is False:
                reasons.append(f"quality outside its budget: {validation.quality['decided_by']}")
            failing = [c for c in validation.components if c.verdict == FAILED]
            reasons += [reason for c in failing if (reason := did_not_run(c)) is not None]
            differing = [c.name for c in failing if did_not_run(c) is None]
            if differing:
                reasons.append(f"outputs differ from the eager model beyond tolerance in {differing}")
            generation = validation.generation
            if generation is not None and generation.status == FAILED:
                reasons.append(f"generation parity failed: {generation.reason or f'first divergence {generation.first_divergence}'}")
            reasons += [f"{proof['runtime']} cannot run it: {proof.get('detail') or 'no message'}"
                        for proof in validation.runtimes if proof["status"] == FAILED]
            self.error = _validation_error("; ".join(reasons))


def _validation_error(message: str) -> dict[str, Any]:
    """A failed validation's error as report.json records it; a cause that is upstream's (a runtime with no kernel for
    an operator: complex-number RoPE's `view_as_complex` in ExecuTorch) said so, as `error_record` says it."""
    error: dict[str, Any] = {"type": "ValidationError", "message": message}
    upstream = upstream_cause(message)
    if upstream:
        error["upstream"] = upstream
        error["message"] += f" [{upstream}]"
    return error

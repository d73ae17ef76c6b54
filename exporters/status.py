"""The typed states shared by the pipeline, the report, publishing and the front ends.

Three verdicts for a check: it ran and passed, it ran and failed, or it did not run. Only the first is a pass: a
target whose checks did not all run is `unverified`, never `passed`.

Example:
    >>> is_passed("passed"), is_passed("unverified")
    (True, False)
    >>> sorted(TARGET_STATUSES)
    ['crashed', 'failed', 'passed', 'timed_out', 'unverified']
"""

from __future__ import annotations

from typing import Literal, get_args

TargetStatus = Literal["passed", "failed", "unverified", "crashed", "timed_out"]
PASSED: TargetStatus = "passed"
FAILED: TargetStatus = "failed"
UNVERIFIED: TargetStatus = "unverified"
CRASHED: TargetStatus = "crashed"
TIMED_OUT: TargetStatus = "timed_out"
TARGET_STATUSES: tuple[str, ...] = get_args(TargetStatus)

# One check (a probe, generation parity): it ran and passed, ran and failed, or did not run.
CheckStatus = Literal["passed", "failed", "skipped"]
SKIPPED: CheckStatus = "skipped"

RunStatus = Literal["passed", "failed", "unverified"]

# `hf-export init`: how one format fared, and how one dynamic dimension is declared in the proposed recipe.
FormatOutcome = Literal["pending", "passed", "left_out"]
PENDING: FormatOutcome = "pending"
LEFT_OUT: FormatOutcome = "left_out"
DimState = Literal["named", "auto", "static"]
NAMED: DimState = "named"
AUTO: DimState = "auto"
STATIC: DimState = "static"

# What publishing did (`failed`: it could not; `none`: a dry run, nothing sent).
PublishOperation = Literal["created", "updated", "unchanged", "superseded", "discussion", "none", "failed"]


def is_passed(status: str) -> bool:
    """Whether a target (or a run) status is a pass: only `passed` is."""
    return status == PASSED


def overall_status(statuses: list[str]) -> RunStatus:
    """A run's status: `passed` when every target passed; `unverified` when the only non-passes are unverified;
    `failed` otherwise (and for a run with no target).

    Example:
        >>> overall_status(["passed", "unverified"]), overall_status(["unverified", "crashed"]), overall_status([])
        ('unverified', 'failed', 'failed')
    """
    if not statuses:
        return FAILED
    if all(s == PASSED for s in statuses):
        return PASSED
    if all(s in (PASSED, UNVERIFIED) for s in statuses):
        return UNVERIFIED
    return FAILED

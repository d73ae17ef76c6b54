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

# A generating runtime's proof over fewer new tokens than this compared with eager's proves little (a tiny SmolVLM
# stopping at eos after one token showed "1/1 tokens"): never shown as a pass ([`judge_token_count`])
MIN_COMPARED_TOKENS = 2
SHORT_MARK = "⚠"  # the flag at the head of the detail of a proof over fewer tokens than asked

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


def judge_token_count(status: str, detail: str, compared: int | None, asked: int | None,
                      ended: str | None = None) -> tuple[str, str]:
    """A runtime proof's status and detail once its token count is read: a pass that compared fewer new tokens with
    eager's than were asked (`compared` of `asked`; `ended` says why) is flagged at the head of its detail, and one
    that compared fewer than `MIN_COMPARED_TOKENS` is `unverified` (a check that did not run is not a pass). Any
    other proof is as it was; a flagged one (a matrix leg's, read back) is not flagged twice.

    Example:
        >>> judge_token_count("passed", "5/5 tokens", 5, 8, "eos came first")
        ('passed', '⚠ 5 of 8 tokens compared (eos came first): 5/5 tokens')
        >>> judge_token_count("passed", "1/1 tokens", 1, 8, "eos came first")[0]
        'unverified'
        >>> judge_token_count("passed", "8/8 tokens", 8, 8)
        ('passed', '8/8 tokens')
    """
    if status != PASSED or compared is None or asked is None or compared >= asked:
        return status, detail
    few = compared < MIN_COMPARED_TOKENS
    verdict = UNVERIFIED if few else PASSED
    if detail.startswith(SHORT_MARK):
        return verdict, detail
    why = f" ({ended})" if ended else ""
    return verdict, (f"{SHORT_MARK} {'only ' if few else ''}{compared} of {asked} tokens compared"
                     f"{', too few to prove generation' if few else ''}{why}: {detail}")

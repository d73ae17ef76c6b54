"""One pure decision: given the plan's marker and what the Hub holds, what publishing does. No I/O here.

| what the Hub holds (our threads of the slot, the base branch)                    | decision     |
|----------------------------------------------------------------------------------|--------------|
| the open thread holds a newer source commit than this run                        | `superseded` |
| the base branch moved past this run's commit to one with other model files       | `superseded` |
| an open thread of this kind with the same fingerprint (or, with none open, the   | `unchanged`  |
|   newest closed one: a PR the owner closed is not reopened for the same inputs)  |              |
| an open PR with another fingerprint                                              | `update`     |
| no open PR                                                                       | `create`     |
| a failed run (kind `failure`): open discussion updated, else a new one           | `discussion` |

"Newer" is decided on the base branch's history: a commit nearer its head is newer; a commit that is not on it
(a local run, another branch) is never called older. A dry run is `decide` without doing.

Example:
    >>> marker = {"kind": "exports", "recipe": "repo", "base": "main", "source_sha": "b" * 40}
    >>> newer = ThreadState(3, True, "open", {**marker, "source_sha": "c" * 40})
    >>> view = HubView((newer,), history=("c" * 40, "b" * 40))
    >>> decide(marker, view).operation
    'superseded'
    >>> decide(marker, HubView(())).operation
    'create'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from exporters.publish.markers import same_fingerprint, same_slot

Operation = Literal["create", "update", "unchanged", "superseded", "discussion"]
OPEN_STATUSES = ("open", "draft")


@dataclass(frozen=True)
class ThreadState:
    """One of our PRs or discussions, as far as deciding goes: its number, kind, status and marker."""

    num: int
    is_pull_request: bool
    status: str
    marker: dict[str, Any]
    url: str = ""
    title: str = ""

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES


@dataclass(frozen=True)
class HubView:
    """What the Hub holds, as publishing needs it.

    `threads`: our threads carrying a marker, any slot, newest first. `history`: the base branch's commits, newest
    first, as far back as needed (None: not known). `inputs_changed`: whether the base head's model files or recipe
    differ from the source commit's (None: not known, or the same commit).
    """

    threads: tuple[ThreadState, ...]
    history: tuple[str, ...] | None = None
    inputs_changed: bool | None = None

    @property
    def base_head(self) -> str | None:
        return self.history[0] if self.history else None


@dataclass(frozen=True)
class Decision:
    """What to do: `operation`, the thread it applies to (update / unchanged / discussion to update), and why."""

    operation: Operation
    reason: str
    thread: ThreadState | None = None


def in_slot(view: HubView, marker: dict[str, Any], kind: str | None = None) -> list[ThreadState]:
    """Our threads of `marker`'s slot (of `kind`, default the marker's own), newest first."""
    kind = kind or marker.get("kind")
    slot = {**marker, "kind": kind}
    return [t for t in view.threads if same_slot(t.marker, slot) and t.is_pull_request == (kind != "failure")]


def superseded_by(marker: dict[str, Any], view: HubView) -> str | None:
    """Why a run of `marker`'s source commit must not publish (a newer export exists or is due), or None."""
    source = marker.get("source_sha")
    if not source or not view.history or source not in view.history:
        return None
    position = {commit: index for index, commit in enumerate(view.history)}
    slot = [t for t in view.threads if t.is_open and all(t.marker.get(k) == marker.get(k) for k in ("recipe", "base"))]
    for thread in slot:
        held = thread.marker.get("source_sha")
        if held and held in position and position[held] < position[source]:
            noun = "PR" if thread.is_pull_request else "discussion"
            return (f"{noun} #{thread.num} already holds a newer commit ({held[:7]}) than this run's "
                    f"({source[:7]}): nothing is published")
    if position[source] > 0 and view.inputs_changed:
        return (f"{marker.get('base')} has moved to {view.history[0][:7]}, which changes the model or its recipe, "
                f"since this run's commit {source[:7]}: nothing is published (the newer commit gets its own run)")
    return None


def decide(plan: Any, view: HubView) -> Decision:
    """The decision for `plan` (a `PublishPlan`, or its marker) given what the Hub holds (see the module's table)."""
    marker: dict[str, Any] = getattr(plan, "marker", plan)
    superseded = superseded_by(marker, view)
    if superseded:
        return Decision("superseded", superseded)
    mine = in_slot(view, marker)
    is_pr = marker.get("kind") != "failure"
    noun = "PR" if is_pr else "discussion"
    open_thread = min((t for t in mine if t.is_open), key=lambda t: t.num, default=None)
    latest = open_thread or (mine[0] if mine else None)
    if latest is not None and same_fingerprint(latest.marker, marker):
        state = "" if latest.is_open else f" ({latest.status}; not reopened for the same inputs)"
        return Decision("unchanged", f"{noun} #{latest.num}{state} already holds this run (same source, recipe and "
                                     "tools): nothing to do", latest)
    if not is_pr:
        if open_thread is not None:
            return Decision("discussion", f"update discussion #{open_thread.num}", open_thread)
        return Decision("discussion", "open a new discussion")
    if open_thread is not None:
        return Decision("update", f"update PR #{open_thread.num}", open_thread)
    return Decision("create", "open a new pull request")


def duplicates_of(created: int, marker: dict[str, Any], view: HubView) -> ThreadState | None:
    """After opening thread `created`: the lowest-numbered other open thread of the slot, which wins (a concurrent
    run opened it), or None when `created` is the one that stays."""
    rivals = [t for t in in_slot(view, marker) if t.is_open and t.num != created]
    lowest = min(rivals, key=lambda t: t.num, default=None)
    return lowest if lowest is not None and lowest.num < created else None

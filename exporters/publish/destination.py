"""Where a run publishes (the Hub repo, the branch its PR targets) and how much it may upload: one answer for the
CLI, the Action and the bot.

Example:
    >>> publish_destination("org/model", revision="a" * 40)
    Destination(repo_id='org/model', base='main')
    >>> publish_destination("org/model", repo_id="org/other", revision="dev")
    Destination(repo_id='org/other', base='dev')
    >>> parse_size("20GB"), parse_size("1.5 MB"), parse_size("0")
    (21474836480, 1572864, 0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.utils import validate_repo_id

from exporters.errors import PublishError

DEFAULT_MAX_UPLOAD_BYTES = 20 * 1024 ** 3  # one PR: 20 GiB (a 1.5B fp32 model in three formats); 0 lifts the limit
_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Destination:
    """The Hub repo to publish to, and the branch the PR targets."""

    repo_id: str
    base: str


def pr_base(revision: str | None) -> str:
    """The branch a PR targets for a run of `revision`: the branch itself, else `main` (a commit id, a PR ref, none).

    Example:
        >>> pr_base(None), pr_base("dev"), pr_base("refs/heads/dev"), pr_base("refs/pr/3"), pr_base("0" * 40)
        ('main', 'dev', 'dev', 'main', 'main')
    """
    if not revision or _COMMIT.fullmatch(revision) or revision.startswith("refs/pr/"):
        return "main"
    return revision.removeprefix("refs/heads/")


def check_repo_id(repo_id: str) -> str:
    """`repo_id` when it names a Hub repo (`org/name`); `PublishError` (option `repo_id`) otherwise."""

    try:
        validate_repo_id(repo_id)
    except Exception as err:
        raise PublishError(f"{repo_id!r} is not a Hub repo id ({err}): say where to publish with `repo_id` (ORG/NAME)",
                           option="repo_id") from None
    if "/" not in repo_id:
        raise PublishError(f"{repo_id!r} has no namespace: say where to publish with `repo_id` (ORG/NAME)",
                           option="repo_id")
    return repo_id


def publish_destination(model: str, *, repo_id: str | None = None, revision: str | None = None) -> Destination:
    """Where a run of `model` at `revision` publishes: `repo_id` when given, else `model` when it is a Hub repo id
    (not a local folder); the PR targets `pr_base(revision)`. `PublishError` (option `repo_id`) when there is no repo.
    """
    if repo_id is None:
        if Path(model).exists():
            raise PublishError(f"{model} is a local folder: say which Hub repo to publish to with `repo_id` "
                               "(ORG/NAME)", option="repo_id")
        repo_id = model
    return Destination(check_repo_id(repo_id), pr_base(revision))


def parse_size(text: str | int) -> int:
    """Bytes from `20GB`, `512 MB`, `1.5GiB` or a plain number (binary units); `ValueError` otherwise."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match:
        raise ValueError(f"{text!r} is not a size: write it like 20GB, 512MB or 0 (no limit)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[f"{unit}B" if unit else ""])

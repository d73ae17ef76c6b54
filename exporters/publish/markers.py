"""The hidden marker that names a thread's slot and records what it holds.

Each PR or discussion this tool opens carries, in its description, an HTML comment holding JSON:
`<!-- export-action:publish {"kind": ..., "recipe": ..., "base": ..., "source_sha": ..., ...} -->`. A *slot* is
(repo, account, kind, recipe, base branch); the *fingerprint* is what a run's inputs and outcome were (source commit,
weights, recipe, tools, cache keys, targets). A duplicate closed by a racing run carries `DUPLICATE_TAG` too, and
never counts again.

Example:
    >>> text = "report... " + render_marker({"kind": "exports", "recipe": "repo", "base": "main"})
    >>> parse_marker(text)["kind"], same_slot(parse_marker(text), {"kind": "exports", "recipe": "repo", "base": "main"})
    ('exports', True)
"""

from __future__ import annotations

import json
import re
from typing import Any

MARKER_TAG = "export-action:publish"
DUPLICATE_TAG = "<!-- export-action:duplicate -->"
SLOT_KEYS = ("kind", "recipe", "base")
FINGERPRINT_KEYS = ("source_sha", "weights_sha256", "recipe_sha256", "versions", "cache_keys", "published", "failed",
                    "unverified")
_MARKER_RE = re.compile(r"<!--\s*" + re.escape(MARKER_TAG) + r"\s+(\{.*?\})\s*-->", re.S)


def render_marker(marker: dict[str, Any]) -> str:
    """The hidden marker: an HTML comment holding JSON (`>` escaped, so it can never close the comment).

    Example:
        >>> render_marker({"kind": "exports"})
        '<!-- export-action:publish {"kind": "exports"} -->'
    """
    payload = json.dumps(marker, sort_keys=True).replace(">", "\\u003e")
    return f"<!-- {MARKER_TAG} {payload} -->"


def parse_marker(text: str) -> dict[str, Any] | None:
    """The last marker in `text`, or None.

    Example:
        >>> parse_marker('report... <!-- export-action:publish {"kind": "exports"} -->')
        {'kind': 'exports'}
    """
    found = None
    for match in _MARKER_RE.finditer(text or ""):
        try:
            value = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(value, dict):
            found = value
    return found


def same_slot(marker: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two markers name the same slot (kind, recipe, base branch)."""
    return all(marker.get(key) == other.get(key) for key in SLOT_KEYS)


def same_fingerprint(marker: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two markers describe the same inputs and outcome (publishing again would change nothing).
    Keys a marker does not use (e.g. a recipe PR has no `cache_keys`) compare equal when both lack them."""
    return all(_value(marker, key) == _value(other, key) for key in (*FINGERPRINT_KEYS, "fingerprint"))


def _value(marker: dict[str, Any], key: str) -> Any:
    value = marker.get(key)
    return None if value in ([], {}, "") else value  # an older marker without the key holds the same as empty

"""Reusing a validated target on a rerun, only when this tool validated it itself and nothing it depended on changed.

A rerun whose inputs (weights and code, the recipe's target, the tools, the device, the revision) are unchanged
reuses the artifacts of an earlier `run`. The earlier report.json is not evidence by itself: anyone can write one
(a folder checked into the workspace, restored from a cache, or written by `validate`). So `run` signs each target
it validated with an HMAC key kept outside the output folder (`$EXPORT_ACTION_STATE_DIR`, else
`~/.cache/export-action`), and a target is reused only when its signature verifies, its status is `passed`, its
cache key matches, and its files are still the ones it signed.

Example:
    >>> import tempfile
    >>> signer = Signer(Path(tempfile.mkdtemp()))
    >>> entry = {"name": "onnx", "status": "passed", "cache_key": "k", "files": []}
    >>> entry["signature"] = signer.sign(entry)
    >>> signer.verify(entry), signer.verify({**entry, "cache_key": "other"})
    (True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from exporters.hashing import file_entries
from exporters.report.results import TargetResult
from exporters.status import PASSED

KEY_FILE = "report-signing.key"


def state_dir() -> Path:
    """Where the tool keeps its own state (the signing key): never inside an output folder."""
    configured = os.environ.get("EXPORT_ACTION_STATE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "export-action"


class Signer:
    """HMAC-SHA256 over what a reused target depends on: name, status, cache key, and each file's path, size and
    sha256."""

    def __init__(self, directory: Path | None = None):
        self.path = (directory or state_dir()) / KEY_FILE
        self._key: bytes | None = None

    def _load_key(self) -> bytes:
        if self._key is None:
            try:
                self._key = bytes.fromhex(self.path.read_text().strip())
            except (OSError, ValueError):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                key = secrets.token_bytes(32)
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(descriptor, "w") as handle:
                    handle.write(key.hex())
                self._key = key
        return self._key

    @staticmethod
    def _material(entry: dict[str, Any]) -> bytes:
        files = [(f.get("path"), f.get("size"), f.get("sha256")) for f in entry.get("files") or []]
        return json.dumps([entry.get("name"), entry.get("status"), entry.get("cache_key"), files]).encode()

    def sign(self, entry: dict[str, Any]) -> str:
        return hmac.new(self._load_key(), self._material(entry), hashlib.sha256).hexdigest()

    def verify(self, entry: dict[str, Any]) -> bool:
        signature = entry.get("signature")
        return isinstance(signature, str) and hmac.compare_digest(signature, self.sign(entry))


def previous_report(out_dir: Path) -> dict[str, Any]:
    """The report.json an earlier run left in `out_dir` ({} when none or unreadable)."""
    try:
        report = json.loads((out_dir / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def reusable(previous: dict[str, Any] | None, key: str, out_dir: Path, signer: Signer) -> TargetResult | None:
    """The earlier passing result for this cache key, when this tool signed it and its files are unchanged."""
    if not isinstance(previous, dict) or previous.get("status") != PASSED or previous.get("cache_key") != key:
        return None
    if not signer.verify(previous):
        return None
    name = previous.get("name")
    directory = out_dir / str(name)
    if not isinstance(name, str) or directory.is_symlink() or not directory.is_dir():
        return None
    files = previous.get("files") or []
    current = file_entries(directory, out_dir, known={f["path"]: f for f in files if isinstance(f, dict)})

    def identity(entries: list[dict[str, Any]]) -> list[tuple[Any, Any, Any]]:
        return [(f.get("path"), f.get("size"), f.get("sha256")) for f in entries]

    if identity(current) != identity(files):
        return None
    result = TargetResult.from_dict(previous)
    result.cached = True
    return result

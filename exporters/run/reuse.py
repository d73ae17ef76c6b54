"""Reusing a validated target on a rerun, only when this tool validated it itself and nothing it depended on changed.

A rerun whose inputs (weights and code, the recipe's target, the tools and this tool's own sources, the device, the
revision) are unchanged reuses the artifacts of an earlier `run`. The earlier report.json is not evidence by itself: anyone can write one
(a folder checked into the workspace, restored from a cache, or written by `validate`). So `run` signs each target
it validated with an HMAC key kept outside the output folder (`$EXPORT_ACTION_STATE_DIR`, else
`~/.cache/export-action`), over the whole target record, and a target is reused only when its signature verifies,
its status is `passed`, its cache key matches (the weights hashed again on every run), and its files, hashed again,
are byte for byte the ones it signed.

Example:
    >>> import tempfile
    >>> signer = Signer(Path(tempfile.mkdtemp()))
    >>> entry = {"name": "onnx", "status": "passed", "cache_key": "k", "files": []}
    >>> entry["signature"] = signer.sign(entry)
    >>> signer.verify(entry), signer.verify({**entry, "cache_key": "other"}), signer.verify({**entry, "findings": ["ok"]})
    (True, False, False)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from exporters.hashing import file_entries
from exporters.report.results import TargetResult
from exporters.status import PASSED

KEY_FILE = "report-signing.key"
KEY_BYTES = 32
# Bumped when what is signed changes: a record signed under another scheme never verifies.
SIGNATURE_DOMAIN = b"export-action target record v2\0"
UNSIGNED_FIELDS = ("signature", "cached")  # the signature itself, and whether this run reused the record
logger = logging.getLogger(__name__)


def state_dir() -> Path:
    """Where the tool keeps its own state (the signing key): never inside an output folder."""
    configured = os.environ.get("EXPORT_ACTION_STATE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "export-action"


class Signer:
    """HMAC-SHA256 over a whole target record, as report.json holds it (canonical JSON: sorted keys, no spaces),
    minus `signature` and `cached`: every field that reaches report.md or a PR (findings, components, quality,
    files...) is covered, and a record edited in any field no longer verifies.

    The key is a file only its owner can read (`report-signing.key`, mode 0600, outside every output folder). A key
    file that is a link, not a regular file, not owned by this user or open to others is not used: anyone who could
    read or plant it could sign a forged report. It is replaced by a new key (earlier signatures stop verifying, so
    those targets are exported again).
    """

    def __init__(self, directory: Path | None = None):
        self.path = (directory or state_dir()) / KEY_FILE
        self._key: bytes | None = None

    def _read_key(self) -> bytes | bool:
        """The key, when the file is a safe one: a regular file (never through a link), ours, mode 0600 or
        stricter, holding 32 bytes in hex. False when there is no file, True when there is one not to use."""
        try:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return False
        except OSError:  # a link (ELOOP), unreadable, not a file
            return True
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                    or stat.S_IMODE(info.st_mode) & 0o077):
                return True
            try:
                key = bytes.fromhex(handle.read(256).decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                return True
        return key if len(key) == KEY_BYTES else True

    def _create_key(self) -> None:
        """A new key, written to a private temp file and linked into place (a reader never sees half a key, and
        a key another run created at the same moment is kept)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}.tmp")
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_bytes(KEY_BYTES).hex())
            try:
                os.link(tmp, self.path, follow_symlinks=False)
            except FileExistsError:
                pass
        finally:
            tmp.unlink()

    def _load_key(self) -> bytes:
        if self._key is not None:
            return self._key
        for _ in range(3):
            key = self._read_key()
            if isinstance(key, bytes):
                self._key = key
                return key
            if key:
                logger.warning("%s is not a private key file of this user (a link, open to others, or not a key): "
                               "replaced by a new key; earlier cached targets will be exported again", self.path)
                try:
                    self.path.unlink(missing_ok=True)  # the link or the file itself, never what a link points to
                except IsADirectoryError:
                    raise PermissionError(f"{self.path} is a folder, not a signing key: remove it") from None
            self._create_key()
        raise PermissionError(f"cannot make a private signing key at {self.path}: another user keeps replacing it; "
                              "set EXPORT_ACTION_STATE_DIR to a folder only you can write")

    @staticmethod
    def _material(entry: dict[str, Any]) -> bytes:
        record = {key: value for key, value in entry.items() if key not in UNSIGNED_FIELDS}
        normal = json.loads(json.dumps(record, default=str))  # what report.json holds (tuples, paths as written)
        return SIGNATURE_DOMAIN + json.dumps(normal, sort_keys=True, separators=(",", ":")).encode()

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
    """The earlier passing result for this cache key, when this tool signed the whole record and the target's files
    on disk are, byte for byte, the ones it signed (every file is hashed again: a size and an mtime can be put
    back, and the record's own `mtime_ns` is only what the folder claims)."""
    if not isinstance(previous, dict) or previous.get("status") != PASSED or previous.get("cache_key") != key:
        return None
    if not signer.verify(previous):
        return None
    name = previous.get("name")
    directory = out_dir / str(name)
    if not isinstance(name, str) or directory.is_symlink() or not directory.is_dir():
        return None
    files = previous.get("files") or []
    current = file_entries(directory, out_dir)

    def identity(entries: list[dict[str, Any]]) -> list[tuple[Any, Any, Any]]:
        return [(f.get("path"), f.get("size"), f.get("sha256")) for f in entries if isinstance(f, dict)]

    if not files or identity(current) != identity(files):
        return None
    result = TargetResult.from_dict(previous)
    result.cached = True
    return result

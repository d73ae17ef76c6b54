"""Paths in the output folder that never follow a link someone planted there.

Every folder and file the pipeline creates, replaces or removes under the output folder goes through these: a link
found where a staging folder, a target folder, the logs folder or a log file goes is removed (the link, never what it
points to) and replaced by a real one.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> elsewhere = Path(tempfile.mkdtemp())
    >>> (root / "logs").symlink_to(elsewhere)
    >>> real_dir(root / "logs").is_symlink(), elsewhere.exists()
    (False, True)
"""

from __future__ import annotations

import shutil
from pathlib import Path


def remove(path: Path) -> None:
    """Remove `path`: a link or a file is unlinked (never followed), a folder deleted with its content."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def real_dir(path: Path) -> Path:
    """`path` as a real folder (created when missing; a link there is replaced, not followed)."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def fresh_dir(path: Path) -> Path:
    """`path` as a new, empty, real folder (whatever was there is removed, links unlinked)."""
    remove(path)
    path.mkdir(parents=True)
    return path


def fresh_file(path: Path, text: str = "") -> Path:
    """`path` as a new real file holding `text` (a link there is replaced, not written through)."""
    remove(path)
    path.write_text(text)
    return path


def move_into_place(staging: Path, final: Path) -> None:
    """Replace `final` (folder, file or link) by `staging` in one rename."""
    remove(final)
    staging.rename(final)

"""Paths in the output folder that never follow a link someone planted there, and model files never read through
one.

Every folder and file the tool creates, replaces or removes goes through these: a link found where a staging folder,
a target folder, the logs folder or a log file goes is removed (the link, never what it points to) and replaced by a
real one. Every file the tool writes (reports, `publish.json`, `problem.json`, a proposed recipe, its summary, a
child's result) is written by [`write_file`]: into a new temporary file beside it (`O_CREAT | O_EXCL | O_NOFOLLOW`,
a random name: nothing planted can be written through), then renamed over the name, which replaces a link there
instead of following it. Logs are opened by [`open_log`] (`O_NOFOLLOW`).

A model folder's files are copied into an artifact (the transformers.js layout's tokenizer files) by
[`copy_model_file`], and the files whose content is rewritten into an artifact (`config.json`,
`generation_config.json`) are checked by [`model_file`]: a link is never followed, so a model folder (a pull
request's checkout) cannot make the tool copy a file from elsewhere (`chat_template.jinja -> ~/.ssh/id_rsa`). The
one link accepted is the one `huggingface_hub` makes in its cache: `snapshots/<rev>/<name> -> ../../blobs/<hash>`, to
a regular file in that repo's real `blobs` folder.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> elsewhere = Path(tempfile.mkdtemp())
    >>> (root / "logs").symlink_to(elsewhere)
    >>> real_dir(root / "logs").is_symlink(), elsewhere.exists()
    (False, True)
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from .errors import ModelSourceError

_BLOB_LINK = re.compile(r"^(?:\.\./)+blobs/[0-9a-f]{40,64}$")


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
    write_file(path, text)
    return path


def write_file(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Write `data` (text as UTF-8) to `path` atomically, never through a link: into a new temporary file beside it
    (created exclusively, links not followed), then renamed over `path` (a link there is replaced, its target left
    alone). A reader sees the old file or the new one, never half of one.

    Example:
        >>> folder = Path(tempfile.mkdtemp())
        >>> victim = Path(tempfile.mkdtemp()) / "victim"
        >>> _ = victim.write_text("mine")
        >>> (folder / "report.json").symlink_to(victim)
        >>> write_file(folder / "report.json", "{}")
        >>> victim.read_text(), (folder / "report.json").is_symlink()
        ('mine', False)
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def open_log(path: Path) -> int:
    """A descriptor appending to the log file `path` (created when missing; a link there is refused, not followed:
    `OSError`)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)


def _hub_blob(path: Path) -> bool:
    """Whether the link `path` is one `huggingface_hub` made in its cache: `snapshots/<rev>/.../<name>` to
    `../../blobs/<hash>` of the same repo, a regular file in a real `blobs` folder."""
    text = os.readlink(path)
    if not _BLOB_LINK.match(text):
        return False
    depth = text.count("../")
    root = path.parent
    for _ in range(depth - 1):
        root = root.parent
    if root.name != "snapshots":
        return False
    blobs = root.parent / "blobs"
    target = path.parent / text
    return (not blobs.is_symlink() and blobs.is_dir() and target.parent.resolve() == blobs.resolve()
            and not target.is_symlink() and target.is_file())


def model_file(folder: Path, name: str) -> Path | None:
    """`folder / name` when it is a regular file of the model folder, None when it is missing; `ModelSourceError`
    when it is a link (other than `huggingface_hub`'s own, into its cache's blobs) or when a folder on its way is one
    ([`model_subfolder`]): a model's files are never read through a link into an artifact.

    Example:
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "chat_template.jinja").symlink_to("/etc/hostname")
        >>> model_file(folder, "chat_template.jinja")
        Traceback (most recent call last):
        ...
        exporters.errors.ModelSourceError: chat_template.jinja in the model folder is a link: a model's files are never copied through a link (it could point anywhere on this machine); replace it by the file itself
    """
    parent = PurePosixPath(name).parent
    if str(parent) != "." and model_subfolder(folder, str(parent)) is None:
        return None
    path = Path(folder) / name
    if path.is_symlink():
        if _hub_blob(path):
            return path
        raise ModelSourceError(f"{name} in the model folder is a link: a model's files are never copied through a "
                               "link (it could point anywhere on this machine); replace it by the file itself")
    return path if path.is_file() else None


def model_subfolder(folder: Path, relative: str) -> Path | None:
    """`folder / relative` when it is a real folder of the model folder, None when it is missing. Every component is
    checked, not only the last: `ModelSourceError` when one is a link (`st/.docker` with `st` a link to a home
    folder) or when `relative` leaves the folder (absolute, `..`).

    Example:
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "st").symlink_to(tempfile.mkdtemp())
        >>> model_subfolder(folder, "st/.docker")
        Traceback (most recent call last):
        ...
        exporters.errors.ModelSourceError: st in the model folder is a link: a model's files are never copied through a link (it could point anywhere on this machine); replace it by the folder itself
    """
    pure = PurePosixPath(relative)
    if not pure.parts or pure.is_absolute() or ".." in pure.parts:
        raise ModelSourceError(f"{relative!r} is not a folder inside the model folder")
    path = Path(folder)
    for index, part in enumerate(pure.parts):
        path = path / part
        if path.is_symlink():
            raise ModelSourceError(f"{PurePosixPath(*pure.parts[:index + 1])} in the model folder is a link: a "
                                   "model's files are never copied through a link (it could point anywhere on this "
                                   "machine); replace it by the folder itself")
        if not path.is_dir():
            return None
    return path


def copy_model_file(folder: Path, name: str, destination: Path) -> bool:
    """Copy the model folder's file `name` to `destination` (written by [`write_file`]) when it has one; False when
    it has none. `ModelSourceError` when it is a link (see [`model_file`])."""
    path = model_file(folder, name)
    if path is None:
        return False
    flags = os.O_RDONLY | (0 if path.is_symlink() else os.O_NOFOLLOW)  # a Hub cache link was checked just above
    descriptor = os.open(path, flags)
    with os.fdopen(descriptor, "rb") as handle:
        write_file(destination, handle.read())
    return True


def move_into_place(staging: Path, final: Path) -> None:
    """Replace `final` (folder, file or link) by `staging` in one rename."""
    remove(final)
    staging.rename(final)

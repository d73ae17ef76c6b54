"""File identities: streaming sha256, per-file entries for reports, and which model files make an export's inputs.

Example:
    >>> is_weight_file("model.safetensors"), is_weight_file("export_config.json"), is_weight_file("exports/a.onnx")
    (True, False, False)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from exporters.files import RECIPE_FILE

# Top-level files of a model repo whose content an export depends on: weights, configs, tokenizer files, and the
# model's own code (`auto_map` modules). The recipe is hashed separately, and nothing under a folder (previous
# exports) counts.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".py")
CHUNK = 1 << 20


def is_weight_file(name: str) -> bool:
    """Whether a model repo file (path relative to the repo root) is one of an export's inputs besides the recipe:
    weights, configs, tokenizer files, code."""
    return "/" not in name and name != RECIPE_FILE and name.endswith(WEIGHT_SUFFIXES)


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(path: Path, name: str) -> dict[str, Any]:
    """`{path, size, sha256, mtime_ns}` of a file, its bytes hashed every time: a size and an mtime prove nothing
    (both can be put back after the bytes changed), and a hash read from an earlier report is only what that
    report claims. `mtime_ns` is recorded for people, never trusted."""
    stat = path.stat()
    return {"path": name, "size": stat.st_size, "sha256": sha256_file(path), "mtime_ns": stat.st_mtime_ns}


def file_entries(directory: Path, base: Path) -> list[dict[str, Any]]:
    """Every regular file under `directory` (links are not followed): path relative to `base`, size, sha256."""
    paths = sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())
    return [file_entry(path, path.relative_to(base).as_posix()) for path in paths]


def weights_fingerprint(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """A hash of the model's weights, configs, tokenizer and code files (an export's inputs besides the recipe and
    the tools), and the per-file entries it came from; every file is hashed again on every run, so the cache key
    never rests on an earlier report's record of them."""
    entries = [file_entry(path, path.name) for path in sorted(folder.iterdir())
               if path.is_file() and is_weight_file(path.name)]
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry['path']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest(), entries

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


def file_entry(path: Path, name: str, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """`{path, size, sha256, mtime_ns}` of a file; the hash is reused from `known` when size and mtime match (the
    way make and git decide a file is unchanged), so a rerun does not re-read gigabytes."""
    stat = path.stat()
    previous = (known or {}).get(name)
    if previous and previous.get("size") == stat.st_size and previous.get("mtime_ns") == stat.st_mtime_ns:
        digest = previous["sha256"]
    else:
        digest = sha256_file(path)
    return {"path": name, "size": stat.st_size, "sha256": digest, "mtime_ns": stat.st_mtime_ns}


def file_entries(directory: Path, base: Path, known: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every regular file under `directory` (links are not followed): path relative to `base`, size, sha256."""
    paths = sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())
    return [file_entry(path, path.relative_to(base).as_posix(), known) for path in paths]


def weights_fingerprint(folder: Path, known: list[dict[str, Any]] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """A hash of the model's weights, configs, tokenizer and code files (an export's inputs besides the recipe and
    the tools), and the per-file entries it came from."""
    by_name = {entry["path"]: entry for entry in known or []}
    entries = [file_entry(path, path.name, by_name) for path in sorted(folder.iterdir())
               if path.is_file() and is_weight_file(path.name)]
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry['path']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest(), entries

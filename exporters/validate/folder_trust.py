"""A runtime proof reads only what this run wrote: before any runtime opens a target folder, everything in it is
accounted for, and no config a runtime executes from names code to load.

```
export (its child)                          validation (this process), before a runtime opens the folder
written: the folder after the export's ──► screen_folder(directory, inventory): refusals, each naming the file
own writes; copied: the allow-listed        · every file is in the inventory and unchanged (configs by sha256,
names complete_folder copied                  programs and weights by size)
take_inventory(): {path: by, size, sha256}  · a runtime config (genai_config.json) was written by the export
                                            · no link, no native library (ELF, Mach-O), anywhere
                                            · no key of a runtime config that loads code or names a path
may_read(check, inventory): a runtime whose config (`check.executes`) the export did not write does not apply
```

`hf-export validate` has no inventory (this run wrote nothing there): the last two rules hold, so a planted
`custom_ops_library` is refused before ONNX Runtime GenAI could load it. A refusal fails the target and every proof
that would have opened the folder.

Example:
    >>> code_loading_keys({"model": {"decoder": {"session_options": {"custom_ops_library": "ops.so"}}}})
    ['model.decoder.session_options.custom_ops_library: loads a native library into the runtime']
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from exporters.capture.source import RUNTIME_CONFIGS, copyable
from exporters.hashing import sha256_file

__all__ = ["code_loading_keys", "may_read", "screen_folder", "take_inventory"]

Inventory = dict[str, dict[str, Any]]
# Programs and weights: a runtime loads them as data, never as its config; their size is checked (their bytes are
# hashed for the report: `exporters.hashing.file_entries`), every other file's sha256.
PROGRAM_SUFFIXES = (".onnx", ".onnx_data", ".data", ".pte", ".ptd", ".pt2", ".safetensors", ".bin")
NATIVE_MAGIC = (b"\x7fELF", b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe",
                b"\xca\xfe\xba\xbe")
# GenAI's session options that set numbers and switches (onnxruntime-genai src/config.cpp, SessionOptions_Element);
# any other key is handed to ONNX Runtime as a session config entry (some name files it loads or writes), and
# `enable_profiling` names the file it writes: refused.
SESSION_OPTIONS = {"log_id", "intra_op_num_threads", "inter_op_num_threads", "log_severity_level",
                   "log_verbosity_level", "enable_cpu_mem_arena", "enable_mem_pattern", "graph_optimization_level",
                   "provider_options", "custom_ops_library"}
PATH_WORDS = ("path", "lib", "file", "dir", "folder", "cache", "config", "plugin", "dll", "model")
LIBRARY = re.compile(r"\.(so(\.\d+)*|dll|dylib|pyd)$", re.IGNORECASE)


def take_inventory(directory: Path, written: list[str], copied: list[str]) -> Inventory:
    """What this run put in a target folder: each file the export wrote (`written`) or the allow-list copied
    (`copied`), `{path: {"by": "export" | "copy", "size", "sha256"}}` (no sha256 for programs and weights)."""
    entries: Inventory = {}
    for by, names in (("export", written), ("copy", copied)):
        for name in names:
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            entries[name] = {"by": by, "size": path.stat().st_size}
            if not name.endswith(PROGRAM_SUFFIXES):
                entries[name]["sha256"] = sha256_file(path)
    return entries


def may_read(check: Any, inventory: Inventory | None) -> bool:
    """Whether a runtime check may prove the folder: each config it executes from (`check.executes`) was written by
    this run's export. Without an inventory (a folder `validate` did not write) the config's keys are screened."""
    return inventory is None or all(inventory.get(name, {}).get("by") == "export"
                                    for name in getattr(check, "executes", ()))


def screen_folder(directory: Path, inventory: Inventory | None = None) -> list[str]:
    """Why no runtime may open `directory` (empty when one may): see the module. `inventory`: what this run wrote
    there ([`take_inventory`]); None for a folder it did not write."""
    directory = Path(directory)
    refused: list[str] = []
    found: dict[str, Path] = {}
    for root, folders, files in os.walk(directory):
        for name in sorted(folders + files):
            path = Path(root) / name
            relative = path.relative_to(directory).as_posix()
            if path.is_symlink():
                refused.append(f"{relative} is a link: a runtime would read what it points to")
            elif path.is_file():
                found[relative] = path
                if _native(path):
                    refused.append(f"{relative} is a native library: no artifact folder holds one")
    if inventory is not None:
        refused += _unaccounted(found, inventory)
    for name in RUNTIME_CONFIGS:
        if name in found:
            try:
                config = json.loads(found[name].read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # the runtime says what is wrong with it; it loads nothing it cannot parse
            refused += [f"{name}: {why}" for why in code_loading_keys(config)]
    return refused


def _unaccounted(found: dict[str, Path], inventory: Inventory) -> list[str]:
    refused = [f"{name} was neither written by the export nor copied by the allow-list"
               for name in found if name not in inventory]
    for name, entry in inventory.items():
        path = found.get(name)
        if path is None:
            continue
        if entry.get("by") == "copy" and (name in RUNTIME_CONFIGS or not copyable(name)):
            refused.append(f"{name} was copied from the model folder: only the export writes a runtime's config")
        elif path.stat().st_size != entry.get("size") or ("sha256" in entry and sha256_file(path) != entry["sha256"]):
            refused.append(f"{name} changed after the export wrote it")
    return refused


def _native(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4).startswith(NATIVE_MAGIC)


def code_loading_keys(config: Any, where: str = "") -> list[str]:
    """The keys of a runtime config (ONNX Runtime GenAI's `genai_config.json`) that load code or name a path, each
    with its JSON path and why: `custom_ops_library` wherever it appears, a session config entry or a provider
    option naming a file, a file name out of the folder, any value naming a native library."""
    refused: list[str] = []
    if isinstance(config, list):
        for index, item in enumerate(config):
            refused += code_loading_keys(item, f"{where}[{index}]")
        return refused
    if not isinstance(config, dict):
        return refused
    for key, value in config.items():
        path = f"{where}.{key}" if where else str(key)
        why = _why(str(key), value, where)
        if why:
            refused.append(f"{path}: {why}")
        else:
            refused += code_loading_keys(value, path)
    return refused


def _why(key: str, value: Any, where: str) -> str | None:
    """Why one key of a GenAI config is refused, None when it is data."""
    if key == "custom_ops_library":
        return "loads a native library into the runtime"
    if where.endswith("session_options") and key not in SESSION_OPTIONS:
        return "a session config entry GenAI hands to ONNX Runtime (some name files it loads or writes)"
    if ".provider_options[" in f".{where}" and (any(word in key.lower() for word in PATH_WORDS)
                                                or isinstance(value, str) and ("/" in value or "\\" in value)):
        return "a provider option naming a file or a library"
    if isinstance(value, str) and (key.endswith("filename") or key.endswith("_file")) and _leaves(value):
        return f"names {value!r}, a file out of the folder"
    if isinstance(value, str) and LIBRARY.search(value.strip()):
        return f"names a native library ({value!r})"
    return None


def _leaves(name: str) -> bool:
    pure = name.replace("\\", "/")
    return pure.startswith("/") or ".." in pure.split("/") or re.match(r"^[A-Za-z]:", pure) is not None

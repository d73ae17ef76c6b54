"""Every target folder loads alone: the model's configs, tokenizer and processor files beside its programs.

A runtime loads a target from its folder and nothing else (`TextLLMRunner("model.pte", "tokenizer.json")`,
`og.Model(folder)`, `ORTModelForCausalLM.from_pretrained(repo, subfolder=...)`, a transformers.js pipeline,
`AutoTokenizer.from_pretrained(folder)`), so each target folder, whatever its format and layout, gets the model
folder's files that describe how to feed it (`exporters.capture.source.COPIED_FILES`):

```
model folder                              target folder (after the programs are saved)
 config.json, generation_config.json  ─►  kept as the export wrote them; copied when the export wrote none
 tokenizer*.json, vocab/merges, ...    ─►  copied as data (exporters.fsutil.copy_model_file: a link is refused,
 chat_template.jinja, *processor*.json      never followed)
 modules.json, 1_Pooling/config.json   ─►  copied: sentence-transformers' pooling and normalization (of each module
                                           folder modules.json names, one folder name, only its config.json and a
                                           Dense module's model.safetensors; "." or a path out of the folder: a
                                           finding naming its JSON path, nothing copied)
 tokenizer_config.json naming a class  ─►  the copy names the class released clients read, and a finding says so
 only transformers 5 has
 genai_config.json, anything else      ─►  never copied: a runtime's config is written by the export or absent
```

The files are data: nothing in them runs, and the model folder's own copies are never changed.

Example:
    >>> import tempfile
    >>> source, target = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    >>> _ = (source / "tokenizer.json").write_text("{}")
    >>> _ = (source / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    >>> notes = []
    >>> complete_folder(target, source, notes)
    ['tokenizer.json', 'tokenizer_config.json']
    >>> json.loads((target / "tokenizer_config.json").read_text())["tokenizer_class"]
    'PreTrainedTokenizerFast'
    >>> "TokenizersBackend" in notes[0] and "PreTrainedTokenizerFast" in notes[0]
    True
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from exporters import fsutil
from exporters.capture.source import (
    COPIED_FILES,
    MODULE_FILES,
    MODULE_FOLDER,
    SENTENCE_TRANSFORMERS_FILES,
    copyable,
)
from exporters.errors import ModelSourceError

__all__ = ["FOLDER_FILES", "READABLE_TOKENIZER_CLASSES", "SENTENCE_TRANSFORMERS_FILES", "complete_folder", "model_folder",
           "sentence_transformers_module_files"]

# What every target folder carries from the model folder (the files a runtime or a tokenizer loader reads).
FOLDER_FILES = COPIED_FILES
# `tokenizer_class` values only transformers 5 knows, and what released clients (transformers 4.x, which optimum
# needs; ONNX Runtime GenAI; transformers.js) read instead. `TokenizersBackend` is transformers 5's name for a
# tokenizer backed by `tokenizer.json` alone: `PreTrainedTokenizerFast` loads the same file in 4.x and 5.x.
READABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}
# The largest safetensors header read to tell a module's weights from another file (a library) under their name.
SAFETENSORS_HEADER_LIMIT = 100 << 20

def model_folder(model: Any) -> Path | None:
    """The folder the eager model was loaded from (`config._name_or_path`), None when it is not a local folder."""
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    if not name or not Path(name).is_dir():
        return None
    return Path(name)


def complete_folder(directory: Path, source: Path | None, notes: list[str]) -> list[str]:
    """Copy the model folder's `FOLDER_FILES` that `directory` lacks into it (the configs the export wrote are kept),
    then make its `tokenizer_config.json` readable by released clients (a finding appended to `notes`). Returns the
    names copied. `ModelSourceError` when one of them is a link in the model folder."""
    directory = Path(directory)
    if source is None or not Path(source).is_dir():
        return []
    names = [*FOLDER_FILES, *SENTENCE_TRANSFORMERS_FILES, *sentence_transformers_module_files(Path(source), notes)]
    copied = [name for name in names  # the allow-list again, where the copy happens
              if copyable(name) and not (directory / name).exists() and not (directory / name).is_symlink()
              and _copy(Path(source), name, directory)]
    if "tokenizer_config.json" in copied:
        note = _readable_tokenizer_config(directory)
        if note:
            notes.append(note)
    return copied


def _copy(source: Path, name: str, directory: Path) -> bool:
    """Copy the model folder's `name` (a module's file: `1_Pooling/config.json`) into `directory`, its folder made
    first; False when the model folder has no such file."""
    if fsutil.model_file(source, name) is None:
        return False
    (directory / name).parent.mkdir(parents=True, exist_ok=True)
    return fsutil.copy_model_file(source, name, directory / name)


def sentence_transformers_module_files(source: Path, notes: list[str] | None = None) -> list[str]:
    """The inert data files (`MODULE_FILES`: `config.json`, a Dense module's `model.safetensors`) of the module
    folders a sentence-transformers `modules.json` names, as paths relative to `source` (`1_Pooling/config.json`);
    empty without a readable `modules.json`. A module path is one folder name (`MODULE_FOLDER`); the Transformer
    module at `""` is the root, whose files are `FOLDER_FILES`. Anything else (`"."`, a nested path, a path out of
    the folder) and a `model.safetensors` that is not a safetensors file copy nothing: a finding in `notes` names
    the JSON path. A linked module folder or file is refused (`ModelSourceError`)."""
    listing = fsutil.model_file(source, "modules.json")
    try:
        modules = json.loads(listing.read_text(encoding="utf-8")) if listing is not None else []
    except (OSError, ValueError):
        return []
    refused: list[str] = []
    names: list[str] = []
    for index, module in enumerate(modules if isinstance(modules, list) else []):
        where = module.get("path") if isinstance(module, dict) else None
        if where == "":
            continue
        if not isinstance(where, str) or not MODULE_FOLDER.match(where):
            refused.append(f"modules.json[{index}].path: {where!r} is not a module folder's name (one folder of the "
                           "model folder, like '1_Pooling'): nothing is copied for it")
            continue
        try:  # a module folder or file is never read through a link
            found = [(name, fsutil.model_file(source, f"{where}/{name}")) for name in MODULE_FILES] \
                if fsutil.model_subfolder(source, where) is not None else []
        except ModelSourceError as err:
            raise ModelSourceError(f"modules.json[{index}].path: {err}") from None
        for name, path in found:
            if path is None:
                continue
            if name.endswith(".safetensors") and not _is_safetensors(path):
                refused.append(f"modules.json[{index}].path: {where}/{name} is not a safetensors file: not copied")
                continue
            names.append(f"{where}/{name}")
    if notes is not None:
        notes += refused
    return names


def _is_safetensors(path: Path) -> bool:
    """Whether `path` starts as a safetensors file: a little-endian header length, then a JSON object."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            if not 1 < size <= SAFETENSORS_HEADER_LIMIT or size + 8 > path.stat().st_size:
                return False
            header = json.loads(handle.read(size))
    except (OSError, ValueError):
        return False
    return isinstance(header, dict)


def _readable_tokenizer_config(directory: Path) -> str | None:
    """Rewrite the copied `tokenizer_config.json`'s `tokenizer_class` when released clients cannot read it; the
    finding to report, or None."""
    path = directory / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    named = config.get("tokenizer_class") if isinstance(config, dict) else None
    readable = READABLE_TOKENIZER_CLASSES.get(named) if isinstance(named, str) else None
    if readable is None:
        return None
    if not (directory / "tokenizer.json").is_file():
        return (f"tokenizer_config.json names tokenizer_class {named!r}, which transformers 4.x (optimum) cannot "
                f"read, and the model has no tokenizer.json for {readable!r} to load: the target folder's tokenizer "
                "loads with transformers 5 only")
    config["tokenizer_class"] = readable
    fsutil.write_file(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return (f"tokenizer_config.json names tokenizer_class {named!r}: only transformers 5 reads it (transformers "
            f"4.x, which optimum needs, cannot load the tokenizer); each target folder's copy names {readable!r}, "
            "which loads the same tokenizer.json in transformers 4.x and 5.x, ONNX Runtime GenAI and "
            "transformers.js (the model folder's own file is unchanged: write it there too)")

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
 modules.json, 1_Pooling/config.json   ─►  copied: sentence-transformers' pooling and normalization
 tokenizer_config.json naming a class  ─►  the copy names the class released clients read, and a finding says so
 only transformers 5 has
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
from pathlib import Path
from typing import Any

from exporters import fsutil
from exporters.capture.source import COPIED_FILES

__all__ = ["FOLDER_FILES", "READABLE_TOKENIZER_CLASSES", "SENTENCE_TRANSFORMERS_FILES", "complete_folder", "model_folder",
           "sentence_transformers_module_files"]

# What every target folder carries from the model folder (the files a runtime or a tokenizer loader reads).
FOLDER_FILES = COPIED_FILES
# `tokenizer_class` values only transformers 5 knows, and what released clients (transformers 4.x, which optimum
# needs; ONNX Runtime GenAI; transformers.js) read instead. `TokenizersBackend` is transformers 5's name for a
# tokenizer backed by `tokenizer.json` alone: `PreTrainedTokenizerFast` loads the same file in 4.x and 5.x.
READABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}
# A sentence-transformers model's own files: without them `SentenceTransformer(folder)` guesses mean pooling and no
# normalization, and encodes differently from the model. `modules.json` names each module's folder (`1_Pooling`), whose
# configs (and a Dense module's weights) are copied too.
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
MODULE_FILE_SUFFIXES = (".json", ".safetensors")


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
    names = [*FOLDER_FILES, *SENTENCE_TRANSFORMERS_FILES, *sentence_transformers_module_files(Path(source))]
    copied = [name for name in names
              if not (directory / name).exists() and not (directory / name).is_symlink()
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


def sentence_transformers_module_files(source: Path) -> list[str]:
    """The files (`MODULE_FILE_SUFFIXES`) in the module folders a sentence-transformers `modules.json` names, as paths
    relative to `source` (`1_Pooling/config.json`); empty without a readable `modules.json`. A module path that leaves
    the folder (absolute, `..`) is not followed; a linked module folder is refused (`ModelSourceError`)."""
    listing = fsutil.model_file(source, "modules.json")
    try:
        modules = json.loads(listing.read_text(encoding="utf-8")) if listing is not None else []
    except (OSError, ValueError):
        return []
    names: list[str] = []
    for module in modules if isinstance(modules, list) else []:
        where = module.get("path") if isinstance(module, dict) else None
        if not isinstance(where, str) or not where or Path(where).is_absolute() or ".." in Path(where).parts:
            continue
        folder = source / where
        if folder.is_symlink():
            fsutil.model_file(source, where)  # raises: a module folder is never read through a link
        if folder.is_dir():
            names += sorted(f"{Path(where).as_posix()}/{p.name}" for p in folder.iterdir()
                            if p.name.endswith(MODULE_FILE_SUFFIXES))
    return names


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

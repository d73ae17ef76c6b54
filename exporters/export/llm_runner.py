"""Writing a target in the ExecuTorch LLM runner's layout (`exporters.capture.llm_runner`): `model.pte` (and
`model.ptd` only when asked or past 2 GB), the manifest, the config files, and the tokenizer files the runner reads.

```
runner program ──► export_runner_program (exporters.upstream.llm_runner) ──► model.pte [+ model.ptd]
                                                                            export.json (layout "runner")
                                                                            config.json, generation_config.json
model folder ──► copy_runner_files ──► tokenizer.json, tokenizer_config.json, special_tokens_map.json
```
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from exporters import fsutil, upstream
from exporters.capture.components import cache_setting_for, generation_config_for
from exporters.capture.llm_runner import PTE_WEIGHTS_LIMIT, custom_ops_of
from exporters.capture.merged import MERGED
from exporters.recipe.model import Recipe
from exporters.upstream import llm_runner

PROGRAM, WEIGHTS_TAG = "model.pte", "model"
# What the runner's tokenizer loader reads from a folder (pytorch_tokenizers' HFTokenizer: tokenizer.json, its
# bos/eos from tokenizer_config.json), and what a user's transformers tokenizer needs beside them.
RUNNER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def eos_ids(model: Any) -> list[int]:
    """The end-of-sequence ids of the model's generation config (else its config): the program's `get_eos_ids`."""
    for source in (model.generation_config, model.config.get_text_config()):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def weight_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def export_runner(model: Any, target: Any, components: dict[str, tuple[Any, dict]], recipe: Recipe, directory: Path,
                  notes: list[str]) -> dict[str, Any]:
    """Export the runner program of `components["model"]` and write the target folder (not the tokenizer files:
    [`copy_runner_files`]). Returns `{"components", "export_only_s", "save_s"}`."""
    module, inputs = components[MERGED]
    setting = cache_setting_for(model, target, recipe)
    custom_ops = custom_ops_of(target)
    external = bool(getattr(target, "external_weights", None)) or weight_bytes(model) > PTE_WEIGHTS_LIMIT
    metadata = llm_runner.runner_metadata(model, setting.max_cache_len, custom_ops, eos_ids(model))
    started = time.time()
    manager, record, custom_nodes = llm_runner.export_runner_program(
        module, model, inputs, max_cache_len=setting.max_cache_len, custom_ops=custom_ops, metadata=metadata,
        external_weights=WEIGHTS_TAG if external else None)
    export_s = time.time() - started
    started = time.time()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / PROGRAM, "wb") as handle:
        manager.write_to_file(handle)
    entry: dict[str, Any] = {"file": PROGRAM, "method": "forward", "metadata": upstream.metadata_dict(record)}
    if external:
        manager.write_tensor_data_to_file(str(directory))
        entry["data_file"] = f"{WEIGHTS_TAG}.ptd"
        if not getattr(target, "external_weights", None):
            notes.append(f"the weights ({weight_bytes(model) >> 20} MiB) are in model.ptd beside model.pte: a .pte "
                         "holds at most 2 GB; pass model.ptd as the runner's data path")
    upstream.write_manifest(directory, {
        "schema_version": 1, "export_format": "executorch", "layout": "runner", "custom_ops": custom_ops,
        "runner_metadata": metadata, "components": {MERGED: entry}})
    model.config.save_pretrained(directory)
    generation_config_for(model, setting).save_pretrained(directory)
    if custom_ops:
        notes.append(f"runner layout with ExecuTorch's LLM custom ops ({custom_nodes} llama:: nodes): a runtime needs "
                     "their kernels (Python: import executorch.extension.llm.custom_ops.custom_ops; C++: link the "
                     "custom_ops kernel library)")
    return {"components": [MERGED], "export_only_s": round(export_s, 3), "save_s": round(time.time() - started, 3)}


def copy_runner_files(source_dir: Path | None, directory: Path) -> list[str]:
    """Copy the model folder's tokenizer files beside the program (as data, never through a link); the names
    copied."""
    if source_dir is None:
        return []
    return [name for name in RUNNER_FILES if fsutil.copy_model_file(Path(source_dir), name, directory / name)]

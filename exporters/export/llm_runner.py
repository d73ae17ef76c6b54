"""Writing a target in the ExecuTorch LLM runner's layout (`exporters.capture.llm_runner`): `model.pte` (and
`model.ptd` when asked, past 2 GB, or when a float model ties its embeddings: the table is then stored once), the
manifest and the config files; the tokenizer files the runner reads (`tokenizer.json`, its bos/eos from
`tokenizer_config.json`) are copied in by `folder_files.complete_folder`, as for every target.

```
runner program ──► export_runner_program (exporters.upstream.llm_runner) ──► model.pte [+ model.ptd]
[quantizer_for("model", prompt at position 0): recipe quantize, PT2E on the traced graph]
                                                                            export.json (layout "runner")
                                                                            config.json, generation_config.json
```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporters import upstream
from exporters.capture.components import cache_setting_for
from exporters.capture.llm_runner import PTE_WEIGHTS_LIMIT, custom_ops_of, custom_ops_off
from exporters.capture.merged import MERGED
from exporters.capture.token_ids import special_token_ids
from exporters.export.footprint import ModelWeights
from exporters.recipe.model import Recipe
from exporters.upstream import llm_runner

PROGRAM, WEIGHTS_TAG = "model.pte", "model"


def export_runner(model: Any, target: Any, components: dict[str, tuple[Any, dict]], recipe: Recipe, directory: Path,
                  notes: list[str], quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None
                  ) -> dict[str, Any]:
    """Export the runner program of `components["model"]` and write the target folder (its tokenizer files come
    from `folder_files.complete_folder`). A quantized target's quantizer comes from `quantizer_for("model",
    inputs)` (`exporters.export.quantize.Quantizing`) and quantizes the traced program, calibrating on the prompt at
    position 0 with a fresh cache per sample. Returns `{"components", "export_only_s", "save_s"}`."""
    module, inputs = components[MERGED]
    quantizer = quantizer_for(MERGED, inputs) if quantizer_for is not None else None
    setting = cache_setting_for(model, target, recipe)
    custom_ops = custom_ops_of(target, model)
    if not custom_ops and getattr(target, "custom_ops", None) is None:
        notes.append(custom_ops_off(model))
    asked, weights = getattr(target, "external_weights", None), ModelWeights.of(model)
    # a tied table is stored once only through the named-data file (docs/upstream-gaps.md #13); a quantized
    # projection is no longer the table (torchao's quantize_ gave it its own tensor), so there is nothing to share
    tied = asked is None and weights.tied and target.quantize is None
    external = bool(asked) or weights.bytes() > PTE_WEIGHTS_LIMIT or tied
    eos = special_token_ids(model.generation_config, model.config).eos
    # a ring-buffer layer's window: the runner feeds a longer prompt in chunks of it
    chunk = module.max_seq_len if module.max_seq_len < setting.max_cache_len - 1 else None
    metadata = llm_runner.runner_metadata(model, setting.max_cache_len, custom_ops, eos, chunk)
    started = time.time()
    manager, record, custom_nodes = llm_runner.export_runner_program(
        module, model, inputs, max_cache_len=setting.max_cache_len, custom_ops=custom_ops, metadata=metadata,
        external_weights=WEIGHTS_TAG if external else None, quantizer=quantizer)
    export_s = time.time() - started
    started = time.time()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / PROGRAM, "wb") as handle:
        manager.write_to_file(handle)
    entry: dict[str, Any] = {"file": PROGRAM, "method": "forward", "metadata": upstream.metadata_dict(record)}
    if external:
        manager.write_tensor_data_to_file(str(directory))
        entry["data_file"] = f"{WEIGHTS_TAG}.ptd"
        if asked is None and weights.bytes() > PTE_WEIGHTS_LIMIT:
            notes.append(f"the weights ({weights.bytes() >> 20} MiB) are in model.ptd beside model.pte: a .pte "
                         "holds at most 2 GB; pass model.ptd as the runner's data path")
    upstream.write_manifest(directory, {
        "schema_version": 1, "export_format": "executorch", "layout": "runner", "custom_ops": custom_ops,
        "runner_metadata": metadata, "components": {MERGED: entry}})
    model.config.save_pretrained(directory)
    setting.for_artifact(model.generation_config).save_pretrained(directory)  # the repo's own, with the cache
    if custom_ops:
        notes.append(f"runner layout with ExecuTorch's LLM custom ops ({custom_nodes} llama:: nodes): a runtime needs "
                     "their kernels (Python: import executorch.extension.llm.custom_ops.custom_ops; C++: link the "
                     "custom_ops kernel library)")
    return {"components": [MERGED], "export_only_s": round(export_s, 3), "save_s": round(time.time() - started, 3)}


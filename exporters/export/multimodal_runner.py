"""Writing a target in ExecuTorch MultimodalRunner's layout (`exporters.capture.multimodal_runner`): one `model.pte`
with the methods `token_embedding`, `vision_encoder` (or `audio_encoder`), `text_decoder` and the runner's metadata (and `model.ptd` when
asked, past 2 GB, or when the model ties its embeddings: the table is then stored once), the manifest and the config files; the tokenizer and processor files are copied in by
`folder_files.complete_folder`, as for every target.

```
three methods ──► export_multimodal_program (exporters.upstream.multimodal_runner) ──► model.pte [+ model.ptd]
                                                                   export.json (layout "multimodal_runner")
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
from exporters.capture.multimodal_runner import AUDIO_ENCODER, MULTIMODAL_RUNNER, TEXT_DECODER
from exporters.capture.token_ids import image_token_id, special_token_ids
from exporters.export.footprint import ModelWeights
from exporters.recipe.model import Recipe
from exporters.upstream import llm_runner, multimodal_runner
from exporters.upstream.fixed_image import IMAGE_SIZE, IMAGE_SPAN, FixedSizeImageEncoder

PROGRAM, WEIGHTS_TAG = "model.pte", "model"


def export_multimodal_runner(model: Any, target: Any, components: dict[str, tuple[Any, dict]], recipe: Recipe,
                             directory: Path, notes: list[str],
                             quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """Export the runner's three methods into one program and write the target folder. A quantized target's
    `quantizer_for(TEXT_DECODER, inputs)` (`exporters.export.quantize.Quantizing`) quantizes the model's text side
    in place (torchao: None returned) or gives the PT2E quantizer of `text_decoder`'s traced graph (`8da8w`: its
    linears; the encoder and the embedding stay float, as the LLM runner's PT2E program keeps its table). Returns
    `{"components", "export_only_s", "save_s"}`."""
    quantizer = quantizer_for(TEXT_DECODER, components[TEXT_DECODER][1]) if quantizer_for is not None else None
    setting = cache_setting_for(model, target, recipe)
    custom_ops = custom_ops_of(target, model)
    if not custom_ops and getattr(target, "custom_ops", None) is None:
        notes.append(custom_ops_off(model))
    asked, weights = getattr(target, "external_weights", None), ModelWeights.of(model)
    # a tied table is stored once only through the named-data file (docs/upstream-gaps.md #13), as the text runner's
    # a quantized projection is no longer the table (torchao gave it its own tensor): nothing to share
    tied = asked is None and weights.tied and target.quantize is None
    external = bool(asked) or weights.bytes() > PTE_WEIGHTS_LIMIT or tied
    eos = special_token_ids(model.generation_config, model.config).eos
    # a ring-buffer layer's window: one text_decoder call takes at most that many positions
    decoder = components[TEXT_DECODER][0]
    chunk = decoder.max_seq_len if decoder.max_seq_len < setting.max_cache_len - 1 else None
    metadata = llm_runner.runner_metadata(model, setting.max_cache_len, custom_ops, eos, chunk)
    audio = AUDIO_ENCODER in components
    image_token = getattr(model.config, "audio_token_id", None) if audio else image_token_id(model.config)
    if image_token is not None:  # optimum-executorch reads it to place the image's (audio's) embeddings
        metadata["audio_token_id" if audio else "vision_token_id"] = int(image_token)
    fixed = next((m for m, _ in components.values() if isinstance(m, FixedSizeImageEncoder)), None)
    if fixed is not None:  # the one image size the program takes (its image_sizes baked in): the snippet resizes to it
        metadata[IMAGE_SIZE] = list(fixed.size)
    if fixed is not None and fixed.span is not None:  # Pixtral's rows: the snippet folds these into the image's run
        metadata[IMAGE_SPAN] = [int(fixed.span[0]), int(fixed.span[1])]
    names = list(components)  # token_embedding, the modality's encoder, text_decoder
    modules = {name: components[name][0] for name in names}
    inputs = {name: components[name][1] for name in names}
    started = time.time()
    manager, records, custom_nodes = multimodal_runner.export_multimodal_program(
        modules, model, inputs, max_cache_len=setting.max_cache_len, custom_ops=custom_ops, metadata=metadata,
        external_weights=WEIGHTS_TAG if external else None, quantizer=quantizer)
    export_s = time.time() - started
    started = time.time()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / PROGRAM, "wb") as handle:
        manager.write_to_file(handle)
    entries: dict[str, Any] = {name: {"file": PROGRAM, "method": name, "metadata": upstream.metadata_dict(records[name])}
                               for name in names}
    if external:
        manager.write_tensor_data_to_file(str(directory))
        for entry in entries.values():
            entry["data_file"] = f"{WEIGHTS_TAG}.ptd"
    upstream.write_manifest(directory, {
        "schema_version": 1, "export_format": "executorch", "layout": MULTIMODAL_RUNNER, "custom_ops": custom_ops,
        "runner_metadata": metadata, "components": entries})
    model.config.save_pretrained(directory)
    setting.for_artifact(model.generation_config).save_pretrained(directory)
    encoder = ("audio_encoder (the feature extractor's log-mel input_features, float [1, bins, frames])" if audio
               else "vision_encoder (the processor's pixel_values, float [1, 3, H, W])")
    if fixed is not None:
        encoder = (f"vision_encoder (one image of {fixed.size[0]}x{fixed.size[1]}, its image_sizes baked in: the "
                   f"processor's {fixed.tiles} tile(s) stacked, float [1, 3, {fixed.tiles} x H, W]"
                   + (f"; its {fixed.span[2]} rows of features each followed by [IMG_BREAK]'s embedding, the last by "
                      "[IMG_END]'s: the processor's span" if fixed.span is not None else "") + ")")
    notes.append(f"ExecuTorch MultimodalRunner layout: model.pte holds token_embedding, {encoder} and text_decoder "
                 f"(the cache inside"
                 + (f", ExecuTorch's LLM custom ops: {custom_nodes} llama:: nodes; a runtime needs their kernels"
                    if custom_ops else "") + ")")
    return {"components": names, "export_only_s": round(export_s, 3),
            "save_s": round(time.time() - started, 3)}

"""ONNX Runtime GenAI's Mistral 3 folder (`Mistral3ForConditionalGeneration`, Pixtral vision tower): the three graphs
its `mistral3` model runs (src/models/multi_modal.cpp's `PixtralVisionState`, mistral3_image_processor.cpp), traced
from the eager model beside the export's own components, then `genai_config.json` and GenAI's processor config.

```
genai_vision.onnx     pixel_values [1, 3, H, W]            -> image_features [(H/p/m)·(W/p/m), text hidden]
                      (one image per run: GenAI slices a prompt's images by PixtralImageSizes' sizes; the image
                      fixed at the traced H x W: Pixtral's 2-D rotary positions and the patch merger's unfold are
                      computed for it, as the export's own image encoder is traced)
genai_embedding.onnx  input_ids [batch, seq], image_features -> inputs_embeds (qwen_vl.write_embedding: the image's
                      features in place of its `[IMG]` tokens, in order, as the model's forward does)
genai_decoder.onnx    inputs_embeds, attention_mask, position_ids [batch, seq],
                      past_key_values.{i}.key/value -> logits, present.{i}.key/value (qwen_vl.write_decoder)
```

GenAI's processor (`pixtral_processor_config.json`, ONNX Runtime Extensions' transforms, ending with `Permute3D`
then `PixtralImageSizes` as GenAI requires) resizes every image to the traced size, rescales, normalizes with the
model's image processor's mean and std (else CLIP's, Pixtral's own defaults); GenAI's own code expands each `[IMG]`
in the prompt to the image's rows of `[IMG]` ended by `[IMG_BREAK]` and the last by `[IMG_END]`, the ids its
tokenizer gives those tokens. The processor config is not named `processor_config.json`: that name is transformers'
own processor file, which the folder's loaders read. The vision graph is written without the eager
`get_image_features`' `squeeze(0)` of the projected features: on a tensor whose first axis is not 1 torch leaves it
as it is, while ONNX's `Squeeze` refuses it ("Dimension of input 0 must be 1 instead of 4", ONNX Runtime on load):
`exporters.upstream.fixed_image.PixtralVision`, which transformers.js's layout traces too.

Example:
    >>> traced_size([1, 3, 32, 32], patch=8, merge=2), traced_size([1, 3, 30, 32], patch=8, merge=2)
    ((32, 32), None)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from exporters import fsutil
from exporters.export.onnx_files import share_external_data
from exporters.layouts.genai.config import GENAI_CONFIG, genai_config
from exporters.layouts.genai.qwen_vl import (CLIP_MEAN, CLIP_STD, DECODER, EMBEDDING, IMAGE_ENCODER, SESSION,
                                             VISION, _export, unwritten, write_decoder, write_embedding)
from exporters.upstream import read_manifest
from exporters.upstream.fixed_image import PixtralVision

MODEL_TYPE = "mistral3"  # GenAI's type (src/models/model_type.h: IsPixtralFamily)
FAMILY = "Mistral 3"
PROCESSOR = "pixtral_processor_config.json"  # what tells a Mistral 3 folder's card apart (its `[IMG]` prompt)
IMAGE_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")  # the tokens GenAI's processor looks up in the tokenizer


def traced_size(shape: list[int], patch: int, merge: int) -> tuple[int, int] | None:
    """(height, width) of one image `shape` [1, 3, H, W] whose sides are multiples of `patch`·`merge` (GenAI's
    processor refuses others), None otherwise."""
    if len(shape) != 4 or shape[0] != 1:
        return None
    height, width = int(shape[2]), int(shape[3])
    return (height, width) if height % (patch * merge) == 0 and width % (patch * merge) == 0 else None


def write_vision(directory: Path, model: Any, size: tuple[int, int]) -> None:
    """`genai_vision.onnx`: the tower at the traced image `size` (see the module)."""
    pixels = torch.zeros(1, 3, *size, device=next(model.parameters()).device)
    _export(PixtralVision(model, size), (pixels,), directory / VISION, ["pixel_values"], ["image_features"])


def processor_config(directory: Path, size: tuple[int, int]) -> dict[str, Any]:
    """GenAI's image processor (ONNX Runtime Extensions' transforms, as GenAI's mistral3 test model names them):
    every image resized to the traced `size`, rescaled, normalized with the folder's image processor's mean and std
    (else CLIP's), channels first, then its size for GenAI's per-image loop."""
    source = directory / "preprocessor_config.json"
    known = json.loads(source.read_text(encoding="utf-8")) if source.is_file() else {}
    steps = [("decode_image", "DecodeImage", {"color_space": "RGB"}), ("convert_to_rgb", "ConvertRGB", None),
             ("resize", "Resize", {"height": size[0], "width": size[1], "smart_resize": 0, "keep_aspect_ratio": 0}),
             ("rescale", "Rescale", {"rescale_factor": float(known.get("rescale_factor", 1 / 255))}),
             ("normalize", "Normalize", {"mean": known.get("image_mean", CLIP_MEAN),
                                         "std": known.get("image_std", CLIP_STD)}),
             ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
             ("pixtral_image_sizes", "PixtralImageSizes", None)]
    transforms = [{"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}
                  for name, kind, attrs in steps]
    return {"processor": {"name": "pixtral_image_processor", "transforms": transforms}}


def mistral3_genai_config(model: Any, generation_config: Any) -> dict[str, Any]:
    """`genai_config.json` for the three graphs: the text decoder's fields (`config.genai_config`) on
    `inputs_embeds`, and the `embedding` and `vision` sections GenAI reads for `mistral3`."""
    config = model.config
    content = genai_config(config, generation_config, DECODER)
    described = content["model"]
    inputs = {name: value for name, value in described["decoder"]["inputs"].items() if name != "input_ids"}
    described["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    described.update({
        "type": MODEL_TYPE, "image_token_id": int(config.image_token_id),
        "embedding": {"filename": EMBEDDING, "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                      "outputs": {"inputs_embeds": "inputs_embeds"}, "session_options": SESSION},
        "vision": {"filename": VISION, "config_filename": PROCESSOR,
                   "spatial_merge_size": int(config.spatial_merge_size),
                   "patch_size": int(config.vision_config.patch_size),
                   "inputs": {"pixel_values": "pixel_values"}, "outputs": {"image_features": "image_features"},
                   "session_options": SESSION}})
    return content


def write_mistral3_files(directory: Path, target: Any, model: Any, notes: list[str]) -> None:
    """GenAI's three graphs, `genai_config.json` and its processor config in `directory` (see the module); a target
    they are not written for (`qwen_vl.unwritten`) or a traced image GenAI's processor cannot make gets none, and a
    note says why."""
    if why := unwritten(target, FAMILY):
        notes.append(f"ONNX Runtime GenAI: no {FAMILY} folder written: {why}")
        return
    entry = read_manifest(directory)["components"].get(IMAGE_ENCODER, {})
    shape = (entry.get("metadata", {}).get("kwargs", {}).get("pixel_values") or {}).get("shape") or []
    patch, merge = int(model.config.vision_config.patch_size), int(model.config.spatial_merge_size)
    size = traced_size(shape, patch, merge)
    if size is None:
        notes.append(f"ONNX Runtime GenAI: no {FAMILY} folder written: the image encoder was traced on pixels "
                     f"{shape}, not one image whose sides are multiples of {patch * merge} (patch x merge)")
        return
    write_vision(directory, model, size)
    write_embedding(directory, model)
    write_decoder(directory, model, mrope=False)
    share_external_data(directory, (VISION, EMBEDDING, DECODER))  # the components' weights, stored once
    fsutil.write_file(directory / PROCESSOR, json.dumps(processor_config(directory, size), indent=2) + "\n")
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    fsutil.write_file(directory / GENAI_CONFIG, json.dumps(mistral3_genai_config(model, generation_config),
                                                           indent=4) + "\n")
    notes.append(f"ONNX Runtime GenAI: its {FAMILY} graphs ({VISION}, {EMBEDDING}, {DECODER}) traced beside the "
                 f"components, the image fixed at {size[0]}x{size[1]} pixels (GenAI's processor resizes every image "
                 "to it)")

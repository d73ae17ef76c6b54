"""Sample inputs for a vision-language model whose text layers cross-attend to the image (Mllama), without its
processor: what its processor makes, from the config.

Such a model has no `get_image_features` whose features take the place of image tokens: one image token marks where
text starts attending to the image, and the vision model's states reach the cross-attention layers
(`text_config.cross_attention_layers`) through a `cross_attention_mask`. The inputs are laid out by the processor's
own code: a synthetic image through a Mllama image processor built from the vision config (`image_size`,
`max_num_tiles`: the tiles, `aspect_ratio_ids`, `aspect_ratio_mask`), the prompt as the processor lays it out (the
image token, then the prompt), and the dense cross-attention mask from transformers'
`get_cross_attention_token_mask` / `convert_sparse_cross_attention_mask_to_dense`: every token from the image token
on attends to each of the image's tiles.

Example:
    >>> from types import SimpleNamespace
    >>> text = SimpleNamespace(cross_attention_layers=[3, 8])
    >>> cross_attends(SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text)))
    [3, 8]
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import MllamaImageProcessorPil
from transformers.models.mllama.processing_mllama import (
    convert_sparse_cross_attention_mask_to_dense,
    get_cross_attention_token_mask,
)

from exporters.capture.multimodal import synthetic_image
from exporters.errors import UnsupportedModelError, describe_error


def cross_attends(model) -> list[int]:
    """The text layers that cross-attend to the image (Mllama's `text_config.cross_attention_layers`); empty for a
    model whose image features take the place of image tokens."""
    layers = getattr(model.config.get_text_config(), "cross_attention_layers", None)
    return [int(layer) for layer in layers] if isinstance(layers, (list, tuple)) else []


def synthesize_cross_attention(model, spec, text_ids: torch.Tensor) -> tuple[dict[str, Any], str]:
    """The inputs of one `model(**inputs)` / `model.generate(**inputs)` call (see the module), and a note saying how
    they were made."""
    config = model.config
    vision = config.vision_config
    image_token = getattr(config, "image_token_id", None)
    size, tiles = getattr(vision, "image_size", None), getattr(vision, "max_num_tiles", None)
    if not isinstance(image_token, int) or not isinstance(size, int) or not isinstance(tiles, int):
        raise UnsupportedModelError(f"{type(config).__name__} gives no image_token_id, vision_config.image_size or "
                                    "vision_config.max_num_tiles: save the model's processor into the folder "
                                    "(processor.save_pretrained(folder))")
    processor = MllamaImageProcessorPil(size={"height": size, "width": size}, max_image_tiles=tiles)
    images = [[synthetic_image(size, spec.seed + row)] for row in range(text_ids.shape[0])]
    try:
        made = processor(images, return_tensors="pt")
    except Exception as err:  # the config's image size or tiles that the processor's code cannot lay out
        raise UnsupportedModelError(f"a Mllama image processor of {size} px and {tiles} tiles cannot make its pixels "
                                    f"({describe_error(err, 200)}): save the model's processor into the folder") from err
    bos = getattr(config.get_text_config(), "bos_token_id", None)
    prefix = [image_token] + ([bos] if isinstance(bos, int) else [])  # the processor's "<|image|><|begin_of_text|>"
    ids = torch.cat([torch.tensor([prefix] * text_ids.shape[0]), text_ids], dim=1)
    sparse = [get_cross_attention_token_mask(row, image_token) for row in ids.tolist()]
    mask = convert_sparse_cross_attention_mask_to_dense(sparse, num_tiles=made["num_tiles"], max_num_tiles=tiles,
                                                        length=ids.shape[1])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": made["pixel_values"],
              "aspect_ratio_ids": made["aspect_ratio_ids"], "aspect_ratio_mask": made["aspect_ratio_mask"],
              "cross_attention_mask": torch.from_numpy(mask)}
    return inputs, (f"sample inputs: a synthetic image through a Mllama image processor built from the vision config "
                    f"({size} px, {tiles} tiles), the prompt and cross-attention mask laid out as its processor does")

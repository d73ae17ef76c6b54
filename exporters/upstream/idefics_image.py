"""ExecuTorch MultimodalRunner's `vision_encoder` of an Idefics3-style model (Idefics3, SmolVLM, Idefics2), whose
processor gives `pixel_values [1, images, 3, H, W]` with a `pixel_attention_mask [1, images, H, W]` (part of the
adapter to upstream: it reads the model's `vision_model` and `connector`).

The runner's image is one tensor `[1, 3, H, W]` (`make_image_input`), no mask beside it; the runner calls
`vision_encoder` once per image input. For a full image of the processor's size (the processor pads nothing: its
mask is all ones; a tile of a split image too) the model's own `get_image_features` computes a mask of ones in the
vision tower when none is given, and drops only all-zero padding images, which a real image is not; so
[`OneImageEncoder`] is `vision_model` (its patch mask left to the model: all ones) then `connector`, without
`get_image_features`' data-dependent padding-image filter that a trace cannot keep (`pixel_values[real_images_inds]`);
Idefics2's connector (a perceiver resampler) also reads the patch mask, all ones for a full image, given as such.
`exporters.capture.multimodal_runner.refused` admits a sample only where its mask is all ones and its prompt holds a
run of image tokens per image (the tiles and the whole image of `do_image_splitting`, each an image input).

Eager `generate()` of such a model with a static cache fails in the pinned transformers: `generate` hands the
model the per-layer-type mask mapping `create_masks_for_generate` makes, which Idefics3's text model reads as one
tensor (`AttributeError: 'dict' object has no attribute 'ndim'`); eager references generate with the dynamic cache
instead ([`eager_cache`]), the same greedy steps over the same keys and values (docs/upstream-gaps.md #57, #58).

Example:
    >>> takes_pixel_mask(torch.nn.Linear(2, 2))
    False
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

PIXEL_MASK = "pixel_attention_mask"
GLOBAL_IMAGE = "<global-img>"  # Idefics3Processor's global_image_tag: once per image, before the whole image's run
CONNECTOR = ["image_hidden_states"]  # the connector's inputs (Idefics2's perceiver resampler: and the patch mask)


def takes_pixel_mask(model: Any) -> bool:
    """Whether `model` is Idefics3-shaped: its `get_image_features` takes a `pixel_attention_mask`, and it has the
    `vision_model` and `connector` [`OneImageEncoder`] runs, a connector that reads the features alone, or the
    features and the patch mask (Idefics2's perceiver resampler: a full image's mask is all ones, a constant)."""
    features = getattr(model, "get_image_features", None)
    if not callable(features) or PIXEL_MASK not in inspect.signature(features).parameters:
        return False
    inner = getattr(model, "model", model)
    if not all(isinstance(getattr(inner, name, None), torch.nn.Module) for name in ("vision_model", "connector")):
        return False
    return list(inspect.signature(inner.connector.forward).parameters) in (CONNECTOR, [*CONNECTOR, "attention_mask"])


def eager_cache(model: Any, generation_config: Any) -> Any:
    """`generation_config` as eager `generate()` runs it for `model`: an Idefics3-style model's static cache
    (`cache_implementation: "static"`) left to the dynamic one (see the module), in place; any other as it is.

    Example:
        >>> from types import SimpleNamespace
        >>> eager_cache(torch.nn.Linear(2, 2), SimpleNamespace(cache_implementation="static")).cache_implementation
        'static'
    """
    if takes_pixel_mask(model) and getattr(generation_config, "cache_implementation", None) == "static":
        generation_config.cache_implementation = None
    return generation_config


class OneImageEncoder(torch.nn.Module):
    """`vision_encoder(pixel_values [1, 3, H, W]) -> [1, image tokens, hidden]`: an Idefics3-style model's features
    of one full image (see the module), equal to `get_image_features(pixel_values[:, None], mask of ones)`.

    The vision tower's position ids depend on the image's size and its mask alone (`torch.bucketize` of each patch's
    fractional coordinates, an op ExecuTorch has no kernel for): for a full image of the vision config's size they are
    a constant, taken here from the model's own embeddings once ([`full_image_position_ids`]), so the traced graph
    holds the patch embedding, that constant's position embeddings, the encoder and the connector. An image of
    another size runs the model's own vision tower (its `bucketize` traced as it is)."""

    def __init__(self, model: Any):
        super().__init__()
        inner = getattr(model, "model", model)
        self.vision_model, self.connector = inner.vision_model, inner.connector
        # Idefics2's connector reads the patch mask: a full image's, all ones
        self.masked = "attention_mask" in inspect.signature(self.connector.forward).parameters
        size = int(self.vision_model.config.image_size)
        self.size = size
        self.register_buffer("position_ids", full_image_position_ids(self.vision_model, size), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        vision = self.vision_model
        if tuple(pixel_values.shape[-2:]) != (self.size, self.size):  # not the size the constant ids are for
            hidden = vision(pixel_values=pixel_values).last_hidden_state
        else:  # the vision transformer's forward, its full mask's attention mask none and its position ids constant
            embeddings = vision.embeddings
            patches = embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
            hidden = patches + embeddings.position_embedding(self.position_ids)
            hidden = vision.post_layernorm(vision.encoder(inputs_embeds=hidden).last_hidden_state)
        mask = {"attention_mask": torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)} \
            if self.masked else {}
        features = self.connector(hidden, **mask)
        return features.reshape(1, -1, features.shape[-1])


def full_image_position_ids(vision_model: torch.nn.Module, size: int) -> torch.Tensor:
    """The position ids `vision_model`'s embeddings give a full `size` x `size` image (its patch mask all ones), read
    from the ids its `position_embedding` is called with."""
    embeddings = vision_model.embeddings
    channels = int(getattr(vision_model.config, "num_channels", 3))
    patches = size // int(embeddings.patch_size)
    seen: list[torch.Tensor] = []
    handle = embeddings.position_embedding.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            embeddings(pixel_values=torch.zeros(1, channels, size, size, dtype=embeddings.patch_embedding.weight.dtype),
                       patch_attention_mask=torch.ones(1, patches, patches, dtype=torch.bool))
    finally:
        handle.remove()
    return seen[0].clone()

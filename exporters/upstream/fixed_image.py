"""ExecuTorch MultimodalRunner's `vision_encoder` of a model whose image comes with its `image_sizes` (LLaVA-NeXT and
LLaVA-OneVision: any-resolution tiles), at one fixed image size (part of the adapter to upstream: it calls the model's
own `get_image_features`). Mistral 3's one image computes here too, but its processor's prompt (rows of image tokens
broken by [IMG_BREAK]) is not the runner's one run: `exporters.capture.multimodal_runner.PIXTRAL_ROWS`.

The runner hands `vision_encoder` one image's pixels, `[1, C, H, W]` (the binding's `make_image_input`: one image of 3
or 4 channels), nothing beside them. At the one image size a program is traced at, what `image_sizes` says is a
constant: the number of tiles, the tile grid, the rows the unpadding keeps and where the `image_newline` rows go
(LLaVA-NeXT, LLaVA-OneVision). [`FixedSizeImageEncoder`] bakes it in: it calls
`get_image_features` with the traced `image_sizes` as Python ints, so the trace holds the features of that size alone,
and its one input is the processor's tiles `[tiles, 3, h, w]` stacked down the height, `[1, 3, tiles x h, w]`
([`stacked_tiles`]: one image of the runner). An image of another size is refused:
its pixels do not have the traced shape, which the program's input keeps fixed, and the card's snippet resizes the
image to the program's size (`image_size`, a constant method) before the processor, and stops where the processor's
`image_sizes` differ.

Example:
    >>> stacked_tiles(torch.arange(8.).reshape(1, 2, 1, 2, 2)).tolist()
    [[[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]]]
    >>> takes_image_sizes(torch.nn.Linear(2, 2))
    False
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

IMAGE_SIZES = "image_sizes"
IMAGE_SIZE = "image_size"  # the program's constant method: [height, width] of the one image it takes


def takes_image_sizes(model: Any) -> bool:
    """Whether `model`'s `get_image_features` takes the images' `image_sizes` (LLaVA-NeXT, LLaVA-OneVision,
    Mistral 3)."""
    features = getattr(model, "get_image_features", None)
    return callable(features) and IMAGE_SIZES in inspect.signature(features).parameters


def stacked_tiles(pixels: torch.Tensor) -> torch.Tensor:
    """One image's tiles `[1, tiles, C, h, w]` (or `[tiles, C, h, w]`, or one image `[1, C, h, w]`) as the runner's
    one image `[1, C, tiles x h, w]`, each tile below the one before."""
    tiles = pixels.reshape(-1, *pixels.shape[-3:])
    return torch.cat(list(tiles), dim=-2)[None]


class FixedSizeImageEncoder(torch.nn.Module):
    """`vision_encoder(pixel_values [1, C, tiles x h, w]) -> [1, image tokens, hidden]`: the model's own
    `get_image_features` of one image whose `image_sizes` are `sizes` (one `[height, width]`), its `tiles` tiles
    unstacked (see the module). `size`: the image's `[height, width]`, the program's `image_size`."""

    def __init__(self, model: Any, sizes: list[list[int]], tiles: int):
        super().__init__()
        self.model, self.tiles = model, tiles
        self.sizes = [[int(value) for value in size] for size in sizes]
        self.size = self.sizes[0]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        channels, height, width = pixel_values.shape[1], pixel_values.shape[2] // self.tiles, pixel_values.shape[3]
        tiles = pixel_values.reshape(channels, self.tiles, height, width).transpose(0, 1)
        features = self.model.get_image_features(pixel_values=tiles, image_sizes=self.sizes)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output object
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), dim=0)
        return features.reshape(1, -1, features.shape[-1])

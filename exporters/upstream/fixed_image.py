"""ExecuTorch MultimodalRunner's `vision_encoder` of a model whose image comes with its `image_sizes` (LLaVA-NeXT and
LLaVA-OneVision: any-resolution tiles), at one fixed image size (part of the adapter to upstream: it calls the model's
own `get_image_features`), and Mistral 3's (Pixtral's tower), whose processor lays one image's tokens out in rows:
`[IMG]` x cols then `[IMG_BREAK]`, ..., the last row ending `[IMG_END]` ([`pixtral_rows`]). At one fixed size that whole
span is a constant layout, so its `vision_encoder` emits the features with the `[IMG_BREAK]` and `[IMG_END]` rows of
the embedding table between them (two rows, constants of the method), and the runner places the span as one image;
the program's constant method `image_span_tokens` names the two ids, which the card's snippet folds into the image's
one run of the prompt (`exporters.layouts.executorch_multimodal.IMAGE_INPUTS`). The ONNX layouts that place the features
at the `[IMG]` tokens alone, the break rows the prompt's own (ONNX Runtime GenAI's, transformers.js's), trace the
tower's features of one image of one size ([`PixtralVision`]).

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
    >>> pixtral_rows(9, 2, 2, 7, 8)
    [9, 9, 7, 9, 9, 8]
    >>> pixtral_span([1, 9, 9, 7, 9, 9, 8, 5], 9, 2, 2), pixtral_span([1, 9, 9, 9, 9, 5], 9, 2, 2)
    ((7, 8), None)
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch._subclasses.fake_tensor as fake_tensor

from exporters.upstream.patches import patched

IMAGE_SIZES = "image_sizes"
IMAGE_SIZE = "image_size"  # the program's constant method: [height, width] of the one image it takes
# the program's constant method of a Pixtral tower's program: [[IMG_BREAK] id, [IMG_END] id], folded by the snippet
IMAGE_SPAN = "image_span_tokens"
PIXTRAL_TOKENS = ("[IMG_BREAK]", "[IMG_END]")  # PixtralProcessor's row break and end tokens


def pixtral_grid(config: Any, size: list[int]) -> tuple[int, int]:
    """The rows and columns of image tokens a Pixtral tower makes of one image of `size` `[height, width]`: one per
    patch, merged `spatial_merge_size` x `spatial_merge_size` (Mistral 3)."""
    step = int(config.vision_config.patch_size) * int(getattr(config, "spatial_merge_size", 1) or 1)
    return int(size[0]) // step, int(size[1]) // step


def pixtral_rows(token: int, rows: int, cols: int, row_break: int, end: int) -> list[int]:
    """One image's span of ids in PixtralProcessor's layout: `rows` rows of `cols` `token`s, each ended by
    `row_break`, the last by `end`."""
    return sum(([token] * cols + [row_break] for _ in range(rows)), [])[:-1] + [end]


def pixtral_span(ids: list[int], token: int, rows: int, cols: int) -> tuple[int, int] | None:
    """The `([IMG_BREAK], [IMG_END])` ids of a prompt whose one image is a span of `rows` (at least 2, so the break
    is seen) x `cols` image tokens in the processor's layout ([`pixtral_rows`]); None for any other prompt."""
    if token not in ids or rows < 2:
        return None
    at, length = ids.index(token), rows * (cols + 1)
    if at + length > len(ids):
        return None
    row_break, end = ids[at + cols], ids[at + length - 1]
    if len({row_break, end, token}) != 3 or ids[at:at + length] != pixtral_rows(token, rows, cols, row_break, end):
        return None
    return None if token in ids[at + length:] else (row_break, end)


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


@contextlib.contextmanager
def image_sizes_as_constants() -> Iterator[None]:
    """Inside the block, a traced tensor of one image's `[height, width]` keeps its values. Mistral 3's
    `get_image_features` splits its features by `(torch.as_tensor(image_sizes) // ratio).prod(-1).tolist()`: traced,
    that tensor of 2 numbers is fake without its values (FakeTensorMode keeps a constant's values up to
    `CONSTANT_NUMEL_LIMIT`, 1 element), so the split size is a data-dependent int with runtime asserts on it, which
    ExecuTorch's constant propagation folds into a bool it cannot hold (`TypeError: cannot create weak reference to
    'bool' object`). With the limit at 2 the split is the constant count in the graph."""
    with patched(fake_tensor, "CONSTANT_NUMEL_LIMIT", max(int(fake_tensor.CONSTANT_NUMEL_LIMIT), 2)):
        yield


class FixedSizeImageEncoder(torch.nn.Module):
    """`vision_encoder(pixel_values [1, C, tiles x h, w]) -> [1, image tokens, hidden]`: the model's own
    `get_image_features` of one image whose `image_sizes` are `sizes` (one `[height, width]`), its `tiles` tiles
    unstacked (see the module). `size`: the image's `[height, width]`, the program's `image_size`. `span`: a Pixtral
    tower's `([IMG_BREAK] id, [IMG_END] id, rows, cols)`: the features laid out in the processor's rows, those two
    tokens' embeddings (the model's own table's rows, constants) after each row and after the last."""

    def __init__(self, model: Any, sizes: list[list[int]], tiles: int,
                 span: tuple[int, int, int, int] | None = None):
        super().__init__()
        self.model, self.tiles, self.span = model, tiles, span
        self.sizes = [[int(value) for value in size] for size in sizes]
        self.size = self.sizes[0]
        self.pixtral = span is not None  # its features' split sizes traced as constants (`image_sizes_as_constants`)
        if span is not None:
            table = model.get_input_embeddings().weight
            self.register_buffer("span_rows", table[[span[0], span[1]]].detach().clone(), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        channels, height, width = pixel_values.shape[1], pixel_values.shape[2] // self.tiles, pixel_values.shape[3]
        tiles = pixel_values.reshape(channels, self.tiles, height, width).transpose(0, 1)
        with image_sizes_as_constants() if self.pixtral else contextlib.nullcontext():
            features = self.model.get_image_features(pixel_values=tiles, image_sizes=self.sizes)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output object
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), dim=0)
        features = features.reshape(-1, features.shape[-1])
        if self.span is not None:  # Pixtral's rows: [IMG_BREAK] after each, [IMG_END] in place of the last break
            rows, cols = self.span[2:]
            grid = features.reshape(rows, cols, -1)
            breaks = self.span_rows[:1].to(grid.dtype).expand(rows, 1, grid.shape[-1])
            laid = torch.cat([grid, breaks], dim=1).reshape(rows * (cols + 1), -1)
            features = torch.cat([laid[:-1], self.span_rows[1:].to(grid.dtype)])
        return features.reshape(1, -1, features.shape[-1])


class PixtralVision(torch.nn.Module):
    """A Pixtral tower's (Mistral 3's) features of one image of `size` (height, width), in order: the tower on it, its
    `vision_feature_layer`'s states (or several, concatenated), merged and projected as `get_image_features` does,
    without its `squeeze(0)` of the projected features: on `[features, hidden]` torch leaves them as they are, while
    ONNX's `Squeeze` refuses them ("Dimension of input 0 must be 1 instead of 4", ONNX Runtime on load). Gives
    `[features, hidden]` (ONNX Runtime GenAI's vision graph), or `[1, features, hidden]` where `batched` (one
    sequence: transformers.js's `vision_encoder`)."""

    def __init__(self, model: Any, size: tuple[int, int] | list[int], batched: bool = False):
        super().__init__()
        self.model, self.sizes, self.batched = model.model, [[int(side) for side in size]], batched

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.vision_tower(pixel_values, image_sizes=self.sizes, output_hidden_states=True,
                                      return_dict=True)
        layer = self.model.config.vision_feature_layer
        states = out.hidden_states[layer] if isinstance(layer, int) else \
            torch.cat([out.hidden_states[index] for index in layer], dim=-1)
        features = self.model.multi_modal_projector(states[0], self.sizes)
        return features.reshape(1, -1, features.shape[-1]) if self.batched else features

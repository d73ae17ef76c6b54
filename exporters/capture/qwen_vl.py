"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's vision tower at one image grid, their 3-D (M-RoPE) positions and Qwen3-VL's
DeepStack features carried in the features' rows ([`widened`]): what transformers.js's vision-language layout
(`image_text.py`) and ONNX Runtime GenAI's Qwen-VL folder (`exporters.layouts.genai.qwen_vl`) trace and feed.

The tower's rotary positions, attention spans and (Qwen2.5-VL) window index are data-dependent on the image's grid
(`image_grid_thw`): they are computed here for the sample's grid and traced as constants ([`FixedGridVision`]).
transformers.js feeds its `vision_encoder` the processor's patches and their grid (`grid_thw` for Qwen2-VL,
`image_grid_thw` for Qwen2.5-VL and Qwen3-VL: [`GRID_INPUT`]); [`GridVisionEncoder`] reads the grid and gives NaN features for any
grid but the traced one, so an image the processor cut otherwise (the same patch count, another shape) fails the
comparison instead of passing through the traced grid's positions.

transformers.js computes the prompt's positions as the model's `get_rope_index` does (text tokens 1-D, an image's
tokens by temporal, height and width), then each new token at its position plus the prompt's `rope_deltas`
([`rope_positions`], [`step_positions`]).

Example:
    >>> step_positions(7, torch.tensor([[-3]])).flatten().tolist()
    [4, 4, 4]
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from transformers import vision_utils

# transformers.js's Qwen2VLForConditionalGeneration and its Qwen2.5-VL and Qwen3-VL classes (the last the second's)
MROPE_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
GRID_INPUT = {"qwen2_vl": "grid_thw", "qwen2_5_vl": "image_grid_thw", "qwen3_vl": "image_grid_thw"}  # per class
PROCESSOR_CLASS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                   "qwen3_vl": "Qwen3VLProcessor"}  # its processors


class FixedGridVision(torch.nn.Module):
    """The tower on one image of the grid `grid` ([1, 3]), its rotary positions, (a Qwen2.5-VL's, whose tower has
    window attention) window index and (a Qwen3-VL's, whose learned position table is interpolated to the grid)
    interpolation computed here for that grid (they are data-dependent on the grid: traced as constants); a Qwen3-VL's
    DeepStack features concatenated after the merged ones (`widened`)."""

    def __init__(self, model: Any, grid: torch.Tensor):
        super().__init__()
        self.visual, self.grid = model.model.visual, grid
        visual = self.visual
        fixed = {"position_ids": vision_utils.get_vision_position_ids(grid, visual.spatial_merge_size, kwargs={}),
                 "cu_seqlens": vision_utils.get_vision_attention_seqlens(grid, visual.config, kwargs={})[0]}
        if hasattr(visual, "window_size"):  # Qwen2.5-VL's tower; Qwen2-VL's attends over the whole image
            fixed["window_index"], fixed["cu_window_seqlens"] = vision_utils.get_vision_window_index(
                grid, spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
                patch_size=visual.patch_size, kwargs={})
        if hasattr(visual, "num_grid_per_side"):  # Qwen3-VL's tower: its position table resampled to the grid
            fixed["interp_indices"], fixed["interp_weights"] = vision_utils.get_vision_interpolation_indices_and_weights(
                grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
                align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.config.spatial_merge_size,
                kwargs={})
        self.names = list(fixed)
        for name, value in fixed.items():
            self.register_buffer(name, value.clone(), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        fixed = {name: getattr(self, name) for name in self.names}
        out = self.visual(pixel_values, grid_thw=self.grid, **fixed)
        return torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], dim=-1)


class GridVisionEncoder(torch.nn.Module):
    """transformers.js's `vision_encoder(pixel_values [patches, 3·t·p·p], image_grid_thw [1, 3])` ->
    `image_features [patches / merge², hidden]`: the tower at the traced grid ([`FixedGridVision`]); NaN features
    where the grid fed is not the traced one (see the module)."""

    def __init__(self, model: Any, grid: torch.Tensor):
        super().__init__()
        self.tower = FixedGridVision(model, grid)
        self.register_buffer("traced_grid", grid.clone(), persistent=False)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        features = self.tower(pixel_values)
        same = (image_grid_thw == self.traced_grid).all()
        return torch.where(same, features, torch.full_like(features, float("nan")))


def deepstack(config: Any) -> int:
    """How many DeepStack features a Qwen3-VL tower adds to its language model's first layers' states (0 for a
    Qwen2.5-VL or Qwen2-VL)."""
    return len(getattr(config.vision_config, "deepstack_visual_indexes", None) or [])


def widened(config: Any) -> int:
    """The width of the image features and `inputs_embeds` passed between the graphs: the text hidden size, times one
    plus the DeepStack features' count. Neither runtime feeds a Qwen3-VL's text graph anything but `inputs_embeds`
    (ONNX Runtime GenAI 0.18, transformers.js 4.3.2: docs/upstream-gaps.md #56, #61), so its DeepStack features ride
    in the same rows: the vision graph concatenates them after the merged features ([`FixedGridVision`]), the
    embedding pads each token's row with zeros to the width ([`WidenedEmbedding`]), and the decoder splits them off
    and adds each after its layer ([`deepstack_added`]; zeros at text tokens: eager adds at the image tokens only, and
    x + 0 is x)."""
    return int(config.text_config.hidden_size) * (1 + deepstack(config))


class WidenedEmbedding(torch.nn.Module):
    """`embed_tokens(input_ids) -> inputs_embeds [batch, seq, widened]`: the token table's rows padded with zeros to
    the features' width (`widened`)."""

    def __init__(self, embedding: torch.nn.Module, width: int):
        super().__init__()
        self.embedding, self.width = embedding, width

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.embedding(input_ids)
        return torch.nn.functional.pad(rows, (0, self.width - rows.shape[-1]))


@contextlib.contextmanager
def deepstack_added(model: Any, inputs_embeds: torch.Tensor) -> Iterator[torch.Tensor]:
    """Within: the text model's own embeddings of `inputs_embeds` (its first `hidden` columns), with hooks that add each
    further part after its language-model layer, as eager adds a Qwen3-VL's DeepStack features (`widened`); the hooks
    are removed on the way out. No hooks where the rows are the text model's width."""
    parts = inputs_embeds.split(int(model.config.text_config.hidden_size), dim=-1)
    layers = model.model.language_model.layers if len(parts) > 1 else []
    hooks = [layer.register_forward_hook(lambda _module, _args, states, feature=feature: states + feature)
             for layer, feature in zip(layers, parts[1:])]
    try:
        yield parts[0]
    finally:
        for hook in hooks:
            hook.remove()


def rope_positions(model: Any, ids: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt's M-RoPE positions [3, 1, seq] and its `rope_deltas` [1, 1], as the model's `get_rope_index`
    computes them for `ids` [1, seq] with one image of `grid` per image block."""
    image = (ids == int(model.config.image_token_id)).long()
    with torch.no_grad():
        positions, deltas = model.model.get_rope_index(ids, mm_token_type_ids=image, image_grid_thw=grid,
                                                       attention_mask=torch.ones_like(ids))
    return positions, deltas


def step_positions(start: int, deltas: torch.Tensor, length: int = 1) -> torch.Tensor:
    """The positions [3, batch, length] of tokens after `start` tokens of a prompt with `deltas` [batch, 1]."""
    text = torch.arange(start, start + length).view(1, -1) + deltas
    return text.unsqueeze(0).expand(3, -1, -1).clone()


def is_mrope(config: Any) -> bool:
    """Whether the model's layout in transformers.js is Qwen2-VL's (3-D positions, the grid beside the pixels).

    Example:
        >>> from types import SimpleNamespace
        >>> is_mrope(SimpleNamespace(model_type="qwen2_vl")), is_mrope(SimpleNamespace(model_type="llava"))
        (True, False)
    """
    return getattr(config, "model_type", None) in MROPE_TYPES

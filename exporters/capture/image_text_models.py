"""Which models transformers.js's vision- and audio-language layouts take (`exporters.capture.image_text`'s three
graphs), and why not: the target (an ONNX generation target with `"layout": "transformers.js"`, [`wants_image_text`]),
the model type (one transformers.js has an `ImageTextToText` or `AudioTextToText` class for, merging as this layout's
graphs do: [`MODEL_TYPES`], [`AUDIO_MODEL_TYPES`]), the sample's inputs (one image, or one audio chunk, and a prompt
long enough to trace the decoder on a cache: [`TRACED_PAST`] + [`TRACED_QUERY`]) and the recipe's settings (a
dynamic cache; no `quantize`, `components` or `dynamic_shapes`). A model outside them keeps its components (the
upstream layout) and transformers.js's "runs in" cell says why ([`refused`], [`refused_audio`]).

transformers.js's `VoxtralProcessor` lays out 375 audio tokens per chunk of its extractor's `n_samples` (a constant
of its code, Voxtral's 30 s at 16 kHz): a model whose audio encoder gives another count per chunk is refused with
that reason, as is a family transformers.js has no class for (Qwen2-Audio).

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "onnx", "mode": "generation", "layout": "transformers.js"}').exports[0]
    >>> wants_image_text(target, "vision-language"), wants_image_text(target, "text")
    (True, False)
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.image_attention import BIDIRECTIONAL_PREFILL
from exporters.capture.merged import mixes_window_layers
from exporters.capture.qwen_vl import MROPE_TYPES
from exporters.capture.token_ids import image_token_id
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.upstream.fixed_image import IMAGE_SIZES, pixtral_grid, pixtral_span

# audio-language model types transformers.js 4.3.2 generates from (its AudioTextToText models), and the audio tokens
# its processor lays out per chunk (VoxtralProcessor's NUM_AUDIO_TOKENS)
AUDIO_MODEL_TYPES = ("voxtral", "granite_speech")
AUDIO_TOKENS_PER_CHUNK = {"voxtral": 375}  # Granite Speech's processor counts them from the audio's length
# model types whose transformers.js class merges the image features as LLaVA's does (in order, at the image tokens);
# Qwen2-VL's and Qwen2.5-VL's with 3-D positions and the image's grid (`exporters.capture.qwen_vl`)
# Gemma 3's with its image's rows marked (its prefill attends both ways among one image's tokens: `image_text.marked`)
# PaliGemma's, each call's rows one block attending both ways (its prompt is its prefix: `image_text.EmbedsDecoder`)
# Mistral 3's (Pixtral's tower) at one image size, the features at its [IMG] tokens, its break rows the prompt's own
MODEL_TYPES = ("llava", "idefics3", "smolvlm", *MROPE_TYPES, "gemma3", "paligemma", "mistral3")
PIXTRAL_TYPES = ("mistral3",)  # one image with its image_sizes, its tokens in PixtralProcessor's rows
IMAGE_INPUTS = {"input_ids", "attention_mask", "pixel_values", "pixel_attention_mask"}
GRID_INPUTS = {"image_grid_thw", "mm_token_type_ids"}  # Qwen-VL's besides (its token types: the image's tokens)
TRACED_PAST, TRACED_QUERY = 3, 2  # the decoder is traced on a cache and a query long enough to stay dynamic


def wants_image_text(target: Any, family: str) -> bool:
    """Whether `target` is an ONNX generation target of a vision- or audio-language model in the transformers.js
    layout."""
    return (target.export_format == "onnx" and target.mode == "generation"
            and family in ("vision-language", "audio-language") and getattr(target, "layout", None) == TRANSFORMERS_JS)


def refused(target: Any, model: Any, generate_inputs: dict[str, Any], cache_implementation: str) -> str | None:
    """Why the model does not fit transformers.js's vision-language layout (see the module), else None.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(model_type="idefics2")
        >>> refused(None, SimpleNamespace(config=config), {}, "dynamic")[:60]
        "transformers.js's vision-language layout is written for mode"
    """
    model_type = getattr(model.config, "model_type", None)
    if "input_features" in generate_inputs:
        return refused_audio(target, model, generate_inputs, cache_implementation)
    pixels, ids = generate_inputs.get("pixel_values"), generate_inputs.get("input_ids")
    extra = sorted(set(generate_inputs) - IMAGE_INPUTS - (GRID_INPUTS if model_type in MROPE_TYPES else set())
                   - ({"token_type_ids", "labels"} if model_type in BIDIRECTIONAL_PREFILL else set())
                   - ({IMAGE_SIZES} if model_type in PIXTRAL_TYPES else set()))
    # Gemma 3's and PaliGemma's token types (PaliGemma's processor returns training labels too, which none feeds)
    if model_type not in MODEL_TYPES:
        return (f"transformers.js's vision-language layout is written for model types {list(MODEL_TYPES)} (the "
                f"image's features in place of its image tokens, LLaVA's merge); this is {model_type!r}")
    if why := _refused_settings(target, cache_implementation):
        return why
    if not hasattr(model, "get_image_features"):
        return f"{type(model).__name__} has no get_image_features (the vision_encoder graph)"
    if model_type == "paligemma" and mixes_window_layers(model.config):
        return ("its sliding-window layers (PaliGemma 2's) would need the prefix's block in a sliding mask too, which "
                "this layout's decoder does not write yet (its prefix mask is one for every layer)")
    if extra:
        return f"its image inputs include {extra}, which transformers.js's image-text-to-text models do not feed"
    if model_type in MROPE_TYPES:
        return _grid_refused(pixels, generate_inputs.get("image_grid_thw"), ids)
    if not isinstance(pixels, torch.Tensor) or pixels.dim() not in (4, 5) or pixels.shape[0] != 1:
        return f"its pixels are not one image [1, (tiles,) 3, H, W] (shape {list(getattr(pixels, 'shape', []))})"
    if not isinstance(ids, torch.Tensor) or ids.shape[1] < TRACED_PAST + TRACED_QUERY:
        return "its prompt is too short to trace the decoder with a dynamic cache"
    if model_type in PIXTRAL_TYPES:
        return _rows_refused(model.config, pixels, generate_inputs.get(IMAGE_SIZES), ids)
    return None


def takes_pixtral_rows(model: Any) -> bool:
    """Whether `model` is a Pixtral tower's (Mistral 3): one image of one size with its `image_sizes`, its image
    tokens in PixtralProcessor's rows, which the layout's vision encoder bakes in (`image_text.image_encoder`).

    Example:
        >>> from types import SimpleNamespace
        >>> takes_pixtral_rows(SimpleNamespace(config=SimpleNamespace(model_type="mistral3")))
        True
    """
    return getattr(model.config, "model_type", None) in PIXTRAL_TYPES


def _rows_refused(config: Any, pixels: torch.Tensor, sizes: Any, ids: torch.Tensor) -> str | None:
    """Why a Mistral 3 sample does not fit the layout, else None: its vision encoder is traced at one square image
    whose sides are multiples of patch x merge, its `image_sizes` baked in (the folder's processor resizes any square
    image to it: `exporters.layouts.transformers_js.files.pixtral_files`), and transformers.js's PixtralProcessor
    lays the image's tokens out in rows, `[IMG]` x cols then `[IMG_BREAK]`, the last row ending `[IMG_END]`, so
    eager's prompt must be in those rows (its break rows are the prompt's own embeddings; the features go at `[IMG]`
    alone)."""
    step = int(config.vision_config.patch_size) * int(getattr(config, "spatial_merge_size", 1) or 1)
    side = int(pixels.shape[-1])
    told = sizes.reshape(-1).tolist() if isinstance(sizes, torch.Tensor) else sizes
    if pixels.dim() != 4 or int(pixels.shape[-2]) != side or side % step or told != [side, side]:
        return (f"its pixels are not one square image whose sides are multiples of {step} (patch x merge) with its "
                f"image_sizes (pixels {list(pixels.shape)}, image_sizes {told})")
    rows, cols = pixtral_grid(config, [side, side])
    if pixtral_span(ids[0].tolist(), image_token_id(config), rows, cols) is None:
        return (f"its prompt's image tokens are not one image in PixtralProcessor's rows ({rows} rows of {cols} "
                "[IMG], each ended by [IMG_BREAK], the last by [IMG_END]), which transformers.js's processor lays out")
    return None


def _grid_refused(pixels: Any, grid: Any, ids: Any) -> str | None:
    """Why a Qwen-VL sample does not fit the layout (one image of a square grid: its tower is traced at that grid
    and the folder's processor resizes every image to it), else None."""
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 2 or not isinstance(grid, torch.Tensor) \
            or list(grid.shape) != [1, 3] or int(grid[0, 0]) != 1 or int(grid[0, 1]) != int(grid[0, 2]):
        return (f"its pixels are not one image's patches of a square grid (image_grid_thw "
                f"{getattr(grid, 'tolist', lambda: grid)()})")
    if not isinstance(ids, torch.Tensor) or ids.shape[1] < TRACED_PAST + TRACED_QUERY:
        return "its prompt is too short to trace the decoder with a dynamic cache"
    return None


def _refused_settings(target: Any, cache_implementation: str) -> str | None:
    """Why the recipe's cache or the target's settings do not fit a transformers.js multimodal layout, else None."""
    if cache_implementation != "dynamic":
        return "transformers.js runs the decoder on a dynamic cache; the recipe's cache is static"
    if target is not None and (target.quantize is not None or target.components or target.dynamic_shapes):
        return "the target sets quantize, components or dynamic_shapes, which this layout does not take yet"
    return None


def refused_audio(target: Any, model: Any, generate_inputs: dict[str, Any], cache_implementation: str) -> str | None:
    """Why an audio-language model does not fit transformers.js's audio-language layout (see the module), else None.

    Example:
        >>> from types import SimpleNamespace
        >>> refused_audio(None, SimpleNamespace(config=SimpleNamespace(model_type="qwen2_audio")), {}, "dynamic")[:73]
        "transformers.js 4.3.2 has no audio-language model class for 'qwen2_audio'"
    """
    model_type = getattr(model.config, "model_type", None)
    if model_type not in AUDIO_MODEL_TYPES:
        return (f"transformers.js 4.3.2 has no audio-language model class for {model_type!r} (its AudioTextToText "
                f"models this layout writes: {list(AUDIO_MODEL_TYPES)})")
    if why := _refused_settings(target, cache_implementation):
        return why
    features, ids = generate_inputs.get("input_features"), generate_inputs.get("input_ids")
    extra = sorted(set(generate_inputs) - {"input_ids", "attention_mask", "input_features"})
    if extra or not isinstance(features, torch.Tensor) or features.dim() != 3 or features.shape[0] != 1:
        return f"its audio inputs are not one chunk's log-mel features [1, bins, frames] (besides: {extra})"
    if not isinstance(ids, torch.Tensor) or ids.shape[1] < TRACED_PAST + TRACED_QUERY:
        return "its prompt is too short to trace the decoder with a dynamic cache"
    count = int((ids[0] == model.config.audio_token_id).sum())
    if model_type in AUDIO_TOKENS_PER_CHUNK and count != AUDIO_TOKENS_PER_CHUNK[model_type]:
        return (f"transformers.js's processor lays out {AUDIO_TOKENS_PER_CHUNK[model_type]} audio tokens per chunk; "
                f"this model's audio encoder gives {count} for a chunk of {features.shape[-1]} frames")
    return None

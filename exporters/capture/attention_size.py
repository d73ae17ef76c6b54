"""How large an attention a model computes on inputs of given shapes: what validation's probes and `hf-export
init`'s ranges are held to, since attention grows with the square of a sequence (of tokens, or of image patches)
where the inputs grow linearly.

Example:
    >>> attention_elements({"input_ids": (1, 8), "cache.layers.0.keys": (1, 2, 4, 8)}, None)
    96
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_PROBE_ATTENTION = 1 << 26  # batch x heads x query x key: 256 MiB a copy in float32 (mask, scores, softmax)
_TOKENS = ("input_ids", "inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds")
_IMAGES = "pixel_values"
# a key-value cache leaf of the inputs (`cache.layers.0.keys`, `past_key_values.0.values`)
CACHE_LEAF = re.compile(r"(^|\.)(cache|past_key_values)\..*\.(keys|values)$")


def attention_elements(shapes: dict[str, Any], config) -> int:
    """The largest attention (batch x heads x query x key elements) a model computes on inputs of `shapes`: a text
    query over itself and the self-attention cache, or over a cross-attention cache (a 131072-token prompt: 0.4M
    input elements, 69 GB of scores a head), or a vision tower's patches over themselves (`vision_attention`).

        >>> attention_elements({"input_ids": (1, 8), "cache.layers.0.keys": (1, 2, 4, 8)}, None)
        96
    """
    return max(_text_attention(shapes, config), vision_attention(shapes, config))


def _text_attention(shapes: dict[str, Any], config) -> int:
    tokens = [shape for path, shape in shapes.items() if path in _TOKENS and len(shape) >= 2]
    if not tokens:
        return 0
    batch, query = max(shape[0] for shape in tokens), max(shape[1] for shape in tokens)
    caches = [(path, shape[-2]) for path, shape in shapes.items() if CACHE_LEAF.search(path) and len(shape) >= 3]
    past, cross = (max((n for path, n in caches if ("cross_attention" in path) == c), default=0) for c in (0, 1))
    text = getattr(config, "text_config", None) or config
    return batch * _heads(text) * query * max(query + past, cross)


def vision_attention(shapes: dict[str, Any], config) -> int:
    """A vision tower's attention over the patches of images `pixel_values` of `[..., channels, height, width]`
    (a ViT's, a vision-language model's `vision_config`): images x heads x patches². A 384-pixel SigLIP tower at 8x
    the size (3072 pixels, 48,000 patches of 14) would score 37 billion elements.

        >>> from types import SimpleNamespace
        >>> vision_attention({"pixel_values": (1, 3, 64, 64)}, SimpleNamespace(vision_config=SimpleNamespace(
        ...     patch_size=8, num_attention_heads=2)))
        8192
    """
    shape = shapes.get(_IMAGES)
    vision = getattr(config, "vision_config", None) or config
    patch = getattr(vision, "patch_size", None)
    if shape is None or len(shape) < 4 or not isinstance(patch, int) or patch <= 0:
        return 0  # flattened patches (Qwen-VL's) are counted as the inputs they are
    patches = (shape[-2] // patch) * (shape[-1] // patch)
    return math.prod(shape[:-3]) * _heads(vision) * patches * patches


def _heads(config) -> int:
    return int(max([getattr(config, name, None) or 1 for name in (
        "num_attention_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads")] + [1]))

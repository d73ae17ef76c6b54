"""The cache a generation target is captured, exported and checked with: decided per target.

The recipe's `generation` section is recipe-wide, but what a target needs is not: an ExecuTorch program cannot grow a
cache (a decode traced with a growing `DynamicCache` whose length axis is static fails at its second step), so an
ExecuTorch generation target that declares no dynamic cache axis gets a fixed-size static cache, the deployable form
of an on-device LLM, unless the recipe chose the cache itself (`generation.cache_implementation`).

A static cache holds `max_cache_len` positions: the recipe's `generation.max_cache_len` (refused past the model's
`max_position_embeddings`: [`check_cache_len`]), else `min(DEFAULT_MAX_CACHE_LEN, max_position_embeddings)`. Every slot is allocated up front whether it is used or not,
so the default is what a typical on-device prompt and reply need, never past what the model can attend to.

An ONNX generation target of a decoder-only model with sliding-window layers is captured with a full-length cache in
every layer ([`full_length_windows`]: the window applied by the attention mask over it), the cache ONNX Runtime
GenAI, optimum and transformers.js allocate and feed; eager validation keeps the model's own sliding cache.

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> recipe = parse_recipe('{"export_format": "executorch", "mode": "generation"}')
    >>> cache_setting(recipe.exports[0], recipe, max_positions=256)
    CacheSetting(implementation='static', max_cache_len=256, defaulted=True, full_windows=False)
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass
from typing import Any, Literal

from transformers.cache_utils import (DynamicCache, DynamicLayer, DynamicSlidingWindowLayer,
                                      LinearAttentionCacheLayerMixin)

from exporters.capture.generation_settings import greedy
from exporters.capture.shapes import axis_specs, spec_key
from exporters.errors import DecodeStepError, ShapeSpecError
from exporters.recipe.model import ComponentOverride
from exporters.recipe.model_limits import (  # noqa: F401  (check_cache_len, positions_in: re-exported)
    DEFAULT_MAX_CACHE_LEN, POSITION_KEYS, check_cache_len, positions_in)
from exporters.upstream import leaf_tensors

CACHE_INPUTS = ("cache", "past_key_values")


@dataclass(frozen=True)
class CacheSetting:
    """`implementation` and `max_cache_len` of one target; `defaulted`: the ExecuTorch default chose it;
    `full_windows`: the capture's cache keeps every position in every layer, sliding-window layers too (the window
    applied by the mask: [`full_length_windows`]), where the model's own cache keeps only a window there."""

    implementation: Literal["dynamic", "static"]
    max_cache_len: int | None = None
    defaulted: bool = False
    full_windows: bool = False

    def capture_inputs(self, generate_inputs: dict[str, Any]) -> dict[str, Any]:
        """`generate_inputs` as the capture's `generate()` takes them: with a config-less `DynamicCache()` (a plain
        `DynamicLayer` per layer: every position kept) when `full_windows`; as they are otherwise (`generate()`
        builds the model's own cache).

        Example:
            >>> CacheSetting("dynamic", full_windows=True).capture_inputs({"input_ids": None})["cache"].layers
            []
        """
        return {**generate_inputs, "cache": DynamicCache()} if self.full_windows else generate_inputs

    def window_finding(self, window: int | None) -> str | None:
        """What a full-length capture does with the model's sliding-window layers, in the report's words."""
        if not self.full_windows:
            return None
        where = f"the window of {window} positions" if window else "the sliding window"
        return (f"every layer's cache keeps every position ({where} applied by the attention mask), the cache ONNX "
                "Runtime GenAI, optimum and transformers.js allocate and feed: one past length, no window input; "
                "generation parity compares it with eager's own sliding-window cache")

    def apply(self, generation_config):
        """A greedy copy of `generation_config` (`exporters.capture.generation_settings.greedy`) capturing with
        this cache: what the capture and validation run."""
        return self.for_artifact(greedy(generation_config))

    def for_artifact(self, generation_config):
        """A copy of `generation_config` with only this cache added: what an artifact folder's
        `generation_config.json` holds (the repo's own sampling settings kept)."""
        config = copy.deepcopy(generation_config)
        if self.implementation == "static":
            config.cache_implementation = "static"
            config.max_cache_len = self.max_cache_len
        return config

    def sliding_finding(self, window: int | None) -> str | None:
        """What a static cache does with a model's sliding-window layers, when the window is shorter than the cache."""
        if self.implementation != "static" or window is None or self.max_cache_len is None \
                or window >= self.max_cache_len:
            return None
        return (f"the static cache keeps its sliding-window layers whole ({self.max_cache_len} positions each; the "
                f"mask applies the window of {window}): a rolling window layer's graph would be right only until its "
                "window filled (docs/upstream-gaps.md, 9)")

    def finding(self, target: str, max_positions: int | None) -> str | None:
        """The sentence the report carries when the default chose the cache."""
        if not self.defaulted:
            return None
        bound = f"max_position_embeddings {max_positions}" if max_positions is not None else "no position limit"
        return (
            "the ExecuTorch generation target declares no dynamic cache axis, so it was exported with a "
            f"static cache of {self.max_cache_len} positions (generation.max_cache_len unset: "
            f"min({DEFAULT_MAX_CACHE_LEN}, {bound})); an ExecuTorch program cannot grow a cache, and every slot is "
            "allocated up front: set generation.max_cache_len to the longest prompt plus reply you will run"
        )


def max_positions(model_config) -> int | None:
    """How many positions the model's decoder can attend to, when its config says."""
    text = _decoder_config(model_config)
    for name in POSITION_KEYS:
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _decode_contract(target) -> tuple[Any, bool]:
    """The decode's dynamic-shape spec and `dynamic` flag (the component's override, else the target's)."""
    override = target.components.get("decode")
    spec = override.dynamic_shapes if override is not None and override.dynamic_shapes is not None else None
    spec = spec if spec is not None else target.dynamic_shapes
    dynamic = override.dynamic if override is not None and override.dynamic is not None else target.dynamic
    return spec, dynamic


def _is_cache_key(key: str) -> bool:
    return any(fnmatch.fnmatchcase(name, key.split(".", 1)[0]) for name in CACHE_INPUTS)


def _axis_dynamic(value: Any, rank: int, axis: int, key: str) -> bool:
    try:
        return axis_specs(value, rank, key).get(axis % rank, "static") != "static"
    except ShapeSpecError:
        return True  # a malformed entry: the export reports it, with its key


def declares_dynamic_cache_axis(target) -> bool:
    """Whether the decode's cache length axis (axis 2 of `[batch, heads, length, head_dim]`) is declared dynamic:
    a cache key with a non-static axis 2, or `dynamic: true` without `dynamic_shapes`. A merged target's one
    graph has a dynamic cache axis by construction (`exporters.capture.merged`)."""
    if getattr(target, "merged", None):
        return True
    spec, dynamic = _decode_contract(target)
    if not spec:
        return bool(dynamic)
    return any(_is_cache_key(key) and _axis_dynamic(value, 4, 2, key) for key, value in spec.items())


def cache_setting(target, recipe, max_positions: int | None) -> CacheSetting:
    """The cache `target` is captured and exported with (see the module docstring)."""
    generation = recipe.generation
    chosen = "cache_implementation" in generation.model_fields_set
    implementation = generation.cache_implementation
    defaulted = (not chosen and target.export_format == "executorch" and target.mode == "generation"
                 and not declares_dynamic_cache_axis(target))
    if defaulted:
        implementation = "static"
    if implementation != "static":
        return CacheSetting("dynamic")
    check_cache_len(recipe, max_positions)  # a run refuses it first (exporters.run.context); a library caller too
    length = generation.max_cache_len
    if length is None:
        length = min(DEFAULT_MAX_CACHE_LEN, max_positions) if max_positions else DEFAULT_MAX_CACHE_LEN
    return CacheSetting("static", length, defaulted)


def _growing_leaves(decode_inputs: dict[str, Any]) -> dict[str, Any]:
    """`{path: tensor}` of the cache leaves that grow by one position per step (a `DynamicLayer`'s keys and values,
    not the fixed cross-attention cache of an encoder-decoder)."""

    grown = {}
    for path, tensor in leaf_tensors(decode_inputs).items():
        parts = path.split(".")
        if parts[0] not in CACHE_INPUTS or parts[-1] not in ("keys", "values") or "cross_attention_cache" in parts:
            continue
        node: Any = decode_inputs
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, (list, tuple)) else node[part] if isinstance(node, dict) \
                else getattr(node, part)
        if isinstance(node, DynamicLayer) and tensor.dim() >= 2:
            grown[path] = tensor
    return grown


GROWN_CACHE_NOTE = ("the decode's {what} length axis is dynamic (what generation grows: the recipe declared no "
                     "dynamic shape for it, and a decode fixed at its traced cache length could not run a second "
                     "step); everything else keeps its traced size")


def default_decode_contract(target, components: dict[str, Any], setting: CacheSetting) -> str | None:
    """Give a generation target's separate decode the one dynamic axis generation needs, when the recipe declares
    no contract for it (`dynamic` unset or false, no `dynamic_shapes` at all): the length
    axis of every cache tensor that grows a position per step. The plainest recipe of an encoder-decoder (Whisper,
    T5) or of a `merged: false` decoder then generates instead of failing [`check_second_step`]. Returns the
    report's note, or None when nothing was added.

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> target = parse_recipe('{"export_format": "onnx", "mode": "generation"}').exports[0]
        >>> default_decode_contract(target, {}, CacheSetting("dynamic")) is None  # no decode captured
        True
    """
    if target.mode != "generation" or "decode" not in components or setting.implementation == "static":
        return None
    spec, dynamic = _decode_contract(target)
    if spec is not None or dynamic:  # a declared contract (even `{}`: nothing dynamic) is checked as declared
        return None
    grown = _growing_leaves(components["decode"][1])
    if not grown:
        return None
    patterns = sorted({layer_pattern(path) for path in grown})
    override = target.components.get("decode")
    shapes = {pattern: {str(grown_axis(grown, pattern)): "auto"} for pattern in patterns}
    if override is None:
        target.components["decode"] = ComponentOverride.model_validate({"dynamic_shapes": shapes})
    else:
        override.dynamic_shapes = shapes
    what = "self-attention cache" if any("self_attention_cache" in p for p in patterns) else "cache"
    return GROWN_CACHE_NOTE.format(what=what)


def layer_pattern(path: str) -> str:
    """A leaf path with its layer indices as `*` (`cache.layers.0.keys` -> `cache.layers.*.keys`)."""
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def grown_axis(grown: dict[str, Any], pattern: str) -> int:
    """The length axis (second to last) of the first grown tensor that `pattern` names."""
    for path, tensor in grown.items():
        if fnmatch.fnmatchcase(path, pattern):
            return tensor.dim() - 2
    return 2


def check_second_step(target, components: dict[str, Any], setting: CacheSetting) -> None:
    """Raise `DecodeStepError` when the decode would be exported fixed at its traced cache length: it could run one
    step and never a second."""
    if target.mode != "generation" or "decode" not in components or setting.implementation == "static":
        return
    spec, dynamic = _decode_contract(target)
    grown = _growing_leaves(components["decode"][1])
    if not grown or (not spec and dynamic):
        return

    fixed = sorted(path for path, tensor in grown.items()
                   if (key := spec_key(spec or {}, path)) is None
                   or not _axis_dynamic(spec[key], tensor.dim(), tensor.dim() - 2, key))
    if not fixed:
        return
    length, axis = int(grown[fixed[0]].shape[-2]), grown[fixed[0]].dim() - 2
    patterns = sorted({layer_pattern(path) for path in fixed})
    declared = ", ".join(f'"{pattern}": {{"{axis}": "auto"}}' for pattern in patterns)
    raise DecodeStepError(
        f"target '{target.name}': the decode graph would keep its cache at the traced length {length} and could not "
        f"run a second step; make the cache axis dynamic (components.decode.dynamic_shapes {{{declared}}}) or use "
        f'the static cache (generation.cache_implementation: "static")'
    )


def has_sliding_layers(config: Any) -> bool:
    """Whether the model's own dynamic cache (`DynamicCache(config=...)`) keeps a window in some layer (Mistral with a
    window, Gemma 2 and 3, Cohere 2, ...): a `DynamicSlidingWindowLayer`, which keeps `window - 1` positions and a
    0-d window tensor the runtimes never feed.

    Example:
        >>> from transformers import Gemma2Config, LlamaConfig
        >>> has_sliding_layers(Gemma2Config(num_hidden_layers=2)), has_sliding_layers(LlamaConfig(num_hidden_layers=2))
        (True, False)
    """
    try:
        cache = DynamicCache(config=_decoder_config(config))
    except Exception:  # noqa: BLE001 - a config transformers' cache cannot read: no window layer known
        return False
    return any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers)


def full_length_windows(target, family: str, implementation: str, config: Any) -> bool:
    """Whether `target` is captured with a full-length cache in every layer: an ONNX generation target of a
    decoder-only text model on a dynamic cache whose own cache keeps a sliding window ([`has_sliding_layers`]).
    ONNX Runtime GenAI and optimum export these models so (GenAI's builder: one KV cache length for every layer,
    the window in the attention), and transformers.js runs optimum's files: every layer's past and present have one
    length, and the runtime feeds only the ids, the mask, the positions and `past_key_values.N.key/value`.
    transformers' sliding masks cover a full cache (`create_sliding_window_causal_mask` over a `DynamicLayer`), so
    the graph computes what the model does. ExecuTorch (ring buffers, or a static cache kept whole) and dynamo keep
    the model's own cache.

    Example:
        >>> from transformers import Gemma2Config
        >>> from exporters.recipe.load import parse_recipe
        >>> target = parse_recipe('{"export_format": "onnx", "mode": "generation"}').exports[0]
        >>> full_length_windows(target, "text", "dynamic", Gemma2Config(num_hidden_layers=2))
        True
        >>> full_length_windows(target, "vision-language", "dynamic", Gemma2Config(num_hidden_layers=2))
        False
    """
    return (target.export_format == "onnx" and target.mode == "generation" and family == "text"
            and implementation == "dynamic" and has_sliding_layers(config))


def sliding_window_of(config: Any) -> int | None:
    """The window of a model whose layer types include sliding-window attention (Gemma 2, Gemma 3), else None.

    Example:
        >>> from transformers import Gemma2Config
        >>> sliding_window_of(Gemma2Config(sliding_window=12, num_hidden_layers=2))
        12
    """
    text = _decoder_config(config)
    if "sliding_attention" in (getattr(text, "layer_types", None) or []):
        return getattr(text, "sliding_window", None)
    return None


def state_space_layers(config: Any) -> list[str]:
    """The cache layer classes of the model's own cache (`DynamicCache(config=...)`) that hold conv or recurrent
    states (Mamba, hybrids: `LinearAttentionLayer`, `LinearAttentionAndFullAttentionLayer`, ...), none for a cache of
    keys and values alone.

    Example:
        >>> from transformers import FalconH1Config, LlamaConfig
        >>> state_space_layers(FalconH1Config(num_hidden_layers=2))
        ['LinearAttentionAndFullAttentionLayer']
        >>> state_space_layers(LlamaConfig(num_hidden_layers=2))
        []
    """
    try:
        cache = DynamicCache(config=_decoder_config(config))
    except Exception:  # noqa: BLE001 - a config transformers' cache cannot read: no state layers known
        return []
    return sorted({type(layer).__name__ for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)})


def _decoder_config(config: Any) -> Any:
    """The config of the model's (text) decoder: the config itself, or a multimodal model's text config."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config

"""What a recipe may ask of a model, checked from the model's `config.json` as read (a dict): no torch, no
transformers, so `hf-export check` answers at once.

A static cache holds `max_cache_len` positions, every slot allocated up front: a cache longer than the positions the
model attends to is memory for nothing, and is refused with the recipe's JSON path and line.

Example:
    >>> positions_in({"model_type": "llava", "text_config": {"max_position_embeddings": 4096}})
    4096
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporters.errors import RecipeError

__all__ = ["DEFAULT_MAX_CACHE_LEN", "POSITION_KEYS", "check_cache_len", "positions_in"]

DEFAULT_MAX_CACHE_LEN = 2048
POSITION_KEYS = ("max_position_embeddings", "max_target_positions", "n_positions",
                 "max_text_positions")  # SpeechT5: its text decoder's sinusoidal table (eager fails past it)


def positions_in(config: Mapping[str, Any]) -> int | None:
    """`max_positions` of a model's `config.json` as read (a dict: the decoder's `text_config` first, when it has
    one)."""
    for section in (config.get("text_config"), config.get("decoder"), config):
        if not isinstance(section, Mapping):
            continue
        for name in POSITION_KEYS:
            value = section.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def check_cache_len(recipe, positions: int | None) -> None:
    """`RecipeError` at `generation.max_cache_len` when the recipe asks for a static cache longer than the positions
    the model can attend to (every slot is allocated up front: a cache past them is memory for nothing)."""
    length = recipe.generation.max_cache_len
    if length is None or positions is None or length <= positions:
        return
    path, line = recipe.locate_setting("generation", "max_cache_len")
    raise RecipeError(f"max_cache_len {length} is longer than the {positions} positions the model attends to "
                      f"(its config's max_position_embeddings): set at most {positions}, or leave it unset for "
                      f"min({DEFAULT_MAX_CACHE_LEN}, {positions})", path=path, line=line, file=recipe.file)

"""Generation settings as the repo ships them: the repo's `generation_config.json` is kept as is in every artifact
folder, and validation derives its greedy settings from it.

Instruct repos turn sampling on (`do_sample: true`, `temperature`, `top_p`, several eos ids). Validation compares
greedy tokens, so it runs a copy of the repo's config with sampling off and the sampling-only settings unset
(transformers refuses to save a greedy config that still carries them); every eos id, the pad id and every other
logits processor (repetition penalty, suppressed tokens, ...) are kept. The artifacts keep the repo's own settings,
with only the cache the program was exported with added (`CacheSetting.for_artifact`); the report says what
validation derived ([`derived_settings`]).

```
generation_config.json (the repo's) ──► artifact folders: as is, plus the program's cache settings
        └─ greedy() ─► capture and validation: do_sample false, num_beams 1, sampling-only settings unset
```

Example:
    >>> from transformers import GenerationConfig
    >>> shipped = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, eos_token_id=[2, 5])
    >>> config = greedy(shipped, max_new_tokens=8)
    >>> config.do_sample, config.temperature, config.top_p, config.eos_token_id, config.max_new_tokens
    (False, None, None, [2, 5], 8)
    >>> shipped.do_sample  # the repo's own config is never changed
    True
    >>> print(derived_settings(shipped))  # doctest: +NORMALIZE_WHITESPACE
    validation generates greedily from the repo's generation_config.json: do_sample true -> false, temperature 0.6,
    top_p 0.9 unset; eos ids [2, 5] kept; the artifacts keep the repo's own settings
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

__all__ = ["SAMPLING_ONLY", "derived_settings", "detected_language_pin", "greedy"]

# The settings transformers uses only when sampling (`GenerationConfig.validate` refuses them with sampling off).
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")
# Their "off" values: a setting at one of these changes nothing even when sampling.
_NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}


def greedy(generation_config: Any, max_new_tokens: int | None = None) -> Any:
    """A copy of `generation_config` that generates greedily: sampling and beams off, the sampling-only settings
    unset, everything else (eos and pad ids, processors) kept; `max_new_tokens` when given."""
    config = copy.deepcopy(generation_config)
    config.do_sample = False
    config.num_beams = 1
    for name in SAMPLING_ONLY:
        if hasattr(config, name):
            setattr(config, name, None)
    if max_new_tokens is not None:
        config.max_new_tokens = max_new_tokens
    language = detected_language_pin(config)
    if language is not None:
        config.language = language
    return config


def detected_language_pin(generation_config: Any) -> str | None:
    """The language validation pins for a multilingual Whisper config that sets none (`"<|en|>"` when the config
    has it, else its first language), None otherwise. Without it `generate()` first detects the language with a
    forward pass of its own (the features through the whole model, no cache), which is no exported component's
    call: the captured prefill would be that pass, and parity could not replay it."""
    languages = getattr(generation_config, "lang_to_id", None)
    if not languages or not getattr(generation_config, "is_multilingual", False) \
            or getattr(generation_config, "language", None) is not None:
        return None
    return "<|en|>" if "<|en|>" in languages else sorted(languages)[0]


def _sampling_settings(generation_config: Any) -> list[str]:
    """The sampling-only settings `generation_config` sets to something that changes sampling, as `name value`."""
    found = []
    for name in SAMPLING_ONLY:
        value = getattr(generation_config, name, None)
        if value is None or value == _NEUTRAL.get(name) or (name == "top_k" and value == 50):
            continue  # 50 is transformers' own default top_k, not a choice of the repo
        found.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return found


def repo_generation_config(folder: Path) -> Any:
    """The generation config a model folder ships (`generation_config.json`), None without one or when it does not
    read (the model's load then says what is wrong)."""
    if not (Path(folder) / "generation_config.json").is_file():
        return None
    try:
        return GenerationConfig.from_pretrained(folder)
    except (OSError, ValueError, TypeError):  # a file transformers cannot read: loading the model says why
        return None


def derived_settings(generation_config: Any) -> str | None:
    """The sentence the report carries when validation's greedy settings differ from the repo's, None when the repo's
    config is already greedy."""
    if generation_config is None:
        return None
    changes = []
    if getattr(generation_config, "do_sample", False):
        changes.append("do_sample true -> false")
    beams = getattr(generation_config, "num_beams", 1) or 1
    if beams != 1:
        changes.append(f"num_beams {beams} -> 1")
    sampling = _sampling_settings(generation_config)
    if sampling:
        changes.append(", ".join(sampling) + " unset")
    language = detected_language_pin(generation_config)
    if language is not None:
        changes.append(f"language {language} pinned (generate() would first detect it with a pass of its own)")
    if not changes:
        return None
    eos = getattr(generation_config, "eos_token_id", None)
    kept = f"; eos ids {list(eos)} kept" if isinstance(eos, (list, tuple)) and len(eos) > 1 else ""
    return (f"validation generates greedily from the repo's generation_config.json: {', '.join(changes)}{kept}; "
            "the artifacts keep the repo's own settings")

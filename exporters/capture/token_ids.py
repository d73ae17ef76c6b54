"""The special token ids a deployment runtime needs beside the graph (`get_eos_ids` of an ExecuTorch LLM program,
`genai_config.json`'s bos / eos / pad, the padded batch a runtime check feeds): the generation config's, else the
model config's (its text config for a multimodal model).

Example:
    >>> from transformers import GenerationConfig, LlamaConfig
    >>> config = LlamaConfig(eos_token_id=2, bos_token_id=1, pad_token_id=None)
    >>> special = special_token_ids(GenerationConfig(eos_token_id=[2, 7]), config)
    >>> special.eos, special.bos, special.pad
    ([2, 7], 1, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpecialTokenIds:
    """`eos`: every end-of-sequence id (may be empty); `bos`: the begin id or None; `pad`: the pad id, else the
    first eos id (runtimes pad a batch with it), else None."""

    eos: list[int]
    bos: int | None
    pad: int | None


def special_token_ids(generation_config: Any, config: Any) -> SpecialTokenIds:
    """The ids of `generation_config` (may be None), each falling back to `config`'s text config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def first_set(name: str) -> Any:
        value = getattr(generation_config, name, None) if generation_config is not None else None
        return value if value is not None else getattr(text, name, None)

    eos = first_set("eos_token_id")
    eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    bos, pad = first_set("bos_token_id"), first_set("pad_token_id")
    pad = int(pad) if pad is not None else (eos_ids[0] if eos_ids else None)
    return SpecialTokenIds(eos_ids, None if bos is None else int(bos), pad)


def decoder_start_id(model: Any) -> int:
    """The token an encoder-decoder's decoder starts from: the generation config's `decoder_start_token_id`, else
    the config's, else its bos id (0 where none is set).

    Example:
        >>> from transformers import GenerationConfig, WhisperConfig
        >>> decoder_start_id(type("M", (), {"generation_config": GenerationConfig(decoder_start_token_id=5),
        ...                                 "config": WhisperConfig()})())
        5
    """
    for source in (getattr(model, "generation_config", None), model.config):
        for name in ("decoder_start_token_id", "bos_token_id"):
            value = getattr(source, name, None)
            if isinstance(value, int):
                return value
    return 0


def image_token_id(config: Any) -> int | None:
    """The id of the token a vision-language prompt holds in place of the image: the config's `image_token_id`, else
    LLaVA's older `image_token_index` (None where it has neither).

    Example:
        >>> image_token_id(type("C", (), {"image_token_index": 32000})()), image_token_id(object())
        (32000, None)
    """
    token = getattr(config, "image_token_id", None)
    return token if token is not None else getattr(config, "image_token_index", None)


def features_in_place(embeds: Any, ids: Any, features: Any, token: int) -> bool:
    """Put `features` (one row per placeholder, any leading dims) in place of the `token` rows of the prompt's
    embeddings `embeds` `[1, n, hidden]` (its ids `[1, n]`), in order, as the models merge an image's (audio's)
    features; False, `embeds` untouched, where the features do not fill those rows one for one.

    Example:
        >>> import torch
        >>> embeds = torch.zeros(1, 3, 2)
        >>> features_in_place(embeds, torch.tensor([[5, 9, 9]]), torch.ones(1, 2, 2), 9), embeds[0, :, 0].tolist()
        (True, [0.0, 1.0, 1.0])
        >>> features_in_place(embeds, torch.tensor([[5, 9, 9]]), torch.ones(3, 2), 9)
        False
    """
    where = ids[0] == int(token)
    rows = features.reshape(-1, features.shape[-1])
    if int(where.sum()) != rows.shape[0]:
        return False
    embeds[0, where] = rows.to(embeds.dtype)
    return True

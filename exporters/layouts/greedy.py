"""The eager side shared by the layouts whose runtime generates over a batch (ONNX Runtime GenAI, optimum): a
left-padded batch of two prompts of different lengths, eager greedy `generate` of the full `max_new_tokens` (eos held
off by `min_new_tokens`, as the runtimes are told: GenAI's `min_length`, optimum's `min_new_tokens`; a proof over
one token proves little). And
what the ExecuTorch runners' proofs share (the LLM and multimodal runners show pieces, not ids): the recipe's greedy
settings ([`greedy_settings`]), each piece's ids ([`pieces_by_id`]) and how many shown pieces match ([`pieces_matched`]).

The runtimes read rows by `pad_token_id`: a prompt token equal to it would be taken for padding, so the prompts never
hold it (a token that is neither the pad id nor an eos id takes its place).

Example:
    >>> until_eos([5, 2, 7], [2]), common_prefix([1, 2, 3], [1, 2, 4])
    ([5, 2], 2)
    >>> pieces_matched(["a", "b", "x"], [1, 2, 3], {"a": [1], "b": [2, 5], "c": [3]})
    (2, 1)
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from exporters.capture.generation_settings import greedy
from exporters.capture.token_ids import special_token_ids
from exporters.layouts.child import RuntimeContext

DEFAULT_NEW_TOKENS = 8


@dataclass
class GenaiReference:  # the name GenAI's proof gave it first
    """The eager side: each row's prompt ids and its greedy new tokens (`steps` of them: eos held off)."""

    prompts: list[list[int]]
    new_tokens: list[list[int]]
    pad: int
    eos: list[int]
    steps: int


def until_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """`tokens` up to and including the first eos id."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[:index + 1]
    return tokens


def compared_of(new_tokens: list[list[int]], eos: list[int] | set[int]) -> int:
    """How many of the rows' new tokens are compared as generated ones: each row's tokens before its first eos.

    Example:
        >>> compared_of([[5, 6, 2], [7]], [2])
        3
    """
    return sum(next((i for i, token in enumerate(row) if token in eos), len(row)) for row in new_tokens)


def common_prefix(want: list[int], have: list[int]) -> int:
    """How many tokens `want` and `have` share before they differ."""
    return next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))


def greedy_settings(model: Any, context: RuntimeContext) -> tuple[GenerationConfig, set[int]]:
    """The run's generation config (the repo's, as derived for validation) made greedy
    (`exporters.capture.generation_settings.greedy`) with the recipe's `max_new_tokens`, and its eos ids."""
    config = greedy(context.generation_config or model.generation_config, context.recipe.generation.max_new_tokens)
    eos = config.eos_token_id
    return config, set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def pieces_by_id(tokenizer: Any) -> tuple[list[str], dict[str, list[int]]]:
    """Every id's piece as a runner shows it (`tokenizers.Tokenizer`, specials kept), and the ids of each piece
    (several ids may decode to one piece)."""
    vocabulary = tokenizer.decode_batch([[i] for i in range(tokenizer.get_vocab_size())], skip_special_tokens=False)
    ids_of: dict[str, list[int]] = {}
    for token, piece in enumerate(vocabulary):
        ids_of.setdefault(piece, []).append(token)
    return vocabulary, ids_of


def pieces_matched(got: list[str], want: list[int], ids_of: dict[str, list[int]]) -> tuple[int, int]:
    """How many of a runner's pieces `got` match eager's ids `want` before the first divergence, and how many of
    those matched by a piece several ids decode to."""
    equal, by_text = 0, 0
    while equal < min(len(got), len(want)) and want[equal] in ids_of.get(got[equal], []):
        by_text += len(ids_of[got[equal]]) > 1
        equal += 1
    return equal, by_text


def batch_reference(model: Any, context: RuntimeContext, default_pad: int) -> GenaiReference:
    """Eager greedy `generate` over a left-padded batch of two prompts of different lengths (see the module);
    `default_pad` pads where the model has no pad token (the runtime's own default). Computed once per context and
    model for a `default_pad` (GenAI's and optimum's proofs ask the same); each caller gets its own copy."""
    key = ("batch_reference", id(model), default_pad)
    kept = context.eager_once.get(key)
    if kept is not None and kept[0]() is model:
        return copy.deepcopy(kept[1])
    reference = _batch_reference(model, context, default_pad)
    context.eager_once[key] = (weakref.ref(model), copy.deepcopy(reference))
    return reference


def _batch_reference(model: Any, context: RuntimeContext, default_pad: int) -> GenaiReference:
    config = getattr(model.config, "text_config", None) or model.config
    ids = context.generate_inputs["input_ids"][0].tolist()
    special = special_token_ids(context.generation_config, model.config)
    eos, pad = special.eos, (special.pad if special.pad is not None else default_pad)
    spare = next(t for t in range(int(config.vocab_size)) if t != pad and t not in eos)
    first = [spare if t == pad else t for t in ids]
    if len(first) < 2:  # the second row is a shorter prompt
        first = first + [spare]
    prompts = [first, first[: len(first) // 2]]
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # eager pads left
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # min_new_tokens: eos is held off, so every row is compared over all `steps` (the runtimes are told the same)
    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=pad,
                              eos_token_id=eos or None)
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                             generation_config=greedy)
    new = [until_eos(row[width:].tolist(), eos) for row in out.cpu()]
    return GenaiReference(prompts, new, pad, eos, steps)

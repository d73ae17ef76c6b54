"""Which rows of a decoder's probe a lossy variant's quality budget judges: those whose logits a runtime reads.

A vision-language (audio-language) decoder is fed the prompt's embeddings with the image's (audio's) features in
place of its image (audio) tokens. Generation reads the logits of text positions (the prompt's last one, then each new
token's; the runners and transformers.js never read the rest either, and no sampler reads an image's). The logits at
an image's rows predict the next image token, which is not a token any prompt asks for, and on a trained model they
are whatever the training left there: a variant would pass or fail on rows that mean nothing. So the quality
metrics of a quantized or half-precision target (`exporters.validate.quality.measure`: top-1 agreement, KL, the
hidden-state cosine of a decoder without its head) judge the text rows only, and count the image's apart
(`media_positions`); the numerical checks of a float32 artifact still compare every output at every position.

The decoders concerned, by layout: transformers.js's `decoder_model_merged`, MultimodalRunner's `text_decoder`, and
the upstream stages' `language_model` and `lm_head` (each traced on the whole prompt). A probe row is an image's
(audio's) when it equals one of the media rows of what the probes are made of ([`media_rows`]): the prompt as the
layout feeds it (the features in place) and, where a probe holds the media token's own embedding (transformers.js's
traced step), that embedding. Rows of a probe grown at unseen shapes (random, at the prompt's scale) hold no
image and are judged.

Example:
    >>> ids = torch.tensor([[7, 7, 3, 4]])
    >>> prompt = torch.arange(8.).reshape(1, 4, 2)
    >>> media = media_rows([(prompt, ids)], {7})
    >>> judged_rows({"inputs_embeds": prompt[:, 1:]}, media).tolist()
    [[False, True, True]]
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.image_text import DECODER as IMAGE_TEXT_DECODER, EMBED_TOKENS
from exporters.capture.multimodal_runner import TEXT_DECODER, TOKEN_EMBEDDING, runner_prompt
from exporters.capture.token_ids import image_token_id

LANGUAGE_MODEL, LM_HEAD = "language_model", "lm_head"
# the input holding a decoder's rows: embeddings, or (lm_head, an nn.Linear) the language model's hidden states
ROW_INPUTS = ("inputs_embeds", "input")


def media_token_ids(config: Any) -> set[int]:
    """The ids of the tokens whose rows hold an image's, a video's or an audio's features.

    Example:
        >>> from types import SimpleNamespace
        >>> sorted(media_token_ids(SimpleNamespace(image_token_index=4, audio_token_id=9)))
        [4, 9]
    """
    found = {image_token_id(config)} | {getattr(config, name, None) for name in
                                        ("video_token_id", "audio_token_id", "audio_token_index")}
    return {int(token) for token in found if isinstance(token, int)}


def media_rows(sequences: list[tuple[Any, Any]], tokens: set[int]) -> torch.Tensor | None:
    """`[rows, width]`: the rows of each `(sequence [batch, n, width], ids [batch, n])` where `ids` holds a media
    token; None where none does (or a sequence is missing or not aligned with its ids)."""
    found = []
    for sequence, ids in sequences:
        if not isinstance(sequence, torch.Tensor) or not isinstance(ids, torch.Tensor) \
                or tuple(sequence.shape[:2]) != tuple(ids.shape):
            continue
        media = torch.isin(ids, torch.tensor(sorted(tokens), dtype=ids.dtype))
        found.append(sequence[media].detach().reshape(-1, sequence.shape[-1]))
    rows = torch.cat(found) if found else None
    return rows if rows is not None and rows.numel() else None


def judged_rows(probe: dict[str, Any] | None, media: torch.Tensor | None) -> torch.Tensor | None:
    """`[batch, seq]` bool: True on each row of `probe`'s row input that is none of the `media` rows (a text row, or
    a probe's synthetic one); None where nothing is left out (no media rows, no row input)."""
    name = next((key for key in ROW_INPUTS if isinstance((probe or {}).get(key), torch.Tensor)), None)
    if media is None or name is None or probe[name].dim() != 3 or probe[name].shape[-1] != media.shape[-1]:
        return None
    rows = probe[name].detach().cpu()
    known = set(_row_bytes(media.to(rows.dtype)))  # bit for bit: a probe's row is copied from the prompt, or not
    same = torch.tensor([key in known for key in _row_bytes(rows)]).reshape(rows.shape[:2])
    return None if not bool(same.any()) else ~same


def _row_bytes(rows: torch.Tensor) -> list[bytes]:
    """Each row's bytes (through uint8: numpy has no bfloat16)."""
    flat = rows.detach().cpu().contiguous().reshape(-1, rows.shape[-1])
    return [row.numpy().tobytes() for row in flat.view(torch.uint8)]


def decoder_media_rows(name: str, components: dict[str, tuple[Any, dict]], model: Any,
                       generate_inputs: dict[str, Any], prompt: Any = None) -> torch.Tensor | None:
    """The media rows of component `name`'s probes ([`media_rows`]), None for a component that is no decoder fed
    an image's (audio's) features. `prompt`: the prompt as the layout feeds the decoder, where the caller made it
    (transformers.js's, MultimodalRunner's)."""
    tokens = media_token_ids(getattr(model, "config", None))
    ids = generate_inputs.get("input_ids")
    if not tokens or not isinstance(ids, torch.Tensor) or name not in components:
        return None
    inputs = components[name][1]
    if name == IMAGE_TEXT_DECODER and EMBED_TOKENS in components:
        ids = ids[:1]
        sequences = [(prompt, ids), (_embedded(components[EMBED_TOKENS][0], ids), ids)]
    elif name == TEXT_DECODER and "inputs_embeds" in inputs and TOKEN_EMBEDDING in components:
        ids = runner_prompt(model, generate_inputs)[:1]
        sequences = [(prompt, ids), (_embedded(components[TOKEN_EMBEDDING][0], ids), ids)]
    elif name in (LANGUAGE_MODEL, LM_HEAD):  # traced on the whole prompt, by the model's forward
        rows = next((inputs[key] for key in ROW_INPUTS if isinstance(inputs.get(key), torch.Tensor)), None)
        sequences = [(rows, ids[:rows.shape[0]] if rows is not None else None)]
    else:
        return None
    return media_rows(sequences, tokens)


def _embedded(embedding: Any, ids: torch.Tensor) -> Any:
    with torch.no_grad():
        return embedding(ids)

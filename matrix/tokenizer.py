"""A family's tokenizer, trained here (no download), for the families whose runtime proof reads one: ExecuTorch's LLM
runner and MultimodalRunner read `tokenizer.json` from the folder, so every decoder-only family's matrix model and
Qwen2-Audio's are built with a byte-level BPE (one ExecuTorch's C++ tokenizer loads) whose vocabulary, BOS, EOS and
padding are the model's, and whose special token (Qwen2-Audio's audio token) is the model's own ([`with_tokenizer`]).

Example:
    >>> from pathlib import Path
    >>> tokenizer = train_bpe_tokenizer(Path("/tmp/tok"), CORPUS, [*SPECIALS, "<|AUDIO|>"], vocab_size=120,
    ...                                 bos="<s>", eos="</s>", pad="<pad>", byte_level=True)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = ["describe the image", "a cat on the mat", "the quick brown fox jumps over the lazy dog"] * 4
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0-3, then the family's own special tokens


def train_bpe_tokenizer(folder: Path, corpus: list[str], specials: list[str], *, vocab_size: int, bos: str, eos: str,
                        pad: str, unk: str | None = None, byte_level: bool = False, chat_template: bool = False):
    """A BPE tokenizer trained here in milliseconds (no download) and saved into `folder` with transformers 5's
    `save_pretrained` (which names `"tokenizer_class": "TokenizersBackend"` in `tokenizer_config.json`); returns it.
    `byte_level`: a byte-level pre-tokenizer and decoder (else whitespace words and an `unk` token); the special
    tokens take the first ids in `specials` order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=unk) if unk else models.BPE())
    if byte_level:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
    else:
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                            show_progress=False))
    named = {"unk_token": unk} if unk else {}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad, **named)
    if chat_template:
        tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    return tokenizer


def special_pairs(special: Any) -> list[tuple[str, str]]:
    """The `(token, setting)` pairs of a family's `tokenizer` spec: `()` none, one pair, or a tuple of pairs.

    Example:
        >>> special_pairs(()), special_pairs(("<image>", "image_token_index"))
        ([], [('<image>', 'image_token_index')])
        >>> special_pairs((("<|image_pad|>", "image_token_id"), ("<|vision_start|>", "vision_start_token_id")))
        [('<|image_pad|>', 'image_token_id'), ('<|vision_start|>', 'vision_start_token_id')]
    """
    if not special:
        return []
    return [tuple(special)] if isinstance(special[0], str) else [tuple(pair) for pair in special]


def with_tokenizer(folder: Path, special: Any, overrides: dict[str, Any], text: str = "") -> dict[str, Any]:
    """Save a byte-level BPE into `folder`; `overrides` completed so the model matches it: the text model's
    vocabulary the tokenizer's, its BOS/EOS/padding the tokenizer's ids 1, 2, 3 (`text`: the dotted prefix of the
    text model's config, `"text_config."` in a multimodal model, `""` in a decoder-only one), and for each
    `(token, setting)` of `special` ([`special_pairs`]) that special token in the tokenizer and `setting` (the
    config's id of it, e.g. `audio_token_index`, `image_token_id`; None: a token of the tokenizer alone, e.g. Mistral
    3's `[IMG_BREAK]`, which its processor reads from the tokenizer) its id."""
    pairs = special_pairs(special)
    tokenizer = train_bpe_tokenizer(folder, CORPUS, [*SPECIALS, *(token for token, _ in pairs)], vocab_size=120,
                                    bos="<s>", eos="</s>", pad="<pad>", byte_level=True)
    named = {setting: tokenizer.convert_tokens_to_ids(token) for token, setting in pairs if setting}
    return {**overrides, **named, f"{text}vocab_size": len(tokenizer), f"{text}bos_token_id": 1,
            f"{text}eos_token_id": 2, f"{text}pad_token_id": 3}

"""A family's tokenizer, trained here (no download), for the families whose runtime proof reads one: the ExecuTorch
MultimodalRunner reads `tokenizer.json` from the folder, so Qwen2-Audio's matrix model is built with a byte-level
BPE (one ExecuTorch's C++ tokenizer loads) whose special audio token is the model's own, and its vocabulary the
tokenizer's ([`with_tokenizer`]).

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


def with_tokenizer(folder: Path, token: str, setting: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Save a byte-level BPE with the special `token` into `folder`; `overrides` completed so the model matches it:
    `setting` (the config's id of that token, e.g. `audio_token_index`) its id, the text model's vocabulary the
    tokenizer's, BOS/EOS/padding its ids 1, 2, 3."""
    tokenizer = train_bpe_tokenizer(folder, CORPUS, [*SPECIALS, token], vocab_size=120, bos="<s>", eos="</s>",
                                    pad="<pad>", byte_level=True)
    return {**overrides, setting: tokenizer.convert_tokens_to_ids(token), "text_config.vocab_size": len(tokenizer),
            "text_config.bos_token_id": 1, "text_config.eos_token_id": 2, "text_config.pad_token_id": 3}

"""Vision-language models whose prompt is not read causally: their prefill attends bidirectionally over the image's
tokens, from the `token_type_ids` their processor returns (transformers' mask: Gemma 3's `token_type_ids_mask_function`
/ `get_block_sequence_ids_for_mask`, PaliGemma's `block_sequence_ids` over its prefix). A runtime whose text decoder
runs every chunk of the prompt causally, as ExecuTorch's `MultimodalRunner` runs `text_decoder` (and as
optimum-executorch exports Gemma 3: no `token_type_ids` anywhere in its program), computes other hidden states at
the image's positions; from the second layer on they reach the text's logits, and it generates other tokens than
transformers. Read from a config as data (no torch), so a layout's face and the capture stage share it.

Example:
    >>> bidirectional_prefill({"model_type": "llava"}) is None
    True
    >>> bidirectional_prefill({"model_type": "gemma3"})[:62]
    "its prefill attends bidirectionally among one image's tokens ("
"""

from __future__ import annotations

from typing import Any

# model type -> over which tokens its prefill attends both ways (transformers 5.24's modeling code)
BIDIRECTIONAL_PREFILL = {
    "gemma3": "among one image's tokens",
    "paligemma": "over the image's tokens and the prompt, its prefix",
}


def bidirectional_prefill(config: dict[str, Any]) -> str | None:
    """Over which tokens this model's prefill attends both ways (its `config.json` as a dict), as a clause a
    runtime's reason continues; None where it reads its prompt causally (see the module)."""
    model_type = config.get("model_type")
    where = BIDIRECTIONAL_PREFILL.get(model_type) if isinstance(model_type, str) else None
    if where is None:
        return None
    return (f"its prefill attends bidirectionally {where} (transformers' {model_type} mask, from the processor's "
            "token_type_ids)")


def runner_declined(config: dict[str, Any]) -> str | None:
    """Why ExecuTorch's `MultimodalRunner` cannot hold this model faithfully, else None.

    Example:
        >>> runner_declined({"model_type": "gemma3"}).endswith("it would generate other tokens than transformers")
        True
    """
    fact = bidirectional_prefill(config)
    if fact is None:
        return None
    return (f"{fact}, where ExecuTorch's MultimodalRunner runs text_decoder causally on every chunk of the prompt "
            "(optimum-executorch's Gemma 3 program too): it would generate other tokens than transformers")

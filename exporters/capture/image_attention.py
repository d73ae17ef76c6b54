"""Vision-language models whose prompt is not read causally: their prefill attends bidirectionally over the image's
tokens, from the `token_type_ids` their processor returns (transformers' mask: Gemma 3's `token_type_ids_mask_function`
/ `get_block_sequence_ids_for_mask`, PaliGemma's `block_sequence_ids` over its prefix). A runtime whose text decoder
runs the prompt causally (ONNX Runtime GenAI's gemma3 text model; optimum-executorch's Gemma 3 program, with no
`token_type_ids` anywhere in it) computes other hidden states at the image's positions; from the second layer on
they reach the text's logits, and it generates other tokens than transformers. ExecuTorch's `MultimodalRunner`
prefills each image in a call of its own, so where the span is one image's tokens (Gemma 3) this product's program
marks the image's rows and its `text_decoder` attends both ways among them ([`marks_image_rows`]); a span beyond
one image (PaliGemma's prefix) it cannot hold ([`runner_declined`]). Read from a config as data (no torch), so a
layout's face and the capture stage share it.

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
IMAGE_BLOCKS = ("gemma3",)  # those whose span is one image's tokens: the runner's program marks the image's rows


def bidirectional_prefill(config: dict[str, Any]) -> str | None:
    """Over which tokens this model's prefill attends both ways (its `config.json` as a dict), as a clause a
    runtime's reason continues; None where it reads its prompt causally (see the module)."""
    model_type = config.get("model_type")
    where = BIDIRECTIONAL_PREFILL.get(model_type) if isinstance(model_type, str) else None
    if where is None:
        return None
    return (f"its prefill attends bidirectionally {where} (transformers' {model_type} mask, from the processor's "
            "token_type_ids)")


def marks_image_rows(config: dict[str, Any]) -> bool:
    """Whether the runner's program holds this model's bidirectional prefill by marking the image's rows (its span
    is one image's tokens, which the runner prefills as one call: `exporters.upstream.multimodal_runner`'s
    `MarkedTextDecoder`).

    Example:
        >>> marks_image_rows({"model_type": "gemma3"}), marks_image_rows({"model_type": "paligemma"})
        (True, False)
    """
    return config.get("model_type") in IMAGE_BLOCKS


def runner_declined(config: dict[str, Any]) -> str | None:
    """Why ExecuTorch's `MultimodalRunner` cannot hold this model faithfully, else None.

    Example:
        >>> runner_declined({"model_type": "paligemma"}).endswith("it would generate other tokens than transformers")
        True
        >>> runner_declined({"model_type": "gemma3"}) is None
        True
    """
    fact = bidirectional_prefill(config)
    if fact is None or marks_image_rows(config):
        return None
    return (f"{fact}, where ExecuTorch's MultimodalRunner prefills the image and the text in calls of their own "
            "(text_decoder attends both ways at most within one call): it would generate other tokens than "
            "transformers")

"""Sliding-window caches (Gemma 2, Gemma 3, Mistral-style models), and what exporting changes about them.

Upstream traces a sliding-window cache layer as a full layer: the exported graph keeps every position in the
cache and its attention mask applies the window, where eager keeps only the window's last positions. Both attend
to the same tokens, so an exported cache is compared with eager's on the positions eager keeps (the trailing ones).
The layer also carries its token count in its pytree context, which `.pt2` programs then refuse at any other step:
`exporters.upstream.fit_traced_spec` feeds them the way flat-input runtimes do. docs/upstream-gaps.md has both.

Example:
    >>> import torch
    >>> trailing_window(torch.arange(6.).reshape(1, 1, 6, 1), torch.zeros(1, 1, 4, 1)).flatten().tolist()
    [2.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

from typing import Any

import torch

COUNTER_FINDING = (
    "{components}: the cache's layers (sliding-window or static) carry their token count in the program's input "
    "spec, so upstream's runner refuses the cache of any other step; validation feeds these programs their tensors "
    "on the traced spec, as a flat-input runtime does, and generation parity checks every token that follows "
    "(docs/upstream-gaps.md, 8: sliding-window caches)")


def sliding_cache_leaves(outputs: Any) -> set[str]:
    """Leaf paths (upstream's naming) of the key/value tensors of sliding-window cache layers in `outputs`."""
    found: set[str] = set()

    def walk(node: Any, prefix: str, depth: int) -> None:
        if depth > 6 or node is None or isinstance(node, (torch.Tensor, str, int, float, bool)):
            return
        if getattr(node, "is_sliding", False) is True and hasattr(node, "keys"):
            found.update({f"{prefix}.keys", f"{prefix}.values"})
            return
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, (list, tuple)):
            items = enumerate(node)
        else:
            items = vars(node).items() if hasattr(node, "__dict__") else ()
        for key, child in items:
            walk(child, f"{prefix}.{key}" if prefix else str(key), depth + 1)

    walk(outputs, "", 0)
    return found


def trailing_window(value: torch.Tensor, reference: torch.Tensor) -> torch.Tensor | None:
    """`value`'s last positions (axis -2) matching `reference`'s window, when `value` is the same cache with a
    longer history; None otherwise."""
    longer = (value.dim() == reference.dim() >= 2 and value.shape[:-2] == reference.shape[:-2]
              and value.shape[-1] == reference.shape[-1] and value.shape[-2] > reference.shape[-2])
    if not longer:
        return None
    return value.narrow(-2, value.shape[-2] - reference.shape[-2], reference.shape[-2])

"""Upstream's pytree rules for transformers' objects: leaves named as upstream names them (the names ONNX inputs
get), cache classes registered as pytree nodes, and a move to a device that keeps caches consistent.

Example:
    >>> sorted(leaf_tensors({"a": torch.ones(1), "b": [torch.zeros(1)]}))
    ['a', 'b.0']
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.exporters.exporter_dynamo import _pytree_flatten, register_cache_pytrees_for_model
from transformers.exporters.utils import cast_leaf_tensors, get_leaf_tensors

__all__ = ["cast_leaf_tensors", "leaf_tensors", "move_to", "pytree_flatten", "register_cache_pytrees"]


def leaf_tensors(obj: Any) -> dict[str, torch.Tensor]:
    """`{dotted path: tensor}` for every tensor leaf of `obj` (upstream's leaf naming, the names ONNX inputs get)."""
    return get_leaf_tensors(obj)


def pytree_flatten(value: Any):
    """Upstream's flattening of a cache or model output object into leaves."""
    return _pytree_flatten(value)


def register_cache_pytrees() -> None:
    """Make transformers' cache classes pytree nodes (needed before walking or tracing inputs that hold a cache)."""
    register_cache_pytrees_for_model(torch.nn.Module())


def _retarget(obj: Any, device: torch.device, seen: set[int]) -> None:
    """Set the `device` attribute of transformers' cache objects inside `obj` (their layers record where their
    tensors live, and upstream's pytree flattening puts that attribute in the traced input spec)."""
    if id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for value in obj.values():
            _retarget(value, device, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _retarget(value, device, seen)
    elif type(obj).__module__.startswith("transformers.") and hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            if name == "device" and isinstance(value, (torch.device, str)):
                setattr(obj, name, device)
            else:
                _retarget(value, device, seen)


def move_to(obj: Any, device: str | torch.device, dtype: torch.dtype | None = None) -> Any:
    """`obj` (inputs, outputs, caches; changed in place) with its tensors on `device` and its floating tensors in
    `dtype` (kept when None), and its caches' recorded device set to match: a cache whose layers say `cpu` while
    their tensors are on the GPU moves them back at every step, and does not match a program traced on the GPU.

    Example:
        >>> move_to({"ids": torch.ones(2, dtype=torch.long), "x": torch.ones(2)}, "cpu", torch.float16)["x"].dtype
        torch.float16
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    moved = cast_leaf_tensors(obj, dtype=dtype, device=device)
    _retarget(moved, device, set())
    return moved

"""The dtype a saved target's files hold, read from their own structure (the labels a report shows are facts, never
the recipe's word): ONNX initializers (without their external data), the `.pt2` weight and constant records, a `.pte`'s
tensor values.

Example:
    >>> artifact_dtype(Path("out/onnx"), "onnx")  # doctest: +SKIP
    'float32'
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch._export.serde.schema import ScalarType  # the enum `.pt2` archives record dtypes with

from exporters.export.onnx_files import initializers
from exporters.upstream import pte_float_dtypes

__all__ = ["artifact_dtype", "typed_bytes"]


def typed_bytes(tensor) -> int:
    """The bytes of an ONNX initializer's data, from its dims and type (its data may be external)."""
    # onnx loads only where an ONNX file is read
    import onnx

    count = 1
    for dim in tensor.dims:
        count *= dim
    return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def _dominant(counts: dict[str, int]) -> str | None:
    return max(counts, key=lambda name: counts[name]) if counts else None


def _onnx_dtypes(directory: Path) -> dict[str, int]:
    # onnx loads only where an ONNX file is read
    import onnx

    counts: dict[str, int] = {}
    for path in sorted(directory.rglob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        packed = _packed_weights(model)
        for tensor in initializers(model):
            name = packed.get(tensor.name) or (onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).name
                                               if tensor.data_type != onnx.TensorProto.BFLOAT16 else "bfloat16")
            counts[name] = counts.get(name, 0) + typed_bytes(tensor)
    return counts


def _packed_weights(model) -> dict[str, str]:
    """`{initializer: "int4"}` for the weights `MatMulNBits` nodes hold packed in bytes (`bits` per value): stored as
    uint8, they are what the node's `bits` says."""
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and len(node.input) > 1:
            bits = next((attribute.i for attribute in node.attribute if attribute.name == "bits"), 4)
            found[node.input[1]] = f"int{bits}"
    return found


def _pt2_dtypes(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if not name.endswith(("_weights_config.json", "_constants_config.json")):
                continue
            for entry in json.loads(archive.read(name)).get("config", {}).values():
                meta = entry.get("tensor_meta") or {}
                dtype = getattr(torch, ScalarType(meta.get("dtype", 0)).name.lower(), None) \
                    if meta.get("dtype") in ScalarType._value2member_map_ else None
                if dtype is None:
                    continue
                numel = 1
                for size in meta.get("sizes", []):
                    numel *= int(size.get("as_int", 1))
                label = str(dtype).removeprefix("torch.")
                counts[label] = counts.get(label, 0) + numel * dtype.itemsize
    return counts


def artifact_dtype(directory: Path, export_format: str) -> str | None:
    """The dtype the target's files hold their weights (ONNX initializers, `.pt2` weight records) or compute in
    (a `.pte`'s tensor values: XNNPACK's weights are opaque), the one most bytes or values are in; None when the
    files say nothing. Read from the files, never from the recipe.

    Example:
        >>> artifact_dtype(Path("out/onnx"), "onnx")  # doctest: +SKIP
        'float32'
    """
    directory = Path(directory)
    if export_format == "onnx":
        counts = _onnx_dtypes(directory)
    elif export_format == "dynamo":
        counts = {}
        for path in sorted(directory.rglob("*.pt2")):
            for name, size in _pt2_dtypes(path).items():
                counts[name] = counts.get(name, 0) + size
    elif export_format == "executorch":
        counts = {}
        for path in sorted(directory.rglob("*.pte")):
            for name, size in pte_float_dtypes(path).items():
                counts[name] = counts.get(name, 0) + size
    else:
        raise ValueError(f"unknown export format {export_format!r}")
    return _dominant(counts)



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
from exporters.upstream import pte_float_dtypes, pte_quantized_weights

__all__ = ["artifact_dtype", "typed_bytes"]


def typed_bytes(tensor) -> int:
    """The bytes of an ONNX initializer's data, from its dims and type (its data may be external)."""
    # onnx loads only where an ONNX file is read
    import onnx

    count = 1
    for dim in tensor.dims:
        count *= dim
    return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def _onnx_dtype_name(data_type: int) -> str:
    """numpy's name of an ONNX element type ("float32"), and "bfloat16", which numpy lacks."""
    # onnx loads only where an ONNX file is read
    import onnx

    if data_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).name


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
            name = packed.get(tensor.name) or _onnx_dtype_name(tensor.data_type)
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


_FLOATS = ("float32", "float16", "bfloat16", "float64")


def _description(weights: dict[str, int], grouping: str, tables: list[str], activations: str | None) -> str | None:
    """"int4 weights in groups of 32, int8 embeddings, float32 activations" where the quantized weights hold most
    of the weight values; None where the files hold no quantized weights (their float dtype is the label)."""
    quantized = sorted((dtype for dtype in weights if dtype not in _FLOATS), key=lambda d: -weights[d])
    if not quantized and not any(table not in _FLOATS for table in tables):
        return None
    parts = [" and ".join(quantized) + f" weights{grouping}"] if quantized else []
    parts += [f"{table} embeddings" for table in tables]
    return ", ".join(parts + ([f"{activations} activations"] if activations else []))


def _onnx_description(directory: Path) -> str | None:
    """The ONNX files' quantized weights (`MatMulNBits`: its bits and block size), their tables (a float `Gather` of
    an initializer or a `GatherBlockQuantized`) and the float dtype of their graph outputs; None unless every file
    holds MatMulNBits."""
    # onnx loads only where an ONNX file is read
    import onnx

    weights: dict[str, int] = {}
    blocks: set[int] = set()
    tables: list[str] = []
    activations: dict[str, int] = {}
    for path in sorted(directory.rglob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        if not any(node.op_type == "MatMulNBits" for node in model.graph.node):
            return None  # a float graph among them (a transformers.js folder's model.onnx beside model_q4.onnx)
        stored = {tensor.name: tensor for tensor in initializers(model)}
        for node in model.graph.node:
            attributes = {attribute.name: attribute.i for attribute in node.attribute}
            if node.op_type == "MatMulNBits":
                dtype = f"int{attributes.get('bits', 4)}"
                weights[dtype] = weights.get(dtype, 0) + attributes.get("N", 0) * attributes.get("K", 0)
                blocks.add(attributes.get("block_size", 0))
            elif node.op_type == "GatherBlockQuantized":
                tables.append(f"int{attributes.get('bits', 4)}")
            elif node.op_type == "Gather" and node.input and node.input[0] in stored:
                tensor = stored[node.input[0]]
                if len(tensor.dims) == 2 and tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                                                  onnx.TensorProto.BFLOAT16):
                    tables.append(_onnx_dtype_name(tensor.data_type))
        for output in model.graph.output:
            elem = output.type.tensor_type.elem_type
            if elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
                activations[_onnx_dtype_name(elem)] = activations.get(_onnx_dtype_name(elem), 0) + 1
    if not weights:
        return None
    grouping = f" in blocks of {blocks.pop()}" if len(blocks) == 1 else ""
    return _description(weights, grouping, sorted(set(tables)), _dominant(activations))


def _pte_description(path: Path, activations: str | None) -> str | None:
    """A `.pte`'s quantized weights: its XNNPACK delegates' constants by datatype (the block-wise 4-bit ones' group
    size) and the tables of its quantized embedding lookups; None for a float program."""
    found = pte_quantized_weights(path)
    group = found["group_size"]
    grouping = f" in groups of {group}" if group else (" per channel" if any(
        dtype not in _FLOATS for dtype in found["weights"]) else "")
    return _description(found["weights"], grouping, sorted(found["embeddings"]), activations)


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
    (a `.pte`'s tensor values), the one most bytes or values are in; None when the files say nothing. Files that
    hold quantized weights (ONNX `MatMulNBits`, a `.pte`'s XNNPACK int4/int8 weights or quantized embedding tables)
    are described: their weights, tables and activations. Read from the files, never from the recipe.

    Example:
        >>> artifact_dtype(Path("out/onnx"), "onnx")  # doctest: +SKIP
        'float32'
        >>> artifact_dtype(Path("out/executorch-int4"), "executorch")  # doctest: +SKIP
        'int4 weights in groups of 32, int8 embeddings, float32 activations'
    """
    directory = Path(directory)
    if export_format == "onnx":
        described = _onnx_description(directory)
        if described:
            return described
        counts = _onnx_dtypes(directory)
    elif export_format == "dynamo":
        counts = {}
        for path in sorted(directory.rglob("*.pt2")):
            for name, size in _pt2_dtypes(path).items():
                counts[name] = counts.get(name, 0) + size
    elif export_format == "executorch":
        counts = {}
        programs = sorted(directory.rglob("*.pte"))
        for path in programs:
            for name, size in pte_float_dtypes(path).items():
                counts[name] = counts.get(name, 0) + size
        described = [_pte_description(path, _dominant(counts)) for path in programs]
        if described and described[0] and len(set(described)) == 1:
            return described[0]
    else:
        raise ValueError(f"unknown export format {export_format!r}")
    return _dominant(counts)



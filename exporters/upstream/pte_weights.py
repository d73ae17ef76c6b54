"""What a `.pte`'s quantized weights are, read from the program (ExecuTorch's private layout, kept in the adapter):
the constant tensors of each XNNPACK delegate by XNNPACK datatype (its blob's own flatbuffer, decompiled with the
`flatc` ExecuTorch ships) and the tables of the quantized embedding lookups the program runs outside the delegate
(`quantized_decomposed::embedding_byte` / `embedding_4bit`).

Example:
    >>> pte_quantized_weights(Path("out/executorch-int4/model.pte"))  # doctest: +SKIP
    {'weights': {'int4': 41680896}, 'group_size': 32, 'embeddings': {'int8': 16384000}}
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["pte_quantized_weights"]

# XNNPACK's datatypes (backends/xnnpack/serialization/schema.fbs, XNNDatatype) as dtype names
_XNN_DTYPES = {"xnn_datatype_fp32": "float32", "xnn_datatype_fp16": "float16", "xnn_datatype_bf16": "bfloat16",
               "xnn_datatype_qint8": "int8", "xnn_datatype_qcint8": "int8", "xnn_datatype_qcint4": "int4",
               "xnn_datatype_qbint4": "int4", "xnn_datatype_qint32": "int32", "xnn_datatype_qcint32": "int32"}
_TABLE_OPS = {"quantized_decomposed::embedding_byte": "int8", "quantized_decomposed::embedding_4bit": "int4",
              "quantized_decomposed::embedding_2bit": "int2"}
_XNN_HEADER_BYTES = 30  # XNNHeader (see internals._XNN_HEADER_BYTES)


def _values(dims: list[int]) -> int:
    count = 1
    for dim in dims:
        count *= int(dim)
    return count


def pte_quantized_weights(path: Path) -> dict[str, Any]:
    """`{"weights": {dtype: values}, "group_size": int | None, "embeddings": {dtype: values}}` of a `.pte`: its
    XNNPACK delegates' constant tensors by datatype (a block-wise 4-bit weight's group size from its quantization
    parameters; None when per channel or float) and the tables its quantized embedding lookups read. Empty dicts for a
    program with neither."""
    # executorch loads only where a .pte is read (seconds at start-up)
    from executorch.backends.xnnpack.serialization import xnnpack_graph_serialize
    # (the same)
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
    # (the same)
    from executorch.exir._serialize._flatbuffer import _flatc_decompile
    # (the same)
    from executorch.exir._serialize._program import _ExtendedHeader, _flatbuffer_to_program

    data = Path(path).read_bytes()
    header = _ExtendedHeader.from_bytes(data[8:64])
    program = _flatbuffer_to_program(data[:header.program_size] if header.is_valid() else data)
    weights: dict[str, int] = {}
    embeddings: dict[str, int] = {}
    groups: set[int] = set()
    seen: set[tuple[str, int]] = set()
    with tempfile.TemporaryDirectory() as tmp:
        schema = Path(tmp) / "schema.fbs"
        shutil.copy(Path(xnnpack_graph_serialize.__file__).parent / "schema.fbs", schema)
        for number, plan in enumerate(program.execution_plan):
            for index, delegate in enumerate(plan.delegates):
                where = (delegate.processed.location.name, delegate.processed.index)
                if delegate.id != "XnnpackBackend" or where in seen:
                    continue
                seen.add(where)
                if where[0] == "SEGMENT":
                    segment = program.segments[where[1]]
                    start = header.segment_base_offset + segment.offset
                    blob = data[start:start + segment.size]
                else:
                    blob = bytes(program.backend_delegate_data[where[1]].data)
                head = XNNHeader.from_bytes(blob[:_XNN_HEADER_BYTES])
                if not head.is_valid():  # a blob of a layout this reader does not know: said nothing of
                    continue
                binary = Path(tmp) / f"graph_{number}_{index}.bin"
                binary.write_bytes(blob[head.flatbuffer_offset:head.flatbuffer_offset + head.flatbuffer_size])
                _flatc_decompile(tmp, str(schema), str(binary), ["--raw-binary"])
                graph = json.loads(binary.with_suffix(".json").read_text())
                for value in graph.get("xvalues", []):
                    union = value["xvalue_union"]
                    tensor = union.get("tensor_value", union)
                    dtype = _XNN_DTYPES.get(tensor.get("datatype"))
                    if not tensor.get("constant_buffer_idx") or dtype is None:
                        continue
                    weights[dtype] = weights.get(dtype, 0) + _values(tensor.get("dims", []))
                    group = (union.get("quant_params") or {}).get("group_size")
                    if tensor.get("datatype") == "xnn_datatype_qbint4" and group:
                        groups.add(int(group))
            for chain in plan.chains:
                for instruction in chain.instructions:
                    call = instruction.instr_args
                    if not hasattr(call, "op_index"):
                        continue
                    dtype = _TABLE_OPS.get(plan.operators[call.op_index].name)
                    if dtype is not None:
                        table = plan.values[call.args[0]].val
                        values = _values(table.sizes) * (2 if dtype == "int4" else 4 if dtype == "int2" else 1)
                        embeddings[dtype] = embeddings.get(dtype, 0) + values
    return {"weights": weights, "group_size": min(groups) if len(groups) == 1 else None, "embeddings": embeddings}

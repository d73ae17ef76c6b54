"""Upstream's quantizers (`transformers.exporters.quantizers`), chosen by `exporters.export.quantize` from the recipe's
method names; part of the one adapter (`exporters.upstream`)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers.exporters.configs import ExportFormat

from exporters.upstream.patches import patched_item


def onnxruntime_quantizer(static: bool, options: dict[str, Any], calibration: list[dict] | None):
    """`OnnxRuntimeQuantizer` with an `OnnxRuntimeStaticConfig` or an `OnnxRuntimeDynamicConfig`."""
    # upstream's quantizers load torchao
    from transformers.exporters.quantizers import (
        OnnxRuntimeDynamicConfig,
        OnnxRuntimeQuantizer,
        OnnxRuntimeStaticConfig,
    )

    config = OnnxRuntimeStaticConfig(**options) if static else OnnxRuntimeDynamicConfig(**options)
    return OnnxRuntimeQuantizer(config, calibration_dataset=calibration)


def onnxruntime_int4_quantizer(options: dict[str, Any]):
    """A weight-only block-wise int4 quantizer of every ONNX `MatMul` with a constant weight: ONNX Runtime's own
    `MatMulNBitsQuantizer` (the `MatMulNBits` contrib op ONNX Runtime and ONNX Runtime GenAI run; what GenAI's model
    builder writes for `--precision int4`), wrapped as one of upstream's `ExportQuantizer`s so the exporter applies it
    to each component as it does the int8 ones. `options`: `block_size`, `accuracy_level`, `symmetric`.

    Example:
        >>> quantizer = onnxruntime_int4_quantizer({"block_size": 32, "accuracy_level": 4, "symmetric": True,
        ...                                          "quantize_embeddings": False})
        >>> type(quantizer).__name__
        'OnnxRuntimeInt4Quantizer'
    """
    from transformers.exporters.quantizers import ExportQuantizer  # upstream's quantizers load torchao

    class OnnxRuntimeInt4Quantizer(ExportQuantizer):
        supported_formats = (ExportFormat.ONNX,)
        required_packages = ("onnx", "onnx_ir", "onnxruntime")

        def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: Any) -> Any:
            return quantize_matmul_nbits(model, **options)

    return OnnxRuntimeInt4Quantizer()


def quantize_matmul_nbits(model: Any, *, block_size: int, accuracy_level: int, symmetric: bool,
                          quantize_embeddings: bool = False, shared_embeddings: bool = True) -> Any:
    """`model` (an `onnx_ir.Model`, consumed: its float weights are dropped as they are quantized) with every
    constant-weight `MatMul` as a 4-bit `MatMulNBits` (and, with `quantize_embeddings`, every constant-table `Gather`
    as a `GatherBlockQuantized`), by ONNX Runtime's own `MatMulNBitsQuantizer` run one weight at a time
    ([`_StreamedWeights`]): the graph goes to the quantizer without its weights, each weight is serialized just
    before its node is quantized and dropped once its last node is, so the run holds the float weights once (less
    as it goes) rather than the graph's copy, a protobuf copy and the quantized ones at once (a 1.1B model's export
    was killed at 12 GiB in the quantizer before). The result is byte for byte the quantizer's over the whole loaded
    model (tests/test_int4_streamed.py compares). With `shared_embeddings`, a table tied to the LM head is stored once
    in 4 bits: the head a `MatMulNBits`, the lookup a `GatherBlockQuantized` over the head's blocks
    ([`_tied_heads`])."""
    import onnx_ir  # ONNX and ONNX Runtime load only where an ONNX model is quantized
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # (the same)

    tied = _tied_heads(model) if shared_embeddings else []
    weights = _StreamedWeights(model)
    quantizer = MatMulNBitsQuantizer(weights.proto, bits=4, block_size=block_size, is_symmetric=symmetric,
                                     accuracy_level=accuracy_level, nodes_to_exclude=[lookup for lookup, _ in tied],
                                     op_types_to_quantize=("MatMul", "Gather") if quantize_embeddings else ("MatMul",))
    quantizer.node_quantizer = weights.streaming(quantizer.node_quantizer)
    quantizer.process()
    quantizer.model.topological_sort()  # what the quantizer's own save does first (its order is the reference)
    quantized = weights.restored(onnx_ir.from_proto(quantizer.model.model))
    for lookup, head in tied:
        _lookup_in_head_blocks(quantized, lookup, head, block_size)
    # ONNX Runtime's sort sorts each graph on its own, blind to the values an `If` branch reads from the outer graph
    # (the guard `ort_fusions: "cpu"` puts around each GroupQueryAttention): onnx_ir's sort sees them
    quantized.graph.sort()
    return quantized


class _StreamedWeights:
    """The weights of an `onnx_ir.Model` held aside while ONNX Runtime's quantizer works on its graph: `proto` is the
    model with every initializer an external placeholder (no bytes; its location names the weight), [`streaming`]
    wraps the quantizer's per-node step so a node's weight is serialized for that node alone and dropped after the
    last node reading it is quantized, and [`restored`] puts the weights still in the graph back into the quantized
    model, the very tensors, uncopied."""

    PREFIX = "hf-export:in-memory-weight/"

    def __init__(self, model: Any) -> None:
        import onnx_ir  # ONNX loads only where an ONNX model is quantized

        self.tensors: list[Any] = []
        self.readers: list[int] = []  # nodes left to quantize that read each weight
        for graph in model.graphs():
            for value in graph.initializers.values():
                tensor = value.const_value
                if tensor is None:
                    continue
                value.const_value = onnx_ir.ExternalTensor(f"{self.PREFIX}{len(self.tensors)}", None, None,
                                                           tensor.dtype, shape=tensor.shape, name=tensor.name or
                                                           value.name, doc_string=tensor.doc_string,
                                                           metadata_props=dict(tensor.metadata_props))
                self.tensors.append(tensor)
                self.readers.append(len(value.uses()))
        self.proto = onnx_ir.to_proto(model)

    def key(self, proto: Any) -> int | None:
        """The index of the weight whose placeholder `proto` (a `TensorProto`) is, None for any other tensor."""
        entries = {entry.key: entry.value for entry in proto.external_data} if proto is not None else {}
        location = entries.get("location", "")
        return int(location[len(self.PREFIX):]) if location.startswith(self.PREFIX) else None

    def streaming(self, node_quantizer: Any) -> Any:
        """`node_quantizer` (ONNX Runtime's `DefaultWeightOnlyQuantizer`) with its `quantize(node, graph_stack)`
        finding the node's weight in a graph of its own, innermost on the stack, which the quantizer writes its
        outputs into: they move to the weight's graph, and the model's protobuf never holds float bytes (protobuf
        keeps what a message once held until the whole message goes, so a weight filled into its placeholder and
        cleared again would stay: the whole float model again by the last layer)."""
        import onnx  # (the same)
        from onnxruntime.quantization.matmul_nbits_quantizer import get_initializer  # (the same)
        from onnx_ir.serde import serialize_tensor_into  # (the same)

        quantize, weights = node_quantizer.quantize, self

        def streamed(node: Any, graph_stack: list[Any]) -> list[Any]:
            name = node.input[1] if node.op_type == "MatMul" and len(node.input) > 1 else node.input[0]
            proto, graph = get_initializer(name, graph_stack)
            key = weights.key(proto)
            if key is None or weights.tensors[key] is None:
                return quantize(node, graph_stack)
            alone = onnx.GraphProto()
            serialize_tensor_into(alone.initializer.add(), weights.tensors[key])  # as loading the data reads it
            alone.initializer[0].name = proto.name  # the initializer's name (a tensor made in place may have none)
            nodes = quantize(node, [*graph_stack, alone])
            if len(nodes) == 1 and nodes[0] is node:
                return nodes
            for graph_input in graph.input:  # what the quantizer does to the weight's graph (an IR < 4 model's)
                if graph_input.name == name:
                    graph.input.remove(graph_input)
                    break
            graph.initializer.extend(alone.initializer[1:])  # the packed weight, its scales (and zero points)
            weights.readers[key] -= 1
            if weights.readers[key] <= 0:
                weights.tensors[key] = None  # the last reader quantized: the float weight goes
            return nodes

        node_quantizer.quantize = streamed
        return node_quantizer

    def restored(self, model: Any) -> Any:
        """`model` (the quantized graph) with each placeholder left in it replaced by its weight."""
        for graph in model.graphs():
            for value in graph.initializers.values():
                tensor = value.const_value
                key = self.key_of(tensor)
                if key is not None:
                    if self.tensors[key] is None:
                        raise RuntimeError(f"the weight {value.name!r} was dropped while a node still reads it")
                    value.const_value = self.tensors[key]
        self.tensors = []
        return model

    def key_of(self, tensor: Any) -> int | None:
        location = str(getattr(tensor, "location", "") or "")
        return int(location[len(self.PREFIX):]) if location.startswith(self.PREFIX) else None


def _tied_heads(model: Any) -> list[tuple[str, str]]:
    """`[(lookup node, head weight)]` for each embedding table (a `Gather` of a float initializer along axis 0) that
    the LM head also reads transposed (`MatMul` over its `Transpose`, or ONNX Runtime's `FusedMatMul` with `transB`,
    what `ort_fusions` makes of it). Each such head is rewritten as a `MatMul` over a new `[hidden, vocab]` initializer
    (the table transposed, for ONNX Runtime's quantizer, which takes only constant weights), in place, its name
    returned; the table itself then has only the lookup left, which [`_lookup_in_head_blocks`] points at the
    quantized head."""
    import onnx_ir  # ONNX loads only where an ONNX model is quantized

    graph, found = model.graph, []
    for lookup in list(graph):
        table = lookup.inputs[0] if lookup.op_type == "Gather" and lookup.domain == "" else None
        if table is None or table.const_value is None or lookup.attributes.get_int("axis", 0) != 0 \
                or len(table.shape or ()) != 2 or not table.const_value.dtype.is_floating_point():
            continue
        for head, _ in list(table.uses()):
            plain = head.op_type == "Transpose" and head.domain == "" and list(head.attributes.get_ints("perm") or ()) == [1, 0]
            fused = head.op_type == "FusedMatMul" and head.domain == "com.microsoft" and head.inputs[1] is table \
                and head.attributes.get_int("transB", 0) == 1 and head.attributes.get_int("transA", 0) == 0 \
                and head.attributes.get_float("alpha", 1.0) == 1.0
            matmuls = [user for user, index in head.outputs[0].uses() if user.op_type == "MatMul"
                       and user.domain == "" and index == 1] if plain else [head] if fused else []
            for matmul in matmuls:
                weight = onnx_ir.Value(name=f"{table.name}.lm_head", shape=onnx_ir.Shape(table.shape[::-1]),
                                       type=table.type,
                                       const_value=onnx_ir.tensor(np.ascontiguousarray(table.const_value.numpy().T)))
                graph.register_initializer(weight)
                replacement = onnx_ir.node("MatMul", [matmul.inputs[0], weight], name=matmul.name)
                graph.insert_before(matmul, replacement)
                replacement.outputs[0].name, replacement.outputs[0].shape, replacement.outputs[0].type = \
                    None, matmul.outputs[0].shape, matmul.outputs[0].type
                matmul.outputs[0].replace_all_uses_with(replacement.outputs[0], replace_graph_outputs=True)
                name = matmul.outputs[0].name
                graph.remove(matmul, safe=True)
                replacement.outputs[0].name = name
                found.append((lookup.name, weight.name))
                break
            if found and found[-1][0] == lookup.name:
                break
    for node in [n for n in graph if n.op_type == "Transpose" and not n.outputs[0].uses()
                 and n.outputs[0] not in graph.outputs]:
        graph.remove(node, safe=True)
    return found


def _lookup_in_head_blocks(model: Any, lookup_name: str, head: str, block_size: int) -> None:
    """The lookup `lookup_name` reads its rows from the 4-bit head quantized from the initializer `head` (GenAI's
    model builder's tied int4 embedding: `GatherBlockQuantized` over the `MatMulNBits` weight reshaped to
    `[vocab, packed hidden]`, its scales and zero points alike, the padding of the last block sliced off), and the
    float table goes."""
    import onnx_ir  # ONNX loads only where an ONNX model is quantized

    graph = model.graph
    [matmul] = [node for node in graph if node.op_type == "MatMulNBits" and node.inputs[1] is not None
                and node.inputs[1].name.startswith(head + "_Q")]
    [lookup] = [node for node in graph if node.name == lookup_name]
    vocab, hidden = matmul.attributes.get_int("N"), matmul.attributes.get_int("K")
    blocks = -(-hidden // block_size)

    def constant(name: str, values: list[int]) -> onnx_ir.Value:
        value = onnx_ir.Value(name=f"{lookup_name}/{name}", const_value=onnx_ir.tensor(values, dtype=onnx_ir.DataType.INT64))
        graph.register_initializer(value)
        return value

    def rows(value: onnx_ir.Value, name: str) -> onnx_ir.Value:
        reshape = onnx_ir.node("Reshape", [value, constant(name, [vocab, -1])], name=f"{lookup_name}/{name}")
        graph.insert_before(lookup, reshape)
        return reshape.outputs[0]

    data, scales = rows(matmul.inputs[1], "data_rows"), rows(matmul.inputs[2], "scale_rows")
    zero_points = rows(matmul.inputs[3], "zero_point_rows") if len(matmul.inputs) > 3 and matmul.inputs[3] else None
    gathered = onnx_ir.node("GatherBlockQuantized", [data, lookup.inputs[1], scales, zero_points], domain="com.microsoft",
                            attributes={"bits": 4, "block_size": block_size, "gather_axis": 0, "quantize_axis": 1},
                            name=f"{lookup_name}/GatherBlockQuantized")
    graph.insert_before(lookup, gathered)
    out = gathered.outputs[0]
    if blocks * block_size != hidden:
        cut = onnx_ir.node("Slice", [out, constant("start", [0]), constant("end", [hidden]), constant("axis", [-1])])
        graph.insert_before(lookup, cut)
        out = cut.outputs[0]
    out.shape, out.type = lookup.outputs[0].shape, lookup.outputs[0].type
    table = lookup.inputs[0]
    lookup.outputs[0].replace_all_uses_with(out, replace_graph_outputs=True)
    graph.remove(lookup, safe=True)
    if table is not None and not table.uses() and table.name in graph.initializers:
        graph.initializers.pop(table.name)


def pt2e_quantizer(torchao_quantizer: Any, calibration: list[dict] | None):
    """`PT2EQuantizer` around a torchao / ExecuTorch PT2E quantizer."""
    # upstream's quantizers load torchao
    from transformers.exporters.quantizers import PT2EQuantizer

    return PT2EQuantizer(torchao_quantizer, calibration_dataset=calibration)


def capture_calibration_inputs(model: Any, generate_samples: list[dict], generation_config: Any,
                               multi_token_decode: bool) -> dict[str, list[dict]]:
    """`{component: [forward kwargs, ...]}` from generate-style calibration samples (upstream's capture)."""
    # upstream's quantizers load torchao
    from transformers.exporters.quantizers.utils import capture_calibration_inputs as capture

    with torch.no_grad():
        return capture(model, [copy.deepcopy(s) for s in generate_samples], generation_config=generation_config,
                       multi_token_decode=multi_token_decode)


@contextlib.contextmanager
def xnnpack_dynamic_quant_partitioners() -> Iterator[None]:
    """Lower ExecuTorch programs with the dynamically quantized linears delegated first, then the rest (ExecuTorch's
    own LLM export does this for 8da4w). `ExecutorchConfig` has no partitioner option and its single
    `XnnpackPartitioner` fails on a PT2E-quantized decoder with a cache ("Invalid partition, found dependency
    cycles"): docs/upstream-gaps.md #18. Process-local: exports run in their own child process."""
    # upstream's ExecuTorch exporter loads ExecuTorch (only an ExecuTorch export lowers with these partitioners)
    import transformers.exporters.exporter_executorch

    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )

    table = transformers.exporters.exporter_executorch._BACKEND_PREPARE
    original = table["xnnpack"]

    def prepare(model, sample_inputs):
        model, sample_inputs, _ = original(model, sample_inputs)
        return model, sample_inputs, [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()]

    with patched_item(table, "xnnpack", prepare):
        yield

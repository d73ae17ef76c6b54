"""The int4 variant's quantizer runs ONNX Runtime's `MatMulNBitsQuantizer` one weight at a time (issue #51: a 1.1B
export was killed at 12 GiB inside it, the whole float model loaded again beside the graph's own copy): its output
must be byte for byte what the quantizer writes over the whole loaded model, the way this project ran it before
(saved with external data, `onnx.load`ed, `process()`, saved, loaded back), on the plain graph, the graph fused for
ONNX Runtime's CPU provider (`If` guards around GroupQueryAttention), a table tied to the LM head stored once or not,
a 4-bit table."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx_ir
import pytest

from exporters.upstream import quantize_matmul_nbits
from tests.conftest import run_cli
from tests.models import tiny_llama

OPTIONS = {"block_size": 32, "accuracy_level": 4, "symmetric": True}


def whole_model_reference(model, *, block_size, accuracy_level, symmetric, quantize_embeddings=False,
                          shared_embeddings=True):
    """The quantizer as `exporters.upstream.quantizers` ran it until the weights were streamed (commit 4892611):
    every weight saved, loaded again in one protobuf, quantized, saved, loaded back."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from exporters.upstream.quantizers import _lookup_in_head_blocks, _tied_heads

    tied = _tied_heads(model) if shared_embeddings else []
    with tempfile.TemporaryDirectory() as tmp:
        path, quantized_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "quantized.onnx")
        onnx_ir.save(model, path, external_data="model.onnx.data")
        quantizer = MatMulNBitsQuantizer(onnx.load(path), bits=4, block_size=block_size, is_symmetric=symmetric,
                                         accuracy_level=accuracy_level,
                                         nodes_to_exclude=[lookup for lookup, _ in tied],
                                         op_types_to_quantize=("MatMul", "Gather") if quantize_embeddings else ("MatMul",))
        quantizer.process()
        quantizer.model.save_model_to_file(quantized_path, use_external_data_format=True)
        quantized = onnx_ir.load(quantized_path)
        onnx_ir.external_data.load_to_model(quantized)
        for graph in quantized.graphs():  # the attributes' tensors into memory too (upstream's helper did this)
            for node in graph:
                for name, attribute in node.attributes.items():
                    if attribute.type == onnx_ir.AttributeType.TENSOR and isinstance(attribute.value,
                                                                                     onnx_ir.ExternalTensor):
                        tensor = attribute.value
                        node.attributes[name] = onnx_ir.AttrTensor(
                            name, onnx_ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=tensor.name))
        for lookup, head in tied:
            _lookup_in_head_blocks(quantized, lookup, head, block_size)
        quantized.graph.sort()
        return quantized


def saved_bytes(model, folder: Path) -> tuple[bytes, bytes]:
    """The files the exporter writes for `model` (`model.onnx` and its data), read back."""
    folder.mkdir()
    onnx_ir.save(model, str(folder / "model.onnx"), external_data="model.onnx.data")
    return (folder / "model.onnx").read_bytes(), (folder / "model.onnx.data").read_bytes()


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """Float graphs as the exporter hands them to the quantizer, plain and fused, of a model whose table is tied to
    its LM head (`shared_embeddings: false` quantizes it as an untied model's: the head alone)."""
    recipe = [{"export_format": "onnx", "mode": "generation", "dynamic": True},
              {"name": "onnx-fused", "export_format": "onnx", "mode": "generation", "dynamic": True,
               "ort_fusions": "cpu"}]
    folder = tiny_llama(tmp_path_factory.mktemp("model"), recipe, tie_word_embeddings=True)
    run = tmp_path_factory.mktemp("out")
    result = run_cli("run", str(folder), "--out", str(run), "--no-bench")
    assert result.returncode == 0, result.stdout + result.stderr
    return {"plain": run / "onnx" / "model.onnx", "fused": run / "onnx-fused" / "model.onnx"}


def loaded(path: Path):
    model = onnx_ir.load(str(path))
    onnx_ir.external_data.load_to_model(model)
    return model


@pytest.mark.parametrize("graph", ["plain", "fused"])
@pytest.mark.parametrize("options", [{}, {"quantize_embeddings": True}, {"shared_embeddings": False},
                                     {"accuracy_level": 0, "symmetric": False, "block_size": 16}])
def test_streamed_quantizer_writes_the_whole_model_quantizers_bytes(graphs, graph, options, tmp_path):
    settings = {**OPTIONS, **options}
    reference = saved_bytes(whole_model_reference(loaded(graphs[graph]), **settings), tmp_path / "reference")
    streamed = saved_bytes(quantize_matmul_nbits(loaded(graphs[graph]), **settings), tmp_path / "streamed")
    assert streamed[0] == reference[0]  # the graph, every node, attribute and initializer's placement
    assert streamed[1] == reference[1]  # every weight's bytes, in the same order
    assert b"MatMulNBits" in streamed[0]
    if graph == "fused":  # the guards' branches were carried through (ONNX Runtime's quantizer rebuilds each `If`)
        assert b"group_query_attention_guard" in streamed[0]


def test_each_float_weight_is_dropped_once_quantized(graphs):
    """Streamed: a weight is serialized for its node only and let go after its last reader is quantized, so the
    float weights are never held twice (the reference held them in the graph and again in the loaded protobuf)."""
    import gc
    import weakref

    import numpy as np

    model = loaded(graphs["plain"])
    matmul_weights = {node.inputs[1].name for node in model.graph if node.op_type == "MatMul"
                      and node.inputs[1].const_value is not None}
    for value in model.graph.initializers.values():  # tensors a weak reference can watch
        value.const_value = onnx_ir.Tensor(np.array(value.const_value.numpy()), name=value.name)
    watched = {name: weakref.ref(model.graph.initializers[name].const_value) for name in matmul_weights}
    others = {name: value.const_value for name, value in model.graph.initializers.items() if name not in matmul_weights}
    quantized = quantize_matmul_nbits(model, **OPTIONS)
    gc.collect()
    assert matmul_weights and all(ref() is None for ref in watched.values()), \
        [name for name, ref in watched.items() if ref() is not None]
    kept = {name: value.const_value for name, value in quantized.graph.initializers.items() if name in others}
    assert kept and all(tensor is others[name] for name, tensor in kept.items()), "the float weights left are the " \
        "very tensors, uncopied"

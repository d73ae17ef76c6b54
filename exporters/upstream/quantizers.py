"""Upstream's quantizers (`transformers.exporters.quantizers`), chosen by `exporters.export.quantize` from the recipe's
method names; part of the one adapter (`exporters.upstream`)."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Iterator
from typing import Any

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
                          quantize_embeddings: bool = False) -> Any:
    """`model` (an `onnx_ir.Model`) with every constant-weight `MatMul` as a 4-bit `MatMulNBits` (and, with
    `quantize_embeddings`, every constant-table `Gather` as a `GatherBlockQuantized`), through files with external
    data as upstream's ONNX Runtime quantizer does (models past protobuf's 2 GB limit work)."""
    import onnx  # ONNX and ONNX Runtime load only where an ONNX model is quantized
    import onnx_ir  # (the same)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # (the same)
    from transformers.exporters.quantizers.quantizer_onnxruntime import _load_external_tensor_attributes  # torchao

    with tempfile.TemporaryDirectory() as tmp:
        path, quantized_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "quantized.onnx")
        onnx_ir.save(model, path, external_data="model.onnx.data")
        quantizer = MatMulNBitsQuantizer(onnx.load(path), bits=4, block_size=block_size, is_symmetric=symmetric,
                                         accuracy_level=accuracy_level,
                                         op_types_to_quantize=("MatMul", "Gather") if quantize_embeddings else ("MatMul",))
        quantizer.process()
        quantizer.model.save_model_to_file(quantized_path, use_external_data_format=True)
        quantized = onnx_ir.load(quantized_path)
        onnx_ir.external_data.load_to_model(quantized)  # into memory before the folder goes away
        _load_external_tensor_attributes(quantized)
        return quantized


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

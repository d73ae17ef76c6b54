"""Upstream's quantizers (`transformers.exporters.quantizers`), chosen by `exporters.export.quantize` from the recipe's
method names; part of the one adapter (`exporters.upstream`)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

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

"""Device selection: CUDA targets fail clearly without a GPU (CI has none), the run's device overrides the recipe's,
and moving inputs between devices keeps a cache's recorded device in step with its tensors (the bug the GPU check
in benchmarks/gpu_check.py found; recorded in benchmarks/RESULTS.md). The GPU itself is not mocked: the CUDA runs
are in that script and its recorded results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.conftest import ROOT, run_cli
from tests.models import tiny_bert


def test_a_cuda_target_without_a_gpu_fails_with_what_to_do(tmp_path):
    model_dir = tiny_bert(tmp_path / "model", [{"name": "gpu", "export_format": "onnx", "device": "cuda"},
                                               {"name": "cpu", "export_format": "onnx"}])
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 1, result.stderr[-2000:]
    targets = {t["name"]: t for t in json.loads((out / "report.json").read_text())["targets"]}
    assert targets["cpu"]["status"] == "passed"
    assert targets["gpu"]["status"] == "failed" and targets["gpu"]["error"]["type"] == "DeviceError"
    assert "no CUDA GPU is visible" in targets["gpu"]["error"]["message"]
    assert "Traceback" not in result.stderr


def test_moving_a_cache_moves_its_recorded_device_too():
    from transformers import DynamicCache, LlamaConfig

    from exporters.upstream import move_to

    cache = DynamicCache(config=LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2))
    for layer in range(2):
        cache.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), layer)
    assert {str(layer.device) for layer in cache.layers} == {"cpu"}
    moved = move_to({"cache": cache, "ids": torch.ones(1, 3, dtype=torch.long)}, "meta", torch.float16)
    assert {str(layer.device) for layer in moved["cache"].layers} == {"meta"}
    assert {layer.keys.device.type for layer in moved["cache"].layers} == {"meta"}
    assert moved["cache"].layers[0].keys.dtype == torch.float16 and moved["ids"].dtype == torch.long


def test_asking_for_a_gpu_does_not_initialize_cuda_in_the_parent():
    """Export children are forked: a parent that initialized CUDA makes every CUDA export fail in them."""
    code = ("import os; from exporters.run.context import cuda_available; cuda_available(); "
            "print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')); import torch; print(torch.cuda.is_initialized())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"})
    assert result.stdout.split() == ["1", "False"], result.stderr[-2000:]

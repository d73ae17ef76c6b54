"""What one decode step of a merged decoder graph costs in ONNX Runtime: kernels (its profiler) and instructions
(valgrind's callgrind), batch 1, one token after a past of 16, 1 intra-op thread, sequential execution.

Usage (benchmarks/RESULTS.md, issue #51):
    .venv/bin/python benchmarks/decode_step_cost.py kernels FOLDER [FOLDER ...]
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python benchmarks/decode_step_cost.py instructions FOLDER   # then: callgrind_annotate /tmp/cg.<pid>

`kernels` prints each folder's kernels a step (the profile's node events of 10 steps, divided by 10).
`instructions` switches callgrind's instrumentation on (`callgrind_control -i on`) only around 10 steps after 3
warm-up steps: the output file's total (`callgrind_annotate`'s first line) divided by 10 is a step's instructions.
The feeds are whatever the graph takes of `input_ids`, `attention_mask`, `position_ids` and `past_key_values.*`
(the GenAI builder's graph and ours alike); the past is random normal, the same for every folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

PAST, STEPS, WARMUP = 16, 10, 3
HEAD = int(os.environ.get("HEAD_SIZE", "64"))  # where a graph names its head size (58M Llama: 64)


def _session(folder: Path, profile: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    graph = next(p for p in sorted(folder.glob("*.onnx")) if p.stat().st_size > 0)
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def _feeds(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = np.array([[5]], np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, PAST + 1), np.int32 if "int32" in value.type else np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.array([[PAST]], np.int32 if "int32" in value.type else np.int64)
        elif value.name.startswith("past_key_values."):
            kv, head = value.shape[1], value.shape[3]
            head = head if isinstance(head, int) else HEAD  # the builder's `kv_cache_dim`
            dtype = np.float16 if "float16" in value.type else np.float32
            feeds[value.name] = rng.standard_normal((1, kv, PAST, head)).astype(dtype)
        else:
            raise SystemExit(f"{value.name}: an input this benchmark does not feed")
    return feeds


def kernels(folder: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        session = _session(folder, str(Path(tmp) / "profile"))
        feeds = _feeds(session)
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return len(nodes) / max(len(runs), 1)


def instructions(folder: Path) -> None:
    session = _session(folder)
    feeds = _feeds(session)
    for _ in range(WARMUP):
        session.run(None, feeds)
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    for _ in range(STEPS):
        session.run(None, feeds)
    subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)


if __name__ == "__main__":
    mode, folders = sys.argv[1], [Path(a) for a in sys.argv[2:]]
    for folder in folders:
        if mode == "kernels":
            print(f"{folder}: {kernels(folder):.1f} kernels a step")
        else:
            instructions(folder)

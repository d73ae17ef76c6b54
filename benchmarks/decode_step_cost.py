"""What one decode step of a merged decoder graph costs in ONNX Runtime: kernels (its profiler) and instructions
(valgrind's callgrind), batch 1, one token after a past of 16, 1 intra-op thread, sequential execution.

Usage (benchmarks/RESULTS.md, issue #51):
    .venv/bin/python benchmarks/decode_step_cost.py kernels FOLDER [FOLDER ...]
    .venv/bin/python benchmarks/decode_step_cost.py ops FOLDER [FOLDER ...]     # µs a step by op type
    .venv/bin/python benchmarks/decode_step_cost.py time FOLDER [FOLDER ...]    # µs a step, folders interleaved
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python benchmarks/decode_step_cost.py instructions FOLDER   # then: callgrind_annotate /tmp/cg.<pid>

`kernels` prints each folder's kernels a step (the profile's node events of one step: a new session's first).
`ops` sums the profile's kernel times by op type over `ROUNDS` sessions' 10 steps each (each session's median
kept; an `If`'s time includes its branch's kernels, which are also counted under their own op types, marked `*`).
`time` runs the folders' sessions in one process, `ROUNDS` rounds of 200 steps each, the order rotating each
round, and prints each folder's median µs a step and its ratio to the last folder's (the reference: the builder's).
Both are native (the machine's own kernels); valgrind lacks AVX-512, so on a machine with it `instructions` counts
the AVX2 kernels ONNX Runtime's MLAS picks under valgrind, not the ones a real run takes.
`instructions` switches callgrind's instrumentation on (`callgrind_control -i on`) only around 10 steps after 3
warm-up steps: the output file's total (`callgrind_annotate`'s first line) divided by 10 is a step's instructions.
The feeds are whatever the graph takes of `input_ids`, `attention_mask`, `position_ids` and `past_key_values.*`
(the GenAI builder's graph and ours alike); the past is random normal, the same for every folder.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

PAST, STEPS, WARMUP = 16, 10, 3
ROUNDS = int(os.environ.get("ROUNDS", "9"))  # `ops` and `time`: sessions or rounds a folder
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


def _profiled(folder: Path, steps: int) -> list[dict]:
    """The profile's events of a new session of `folder` that ran `steps` decode steps."""
    with tempfile.TemporaryDirectory() as tmp:
        session = _session(folder, str(Path(tmp) / "profile"))
        feeds = _feeds(session)
        for _ in range(steps):
            session.run(None, feeds)
        return json.loads(Path(session.end_profiling()).read_text())


def kernels(folder: Path) -> float:
    events = _profiled(folder, 1)
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return len(nodes) / max(len(runs), 1)


def ops(folder: Path, rounds: int) -> dict[str, tuple[float, float]]:
    """`{op type: (kernels a step, median µs a step)}` from `rounds` profiled sessions, each's last `STEPS` steps
    after `WARMUP` (the first runs allocate)."""
    per_round: list[dict[str, list[float]]] = []
    for _ in range(rounds):
        events = _profiled(folder, WARMUP + STEPS)
        runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][-STEPS:]
        totals: dict[str, list[float]] = {}
        for event in events:
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= runs[0]["ts"]:
                entry = totals.setdefault(event["args"]["op_name"], [0.0, 0.0])
                entry[0] += 1 / STEPS
                entry[1] += event["dur"] / STEPS
        per_round.append(totals)
    names = sorted({name for totals in per_round for name in totals})
    return {name: (max(t.get(name, [0, 0])[0] for t in per_round),
                   statistics.median(t.get(name, [0, 0])[1] for t in per_round)) for name in names}


def timed(folders: list[Path], rounds: int, steps: int = 200) -> list[float]:
    """Each folder's median µs a step over `rounds` rounds of `steps` steps, the order rotating each round."""
    sessions = [_session(folder) for folder in folders]
    feeds = [_feeds(session) for session in sessions]
    for session, feed in zip(sessions, feeds):
        for _ in range(20):
            session.run(None, feed)
    times: list[list[float]] = [[] for _ in folders]
    for round_ in range(rounds):
        order = list(range(len(folders)))
        order = order[round_ % len(order):] + order[:round_ % len(order)]
        for index in order:
            start = time.perf_counter()
            for _ in range(steps):
                sessions[index].run(None, feeds[index])
            times[index].append((time.perf_counter() - start) / steps * 1e6)
    return [statistics.median(t) for t in times]


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
    if mode == "time":
        medians = timed(folders, ROUNDS)
        for folder, median in zip(folders, medians):
            print(f"{median:9.1f} µs a step  {median / medians[-1]:.4f}x  {folder}")
        sys.exit()
    if mode == "ops":
        tables = [ops(folder, ROUNDS) for folder in folders]
        names = sorted({n for t in tables for n in t}, key=lambda n: -max(t.get(n, (0, 0))[1] for t in tables))
        print("op type | " + " | ".join(f"kernels, µs ({f.parent.name}/{f.name})" for f in folders))
        for name in names:
            cells = [f"{t.get(name, (0, 0))[0]:.0f}, {t.get(name, (0, 0))[1]:.1f}" for t in tables]
            print(f"{name}{'*' if name == 'GroupQueryAttention' else ''} | " + " | ".join(cells))
        print("total | " + " | ".join(f"{sum(v[0] for v in t.values()):.0f}, "
                                      f"{sum(v[1] for k, v in t.items() if k != 'If'):.1f} (without If)" for t in tables))
        sys.exit()
    for folder in folders:
        if mode == "kernels":
            print(f"{folder}: {kernels(folder):.1f} kernels a step")
        else:
            instructions(folder)

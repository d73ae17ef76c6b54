"""Where the ONNX target's time goes at TinyLlama-1.1B's width, at a depth a shared machine affords (issue #46).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_onnx_phases.py [--layers 4] [--work /tmp/onnx-phases]
        [--profile] [--top 40]
    # CPU seconds of the whole process tree (the export child and the runtimes' proof children included):
    .venv/bin/python benchmarks/cpu_seconds.py -- env PYTHONPATH=$PWD .venv/bin/python \
        benchmarks/profile_onnx_phases.py --layers 4

The checkpoint is bench_peers.py's `tinyllama11b` (hidden 2048, intermediate 5632, 32 heads, 4 key-value heads,
vocab 32,000, untied, bfloat16, TinyLlama-Chat's ids, generation_config.json and the ASCII byte-level BPE) cut to
`--layers` layers and saved in 200 MB shards with an index, built once under `--work`. The run is bench_peers.py's:
`hf-export run MODEL --config recipe-onnx.json --no-cache --no-bench --jobs 1` (the plainest ONNX target:
`onnx`, generation, dynamic).

Without `--profile` the CLI runs as a subprocess, as bench_peers.py runs it; report.json's phase timings are printed.
With `--profile` it runs in this process under cProfile (CPU time: `time.process_time`, this process's
threads together; wall time would measure the machine's load), and so does the forked export child (its own profile,
written by the child before it exits): the top functions of each by cumulative and own time are printed, the
profiles kept under `--work` for `python -m pstats`. The runtimes' proofs run in their own processes: their CPU
seconds are in `cpu_seconds.py`'s total, not in either profile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import bench_peers  # the 1.1B checkpoint's tokenizer and recipes

PHASES = ("load_s", "eager_ahead_s", "export_s", "trace_s", "save_s", "validate_s")


def build(folder: Path, layers: int) -> dict:
    """TinyLlama-1.1B-Chat's width and files (bench_peers.build_tinyllama) at `layers` layers, once."""
    facts = bench_peers.built_facts(folder)
    return facts or bench_peers.build_tinyllama(folder, folder / "facts.json", layers, max_shard_size="200MB")


def phases(out: Path) -> dict:
    """report.json's phase timings and verdict of the one target."""
    report = json.loads((out / "report.json").read_text())
    target = report["targets"][0]
    timings = {**{k: report.get("timings", {}).get(k) for k in ("load_s",)}, **target.get("timings", {})}
    return {"status": target["status"], **{k: timings.get(k) for k in PHASES if timings.get(k) is not None}}


def _print_top(path: Path, title: str, top: int) -> None:
    import pstats

    print(f"\n===== {title}: {path}")
    for key in ("cumulative", "tottime"):
        stats = pstats.Stats(str(path))
        stats.sort_stats(key).print_stats(top)


def run_profiled(argv: list[str], work: Path, top: int) -> None:
    """The CLI in this process under cProfile; the export child profiled by itself (fork: the same patch)."""
    import cProfile

    from exporters import cli
    from exporters.run import isolation

    parent_stats, child_stats = work / "parent.prof", work / "child.prof"
    original = isolation._child

    def profiled_child(work_fn, result_path, log_path):  # the forked child: its own profile, dumped before _exit
        profile = cProfile.Profile(time.process_time)

        def profiled_work():
            profile.enable()
            try:
                return work_fn()
            finally:
                profile.disable()
                profile.dump_stats(str(child_stats))
        original(profiled_work, result_path, log_path)

    isolation._child = profiled_child
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        cli.app(args=argv, standalone_mode=False)  # not cli.main: it ends the process without returning
    except SystemExit:
        pass
    finally:
        profile.disable()
        profile.dump_stats(str(parent_stats))
    _print_top(parent_stats, "parent", top)
    if child_stats.exists():
        _print_top(child_stats, "export child", top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("/tmp/onnx-phases"))
    parser.add_argument("--profile", action="store_true", help="cProfile the parent and the export child")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    work = args.work / f"layers{args.layers}"
    work.mkdir(parents=True, exist_ok=True)
    facts = build(work / "model", args.layers)
    recipe = work / "recipe-onnx.json"
    recipe.write_text(json.dumps(bench_peers.RECIPES["onnx"]))
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["run", str(work / "model"), "--quiet", "--no-cache", "--no-bench", "--jobs", "1", "--config", str(recipe),
            "--out", str(out)]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    if args.profile:
        run_profiled(argv, work, args.top)
    else:
        subprocess.run([sys.executable, "-m", "exporters.cli", *argv], cwd=ROOT, check=False)
    wall = time.monotonic() - started
    print(f"\nmodel: {facts}")
    print(f"phases: {json.dumps(phases(out))} wall_s={wall:.1f} load={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

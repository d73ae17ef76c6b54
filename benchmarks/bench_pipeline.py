"""Benchmark the pipeline against bare upstream calls, side by side in one run (issue #7).

Prints one table: each measured ratio, its target, and the machine. Run from a `make demo` environment:

    .venv/bin/python benchmarks/bench_pipeline.py [--layers 8 --hidden 512] [--skip-optimum] [--work DIR]

P1  full pipeline (load, export, save, validate, report; dynamo + onnx + executorch) / bare upstream export+save
    of the same configs                                                                        target <= 1.15
P2  the model is loaded once and each probe's eager reference computed once, shared by targets   (counts)
P3  a rerun with unchanged inputs (wall time of the whole CLI run)                              target <= 3 s
P4  dynamic=True (Dim.AUTO) export time / explicit dynamic-shape export time, ONNX generation     target >= 1.3
P5  peak RSS of the pipeline / peak RSS of the largest single bare upstream export              target <= 1.1
P6  hf-export run (merged onnx generation target: export + validation) / optimum-cli export onnx
    --task text-generation-with-past (optimum-onnx 0.1.0 in its own venv)                       target <= 1.0
P7  --jobs 1 / --jobs auto, the 3-format pipeline (wall)                                          (info)
P8  validation / export time of the ONNX-only run of P6 (report.json timings)                    target < 0.25

The ONNX target is the merged generation graph (`"merged": true`: one graph for the prompt and every decode step,
upstream's multi-token decode); "bare upstream" exports the very same components with the same configs. Runs pass
`--no-bench` (the per-artifact timings of #14 are a separate feature, measured by bench_variants.py).

Every measured step runs in its own subprocess (`resource.getrusage(RUSAGE_CHILDREN)` gives its peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

PREFILL = {"dynamic_shapes": {"input_ids": {"1": {"name": "prompt", "min": 2, "max": 512}},
                              "position_ids": {"1": {"name": "prompt", "min": 2, "max": 512}}},
           "prefer_deferred_runtime_asserts_over_guards": True}
DECODE = {"dynamic_shapes": {"cache.layers.*.keys": {"2": {"name": "past", "min": 2, "max": 1024}},
                             "cache.layers.*.values": {"2": {"name": "past", "min": 2, "max": 1024}}},
          "prefer_deferred_runtime_asserts_over_guards": True}
DECODE_AUTO = {"dynamic_shapes": {"cache.layers.*.keys": {"2": "auto"}, "cache.layers.*.values": {"2": "auto"}}}


def recipe() -> dict:
    return {
        "schema_version": 1,
        "exports": [
            {"name": "dynamo", "export_format": "dynamo", "mode": "generation",
             "components": {"prefill": PREFILL, "decode": DECODE}},
            {"name": "onnx", "export_format": "onnx", "mode": "generation", "merged": True},
            {"name": "executorch", "export_format": "executorch", "mode": "generation",
             "components": {"prefill": PREFILL, "decode": DECODE_AUTO}},
        ],
        "inputs": {"sequence_length": 8},
        "generation": {"max_new_tokens": 8},
        # the declared cache bound (1024) is probed: its inputs (8 layers of keys and values) hold 8.4M elements
        "validation": {"max_probe_elements": 10_000_000},
    }


def build_model(folder: Path, layers: int, hidden: int) -> int:
    """A Llama-style model with random weights, saved locally; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.6875),
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    (folder / "export_config.json").write_text(json.dumps(recipe(), indent=2))
    return sum(p.numel() for p in model.parameters())


def measure(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (MiB) of a command run in a fresh child, measured through a wrapper process so
    each measurement's `ru_maxrss` covers only that command's process tree."""
    wrapper = textwrap.dedent(
        """
        import json, resource, subprocess, sys, time
        start = time.perf_counter()
        proc = subprocess.run(sys.argv[1:])
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print("__MEASURE__" + json.dumps({"wall": wall, "rss": peak, "rc": proc.returncode}), file=sys.stderr)
        sys.exit(proc.returncode)
        """
    )
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([PY, "-c", wrapper, *cmd], capture_output=True, text=True, env=full_env, cwd=cwd)
    line = next((l for l in proc.stderr.splitlines() if l.startswith("__MEASURE__")), None)
    if line is None:
        raise RuntimeError(f"measurement failed: {proc.stderr[-2000:]}")
    data = json.loads(line.removeprefix("__MEASURE__"))
    if data["rc"] != 0:
        print(f"  ! {' '.join(cmd[:4])}… exited {data['rc']}: {proc.stderr[-1500:]}", file=sys.stderr)
    return data["wall"], data["rss"], proc


BARE = textwrap.dedent(
    """
    # Bare upstream: the very components and configs the pipeline exports (the library's capture; the whole process
    # is measured), each exported with upstream's `exporter.export` and saved with `ExportedModel.save_pretrained`:
    # no validation, no report, no shared weights file, no multi-method .pte.
    import sys, time
    from pathlib import Path
    from exporters import engine, upstream
    from exporters.run.context import RunOptions, prepare_run
    from exporters.run.workbench import Workbench

    model_dir, target_name, out, mode = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    context = prepare_run(model_dir, RunOptions(out_dir=out.parent / (out.name + "-ctx"), targets=[target_name]))
    bench = Workbench.load(context, RunOptions(out_dir=out, bench=False), context.targets)
    target = bench.plan(context.targets[0])
    components = bench.components(target, context.recipe)
    if mode == "auto":   # dynamic=True everywhere: Dim.AUTO on every axis
        target.dynamic, target.dynamic_shapes, target.components = True, None, {}
        configs = {name: engine.upstream_config(target) for name in components}
    else:
        configs = engine.component_configs(target, components, context.recipe, [])
    exporter = upstream.exporter_class(target.export_format)()
    start = time.perf_counter()
    for name, (module, inputs) in components.items():
        component = exporter.export(module, inputs, configs[name]).components["model"]
        upstream.ExportedModel({name: component}, target.export_format,
                               config=bench.model.config).save_pretrained(out / name)
    print(f"components {list(components)}: export + save {time.perf_counter() - start:.1f} s", file=sys.stderr)
    """
)


def optimum_venv(work: Path) -> Path | None:
    venv = work / "venv-optimum"
    python = venv / "bin" / "python"
    if not (venv / "bin" / "optimum-cli").exists():
        print("installing optimum-onnx 0.1.0 with transformers 4.57.x in its own venv (once)…", file=sys.stderr)
        subprocess.run([PY, "-m", "venv", str(venv)], check=True)
        result = subprocess.run([str(python), "-m", "pip", "install", "-q", "optimum-onnx==0.1.0",
                                 "transformers>=4.57,<4.58", "torch==2.13.0", "onnxruntime"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"  ! could not install optimum-onnx: {result.stderr[-800:]}", file=sys.stderr)
            return None
    return venv / "bin" / "optimum-cli"


def machine() -> str:
    """The machine, as the pipeline's own benchmarks describe it (exporters.validate.benchmark.machine_info)."""
    from exporters.report.markdown import machine_line
    from exporters.validate.benchmark import machine_info

    return f"{machine_line(machine_info())}, Python {platform.python_version()}"


def p6(rows: list, suffix: str, env: dict | None, cli: list[str], model_dir: Path, work: Path,
       optimum: Path | None) -> dict:
    """P6 and P8 rows for one environment; returns the ONNX-only run's timings."""
    onnx_out = work / "out-onnx"
    shutil.rmtree(onnx_out, ignore_errors=True)
    ours_wall, ours_rss, _ = measure([*cli, "run", str(model_dir), "--out", str(onnx_out), "--quiet", "--no-cache",
                                      "--no-bench", "--target", "onnx"], env=env)
    onnx_target = json.loads((onnx_out / "report.json").read_text())["targets"][0]
    timings = onnx_target.get("timings") or {}
    share = timings["validate_s"] / timings["export_s"]
    rows.append((f"P8 validation / export, onnx-only run{suffix}",
                 f"{timings['validate_s']:.1f} s / {timings['export_s']:.1f} s ({onnx_target['status']})", share,
                 "< 0.25", share < 0.25))
    if optimum is None:
        rows.append((f"P6 hf-export onnx / optimum-cli{suffix}", f"{ours_wall:.1f} s / not run", None, "<= 1.0", None))
        return timings
    optimum_out = work / "optimum-out"
    shutil.rmtree(optimum_out, ignore_errors=True)
    opt_wall, opt_rss, _ = measure([str(optimum), "export", "onnx", "--model", str(model_dir), "--task",
                                    "text-generation-with-past", str(optimum_out)], env=env)
    rows.append((f"P6 hf-export onnx / optimum-cli (wall){suffix}", f"{ours_wall:.1f} s / {opt_wall:.1f} s",
                 ours_wall / opt_wall, "<= 1.0", ours_wall / opt_wall <= 1.0))
    rows.append(("   peak RSS hf-export / optimum-cli", f"{ours_rss:.0f} / {opt_rss:.0f} MiB", ours_rss / opt_rss,
                 "(info)", None))
    return timings


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work")
    parser.add_argument("--skip-optimum", action="store_true")
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work / "model", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"
    params = build_model(model_dir, args.layers, args.hidden)
    print(f"model: Llama-style, {params / 1e6:.1f}M parameters ({args.layers} layers, hidden {args.hidden})",
          file=sys.stderr)
    load_at_start = os.getloadavg()
    cli = [PY, "-m", "exporters.cli"]
    rows = []

    # P1, P2, P5: the pipeline, then bare upstream for the same three configs.
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    pipe_wall, pipe_rss, _ = measure([*cli, "run", str(model_dir), "--out", str(out), "--quiet", "--no-cache",
                                      "--no-bench", "--jobs", "auto"])
    report = json.loads((out / "report.json").read_text())
    jobs_auto = report.get("jobs")
    statuses = {t["name"]: t["status"] for t in report["targets"]}
    bare_wall, bare_rss = 0.0, 0.0
    bare_each = {}
    for target in ("dynamo", "onnx", "executorch"):
        target_out = work / f"bare-{target}"
        shutil.rmtree(target_out, ignore_errors=True)
        wall, rss, _ = measure([PY, "-c", BARE, str(model_dir), target, str(target_out), "explicit"])
        bare_each[target] = (wall, rss)
        bare_wall += wall
        bare_rss = max(bare_rss, rss)
    rows.append(("P1 pipeline / bare upstream (wall)", f"{pipe_wall:.1f} s / {bare_wall:.1f} s",
                 pipe_wall / bare_wall, "<= 1.15", pipe_wall / bare_wall <= 1.15))
    cache = report.get("eager_cache") or {}
    rows.append(("P2 model loads; eager refs computed / reused", f"1 load; {cache.get('misses')} / {cache.get('hits')}",
                 None, "1 load, reuse > 0", bool(cache.get("hits"))))

    # P3: the same run again, unchanged inputs.
    rerun_wall, _, _ = measure([*cli, "run", str(model_dir), "--out", str(out), "--quiet", "--no-bench"])
    rerun = json.loads((out / "report.json").read_text())
    all_cached = all(t.get("cached") for t in rerun["targets"])
    rows.append(("P3 rerun, unchanged inputs (wall)", f"{rerun_wall:.2f} s, cached: {all_cached}", rerun_wall,
                 "<= 3 s", rerun_wall <= 3 and all_cached))

    # P7: the same pipeline, one export at a time.
    serial_out = work / "out-jobs1"
    shutil.rmtree(serial_out, ignore_errors=True)
    serial_wall, serial_rss, _ = measure([*cli, "run", str(model_dir), "--out", str(serial_out), "--quiet",
                                          "--no-cache", "--no-bench", "--jobs", "1"])
    serial_statuses = {t["name"]: t["status"] for t in json.loads((serial_out / "report.json").read_text())["targets"]}
    rows.append((f"P7 pipeline --jobs 1 / --jobs auto ({jobs_auto}) (wall)", f"{serial_wall:.1f} s / {pipe_wall:.1f} s",
                 serial_wall / pipe_wall, "(info)", None))
    rows.append(("   peak RSS --jobs 1 / --jobs auto", f"{serial_rss:.0f} / {pipe_rss:.0f} MiB", serial_rss / pipe_rss,
                 "(info)", None))

    # P4: ONNX generation export, Dim.AUTO vs the explicit contract (export + save only, same process shape).
    auto_out = work / "bare-onnx-auto"
    shutil.rmtree(auto_out, ignore_errors=True)
    auto_wall, _, _ = measure([PY, "-c", BARE, str(model_dir), "onnx", str(auto_out), "auto"])
    explicit_wall = bare_each["onnx"][0]
    rows.append(("P4 onnx export: dynamic=True / explicit shapes", f"{auto_wall:.1f} s / {explicit_wall:.1f} s",
                 auto_wall / explicit_wall, ">= 1.3", auto_wall / explicit_wall >= 1.3))

    rows.append(("P5 peak RSS: pipeline / largest bare export", f"{pipe_rss:.0f} MiB / {bare_rss:.0f} MiB",
                 pipe_rss / bare_rss, "<= 1.1", pipe_rss / bare_rss <= 1.1))

    # P6, P8: ONNX generation through hf-export (export + validation) against optimum-cli; then both again with one
    # torch intra-op thread (on a shared machine, OpenMP threads that wait for a descheduled sibling dominate small
    # forwards: both tools run many of them).
    optimum = None if args.skip_optimum else optimum_venv(work)
    timings = {}
    for suffix, env in (("", None), (" [OMP_NUM_THREADS=1]", {"OMP_NUM_THREADS": "1"})):
        timings[suffix] = p6(rows, suffix, env, cli, model_dir, work, optimum)

    print(f"\nmachine: {machine()}")
    print(f"model: {params / 1e6:.1f}M parameters; pipeline target statuses: {statuses} (--jobs 1: {serial_statuses})")
    print("load average (1, 5, 15 min) at the start: %.2f %.2f %.2f, at the end: %.2f %.2f %.2f"
          % (*load_at_start, *os.getloadavg()))
    print("pipeline timings (s): " + json.dumps({t["name"]: t.get("timings") for t in report["targets"]}))
    print("onnx-only timings (s): " + json.dumps(timings))
    print(f"threads: torch {torch_threads()} by default")
    print("bare upstream per target (wall s, peak MiB): "
          + ", ".join(f"{k} {w:.1f}/{r:.0f}" for k, (w, r) in bare_each.items()))
    print("\n| check | measured | ratio | target | met |\n|---|---|---|---|---|")
    for name, measured, ratio, target, met in rows:
        ratio_text = "–" if ratio is None else f"{ratio:.2f}"
        met_text = "–" if met is None else ("yes" if met else "NO")
        print(f"| {name} | {measured} | {ratio_text} | {target} | {met_text} |")


if __name__ == "__main__":
    main()

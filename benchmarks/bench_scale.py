"""Scale benchmark (issue #19): one-target `hf-export run`s on a 0.5B-parameter model, per format.

The model is Qwen2.5-0.5B-shaped (24 layers, hidden 896, 14 heads / 2 KV heads, vocab 151,936, tied embeddings,
494M parameters, 1.98 GB of float32 safetensors) with random weights, built locally. Each target runs alone, the way
the Action's matrix runs it, and for each the script records:

- wall time of the whole CLI run (load, export, save, validation with parity, report);
- peak RSS: the largest single process of the run's tree (`ru_maxrss`, what a runner's OOM killer sees per
  process) and the peak of the tree's summed PSS (shared pages split between the processes that map them: the
  memory the run actually holds), each over the model's float32 weight bytes;
- artifact bytes (every file of the target folder, what a Hub PR uploads) over the weight bytes.

Goals: artifact / weights <= 1.05 per target, peak RSS / weights <= 2.0.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_scale.py --source . --label after
    flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_scale.py --source /path/to/old/checkout --label before \\
        --targets onnx dynamo executorch

`--source` is the checkout whose `exporters` runs (a `git archive` of an older commit measures "before"); results
are appended to `--results` as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

TARGETS = {
    "onnx": {"export_format": "onnx", "mode": "generation", "dynamic": True},
    "dynamo": {"export_format": "dynamo", "mode": "generation", "dynamic": True},
    "dynamo-merged": {"export_format": "dynamo", "mode": "generation", "dynamic": True, "merged": True},
    "executorch": {"export_format": "executorch", "mode": "generation", "dynamic": True},
    "executorch-merged": {"export_format": "executorch", "mode": "generation", "merged": True},
}


def build_model(folder: Path) -> int:
    """A Qwen2.5-0.5B-shaped model with random weights, saved in float32; returns its parameter bytes."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return json.loads((folder / "params.json").read_text())["parameter_bytes"]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=151643, eos_token_id=151643)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=151643, pad_token_id=151643)
    model.save_pretrained(folder)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    (folder / "params.json").write_text(json.dumps({"parameter_bytes": parameter_bytes,
                                                    "parameters": sum(p.numel() for p in model.parameters())}))
    return parameter_bytes


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Wall time, peak single-process RSS and peak summed PSS of the process tree of `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_pss = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_pss
        while not stop.is_set():
            peak_pss = max(peak_pss, sum(_pss(pid) for pid in _tree(proc.pid)))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    stop.set()
    sampler.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"wall_s": round(wall, 1), "rc": proc.returncode, "peak_rss": max(after, before) * 1024,
            "peak_rss_is_new": after > before, "peak_pss": peak_pss, "tail": output[-3000:]}


def machine() -> str:
    """The machine, as the pipeline's own benchmarks describe it (exporters.validate.benchmark.machine_info)."""
    from exporters.report.markdown import machine_line
    from exporters.validate.benchmark import machine_info

    return f"{machine_line(machine_info())}, Python {platform.python_version()}"


def run_target(name: str, source: Path, model_dir: Path, work: Path, weight_bytes: int) -> dict:
    recipe = {"schema_version": 1, "exports": [{"name": name, **TARGETS[name]}],
              "generation": {"max_new_tokens": 8}}
    recipe_file = work / f"{name}.json"
    recipe_file.write_text(json.dumps(recipe))
    out = work / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1"}
    cmd = [PY, "-m", "exporters.cli", "run", str(model_dir), "--config", str(recipe_file), "--out", str(out),
           "--quiet", "--no-cache"]
    # One measured command per Python process: ru_maxrss of RUSAGE_CHILDREN only grows, so each target is measured
    # from a fresh wrapper.
    wrapper = ("import json, sys; sys.path.insert(0, sys.argv[1]); from bench_scale import measure; "
               "print('__M__' + json.dumps(measure(json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))))")
    proc = subprocess.run([PY, "-c", wrapper, str(Path(__file__).parent), json.dumps(cmd), str(source),
                           json.dumps(env)], capture_output=True, text=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("__M__")), None)
    if line is None:
        raise RuntimeError(proc.stderr[-3000:])
    measured = json.loads(line.removeprefix("__M__"))
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    target = (report.get("targets") or [{}])[0]
    folder = out / name
    artifact = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
    return {
        "target": name, "status": target.get("status"), "error": (target.get("error") or {}).get("message"),
        "generation": (target.get("generation") or {}).get("status"),
        "components": target.get("expected_components"), "wall_s": measured["wall_s"],
        "timings": target.get("timings"), "rc": measured["rc"],
        "peak_rss_mib": round(measured["peak_rss"] / 2**20), "peak_pss_mib": round(measured["peak_pss"] / 2**20),
        "rss_over_weights": round(measured["peak_rss"] / weight_bytes, 2),
        "pss_over_weights": round(measured["peak_pss"] / weight_bytes, 2),
        "artifact_bytes": artifact, "artifact_over_weights": round(artifact / weight_bytes, 3),
        "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else [],
        "findings": target.get("findings"), "tail": None if measured["rc"] == 0 else measured["tail"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout whose `exporters` package runs")
    parser.add_argument("--label", default="after")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work-scale")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / ".work-scale" / "results.jsonl")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / "qwen2.5-0.5b-random"
    weight_bytes = build_model(model_dir)
    print(f"model: {weight_bytes / 1e9:.2f} GB of float32 weights; machine: {machine()}", file=sys.stderr)
    for name in args.targets:
        row = {"label": args.label, "machine": machine(), "weight_bytes": weight_bytes,
               **run_target(name, args.source.resolve(), model_dir, args.work, weight_bytes)}
        with args.results.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        shown = {k: row[k] for k in ("label", "target", "status", "generation", "wall_s", "peak_rss_mib",
                                     "rss_over_weights", "peak_pss_mib", "pss_over_weights", "artifact_over_weights")}
        print(json.dumps(shown), file=sys.stderr)
        if args.work.joinpath(f"out-{name}").exists():  # the next run needs the disk
            shutil.rmtree(args.work / f"out-{name}" / name, ignore_errors=True)


if __name__ == "__main__":
    main()

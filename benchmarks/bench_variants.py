"""Quantized variants of the 58M-parameter Llama of `bench_pipeline.py` (issue #14): fp32 vs int8 ONNX, fp32 vs
8da4w ExecuTorch — sizes, speed and quality side by side, from one `hf-export run`.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_variants.py [--layers 8 --hidden 512] [--work DIR]

The recipe is `bench_pipeline.py`'s generation contract (prompt 2-512, cache 2-1024; ExecuTorch decode on "auto")
with `variants`: `onnx` + `onnx-int8` (ONNX Runtime dynamic int8) and `executorch` + `executorch-8da4w` (PT2E,
XNNPACK). The pipeline measures every artifact itself (fresh process per artifact, its own runtime, median of timed
runs after warm-ups): file size, load time, prefill at the prompt length, decode tokens per second over
`max_new_tokens`, peak memory. Quality is measured against the eager float32 model on the validation probes.

The weights are random, so the logits are nearly flat and top-1 agreement is far more fragile than on a trained model
(a tiny logit change flips the argmax): the quality budgets are opened (every variant gets timed) and the measured
metrics are printed as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import DECODE, DECODE_AUTO, PREFILL, PY, ROOT, build_model, machine, measure  # noqa: E402

OPEN_BUDGET = {"min_top1_agreement": 0, "max_kl": 100, "min_greedy_match": 0, "min_cosine": -1}


def recipe(new_tokens: int) -> dict:
    return {
        "schema_version": 1,
        "exports": [
            {"name": "onnx", "export_format": "onnx", "mode": "generation", "variants": ["fp32", "int8-dynamic"],
             "components": {"prefill": PREFILL, "decode": DECODE}, "validation": OPEN_BUDGET},
            {"name": "executorch", "export_format": "executorch", "mode": "generation", "variants": ["fp32", "8da4w"],
             "components": {"prefill": PREFILL, "decode": DECODE_AUTO}, "validation": OPEN_BUDGET},
        ],
        "inputs": {"sequence_length": 8},
        "generation": {"max_new_tokens": new_tokens},
        # the declared cache bound (1024) is probed: its inputs (8 layers of keys and values) hold 8.4M elements
        "validation": {"max_probe_elements": 10_000_000},
    }


def row(target: dict) -> dict:
    bench, quality = target.get("bench") or {}, target.get("quality") or {}
    generation = bench.get("generation") or {}
    metrics = quality.get("metrics") or {}
    return {
        "name": target["name"], "status": target["status"], "size_mb": (bench.get("size_bytes") or 0) / 2**20,
        "load_s": bench.get("load_s"), "prefill_ms": generation.get("prefill_ms"),
        "tokens_per_s": generation.get("decode_tokens_per_s"), "decode_ms": (bench.get("latency") or {}).get(
            "decode", {}).get("median_ms"),
        "peak_mb": bench.get("peak_rss_mb"), "runtime_mb": bench.get("runtime_peak_mb"),
        "top1": metrics.get("top1_agreement"), "kl": metrics.get("kl"), "greedy": metrics.get("greedy_match"),
        "max_abs_diff": metrics.get("max_abs_diff"), "export_s": (target.get("timings") or {}).get("export_s"),
    }


def fmt(value, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work" / "variants")
    parser.add_argument("--target", action="append", default=[], help="only these targets (repeatable)")
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model_dir = work / "model"
    params = build_model(model_dir, args.layers, args.hidden)
    (model_dir / "export_config.json").write_text(json.dumps(recipe(args.new_tokens), indent=2))
    print(f"model: Llama-style, {params / 1e6:.1f}M parameters ({args.layers} layers, hidden {args.hidden})",
          file=sys.stderr)
    out = work / "out"
    only = [flag for name in args.target for flag in ("--target", name)]
    wall, rss, _ = measure([PY, "-m", "exporters.cli", "run", str(model_dir), "--out", str(out), "--quiet",
                            "--no-cache", *only])
    report = json.loads((out / "report.json").read_text())
    rows = {t["name"]: row(t) for t in report["targets"]}
    print(f"\nMachine: {machine()}; the pipeline's benchmark saw: {report.get('machine')}")
    print(f"Whole run: {wall:.0f} s wall, peak RSS {rss:.0f} MiB, load average {os.getloadavg()}\n")
    print("| variant | status | size | load | prefill (8 tokens) | decode | decode tokens/s | peak RSS (runtime) "
          "| quality vs eager fp32 | export |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows.values():
        if r["top1"] is not None:
            quality = f"top-1 {r['top1']:.1%}, KL {r['kl']:.2g}, greedy {r['greedy']}/{args.new_tokens}"
        else:
            quality = f"max abs diff {fmt(r['max_abs_diff'], '.1e')}, greedy {r['greedy']}/{args.new_tokens}"
        print(f"| `{r['name']}` | {r['status']} | {r['size_mb']:.1f} MiB | {fmt(r['load_s'], '.2f')} s | "
              f"{fmt(r['prefill_ms'], '.1f')} ms | {fmt(r['decode_ms'], '.2f')} ms | {fmt(r['tokens_per_s'], '.1f')} | "
              f"{fmt(r['peak_mb'], '.0f')} MiB ({fmt(r['runtime_mb'], '.0f')}) | {quality} | "
              f"{fmt(r['export_s'], '.0f')} s |")
    print("\n| ratio | size | decode tokens/s | prefill time |")
    print("|---|---|---|---|")
    for quantized, base in (("onnx-int8", "onnx"), ("executorch-8da4w", "executorch")):
        q, b = rows.get(quantized), rows.get(base)
        if not q or not b or not (q["tokens_per_s"] and b["tokens_per_s"]):
            print(f"| {quantized} / {base} | – | – | – |")
            continue
        print(f"| `{quantized}` / `{base}` | {q['size_mb'] / b['size_mb']:.2f} | "
              f"{q['tokens_per_s'] / b['tokens_per_s']:.2f} | {q['prefill_ms'] / b['prefill_ms']:.2f} |")


if __name__ == "__main__":
    main()

"""The load's memory peak of a bfloat16 checkpoint loaded for float32 targets (issue #46 item 6), before and after.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_load_memory.py [--work /tmp/bench-load-memory] [--layers 2]

The checkpoint: TinyLlama-1.1B's width (hidden 2048, intermediate 5632, 32 heads, 4 key-value heads, vocab 32,000,
untied) cut to `--layers` layers, random weights saved as bfloat16 in safetensors shards with an index (shards of
at most 200 MB, so the layout is the 1.1B checkpoint's: several shards), built once under `--work`.

Each way of loading runs in a fresh process, which prints `VmRSS` and `VmHWM` (/proc/self/status) before and after
the load; the figure is the peak's growth during the load over the float32 weights:

- `from_pretrained(dtype=float32)`: transformers converts each tensor while reading, and holds the shards' pages
  (memory-mapped, resident) beside the float32 tensors until the load ends (the way before);
- `load_model(dtype="float32")`: `exporters.capture.loading.load_model`, whatever it does now (since issue #46: the
  shards read instead of mapped when the load converts, `exporters.upstream.checkpoint_read_not_mapped`; each tensor
  is a temporary, converted and dropped).

Nothing else runs in those processes; the machine's load average is printed (memory does not depend on it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("from_pretrained-float32", "load_model-float32")

_CHILD = r"""
import json, sys, torch, transformers
from pathlib import Path

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0

folder, way = Path(sys.argv[1]), sys.argv[2]
from exporters.capture.loading import load_model  # the stack imported before the first figure
from exporters.capture.source import ModelSource
before_rss, before_hwm = status("VmRSS"), status("VmHWM")
if way == "from_pretrained-float32":
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
else:
    model = load_model(ModelSource(model_id=str(folder), folder=folder), dtype="float32")
dtypes = sorted({str(p.dtype) for p in model.parameters()})
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(json.dumps({"way": way, "before_rss": before_rss, "before_hwm": before_hwm, "after_rss": status("VmRSS"),
                  "after_hwm": status("VmHWM"), "weights_mib": weights, "dtypes": dtypes}))
"""


def build(folder: Path, layers: int) -> None:
    """The bfloat16 checkpoint of TinyLlama's width, `layers` deep, with an index (once)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors.index.json").is_file():
        return
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # drawn in bf16: never a float32 copy here
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder, max_shard_size="200MB")


def measure(folder: Path, way: str) -> dict:
    """One way of loading, in a fresh process: its RSS and peak before and after the load (MiB)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder), way], env=env, cwd=ROOT, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["peak_growth_mib"] = result["after_hwm"] - result["before_rss"]
    result["growth_over_fp32_weights"] = round(result["peak_growth_mib"] / result["weights_mib"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-load-memory"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--way", action="append", choices=WAYS, help="only these ways (repeatable)")
    args = parser.parse_args()
    folder = args.work / f"tinyllama-width-{args.layers}l-bf16"
    build(folder, args.layers)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    stored = sum((folder / name).stat().st_size for name in shards) / 2**20
    print(f"checkpoint: {folder} ({len(shards)} shards, {stored:.0f} MiB as stored); "
          f"load average {os.getloadavg()[0]:.2f}")
    for way in args.way or WAYS:
        r = measure(folder, way)
        print(f"{way:26} weights {r['weights_mib']:.0f} MiB {r['dtypes']}; RSS {r['before_rss']:.0f} -> "
              f"{r['after_rss']:.0f} MiB, peak {r['after_hwm']:.0f} MiB: the load's peak grew "
              f"{r['peak_growth_mib']:.0f} MiB = {r['growth_over_fp32_weights']}x the float32 weights")


if __name__ == "__main__":
    main()

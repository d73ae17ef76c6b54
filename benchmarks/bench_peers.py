"""hf-export against its peers with the plainest recipes, alternating whole processes (issue #31).

    .venv/bin/python benchmarks/bench_peers.py [--model llama58m|qwen05b] [--rounds 2] [--only onnx|executorch]

Each round runs, each in a fresh process measured from outside (wall time, peak RSS of its largest process):

O1  `hf-export run` with `[{"export_format": "onnx", "mode": "generation", "dynamic": true}]`
O2  `optimum-cli export onnx --task text-generation-with-past` (optimum-onnx 0.1.0, transformers 4.57, own venv)
E1  `hf-export run` with `[{"export_format": "executorch", "mode": "generation"}]` (the LLM runner's layout,
    custom ops, static cache min(2048, max_position_embeddings))
E2  `optimum-cli export executorch --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache` (optimum-executorch
    1.1.0, executorch 1.5.1, own venv), `--max_seq_len` equal to our cache length

Rounds alternate the order (ours first in odd rounds, the peer first in even ones). hf-export runs pass `--no-cache
--no-bench --jobs 1`: export and our validation (probes, generation parity, the runtimes' own runners), no
per-artifact timing. "Without validation" is the same run's wall less `validate_s` of report.json (the
validation phase, timed by the pipeline itself); report.json's phase timings are printed for the profile.

`uptime`'s load average is recorded before and after every step: the machine is shared. Goals (#31): ONNX <= 1.0x
optimum-cli (this round <= 1.5x on the 58M Llama, <= 1.2x on the 0.5B), ExecuTorch <= 1.0x optimum-executorch.
The artifacts stay under --work for `bench_runtimes.py`. Every process runs with HF_HUB_OFFLINE=1.

optimum-executorch 1.1.0 pins transformers 5.0.0rc1 (its custom KV cache imports `HybridCache`, gone in 5.24) and
needs accelerate; its venv (OET_CLI) reuses the product venv's torch and executorch 1.5.1:

    python3 -m venv V && echo $PWD/.venv/lib/python3.11/site-packages > V/lib/python3.11/site-packages/main.pth
    V/bin/pip install --no-deps optimum-executorch==1.1.0 "optimum~=2.0.0" transformers==5.0.0rc1 accelerate \
        tokenizers==0.22.2 huggingface-hub==1.3.0 typer-slim
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
sys.path.insert(0, str(HERE))
import bench_pipeline  # the sibling benchmark's measuring wrapper and machine line)

ROOT = HERE.parent
PY = sys.executable
OPTIMUM_CLI = Path(os.environ.get("OPTIMUM_CLI", ROOT / ".cache" / "optimum-venv" / "bin" / "optimum-cli"))
OET_CLI = Path(os.environ.get("OET_CLI", "/work/bench-venv-oet/bin/optimum-cli"))
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
RECIPES = {
    "onnx": {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation", "dynamic": True}]},
    "executorch": {"schema_version": 1, "exports": [{"export_format": "executorch", "mode": "generation"}]},
}
CACHE_LEN = 2048  # our default static cache: min(2048, max_position_embeddings); the models below have 2048


def ascii_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of exactly `vocab_size` ASCII tokens (3 specials, letters and digits, then pairs
    and triples of them, each with its merge), so that `config.vocab_size == len(tokenizer)` (the ExecuTorch
    runner's sampler uses the tokenizer's size) and every piece a random model emits is valid UTF-8 (the runner's
    pybinding raises on partial UTF-8 pieces). Nothing is trained or downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] \
        + [str(d) for d in range(10)]
    vocab = {BOS: 0, EOS: 1, PAD: 2}
    merges: list[tuple[str, str]] = []
    for c in chars:
        vocab[c] = len(vocab)
    pairs = [a + b for a in chars for b in chars]
    for p in pairs:
        if len(vocab) == vocab_size:
            break
        vocab[p] = len(vocab)
        merges.append((p[0], p[1]))
    for p in pairs:
        for c in chars:
            if len(vocab) == vocab_size:
                break
            vocab[p + c] = len(vocab)
            merges.append((p, c))
    if len(vocab) != vocab_size:
        raise ValueError(f"cannot build {vocab_size} ASCII tokens (got {len(vocab)})")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD).save_pretrained(folder)


def build_model(folder: Path, kind: str) -> dict:
    """The benchmark model with random weights and its tokenizer, saved locally (once); returns its facts."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    facts_file = folder / "facts.json"
    if facts_file.is_file():
        return json.loads(facts_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    torch.manual_seed(0)
    if kind == "llama58m":  # bench_pipeline.py's model (8 layers, hidden 512, vocab 32,000)
        config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=CACHE_LEN,
                             tie_word_embeddings=False, **ids)
        model = LlamaForCausalLM(config)
    else:  # bench_scale.py's Qwen2.5-0.5B shape, its context cut to the cache length both tools use
        config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=CACHE_LEN,
                             rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **ids)
        model = Qwen2ForCausalLM(config)
    model.eval()
    with torch.no_grad():  # greedy never picks EOS: every generation runs its full length in every tool
        model.get_output_embeddings().weight[ids["eos_token_id"]].zero_()
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(folder)
    ascii_tokenizer(folder, config.vocab_size)
    facts = {"kind": kind, "parameters": sum(p.numel() for p in model.parameters()),
             "layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab": config.vocab_size}
    facts_file.write_text(json.dumps(facts))
    return facts


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def step(label: str, cmd: list[str], out: Path, log: list[dict], env: dict | None = None) -> dict:
    """One measured process; its load before and after; hf-export's report timings when it wrote a report."""
    shutil.rmtree(out, ignore_errors=True)
    before = os.getloadavg()
    print(f"[{time.strftime('%H:%M:%S')}] {label}: {uptime()}", file=sys.stderr, flush=True)
    wall, rss, proc = bench_pipeline.measure(cmd, env={"HF_HUB_OFFLINE": "1", **(env or {})})
    after = os.getloadavg()
    entry = {"step": label, "wall": round(wall, 2), "rss_mib": round(rss), "rc": proc.returncode,
             "load_before": before, "load_after": after, "out": str(out)}
    report = out / "report.json"
    if report.is_file():
        target = json.loads(report.read_text())["targets"][0]
        entry["status"] = target["status"]
        entry["timings"] = target.get("timings") or {}
        entry["verdicts"] = {k: target.get(k) for k in ("parity", "runs_in") if k in target}
    if proc.returncode != 0:
        entry["stderr_tail"] = proc.stderr[-1500:]
    print(f"    {label}: {wall:.1f} s, {rss:.0f} MiB, rc {proc.returncode}, status {entry.get('status', '-')}, "
          f"load {before[0]:.2f} -> {after[0]:.2f}", file=sys.stderr, flush=True)
    log.append(entry)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("llama58m", "qwen05b"), default="llama58m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-round", type=int, default=1, help="resume at this round (the order alternates)")
    parser.add_argument("--only", choices=("onnx", "executorch"), action="append")
    parser.add_argument("--work", type=Path, default=HERE / ".work-peers")
    args = parser.parse_args()
    formats = args.only or ["onnx", "executorch"]
    work = args.work / args.model
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"
    facts = build_model(model_dir, args.model)
    print(f"model: {facts}", file=sys.stderr)
    for name, recipe in RECIPES.items():
        (work / f"recipe-{name}.json").write_text(json.dumps(recipe))
    cli = [PY, "-m", "exporters.cli", "run", str(model_dir), "--quiet", "--no-cache", "--no-bench", "--jobs", "1"]
    peers = {
        "onnx": [str(OPTIMUM_CLI), "export", "onnx", "--model", str(model_dir), "--task", "text-generation-with-past"],
        "executorch": [str(OET_CLI), "export", "executorch", "--model", str(model_dir), "--task", "text-generation",
                       "--recipe", "xnnpack", "--use_custom_sdpa", "--use_custom_kv_cache",
                       "--max_seq_len", str(CACHE_LEN)],
    }
    log: list[dict] = []
    started = uptime()
    rounds = range(args.first_round, args.rounds + 1)
    for n in rounds:
        for fmt in formats:
            ours = (f"hf-export {fmt} r{n}", [*cli, "--config", str(work / f"recipe-{fmt}.json"), "--out"],
                    work / f"r{n}-ours-{fmt}")
            peer_out = work / f"r{n}-peer-{fmt}"
            peer_cmd = [*peers[fmt], str(peer_out)] if fmt == "onnx" else [*peers[fmt], "--output_dir", str(peer_out)]
            peer = (f"peer {fmt} r{n}", peer_cmd, peer_out)
            order = [ours, peer] if n % 2 else [peer, ours]
            for label, cmd, out in order:
                if label.startswith("hf-export"):
                    cmd = [*cmd, str(out)]
                step(label, cmd, out, log)
                (work / f"log-{'-'.join(formats)}-from-r{args.first_round}.json").write_text(json.dumps(log, indent=1))
    print(f"\nmachine: {bench_pipeline.machine()}")
    print(f"model: {facts}")
    print(f"uptime at the start: {started}\nuptime at the end:   {uptime()}")
    print("\n| round | format | hf-export wall (validation) | peer wall | ratio | ratio without our validation "
          "| peak RSS ours / peer | status |\n|---|---|---|---|---|---|---|---|")
    for n in rounds:
        for fmt in formats:
            ours = next(e for e in log if e["step"] == f"hf-export {fmt} r{n}")
            peer = next(e for e in log if e["step"] == f"peer {fmt} r{n}")
            validate = (ours.get("timings") or {}).get("validate_s", 0.0)
            ok = ours["rc"] == 0 and peer["rc"] == 0
            ratio = f"{ours['wall'] / peer['wall']:.2f}" if ok else "–"
            bare = f"{(ours['wall'] - validate) / peer['wall']:.2f}" if ok else "–"
            print(f"| {n} | {fmt} | {ours['wall']:.1f} s ({validate:.1f} s) | {peer['wall']:.1f} s (rc {peer['rc']}) "
                  f"| {ratio} | {bare} | {ours['rss_mib']} / {peer['rss_mib']} MiB | {ours.get('status')} |")
    print("\nhf-export phase timings (report.json, s):")
    for e in log:
        if e["step"].startswith("hf-export"):
            print(f"  {e['step']}: {json.dumps(e.get('timings'))} load {e['load_before'][0]:.2f} -> "
                  f"{e['load_after'][0]:.2f}")


if __name__ == "__main__":
    main()

"""hf-export against its peers with the plainest recipes, alternating whole processes (issue #31).

    make peers   # the peers' pinned side environments (optimum-executorch's venv: .cache/oet-venv), once
    .venv/bin/python benchmarks/bench_peers.py [--model llama58m|qwen05b|tinyllama11b|trained] [--rounds 2]
        [--only onnx|executorch|dynamo|onnx-int4|onnx-int4-b1|onnx-int4-genai|executorch-int4] [--step NAME ...] [--kill-above-gib 12]

Each round runs, each in a fresh process measured from outside (wall time, peak RSS of its largest process):

O1  `hf-export run` with `[{"export_format": "onnx", "mode": "generation", "dynamic": true}]`
O2  `optimum-cli export onnx --task text-generation-with-past` (optimum-onnx 0.1.0, transformers 4.57, own venv)
E1  `hf-export run` with `[{"export_format": "executorch", "mode": "generation"}]` (the LLM runner's layout,
    custom ops, static cache min(2048, max_position_embeddings))
E2  `optimum-cli export executorch --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache` (optimum-executorch
    1.1.0, executorch 1.5.1, own venv), `--max_seq_len` equal to our cache length
D1  `hf-export run` with `[{"export_format": "dynamo", "mode": "generation", "dynamic": true}]` (no peer)
Q1, Q2  (`--only executorch-int4`) `hf-export run` with `variants: ["int4"]` (torchao 8da4w linears, int8 table)
    against `optimum-cli export executorch ... --qlinear 8da4w --qembedding 8w` (issue #51)
N1, N2  (`--only onnx-int4`) `hf-export run` with `[{"export_format": "onnx", "mode": "generation", "dynamic": true,
    "ort_fusions": "cpu", "variants": ["int4"]}]` (MatMulNBits on the fused graph) against the GenAI builder's
    `-p int4 -e cpu` (issue #51); `--only onnx-int4-b1` the same with the batch fixed at 1 (`"merged": true`, the
    merged contract without the batch axis: docs/recipe.md's GenAI-on-CPU recipe, upstream's fusion with no `If`
    guard), its decode then timed with `bench_runtimes.py --pair int4 --skip-executorch --genai b1=FOLDER`;
    `--only onnx-int4-genai` the graph written for GenAI's unpadded calls (`"unpadded": true`, batch 1)
G1, G2  ONNX Runtime GenAI's model builder (`python -m onnxruntime_genai.models.builder -i MODEL -p fp32|int4 -e cpu`,
    onnxruntime-genai 0.18 of the product venv): `-p fp32` the ONNX peer beside optimum-cli, `-p int4` onnx-int4's

`--model tinyllama11b` is TinyLlama-1.1B's shape at full depth (22 layers, hidden 2048, 32 heads, 4 key-value heads,
vocab 32,000, untied) saved as a bfloat16 checkpoint in 3 safetensors shards with an index, TinyLlama-Chat's ids
(`<unk>` 0, `<s>` 1, `</s>` 2) and generation_config.json (bos 1, eos 2, pad 0, max_length 2048), the ASCII
byte-level BPE below. `--model trained` is tests/trained.py's tiny Llama and training at width 64 (2 layers,
4 heads of 16 — the GenAI builder's GroupQueryAttention needs heads of 16 —, vocab 197, tied, 128 positions: the
cache length of every tool), trained here in seconds; its greedy continuations are not noise: the quality column of
issue #51 (`--runtimes`, i.e. `bench_runtimes.py --pair int4 --quality`). `--step` (repeatable) runs only the named steps (`ours-onnx`, `ours-executorch`,
`ours-dynamo`, `ours-executorch-int4`, `ours-onnx-int4`, `ours-onnx-int4-b1`, `optimum-onnx`, `genai-fp32`,
`genai-int4`, `optimum-executorch`, `optimum-executorch-8da4w`); one process runs at a time and
`--kill-above-gib` SIGKILLs (by pid) any process of a step whose RSS passes the limit (the machine is shared).

Rounds alternate the order (ours first in odd rounds, the peer first in even ones). hf-export runs pass `--no-cache
--no-bench --jobs 1`: export and our validation (probes, generation parity, the runtimes' own runners), no
per-artifact timing. "Without validation" is the same run's wall less `validate_s` of report.json (the
validation phase, timed by the pipeline itself); report.json's phase timings are printed for the profile.

`uptime`'s load average is recorded before and after every step: the machine is shared. Goals (#31): ONNX <= 1.0x
optimum-cli (this round <= 1.5x on the 58M Llama, <= 1.2x on the 0.5B), ExecuTorch <= 1.0x optimum-executorch.
The artifacts stay under --work for `bench_runtimes.py`. Every process runs with HF_HUB_OFFLINE=1.

optimum-executorch 1.1.0 pins transformers 5.0.0rc1 (its custom KV cache imports `HybridCache`, gone in 5.24) and
needs accelerate; its venv (`make peers`: .cache/oet-venv, the pins in constraints-peers.txt; OET_CLI overrides)
reuses the product venv's torch and executorch 1.5.1 through a .pth file. optimum-cli ONNX is the optimum side venv
of `make test-deps` (OPTIMUM_CLI overrides), the GenAI builder the product venv's onnxruntime-genai (GENAI_PY).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_pipeline  # the sibling benchmark's measuring wrapper and machine line)

ROOT = HERE.parent
PY = sys.executable
OPTIMUM_CLI = Path(os.environ.get("OPTIMUM_CLI", ROOT / ".cache" / "optimum-venv" / "bin" / "optimum-cli"))
OET_CLI = Path(os.environ.get("OET_CLI", ROOT / ".cache" / "oet-venv" / "bin" / "optimum-cli"))  # make peers
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")  # TinyLlama's ids 0, 1, 2
# The merged graph's contract with the batch left static (traced at 1), as tests/test_genai_fused.py's BATCH_ONE
BATCH_ONE = {"input_ids": {"1": {"name": "sequence_length", "min": 1}},
             "position_ids": {"1": {"name": "sequence_length"}}, "attention_mask": {"1": "auto"},
             "cache.layers.*.keys": {"2": {"name": "past_sequence_length", "min": 0}},
             "cache.layers.*.values": {"2": {"name": "past_sequence_length"}}}
RECIPES = {
    "onnx": {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation", "dynamic": True}]},
    "executorch": {"schema_version": 1, "exports": [{"export_format": "executorch", "mode": "generation"}]},
    "dynamo": {"schema_version": 1, "exports": [{"export_format": "dynamo", "mode": "generation", "dynamic": True}]},
    # issue #51: 8da4w with an int8 embedding table (torchao), against optimum-executorch's --qlinear/--qembedding
    # issue #51: MatMulNBits int4 (block 32, accuracy level 4: the GenAI builder's defaults) against `-p int4`, on
    # the graph fused for ONNX Runtime's CPU provider (docs/recipe.md's GenAI recipe: fusions, then quantization)
    "onnx-int4": {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation", "dynamic": True,
                                                    "ort_fusions": "cpu", "variants": ["int4"]}]},
    # the same with the batch fixed at 1: no `If` guard around each GroupQueryAttention (RESULTS: "int4, round 6")
    "onnx-int4-b1": {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation", "merged": True,
                                                       "ort_fusions": "cpu", "variants": ["int4"], "components": {
                                                           "model": {"dynamic_shapes": BATCH_ONE}}}]},
    # written for GenAI's calls alone (`"unpadded": true`): the builder's kernels (RESULTS, nineteenth round)
    "onnx-int4-genai": {"schema_version": 1, "exports": [{"export_format": "onnx", "mode": "generation",
                                                          "merged": True, "ort_fusions": "cpu", "unpadded": True,
                                                          "variants": ["int4"]}]},
    "executorch-int4": {"schema_version": 1, "exports": [{"export_format": "executorch", "mode": "generation",
                                                          "variants": ["int4"]}]},
}
GENAI_PY = Path(os.environ.get("GENAI_PY", sys.executable))  # onnxruntime-genai is pinned in constraints.txt
PEERS = {"onnx": ["optimum-onnx", "genai-fp32"], "executorch": ["optimum-executorch"], "dynamo": [],
         "executorch-int4": ["optimum-executorch-8da4w"], "onnx-int4": ["genai-int4"], "onnx-int4-b1": ["genai-int4"],
         "onnx-int4-genai": ["genai-int4"]}
CACHE_LEN = 2048  # our default static cache: min(2048, max_position_embeddings); the models below have 2048


def ascii_tokenizer(folder: Path, vocab_size: int, specials: tuple[str, str, str] = (BOS, EOS, PAD),
                    roles: tuple[str, str, str] = ("bos", "eos", "pad")) -> None:
    """A byte-level BPE tokenizer of exactly `vocab_size` ASCII tokens (3 specials, letters and digits, then pairs
    and triples of them, each with its merge), so that `config.vocab_size == len(tokenizer)` (the ExecuTorch
    runner's sampler uses the tokenizer's size) and every piece a random model emits is valid UTF-8 (the runner's
    pybinding raises on partial UTF-8 pieces). Nothing is trained or downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] \
        + [str(d) for d in range(10)]
    vocab = {token: i for i, token in enumerate(specials)}
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
    tok.add_special_tokens(list(specials))
    named = {f"{role}_token": token for role, token in zip(roles, specials)}
    PreTrainedTokenizerFast(tokenizer_object=tok, **named).save_pretrained(folder)


def built_facts(folder: Path) -> dict | None:
    """The facts of the model already built in `folder`; else None, with `folder` emptied and torch's seed set for a
    build that draws the same weights every time."""
    import torch

    facts_file = folder / "facts.json"
    if facts_file.is_file():
        return json.loads(facts_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    return None


def build_model(folder: Path, kind: str) -> dict:
    """The benchmark model with random weights and its tokenizer, saved locally (once); returns its facts."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    facts_file = folder / "facts.json"
    built = built_facts(folder)
    if built is not None:
        return built
    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    if kind == "tinyllama11b":
        return build_tinyllama(folder, facts_file)
    if kind == "trained":
        return build_trained(folder, facts_file)
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


def tinyllama_model(layers: int = 22):
    """TinyLlama-1.1B-Chat's shape (`layers` deep) with random bfloat16 weights, its ids and generation config, the
    EOS row of the LM head zeroed so greedy never picks EOS: every generation runs its full length in every tool."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, hidden_act="silu", initializer_range=0.02)
    torch.set_default_dtype(torch.bfloat16)  # drawn in bf16 directly: never a 4.4 GB fp32 copy here
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.eval()
    with torch.no_grad():
        model.get_output_embeddings().weight[config.eos_token_id].zero_()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, max_length=2048)
    return model


def build_tinyllama(folder: Path, facts_file: Path, layers: int = 22, max_shard_size: str = "1GB") -> dict:
    """TinyLlama-1.1B-Chat's shape and files with random weights (`layers` deep): bfloat16, 3 shards + index at full
    depth (written by `save_pretrained(max_shard_size="1GB")`), its config, ids and generation_config.json."""
    model = tinyllama_model(layers)
    config = model.config
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    ascii_tokenizer(folder, config.vocab_size, LLAMA_SPECIALS, ("unk", "bos", "eos"))
    parameters = sum(p.numel() for p in model.parameters())
    facts = {"kind": "tinyllama11b", "parameters": parameters, "layers": config.num_hidden_layers,
             "hidden": config.hidden_size, "vocab": config.vocab_size, "dtype": "bfloat16",
             "shards": sorted(p.name for p in folder.glob("*.safetensors")), "fp32_weights_mb": parameters * 4 / 1e6}
    facts_file.write_text(json.dumps(facts))
    return facts


def build_trained(folder: Path, facts_file: Path) -> dict:
    """tests/trained.py's tiny Llama and training (its text, tokenizer and steps; seconds on one thread), at width
    64 with 4 heads: a head of 16, the least ONNX Runtime's GroupQueryAttention (the GenAI builder's graph) takes.
    Its greedy continuations have margins, so top-1 agreement and greedy match mean something."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from tests.models import RUNNER_BOS, RUNNER_EOS, RUNNER_PAD, train_bpe_tokenizer
    from tests.trained import TRAINED_PROMPT, TRAINED_TEXT, _steps

    tokenizer = train_bpe_tokenizer(folder, TRAINED_TEXT * 20, [RUNNER_BOS, RUNNER_EOS, RUNNER_PAD], vocab_size=200,
                                    bos=RUNNER_BOS, eos=RUNNER_EOS, pad=RUNNER_PAD, byte_level=True)
    stream = torch.tensor(tokenizer(" ".join(TRAINED_TEXT * 40), add_special_tokens=False)["input_ids"])
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, **ids)
    model = LlamaForCausalLM(config)
    torch.set_num_threads(1)  # a model this small trains faster on one thread than on a shared machine's cores
    _steps(model.train(), torch.optim.AdamW(model.parameters(), lr=3e-3), stream, torch.Generator().manual_seed(0))
    model.generation_config = GenerationConfig(**ids)
    model.eval().save_pretrained(folder)
    facts = {"kind": "trained", "parameters": sum(p.numel() for p in model.parameters()), "layers": 2, "hidden": 64,
             "vocab": config.vocab_size, "cache_len": config.max_position_embeddings, "prompt": TRAINED_PROMPT}
    facts_file.write_text(json.dumps(facts))
    return facts


class RssGuard:
    """SIGKILLs, by pid, any descendant of this process whose RSS passes `limit_gib` (polled every second) while a
    step runs: a runaway 1.1B export must not take the shared machine down."""

    def __init__(self, limit_gib: float) -> None:
        self.limit_kib = int(limit_gib * 1024 * 1024)
        self.killed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "RssGuard":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        me = os.getpid()
        while not self._stop.wait(1.0):
            parents: dict[int, int] = {}
            rss: dict[int, int] = {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    status = Path(f"/proc/{entry}/status").read_text()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                parents[int(entry)] = int(fields.get("PPid", "0").strip() or 0)
                rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0])
            for pid, kib in rss.items():
                ancestor = parents.get(pid, 0)
                while ancestor not in (0, 1, me):
                    ancestor = parents.get(ancestor, 0)
                if ancestor == me and kib > self.limit_kib:
                    os.kill(pid, 9)
                    self.killed.append(f"pid {pid} at {kib / 1024 / 1024:.1f} GiB")
                    print(f"    ! killed pid {pid}: RSS {kib / 1024 / 1024:.1f} GiB", file=sys.stderr, flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def mem_available_gib() -> float:
    """/proc/meminfo's MemAvailable: what the shared machine has left for a step."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def step(label: str, cmd: list[str], out: Path, log: list[dict], env: dict | None = None,
         kill_above_gib: float = 12.0, min_available_gib: float = 0.0) -> dict:
    """One measured process, started once MemAvailable passes `min_available_gib` (polled every 15 s); its load
    and MemAvailable before and after; hf-export's report timings when it wrote a report."""
    shutil.rmtree(out, ignore_errors=True)
    while mem_available_gib() < min_available_gib:
        print(f"    {label}: waiting, MemAvailable {mem_available_gib():.1f} GiB < {min_available_gib} GiB",
              file=sys.stderr, flush=True)
        time.sleep(15)
    available = round(mem_available_gib(), 1)
    before, started = os.getloadavg(), time.strftime("%H:%M:%S")
    print(f"[{started}] {label}: {uptime()}", file=sys.stderr, flush=True)
    with RssGuard(kill_above_gib) as guard:
        wall, rss, proc = bench_pipeline.measure(cmd, env={"HF_HUB_OFFLINE": "1", **(env or {})})
    after = os.getloadavg()
    entry = {"step": label, "wall": round(wall, 2), "rss_mib": round(rss), "rc": proc.returncode,
             "load_before": before, "load_after": after, "out": str(out), "started": started,
             "killed": guard.killed, "mem_available_gib": [available, round(mem_available_gib(), 1)]}
    report = out / "report.json"
    if report.is_file():
        target = json.loads(report.read_text())["targets"][0]
        entry["status"] = target["status"]
        entry["timings"] = target.get("timings") or {}
        entry["verdicts"] = {k: target.get(k) for k in ("parity", "runs_in") if k in target}
        entry["dtypes"] = {k: target.get(k) for k in ("checkpoint_dtype", "load_dtype", "artifact_dtype")
                           if k in target}
    if proc.returncode != 0:
        entry["stderr_tail"] = proc.stderr[-1500:]
    print(f"    {label}: {wall:.1f} s, {rss:.0f} MiB, rc {proc.returncode}, status {entry.get('status', '-')}, "
          f"load {before[0]:.2f} -> {after[0]:.2f}", file=sys.stderr, flush=True)
    log.append(entry)
    return entry


def summary(log: list[dict], facts: dict) -> None:
    """The steps' table: wall, peak RSS, its ratio to the fp32 weights, status and load; ours against each peer."""
    fp32_mib = facts["parameters"] * 4 / 2**20
    print("\n| step | wall | peak RSS | RSS / fp32 weights | rc | status | artifact dtype | load before -> after "
          "| MemAvailable GiB before -> after |\n|---|---|---|---|---|---|---|---|---|")
    for e in log:
        dtype = (e.get("dtypes") or {}).get("artifact_dtype", "–")
        print(f"| {e['step']} | {e['wall']:.1f} s | {e['rss_mib']} MiB | {e['rss_mib'] / fp32_mib:.2f}x | {e['rc']} "
              f"| {e.get('status', '–')} | {dtype} | {e['load_before'][0]:.2f} -> {e['load_after'][0]:.2f} "
              f"| {' -> '.join(map(str, e.get('mem_available_gib', [])))} |")
    print("\nwall ratios (ours / peer, same round):")
    for e in log:
        if not e["step"].startswith("hf-export"):
            continue
        fmt, rnd = e["step"].split()[1], e["step"].split()[2]
        for peer in PEERS[fmt]:
            other = next((p for p in log if p["step"] == f"{peer} {rnd}"), None)
            if other and other["rc"] == 0 and e["rc"] == 0:
                validate = (e.get("timings") or {}).get("validate_s", 0.0)
                print(f"  {e['step']} / {other['step']}: {e['wall'] / other['wall']:.2f} "
                      f"(without our validation {(e['wall'] - validate) / other['wall']:.2f})")
    print("\nhf-export phase timings (report.json, s):")
    for e in log:
        if e["step"].startswith("hf-export"):
            print(f"  {e['step']}: {json.dumps(e.get('timings'))} load {e['load_before'][0]:.2f} -> "
                  f"{e['load_after'][0]:.2f}")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def decides(log: list[dict], measured: dict) -> None:
    """Issue #51's table: ours against the peer per format (int4 ONNX in GenAI, 8da4w in the ExecuTorch runner):
    stored bytes, decode tokens/s, first-token (prefill) ms, quality against eager, export wall; ratios ours / peer."""
    from bench_runtimes import greedy_match

    reference, eos = measured["reference"], measured["eos"]
    sides = [("executorch-int4", "optimum-executorch-8da4w", "executorch", "ours", "optimum-executorch",
              "runner_decode_tok_s", "runner_prefill_ms", "TextLLMRunner"),
             ("onnx-int4", "genai-int4", "genai ours", "ours", "builder", "decode_tok_s", "prefill_ms", "GenAI")]
    print("\n| format | measure | ours | peer | ours / peer | goal |\n|---|---|---|---|---|---|")
    for fmt, peer, key, ours, theirs, decode, prefill, runtime in sides:
        if key not in measured:
            continue
        res, sizes = measured[key]["results"], measured[key]["sizes"]
        rows = [("stored bytes", sizes[ours], sizes[theirs], "<= 1.0x")]
        rows.append((f"decode tok/s ({runtime}, median)", _median(res[ours][decode]), _median(res[theirs][decode]),
                     ">= 1.0x"))
        ratios = [r for name, r in measured[key]["process_ratios"] if name == decode]
        rows.append((f"first-token ms ({runtime} prefill, median)", _median(res[ours][prefill]),
                     _median(res[theirs][prefill]), "(lower is better)"))
        if reference:
            for label, value in (("top-1 agreement vs eager", lambda r: r.get("top1_agreement")),
                                 ("greedy match vs eager", lambda r: greedy_match(reference, r["tokens"], eos))):
                rows.append((label, value(res[ours]), value(res[theirs]), ">= the peer's"))
        for e in log:
            if e["step"].startswith(f"hf-export {fmt} r"):
                other = next((o for o in log if o["step"] == f"{peer} {e['step'].split()[-1]}"), None)
                if other and other["rc"] == 0 and "status" in e:  # ours wrote its artifacts (a verdict either way)
                    rows.append((f"export wall {e['step'].split()[-1]} (s; ours {e['status']}; load "
                                 f"{e['load_before'][0]:.1f} / {other['load_before'][0]:.1f})", e["wall"],
                                 other["wall"], "<= 1.0x"))
        for label, mine, peers_value, goal in rows:
            ratio = f"{mine / peers_value:.3f}" if isinstance(mine, (int, float)) and peers_value else "-"
            if label.startswith("decode") and ratios:
                ratio += f" (per-process median {_median(ratios):.3f})"
            print(f"| {fmt} vs {peer} | {label} | {mine:,.3f} | {peers_value:,.3f} | {ratio} | {goal} |"
                  if isinstance(mine, float) else f"| {fmt} vs {peer} | {label} | {mine:,} | {peers_value:,} | {ratio} "
                  f"| {goal} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("llama58m", "qwen05b", "tinyllama11b", "trained"), default="llama58m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-round", type=int, default=1, help="resume at this round (the order alternates)")
    parser.add_argument("--only", choices=tuple(RECIPES), action="append", help="formats (default: onnx, executorch)")
    parser.add_argument("--step", action="append", help="run only these steps (ours-onnx, genai-int4, ...)")
    parser.add_argument("--kill-above-gib", type=float, default=12.0, help="SIGKILL a step's process above this RSS")
    parser.add_argument("--min-available-gib", type=float, default=0.0,
                        help="start each step only once MemAvailable passes this (the 1.1B steps: 16)")
    parser.add_argument("--work", type=Path, default=HERE / ".work-peers")
    parser.add_argument("--runtimes", action="store_true", help="then bench_runtimes.py --pair int4 --quality on "
                        "round 1's artifacts, and issue #51's table (with --only onnx-int4 / executorch-int4)")
    args = parser.parse_args()
    formats = args.only or ["onnx", "executorch"]
    work = args.work / args.model
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"
    facts = build_model(model_dir, args.model)
    print(f"model: {facts}", file=sys.stderr)
    cache_len = facts.get("cache_len", CACHE_LEN)  # our default static cache: min(2048, max_position_embeddings)
    for name, recipe in RECIPES.items():
        (work / f"recipe-{name}.json").write_text(json.dumps(recipe))
    cli = [PY, "-m", "exporters.cli", "run", str(model_dir), "--quiet", "--no-cache", "--no-bench", "--jobs", "1"]
    genai = [str(GENAI_PY), "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-e", "cpu"]
    peers = {  # each command takes its output folder last
        "optimum-onnx": [str(OPTIMUM_CLI), "export", "onnx", "--model", str(model_dir), "--task",
                         "text-generation-with-past"],
        "genai-fp32": [*genai, "-p", "fp32", "-c", str(work / "genai-cache-fp32"), "-o"],
        "genai-int4": [*genai, "-p", "int4", "-c", str(work / "genai-cache-int4"), "-o"],
        "optimum-executorch": [str(OET_CLI), "export", "executorch", "--model", str(model_dir), "--task",
                               "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa", "--use_custom_kv_cache",
                               "--max_seq_len", str(cache_len), "--output_dir"],
        "optimum-executorch-8da4w": [str(OET_CLI), "export", "executorch", "--model", str(model_dir), "--task",
                                     "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa",
                                     "--use_custom_kv_cache", "--qlinear", "8da4w", "--qembedding", "8w",
                                     "--max_seq_len", str(cache_len), "--output_dir"],
    }
    log: list[dict] = []
    started = uptime()
    rounds = range(args.first_round, args.rounds + 1)
    log_file = work / f"log-{'-'.join(args.step or formats)}-from-r{args.first_round}.json"
    for n in rounds:
        for fmt in formats:
            ours = (f"hf-export {fmt} r{n}", [*cli, "--config", str(work / f"recipe-{fmt}.json"), "--out"],
                    work / f"r{n}-ours-{fmt}", f"ours-{fmt}")
            theirs = [(f"{peer} r{n}", peers[peer], work / f"r{n}-{peer}", peer) for peer in PEERS[fmt]]
            order = [ours, *theirs] if n % 2 else [*theirs, ours]
            for label, cmd, out, name in order:
                if args.step and name not in args.step:
                    continue
                step(label, [*cmd, str(out)], out, log, kill_above_gib=args.kill_above_gib,
                     min_available_gib=args.min_available_gib)
                log_file.write_text(json.dumps(log, indent=1))
    print(f"\nmachine: {bench_pipeline.machine()}")
    print(f"model: {facts}")
    print(f"uptime at the start: {started}\nuptime at the end:   {uptime()}")
    summary(log, facts)
    if args.runtimes:
        measured = work / "runtimes-int4.json"
        skip = [flag for fmt, flag in (("onnx-int4", "--skip-genai"), ("executorch-int4", "--skip-executorch"))
                if fmt not in formats]
        text = ["--prompt", facts["prompt"], "--text", facts["prompt"]] if "prompt" in facts else []
        subprocess.run([PY, str(HERE / "bench_runtimes.py"), "--work", str(work), "--pair", "int4", "--quality",
                        "--summary", str(measured), *text, *skip], check=True)
        print(f"\nuptime after the runtimes: {uptime()}")
        decides(log, json.loads(measured.read_text()))


if __name__ == "__main__":
    main()

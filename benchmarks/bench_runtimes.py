"""Our artifacts against the peers' in the same runtime, side by side in one process (issue #26 §5).

    .venv/bin/python benchmarks/bench_runtimes.py [--work benchmarks/.work-peers/llama58m] [--reps 3]

Reads what `bench_peers.py` left under --work (round 1's folders):

R1  ExecuTorch: our runner-layout `model.pte` (`hf-export run`, `[{"export_format": "executorch", "mode":
    "generation"}]`) and optimum-executorch's `model.pte` (`--recipe xnnpack --use_custom_sdpa
    --use_custom_kv_cache`, the same static cache length), both loaded in ONE process by executorch 1.5.1's Python
    `Runtime` (`forward(tokens, cache_position)`): prefill of an 8-token prompt (ms) and 32 greedy single-token
    decode steps (tokens/s); then both by executorch's own C++ `TextLLMRunner` (pybinding) in one process: its
    Stats' prefill time and decode rate for 32 new tokens. The programs alternate rep by rep.
R2  ONNX Runtime GenAI 0.18: our merged `model.onnx` + `genai_config.json` against the model builder's output
    (`python -m onnxruntime_genai.models.builder -p fp32 -e cpu`, built here from the same random-weight folder),
    both loaded in one process: prefill of the 8-token prompt (`append_tokens`, ms) and 32 greedy decode steps.
    `--genai NAME=FOLDER` (repeatable) adds more folders (e.g. an `"ort_fusions": "cpu"` export), each compared with
    the builder's in processes of its own; `--genai-ours FOLDER` replaces round 1's; `--prompt-len` sets GenAI's prompt
    (8 by default; R1's stays 8, the runner's text) and `--steps` the decode steps of both (32 by default).

Each measurement also records the greedy tokens, so a fast artifact that computes something else shows. Ratios are
ours / theirs for tokens/s (goal >= 1.0) and theirs / ours for prefill time. `uptime` before and after each part.

Order-balanced: in one process the artifact loaded second decodes faster (measured 2026-12-03: ~10% in GenAI, the
same folders swapped), so every pair is measured in `--rounds` x 2 processes, one per load order, and the verdict is
the median and geometric mean of the per-process ratios (each the ratio of that process's median rates), beside the
ratio of the pooled medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
GENAI_PY = Path(os.environ.get("GENAI_PY", sys.executable))  # onnxruntime-genai is pinned in constraints.txt
PROMPT_LEN, STEPS = 8, 32

ET = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  the llama:: kernels both programs use
    from executorch.runtime import Runtime
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    programs, tokenizer, reps, steps = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prompt_len = 8
    prompt = torch.arange(3, 3 + prompt_len).unsqueeze(0)
    methods = {name: Runtime.get().load_program(path).load_method("forward") for name, path in programs.items()}
    res = {name: {"prefill_ms": [], "decode_tok_s": [], "tokens": None} for name in programs}
    for _ in range(reps):
        for name, forward in methods.items():
            start = time.perf_counter()
            logits = forward.execute([prompt, torch.arange(prompt_len)])[0]
            res[name]["prefill_ms"].append(round((time.perf_counter() - start) * 1000, 2))
            token, tokens = int(logits[0, -1].argmax()), []
            start = time.perf_counter()
            for s in range(steps):
                tokens.append(token)
                logits = forward.execute([torch.tensor([[token]]), torch.tensor([prompt_len + s])])[0]
                token = int(logits[0, -1].argmax())
            res[name]["decode_tok_s"].append(round(steps / (time.perf_counter() - start), 1))
            res[name]["tokens"] = tokens
    del methods
    text = "abcdefghijklmnop"  # 8 tokens with the benchmark's ASCII tokenizer, in HF tokenizers and the runner's
    runners = {name: TextLLMRunner(path, tokenizer) for name, path in programs.items()}
    for name in programs:
        res[name].update(runner_prefill_ms=[], runner_decode_tok_s=[], runner_prompt_tokens=None)
    for _ in range(reps):
        for name, runner in runners.items():
            stats = {}
            def on_stats(s, stats=stats):
                stats.update(n=s.num_generated_tokens, prompt=s.num_prompt_tokens,
                             prefill=s.prompt_eval_end_ms - s.inference_start_ms,
                             decode=s.inference_end_ms - s.prompt_eval_end_ms)
            runner.reset()
            runner.generate(text, GenerationConfig(echo=False, max_new_tokens=steps + 1, temperature=0.0),
                            stats_callback=on_stats)
            res[name]["runner_prefill_ms"].append(stats["prefill"])
            res[name]["runner_decode_tok_s"].append(round(stats["n"] / max(stats["decode"], 1) * 1000, 1))
            res[name]["runner_prompt_tokens"] = stats["prompt"]
    open(sys.argv[-1], "w").write(json.dumps(res))  # not stdout: the C++ runner prints every piece there
    """
)

GENAI = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import onnxruntime_genai as og

    folders, reps, prompt_len, steps = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ids = np.arange(3, 3 + prompt_len, dtype=np.int32).reshape(1, -1)
    models = {name: og.Model(path) for name, path in folders.items()}
    res = {name: {"prefill_ms": [], "decode_tok_s": [], "tokens": None} for name in folders}
    for _ in range(reps):
        for name, model in models.items():
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=prompt_len + steps + 1)
            gen = og.Generator(model, params)
            start = time.perf_counter()
            gen.append_tokens(ids)
            res[name]["prefill_ms"].append(round((time.perf_counter() - start) * 1000, 2))
            start, n = time.perf_counter(), 0
            while not gen.is_done() and n < steps:
                gen.generate_next_token()
                n += 1
            res[name]["decode_tok_s"].append(round(n / (time.perf_counter() - start), 1))
            res[name]["tokens"] = gen.get_sequence(0).tolist()[prompt_len:]
    open(sys.argv[-1], "w").write(json.dumps(res))
    """
)


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def run_json(cmd: list[str], result: Path) -> dict:
    """Runs a measuring script in its own process; it writes its results to `result` (its last argument)."""
    result.unlink(missing_ok=True)
    proc = subprocess.run([*cmd, str(result)], check=False, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-2500:]}")
    return json.loads(result.read_text())


def one_file(folder: Path, name: str) -> Path:
    found = sorted(folder.rglob(name))
    if not found:
        raise FileNotFoundError(f"no {name} under {folder}: run bench_peers.py first")
    return found[0]


def balanced(run_one, pair: tuple[str, str], rounds: int) -> dict:
    """`run_one(order)` (a dict of results keyed by name, measured in one process loading `order`'s names in that
    order) for both orders of `pair`, `rounds` times: the pooled per-name results, every process's own ratio of
    median decode rates (first name / second), and the load order of each."""
    pooled: dict = {}
    ratios, orders = [], []
    for _ in range(rounds):
        for order in (pair, pair[::-1]):
            res = run_one(order)
            for name, values in res.items():
                slot = pooled.setdefault(name, {})
                for key, value in values.items():
                    if key.endswith(("_ms", "_tok_s")):  # per-rep measurements, pooled
                        slot[key] = slot.get(key, []) + value
                    else:  # what every process must agree on (the greedy tokens, the prompt's length)
                        slot[key] = value if slot.get(key, value) == value else "DIFFERENT"
            for rate in ("decode_tok_s", "runner_decode_tok_s"):
                if rate in res[pair[0]]:
                    first, second = (statistics.median(res[name][rate]) for name in pair)
                    ratios.append((rate, first / second))
            orders.append(list(order))
    return {"results": pooled, "process_ratios": ratios, "orders": orders}


def process_verdict(measured: dict) -> None:
    """The per-process ratios of `balanced`: median and geometric mean per rate."""
    for rate in dict.fromkeys(rate for rate, _ in measured["process_ratios"]):
        values = [ratio for name, ratio in measured["process_ratios"] if name == rate]
        geo = math.exp(sum(math.log(v) for v in values) / len(values))
        print(f"{rate}: per-process ratios {[round(v, 3) for v in values]} (load orders alternate, ours first in "
              f"the odd ones): median **{statistics.median(values):.3f}**, geometric mean {geo:.3f}")


def best(values: list[float], high: bool) -> float:
    return max(values) if high else min(values)


def table(title: str, res: dict, ours: str, theirs: str, runner: bool) -> None:
    rows = [("Python runtime" if runner else "GenAI", "prefill_ms", "decode_tok_s")]
    if runner:
        rows.append(("TextLLMRunner", "runner_prefill_ms", "runner_decode_tok_s"))
    print(f"\n{title}\n| runtime | ours: prefill ms / decode tok/s (all reps) | theirs | decode ratio (best; median) "
          "| prefill theirs / ours (best; median) |\n|---|---|---|---|---|")
    for label, prefill, decode in rows:
        o, t = res[ours], res[theirs]
        ratio = best(o[decode], True) / best(t[decode], True)
        pre = best(t[prefill], False) / best(o[prefill], False)
        mid = statistics.median(o[decode]) / statistics.median(t[decode])
        mid_pre = statistics.median(t[prefill]) / statistics.median(o[prefill])
        print(f"| {label} | {o[prefill]} / {o[decode]} | {t[prefill]} / {t[decode]} | {ratio:.2f}; {mid:.2f} "
              f"| {pre:.2f}; {mid_pre:.2f} |")
    same = res[ours]["tokens"] == res[theirs]["tokens"]
    print(f"greedy tokens equal: {same} (ours {res[ours]['tokens'][:8]}…, theirs {res[theirs]['tokens'][:8]}…)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=HERE / ".work-peers" / "llama58m")
    parser.add_argument("--reps", type=int, default=3, help="reps per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per load order and pair")
    parser.add_argument("--skip-genai", action="store_true")
    parser.add_argument("--skip-executorch", action="store_true")
    parser.add_argument("--genai-ours", type=Path, help="our GenAI folder (default: round 1's under --work)")
    parser.add_argument("--genai", action="append", default=[], metavar="NAME=FOLDER",
                        help="another GenAI folder measured in the same process, compared with the builder's")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help="GenAI: prompt tokens (R1 keeps 8)")
    parser.add_argument("--steps", type=int, default=STEPS, help="greedy decode steps, both runtimes")
    args = parser.parse_args()
    work, model_dir = args.work, args.work / "model"
    if not args.skip_executorch:
        programs = {"ours": str(one_file(work / "r1-ours-executorch", "model.pte")),
                    "optimum-executorch": str(one_file(work / "r1-peer-executorch", "model.pte"))}
        print(f"R1 before: {uptime()}", file=sys.stderr, flush=True)
        et = balanced(lambda order: run_json([PY, "-c", ET, json.dumps({name: programs[name] for name in order}),
                                              str(model_dir / "tokenizer.json"), str(args.reps), str(args.steps)],
                                             work / "runtimes-executorch.json"),
                      ("ours", "optimum-executorch"), args.rounds)
        print(f"R1 after:  {uptime()}", file=sys.stderr, flush=True)
        print(json.dumps({"programs": programs, **et}))
        table(f"R1 ExecuTorch (executorch 1.5.1), 8-token prompt, {args.steps} greedy steps (pooled)", et["results"],
              "ours", "optimum-executorch", runner=True)
        process_verdict(et)
    if not args.skip_genai:
        builder_out = work / "genai-builder"
        if not (builder_out / "genai_config.json").is_file():
            start = time.perf_counter()
            proc = subprocess.run([str(GENAI_PY), "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o",
                                   str(builder_out), "-p", "fp32", "-e", "cpu", "-c", str(work / "genai-cache")],
                                  check=False, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            print(f"model builder: rc {proc.returncode}, {time.perf_counter() - start:.1f} s", file=sys.stderr)
            if proc.returncode != 0:
                raise RuntimeError(f"model builder failed: {proc.stderr[-2500:]}")
        ours = args.genai_ours or one_file(work / "r1-ours-onnx", "genai_config.json").parent
        folders = {"ours": str(ours), "builder": str(builder_out)}
        folders.update(item.split("=", 1) for item in args.genai)
        print(f"R2 before: {uptime()}", file=sys.stderr, flush=True)
        for name, folder in folders.items():
            if name == "builder":
                continue
            pair = {name: folder, "builder": folders["builder"]}
            genai = balanced(lambda order: run_json([str(GENAI_PY), "-c", GENAI,
                                                     json.dumps({key: pair[key] for key in order}), str(args.reps),
                                                     str(args.prompt_len), str(args.steps)],
                                                    work / "runtimes-genai.json"),
                             (name, "builder"), args.rounds)
            print(json.dumps({"folders": pair, **genai}))
            table(f"R2 ONNX Runtime GenAI 0.18 (fp32, CPU), {args.prompt_len}-token prompt, {args.steps} greedy "
                  f"steps: {name} (pooled)", genai["results"], name, "builder", runner=False)
            process_verdict(genai)
        print(f"R2 after:  {uptime()}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

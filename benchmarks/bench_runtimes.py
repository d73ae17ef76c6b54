"""Our artifacts against the peers' in the same runtime, side by side in one process (issue #26 §5).

    .venv/bin/python benchmarks/bench_runtimes.py [--work benchmarks/.work-peers/llama58m] [--reps 3]
        [--pair fp32|int4] [--quality] [--prompt TEXT --text TEXT] [--summary FILE]

Reads what `bench_peers.py` left under --work (round 1's folders). `--pair fp32` (the default) compares the plain
artifacts as below; `--pair int4` (issue #51) compares our `executorch-int4` program (torchao 8da4w, int8 table)
with optimum-executorch's `--qlinear 8da4w --qembedding 8w` one in R1, and our `onnx-int4` folder with the GenAI
builder's `-p int4 -e cpu` output in R2. Every pair also reports the bytes a runtime loads (programs, graphs and
their external weights). `--quality` runs the float32 eager model (transformers) greedily after the prompt and
judges each artifact in its runtime against it: top-1 agreement teacher-forced on eager's greedy tokens, and greedy
match (eager's tokens, up to its first EOS, that the artifact's own greedy run reproduces in order). `--prompt`
tokenizes a text with the model's tokenizer for the prompt (default: the ids 3, 4, ..., `--prompt-len` of them),
`--text` is the runner's prompt. `bench_peers.py --runtimes` runs this with `--pair int4 --quality`.

R1  ExecuTorch: our runner-layout `model.pte` (`hf-export run`, `[{"export_format": "executorch", "mode":
    "generation"}]`) and optimum-executorch's `model.pte` (`--recipe xnnpack --use_custom_sdpa
    --use_custom_kv_cache`, the same static cache length), both loaded in ONE process by executorch 1.5.1's Python
    `Runtime` (`forward(tokens, cache_position)`): prefill of an 8-token prompt (ms) and 32 greedy single-token
    decode steps (tokens/s); then both by executorch's own C++ `TextLLMRunner` (pybinding) in one process: its
    Stats' prefill time and decode rate for 32 new tokens. The programs alternate rep by rep.
R2  ONNX Runtime GenAI 0.18: our merged `model.onnx` + `genai_config.json` against the model builder's output
    (`python -m onnxruntime_genai.models.builder -p fp32 -e cpu`, built here from the same random-weight folder; with
    `--pair int4`, bench_peers.py's `-p int4` folder),
    both loaded in one process: prefill of the 8-token prompt (`append_tokens`, ms) and 32 greedy decode steps.
    `--genai NAME=FOLDER` (repeatable) adds more folders (e.g. an `"ort_fusions": "cpu"` export), each compared with
    the builder's in processes of its own; `--genai-ours FOLDER` replaces round 1's; `--prompt-len` sets the prompt
    of both (8 by default) and `--steps` the decode steps of both (32 by default).

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
    import executorch.kernels.quantized  # noqa: F401  quantized_decomposed::embedding_byte (an int8 table)
    from executorch.runtime import Runtime
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    programs, tokenizer, reps, steps = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    extra = json.loads(sys.argv[5])  # the prompt's ids, the runner's text, eager's greedy tokens (or None)
    prompt_len = len(extra["prompt"])
    prompt = torch.tensor([extra["prompt"]])
    methods = {name: Runtime.get().load_program(path).load_method("forward") for name, path in programs.items()}
    res = {name: {"prefill_ms": [], "decode_tok_s": [], "tokens": None} for name in programs}
    reference = extra["reference"]
    for name, forward in methods.items():  # teacher-forced on eager's greedy tokens: top-1 agreement at each step
        if reference is None:
            break
        logits = forward.execute([prompt, torch.arange(prompt_len)])[0]
        hits = [int(logits[0, -1].argmax()) == reference[0]]
        for s, token in enumerate(reference[:-1]):
            logits = forward.execute([torch.tensor([[token]]), torch.tensor([prompt_len + s])])[0]
            hits.append(int(logits[0, -1].argmax()) == reference[s + 1])
        res[name]["top1_agreement"] = sum(hits) / len(hits)
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
    text = extra["text"]  # e.g. 8 tokens with the benchmark's ASCII tokenizer, in HF tokenizers and the runner's
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
    extra = json.loads(sys.argv[5])  # the prompt's ids (or None: 3, 4, ...) and eager's greedy tokens (or None)
    prompt = extra["prompt"]
    prompt_len = len(prompt)
    ids = np.array([prompt], dtype=np.int32)
    models = {name: og.Model(path) for name, path in folders.items()}
    res = {name: {"prefill_ms": [], "decode_tok_s": [], "tokens": None} for name in folders}
    reference = extra["reference"]
    for name, model in models.items():  # teacher-forced on eager's greedy tokens: top-1 agreement at each step
        if reference is None:
            break
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=prompt_len + len(reference) + 1)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        hits = []
        for s, expected in enumerate(reference):
            logits = gen.get_logits()
            hits.append(int(logits.reshape(-1, logits.shape[-1])[-1].argmax()) == expected)
            if s + 1 < len(reference):
                gen.append_tokens(np.array([[expected]], dtype=np.int32))
        res[name]["top1_agreement"] = sum(hits) / len(hits)
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
                    ratios.append((rate, divide(first, second)))
            orders.append(list(order))
    return {"results": pooled, "process_ratios": ratios, "orders": orders}


def process_verdict(measured: dict) -> None:
    """The per-process ratios of `balanced`: median and geometric mean per rate."""
    for rate in dict.fromkeys(rate for rate, _ in measured["process_ratios"]):
        values = [ratio for name, ratio in measured["process_ratios"] if name == rate]
        geo = math.exp(sum(math.log(v) for v in values) / len(values))
        print(f"{rate}: per-process ratios {[round(v, 3) for v in values]} (load orders alternate, ours first in "
              f"the odd ones): median **{statistics.median(values):.3f}**, geometric mean {geo:.3f}")


def divide(a: float, b: float) -> float:
    """a / b, or NaN where b is 0 (the runner's stats count whole milliseconds: a tiny model's prefill reads 0)."""
    return a / b if b else float("nan")


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
        ratio = divide(best(o[decode], True), best(t[decode], True))
        pre = divide(best(t[prefill], False), best(o[prefill], False))
        mid = divide(statistics.median(o[decode]), statistics.median(t[decode]))
        mid_pre = divide(statistics.median(t[prefill]), statistics.median(o[prefill]))
        print(f"| {label} | {o[prefill]} / {o[decode]} | {t[prefill]} / {t[decode]} | {ratio:.2f}; {mid:.2f} "
              f"| {pre:.2f}; {mid_pre:.2f} |")
    same = res[ours]["tokens"] == res[theirs]["tokens"]
    print(f"greedy tokens equal: {same} (ours {res[ours]['tokens'][:8]}…, theirs {res[theirs]['tokens'][:8]}…)")


# `--pair`: which of bench_peers.py's round-1 folders are compared (ours, theirs) in each runtime
PAIRS = {"fp32": {"executorch": ("r1-ours-executorch", "r1-optimum-executorch"), "genai": ("r1-ours-onnx", None)},
         "int4": {"executorch": ("r1-ours-executorch-int4", "r1-optimum-executorch-8da4w"),
                  "genai": ("r1-ours-onnx-int4", "r1-genai-int4")}}
WEIGHT_FILES = (".pte", ".ptd", ".onnx", ".data", ".onnx_data")


def stored_bytes(folder: Path) -> int:
    """The bytes a runtime loads from an artifact folder: its programs, graphs and external weights."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and f.name.endswith(WEIGHT_FILES))


def eager_reference(model_dir: Path, prompt: list[int], steps: int) -> list[int]:
    """The float32 eager model's greedy tokens after `prompt` (transformers, no EOS stop): what the artifacts'
    top-1 agreement (teacher-forced) and greedy match are judged against."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, tokens = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(input_ids=ids).logits[0, -1].argmax())
            tokens.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokens


def greedy_match(reference: list[int], tokens: list[int], eos: int | None) -> float:
    """Eager's greedy tokens (up to its first EOS, included) that the artifact's own greedy run reproduces, in
    order, as a fraction."""
    if eos in reference:
        reference = reference[:reference.index(eos) + 1]
    same = 0
    for want, got in zip(reference, tokens):
        if want != got:
            break
        same += 1
    return same / len(reference)


def quality(title: str, measured: dict, reference: list[int] | None, eos: int | None, sizes: dict) -> None:
    """Size, top-1 agreement (teacher-forced on eager's greedy tokens) and greedy match against eager, per artifact."""
    print(f"\n{title}: stored bytes and quality against the float32 eager model\n"
          "| artifact | stored bytes | top-1 agreement | greedy match |\n|---|---|---|---|")
    for name, res in measured["results"].items():
        top1 = res.get("top1_agreement")
        match = greedy_match(reference, res["tokens"], eos) if reference else None
        print(f"| {name} | {sizes[name]:,} | {'-' if top1 is None else f'{top1:.3f}'} "
              f"| {'-' if match is None else f'{match:.3f}'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=HERE / ".work-peers" / "llama58m")
    parser.add_argument("--pair", choices=tuple(PAIRS), default="fp32", help="fp32 artifacts, or int4/8da4w ones")
    parser.add_argument("--reps", type=int, default=3, help="reps per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per load order and pair")
    parser.add_argument("--skip-genai", action="store_true")
    parser.add_argument("--skip-executorch", action="store_true")
    parser.add_argument("--genai-ours", type=Path, help="our GenAI folder (default: round 1's under --work)")
    parser.add_argument("--genai", action="append", default=[], metavar="NAME=FOLDER",
                        help="another GenAI folder measured in the same process, compared with the builder's")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help="prompt tokens (the ids 3, 4, ...)")
    parser.add_argument("--steps", type=int, default=STEPS, help="greedy decode steps, both runtimes")
    parser.add_argument("--prompt", help="prompt text (the model's tokenizer) instead of the ids 3, 4, ...")
    parser.add_argument("--text", default="abcdefghijklmnop", help="TextLLMRunner's prompt (8 ASCII-BPE tokens)")
    parser.add_argument("--summary", type=Path, help="write the measurements here as JSON (bench_peers.py's table)")
    parser.add_argument("--quality", action="store_true",
                        help="top-1 agreement and greedy match against the float32 eager model")
    args = parser.parse_args()
    work, model_dir = args.work, args.work / "model"
    prompt = list(range(3, 3 + args.prompt_len))
    if args.prompt:
        from transformers import AutoTokenizer

        prompt = AutoTokenizer.from_pretrained(model_dir)(args.prompt, add_special_tokens=False)["input_ids"]
    reference = eager_reference(model_dir, prompt, args.steps) if args.quality else None
    eos = json.loads((model_dir / "config.json").read_text()).get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    extra = json.dumps({"prompt": prompt, "text": args.text, "reference": reference})
    pair = PAIRS[args.pair]
    summary: dict = {"pair": args.pair, "prompt": prompt, "reference": reference, "eos": eos}
    if not args.skip_executorch:
        ours_dir, theirs_dir = (work / name for name in pair["executorch"])
        programs = {"ours": str(one_file(ours_dir, "model.pte")),
                    "optimum-executorch": str(one_file(theirs_dir, "model.pte"))}
        sizes = {"ours": stored_bytes(ours_dir), "optimum-executorch": stored_bytes(theirs_dir)}
        print(f"R1 before: {uptime()}", file=sys.stderr, flush=True)
        et = balanced(lambda order: run_json([PY, "-c", ET, json.dumps({name: programs[name] for name in order}),
                                              str(model_dir / "tokenizer.json"), str(args.reps), str(args.steps),
                                              extra], work / "runtimes-executorch.json"),
                      ("ours", "optimum-executorch"), args.rounds)
        print(f"R1 after:  {uptime()}", file=sys.stderr, flush=True)
        print(json.dumps({"programs": programs, "sizes": sizes, "reference": reference, **et}))
        table(f"R1 ExecuTorch (executorch 1.5.1), {len(prompt)}-token prompt, {args.steps} greedy steps, "
              f"{args.pair} (pooled)", et["results"], "ours", "optimum-executorch", runner=True)
        process_verdict(et)
        quality(f"R1 {args.pair}", et, reference, eos, sizes)
        summary["executorch"] = {"sizes": sizes, **et}
    if not args.skip_genai:
        ours_name, theirs_name = pair["genai"]
        builder_out = work / theirs_name if theirs_name else work / "genai-builder"
        if not (builder_out / "genai_config.json").is_file() and theirs_name:
            raise FileNotFoundError(f"no genai_config.json under {builder_out}: run bench_peers.py first")
        if not (builder_out / "genai_config.json").is_file():
            start = time.perf_counter()
            proc = subprocess.run([str(GENAI_PY), "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o",
                                   str(builder_out), "-p", "fp32", "-e", "cpu", "-c", str(work / "genai-cache")],
                                  check=False, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            print(f"model builder: rc {proc.returncode}, {time.perf_counter() - start:.1f} s", file=sys.stderr)
            if proc.returncode != 0:
                raise RuntimeError(f"model builder failed: {proc.stderr[-2500:]}")
        ours = args.genai_ours or one_file(work / ours_name, "genai_config.json").parent
        folders = {"ours": str(ours), "builder": str(builder_out)}
        folders.update(item.split("=", 1) for item in args.genai)
        print(f"R2 before: {uptime()}", file=sys.stderr, flush=True)
        for name, folder in folders.items():
            if name == "builder":
                continue
            both = {name: folder, "builder": folders["builder"]}
            sizes = {key: stored_bytes(Path(value)) for key, value in both.items()}
            genai = balanced(lambda order: run_json([str(GENAI_PY), "-c", GENAI,
                                                     json.dumps({key: both[key] for key in order}), str(args.reps),
                                                     str(args.prompt_len), str(args.steps), extra],
                                                    work / "runtimes-genai.json"),
                             (name, "builder"), args.rounds)
            print(json.dumps({"folders": both, "sizes": sizes, "reference": reference, **genai}))
            table(f"R2 ONNX Runtime GenAI 0.18 ({args.pair}, CPU), {len(prompt)}-token "
                  f"prompt, {args.steps} greedy steps: {name} (pooled)", genai["results"], name, "builder",
                  runner=False)
            process_verdict(genai)
            quality(f"R2 {args.pair}: {name}", genai, reference, eos, sizes)
            summary[f"genai {name}"] = {"sizes": sizes, **genai}
        print(f"R2 after:  {uptime()}", file=sys.stderr, flush=True)
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

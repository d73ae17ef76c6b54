"""Size and speed of each passing artifact, with its own runtime, on the machine that exported it.

```
passing target ──► fresh process ──► load (timed) ──► each component at its traced inputs: warm-up, timed runs
                                                  └─► generation: prefill at the prompt length, decode N tokens
                                  ──► peak memory (VmHWM) ──► report.json "bench", the variants table
```

A fresh process per artifact: the runtime's threads and memory are its own (the pipeline has other runtimes loaded,
and a child forked from it would inherit their thread pools), and its peak resident memory is measured from a clean
start. The processes are forked from a `forkserver` that has imported torch and nothing else, so each starts in
milliseconds instead of re-importing the stack; the process that started the server ends it at its own exit
(`_end_forkserver`: SIGKILL and reap), sparing the server the interpreter's teardown of that stack.
Numbers are medians and 90th percentiles over a fixed number of runs after a warm-up. `hf-export run --no-bench`
skips all of it.

Example:
    >>> summary([3.0, 1.0, 2.0, 4.0])
    {'median_ms': 2.5, 'p90_ms': 3.7, 'runs': 4}
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import platform
import signal
import statistics
import time
import traceback
from multiprocessing import forkserver, util
from pathlib import Path
from typing import Any

import torch

from exporters import fsutil
from exporters.capture.merged import MERGED, prompt_inputs
from exporters.capture.steps import cache_input_name, output_cache, step_inputs
from exporters.status import PASSED
from exporters.upstream import exporter_class, load_exported, run_component, runner_class

WARMUP_RUNS = 3
TIMED_RUNS = 20
GENERATION_REPEATS = 5  # after one warm-up pass
BENCH_TIMEOUT_S = 900.0


def summary(samples_ms: list[float]) -> dict[str, Any]:
    """Median and 90th percentile (linear interpolation) of timings in milliseconds."""
    ordered = sorted(samples_ms)
    rank = 0.9 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    p90 = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(p90, 3), "runs": len(ordered)}


def machine_info() -> dict[str, Any]:
    """The machine the numbers were taken on: CPU model, cores (and those this process may use), memory, GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = None
    try:

        if torch.cuda.is_available():
            gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:  # no torch or no driver: no GPU to report
        gpu = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "memory_gb": memory_gb, "gpu": gpu,
            "os": platform.platform()}


def artifact_size(directory: Path) -> int:
    """Bytes of the files the runtime loads: every component's program files (graph and weights), each file once (the
    methods of one ExecuTorch program share its `.pte`)."""

    manifest = json.loads((directory / "export.json").read_text())
    exporter = exporter_class(manifest["export_format"])
    names = {name for entry in manifest["components"].values() for name in exporter.program_files(entry["file"])}
    names |= {entry["data_file"] for entry in manifest["components"].values() if entry.get("data_file")}
    return sum((directory / name).stat().st_size for name in names if (directory / name).is_file())


# ── The measuring process ─────────────────────────────────────────────────────


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _timed(call, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _generation(runners, templates: dict[str, dict], prompt, steps: int) -> dict[str, Any]:
    """Prefill at the prompt length, then `steps` greedy decode steps (no early stop): median prefill time and
    decode tokens per second over `GENERATION_REPEATS` passes after a warm-up pass. A merged target's one graph
    (`model`) serves both: the prompt on an empty cache, then each token."""

    merged = "prefill" not in templates  # one graph: the prompt on an empty cache, then one token at a time
    first, step = (MERGED, MERGED) if merged else ("prefill", "decode")
    if merged and cache_input_name(templates[MERGED]) is None:  # the LLM runner's program holds its cache
        return _stateful_generation(runners[MERGED], templates[MERGED], prompt, steps)

    def one_pass() -> tuple[float, float]:
        prefill = templates[first]
        if merged:
            feed = prompt_inputs(prefill, prompt)
        else:
            key = cache_input_name(prefill)
            feed = step_inputs(prefill, prompt, 0, copy.deepcopy(prefill[key]) if key else None)
        started = time.perf_counter()
        out = run_component(runners[first], feed)
        prefill_ms = (time.perf_counter() - started) * 1000
        logits, cache, position = out["logits"], output_cache(out), prompt.shape[1]
        decode, runner = templates[step], runners[step]
        traced = runner.metadata.kwargs
        # On the CPU in float32 the runner takes the step's inputs as they are; elsewhere run_component moves and
        # casts them (and copies the cache, which a float32 CPU step does not pay)
        direct = torch.device(runner.device).type == "cpu" and runner.dtype == torch.float32
        started = time.perf_counter()
        for _ in range(steps):
            token = logits[:, -1].argmax(-1)[:, None].cpu()
            feed = {k: v for k, v in step_inputs(decode, token, position, cache).items() if k in traced}
            out = runner(**feed) if direct else run_component(runner, feed)
            logits, cache, position = out["logits"], output_cache(out), position + 1
        decode_s = time.perf_counter() - started
        return prefill_ms, steps / decode_s

    return _passes(one_pass, prompt, steps)


def _passes(one_pass, prompt, steps: int) -> dict[str, Any]:
    """A warm-up pass, then the medians of `GENERATION_REPEATS` passes of `(prefill ms, decode tokens/s)`."""
    with torch.no_grad():
        one_pass()
        passes = [one_pass() for _ in range(GENERATION_REPEATS)]
    return {"prompt_length": int(prompt.shape[1]), "new_tokens": steps,
            "prefill_ms": round(statistics.median(p for p, _ in passes), 3),
            "decode_tokens_per_s": round(statistics.median(t for _, t in passes), 2)}


def _stateful_generation(runner, template: dict[str, Any], prompt, steps: int) -> dict[str, Any]:
    """The ExecuTorch LLM runner's program (`forward(tokens, input_pos)`, the cache inside it), fed as the runner
    feeds it: the prompt at position 0 in one call (which restarts generation), then one token per call at its
    position."""

    def one_pass() -> tuple[float, float]:
        started = time.perf_counter()
        logits = run_component(runner, step_inputs(template, prompt, 0, None))["logits"]
        prefill_ms = (time.perf_counter() - started) * 1000
        position = prompt.shape[1]
        started = time.perf_counter()
        for _ in range(steps):
            token = logits[:, -1].argmax(-1)[:, None].cpu()
            logits = run_component(runner, step_inputs(template, token, position, None))["logits"]
            position += 1
        return prefill_ms, steps / (time.perf_counter() - started)

    return _passes(one_pass, prompt, steps)


def _import_runtime(export_format: str) -> None:
    """Import the format's exporter and runner modules (and so its runtime: ONNX Runtime, ExecuTorch)."""

    exporter_class(export_format)
    runner_class(export_format)


def _measure(request: dict[str, Any]) -> dict[str, Any]:
    """Runs in the fresh process: load, time, measure peak memory."""

    _import_runtime(request["export_format"])  # imports are not the artifact's load time nor its memory
    try:  # reset the peak (VmHWM) to the current size, so the peak below is this measurement's own
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    baseline_kb = _status_kb("VmRSS")
    started = time.perf_counter()
    # this run wrote and validated it; on the device the target was exported for
    exported = load_exported(Path(request["directory"]), device=request.get("device"), allow_pickles=True)
    load_s = time.perf_counter() - started
    latency = {}
    with torch.no_grad():
        for name, inputs in request["components"].items():
            runner = exported.runners[name]
            _timed(lambda: run_component(runner, inputs), WARMUP_RUNS)
            latency[name] = summary(_timed(lambda: run_component(runner, inputs), TIMED_RUNS))
    result: dict[str, Any] = {"load_s": round(load_s, 4), "latency": latency, "warmup_runs": WARMUP_RUNS,
                              "timed_runs": TIMED_RUNS,
                              "threads": torch.get_num_threads()}
    generation = request.get("generation")
    if generation:
        result["generation"] = _generation(exported.runners, request["components"], generation["prompt"],
                                           generation["steps"])
    peak_kb = _status_kb("VmHWM")
    if peak_kb is not None:
        result["peak_rss_mb"] = round(peak_kb / 1024, 1)
        if baseline_kb is not None:
            result["runtime_peak_mb"] = round(max(peak_kb - baseline_kb, 0) / 1024, 1)
    return result


def _child(request: dict[str, Any], connection) -> None:
    if request.get("log"):  # the runtimes' own chatter goes to the target's log, as the export's does
        handle = fsutil.open_log(request["log"])
        os.dup2(handle, 1)
        os.dup2(handle, 2)
    try:
        connection.send({"ok": True, **_measure(request)})
    except BaseException as err:  # reported as the benchmark's error; the target's verdict does not change
        connection.send({"ok": False, "error": f"{type(err).__name__}: {err}"[:1000],
                         "traceback": traceback.format_exc(limit=-8)})
    finally:
        connection.close()


def _forkserver():
    """The process every benchmark is forked from: it imports the stack once and loads no runtime session or
    program, so no runtime thread pool is ever forked."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "onnxruntime", "exporters.validate.benchmark", "exporters.upstream"])
    return context


def warm_up() -> None:
    """Start the forkserver now (it imports while the other targets export and validate) instead of at the first
    benchmark; a run calls it when its first target passes, so a run whose targets all fail (or were all reused)
    never pays its imports (~5.5 CPU-s). Its stderr is /dev/null: the stack's import chatter stays off the terminal
    (each benchmark writes to its target's log)."""

    _forkserver()
    saved, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(quiet, 2)
        forkserver.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)
    if os.getpid() not in _ENDS_ITS_SERVER:
        _ENDS_ITS_SERVER.add(os.getpid())
        # after multiprocessing's own exit handler has terminated and joined this process's children (priority < 0)
        util.Finalize(None, _end_forkserver, exitpriority=-50)


_ENDS_ITS_SERVER: set[int] = set()  # the process (pid) whose exit ends its forkserver (`_end_forkserver`)


def _end_forkserver() -> None:
    """At this process's exit (a multiprocessing finalizer: it runs only in the process that registered it, never in
    a child forked from it): end the forkserver it started with SIGKILL and reap it, instead of letting the server see
    the end of its `alive` pipe and exit through the interpreter's teardown, which frees torch, ONNX Runtime and the
    rest it preloaded (~1 CPU s, benchmarks/RESULTS.md tenth round) with no one to read anything from it: every
    benchmark process has sent its result (or died, which `benchmark` reported) and been joined or terminated by then,
    the server writes nothing of its own (its stderr is /dev/null), and its socket lies in this process's temporary
    folder, which this process's own finalizer removes. The pid is CPython's record of the server
    (`multiprocessing.forkserver`); it is signalled only while it is this process's unreaped child (alive, or a
    zombie whose pid nothing else can hold), which `waitpid(WNOHANG)` tells first."""
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == 0:  # ChildProcessError: not this process's child; nonzero: just reaped
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        return
    server._forkserver_pid = None


def benchmark(directory: Path, components: dict[str, dict[str, Any]], generation: dict[str, Any] | None,
              timeout: float = BENCH_TIMEOUT_S, log: Path | None = None, device: str | None = None) -> dict[str, Any]:
    """Measure one saved artifact in a fresh process, on `device` (the runtime's default when None). `components`:
    the traced inputs of each component; `generation`: `{"prompt": ids, "steps": n}` for decoder-only generation
    targets; `log`: where the process's output goes."""
    warm_up()  # (a no-op once the server runs)
    context = _forkserver()
    receive, send = context.Pipe(duplex=False)
    manifest = json.loads((Path(directory) / "export.json").read_text())
    request = {"directory": str(directory), "components": components, "generation": generation,
               "log": str(log) if log else None, "export_format": str(manifest["export_format"]), "device": device}
    process = context.Process(target=_child, args=(request, send), daemon=True)
    process.start()
    send.close()
    outcome: dict[str, Any] | None = None
    if receive.poll(timeout):
        try:
            outcome = receive.recv()
        except EOFError:
            outcome = None
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()
        return {"ok": False, "error": f"the benchmark ran past {timeout:g} s and was stopped"}
    if outcome is None:
        return {"ok": False, "error": f"the benchmark process died (exit code {process.exitcode})"}
    return outcome


def bench_passing(validated: list[Any], workbench: Any, context: Any, progress: Any) -> None:
    """Benchmark every passing target of a run (items with `.target` and `.result`, saved in `OUT/<target>/`),
    recording the machine on `context`."""

    context.machine = machine_info()
    for item in validated:
        target, result, final = item.target, item.result, context.out_dir / item.target.name
        if result.status != PASSED:
            continue
        progress.update(target.name, "benchmarking")
        log = context.out_dir / "logs" / f"{target.name}.log"
        bench_into(result, target, final, workbench.components(target, context.recipe), workbench.sample,
                   context.recipe, log)
        progress.update(target.name, "[green]passed", done=True)


def bench_into(result, target, directory: Path, components, sample, recipe, log: Path | None = None) -> None:
    """Benchmark a passing target and store the numbers (or why there are none) in `result.bench`."""
    templates = {name: inputs for name, (_, inputs) in components.items()}
    generation = None
    if target.mode == "generation" and sample.family == "text" and (
            {"prefill", "decode"} <= set(templates) or set(templates) == {"model"}):
        generation = {"prompt": sample.generate["input_ids"], "steps": recipe.generation.max_new_tokens}
    started = time.time()
    measured = benchmark(directory, templates, generation, log=log, device=result.device)
    result.timings["bench_s"] = round(time.time() - started, 3)
    bench: dict[str, Any] = {"size_bytes": artifact_size(directory), "machine": machine_info()}
    if measured.pop("ok", False):
        bench.update(measured)
        if target.mode == "generation" and generation is None:
            bench["note"] = "prefill and decode timing is measured for decoder-only models"
    else:
        bench["error"] = measured.get("error")
        result.findings.append(f"benchmark did not run: {measured.get('error')}")
    result.bench = bench

"""The pipeline: load once, export every target in its own process, validate from disk, report.

```
prepare_run ──► reuse signed, unchanged targets ──► load the model once ──► for each target:
  (context)        (exporters.run.reuse)                  (sample inputs)         decompose ─► export in a child
                                                                                 (exporters.run.isolation; or init's,
                                                                                 handed over) ─► staging into place
validate every new target from disk against the eager model ──► report.json + report.md
  (exporters.validate, eager references shared)                   (exporters.report)
```

Each target is exported in a forked child process (which inherits the loaded model), into a staging folder that is
renamed into place only when the export finished: a crash or a timeout in one target leaves nothing half-written
and does not stop the others. Validation runs after every export, in this process: the export children fork from a
parent that has loaded no runtime yet. An export `init` checked is taken instead (exporters.run.handover).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

import torch

from exporters import fsutil
from exporters.capture import llm_runner
from exporters.capture.dtypes import export_cast, reference_groups
from exporters.capture.families import MULTIMODAL_GENERATORS
from exporters.errors import DeviceError, recovering
from exporters.export.convert import export_to, release_weights
from exporters.export.footprint import record_footprint
from exporters.export.quantize import Quantizing
from exporters.hashing import file_entries
from exporters.layouts import write_layout_files
from exporters.recipe.model import Recipe, Target
from exporters.report.results import TargetResult
from exporters.run.context import DEFAULT_TIMEOUT_S, RunContext, RunOptions, prepare_run, resolve_device
from exporters.run.handover import as_exported, hand_over, take_over
from exporters.run.isolation import Isolated, log_excerpt, logged_error
from exporters.run.outcomes import new_result, strip_after_validation, write_results
from exporters.run.progress import Progress
from exporters.run.resources import default_jobs, threads_left
from exporters.run.twins import Twins
from exporters.run.reuse import Signer, previous_report, reusable
from exporters.run.workbench import Workbench
from exporters.status import FAILED, PASSED, UNVERIFIED
from exporters.upstream import exporter_ready, import_loaders, move_to
from exporters.validate.arbitration import keeps_eager_weights
from exporters.validate.benchmark import bench_passing, warm_up
from exporters.validate.checks import validate_target
from exporters.validate.dtype_files import judge_dtype_files, record_dtype_files
from exporters.validate.eager_side import EagerSide
from exporters.validate.folder_trust import Inventory, take_inventory
from exporters.validate.subject import SavedTarget

__all__ = ["RunOptions", "run_pipeline"]
STAGING_PREFIX = ".staging-"


def run_pipeline(model: str, options: RunOptions) -> dict[str, Any]:
    """Run a model's recipe end to end; write `OUT/<target>/`, `OUT/report.json` and `OUT/report.md`.

    Args:
        model: a local model folder (written by `save_pretrained`) or a Hub repo id.
        options: what to run (targets, output folder, device, revision, token, remote code, cache, timeout).

    Returns:
        The report dict (also written to `OUT/report.json`): `status` is `passed` only when every target passed.

    Raises:
        RecipeError: no recipe, an invalid one, or an unknown `target` (a failing target is reported, not raised).
        ModelSourceError, RemoteCodeError: the model cannot be loaded, or needs code that was not allowed.

    Example:
        >>> report = run_pipeline("examples/demo-model", RunOptions(out_dir=Path("demo-out")))  # doctest: +SKIP
        >>> report["status"], [t["name"] for t in report["targets"]]  # doctest: +SKIP
        ('passed', ['dynamo', 'onnx', 'executorch'])
    """
    out_dir = options.out_dir
    earlier = previous_report(out_dir)
    context = prepare_run(model, options)  # the weights hashed again: an earlier report's record is not trusted
    fsutil.real_dir(out_dir / "logs")
    signer = Signer()
    previous = {t.get("name"): t for t in earlier.get("targets") or [] if isinstance(t, dict)}
    results: list[TargetResult] = []
    to_run = []
    for target in context.targets:
        device = options.device or target.device
        hit = None
        if options.use_cache and device != "auto":
            hit = reusable(previous.get(target.name), context.cache_key(target.name, device), out_dir, signer)
        (to_run if hit is None else results).append(target if hit is None else hit)
    if to_run:
        results += _export_and_validate(to_run, context, options)
    for result in results:
        if result.status == PASSED and not result.cached:
            result.signature = signer.sign(result.to_dict())
    return write_results(results, context)


@dataclass
class _Export:
    """One target on its way: planned (device, components), exporting in a child, then validated."""

    target: Target
    result: TargetResult
    components: Any = None
    staging: Path | None = None
    run: Isolated | None = None
    started: float = 0.0
    eager: EagerSide | None = None  # the eager side of its validation, computed while it exports
    eager_tried: bool = False
    inventory: Inventory | None = None  # what its export wrote and copied: all a runtime proof may read
    exported: dict[str, Any] | None = None  # its child's outcome and files, kept to hand over (RunOptions.hand_over)


def _export_and_validate(targets: list[Target], context: RunContext, options: RunOptions) -> list[TargetResult]:
    """Export the targets, up to `jobs` at a time in child processes, and validate each from disk.

    A target's child starts as soon as its components are captured, so the first export overlaps the captures of
    the others. While a target exports, this process computes the eager side of its validation (probes' and
    generation's references: `exporters.validate.eager_side`), which reads nothing the export writes. Every child is
    forked before the first validation starts: the children fork from a parent that has not yet loaded ONNX Runtime
    sessions or ExecuTorch programs (so no runtime's threads or memory are forked); validation then overlaps with the
    exports still running.
    """
    groups = reference_groups([t.dtype for t in targets], context.checkpoint_dtype)
    workbench = Workbench.load(context, options, targets, dtype=groups[0][0])
    results: list[TargetResult] = []
    context.jobs = context.jobs or default_jobs(weight_bytes=workbench.weights.bytes(), targets=len(targets))
    validated: list[_Export] = []
    with Progress(options.progress) as progress:
        for index, (dtype, members) in enumerate(groups):
            if index:  # the next group's references in its dtype: the weights converted in place (lossless)
                workbench.convert(dtype)
            results += _export_group([targets[i] for i in members], context, options, workbench, progress,
                                     validated, final=index == len(groups) - 1)
        if options.bench:  # after every export: timings taken while nothing else runs, each in a fresh process
            bench_passing(validated, workbench, context, progress)
    return results


def _export_group(targets: list[Target], context: RunContext, options: RunOptions, workbench: Workbench,
                  progress: Progress, validated: list[_Export], final: bool) -> list[TargetResult]:
    """Export and validate targets whose eager references share the model's current dtype (see
    `_export_and_validate`); each validated target is appended to `validated`. The eager weights are released after
    the last validation only in the `final` group."""
    calibration = workbench.calibration(targets, context.recipe)
    results: list[TargetResult] = []
    jobs, twins = context.jobs, Twins(options.out_dir, targets, workbench.model, context.recipe)
    pending, running, exported = [], [], []  # of _Export: planned, exporting, to validate

    def start_free_slots() -> None:  # ONNX twins (one export's graphs: exporters.run.twins) wait for the first
        while len(running) < jobs and (ready := twins.take_ready(pending)) is not None:
            running.append(_start(ready, workbench, context, options, progress, calibration, twins))

    for target in targets:
        target = workbench.plan(target)
        target.timeout = target.timeout or options.timeout or DEFAULT_TIMEOUT_S  # its export's and its proofs'
        item = _Export(target, new_result(target, context, options))
        results.append(item.result)
        if _prepare(item, workbench, context, options, progress):
            (exported if take_over(item, context, options, STAGING_PREFIX) else pending).append(item)
            start_free_slots()
    while pending or running or exported:
        start_free_slots()
        if exported and not pending:
            validated.append(exported.pop(0))  # on the cores the running exports leave; the last frees the weights
            with threads_left(busy=len(running)):
                _validate(validated[-1], context, workbench, options, progress,
                          last=final and not running and not exported)
            continue
        # the cores the running exports leave would idle: the eager side of a validation, not of a torch program's
        # (compared with eager at the thread count it is validated at: `EagerSide.usable_for`)
        ahead = next((i for i in running if not i.eager_tried and i.target.export_format != "dynamo"), None)
        if ahead is not None:
            _eager_side(ahead, context, workbench, progress, busy=len(running))
            continue
        mp_wait([item.run.sentinel for item in running], timeout=1.0)
        for item in [i for i in running if i.run.done()]:
            running.remove(item)
            if twins.finished(item.target.name, _finish(item, options, progress)):
                exported.append(item)
            elif _planned_again(item, workbench, context, options, progress):
                pending.insert(0, item)
    twins.close()
    return results


def _prepare(item: _Export, workbench: Workbench, context: RunContext, options: RunOptions, progress: Progress) -> bool:
    """Resolve the device and capture the components (in this process); False when the target already failed."""
    target, result = item.target, item.result
    try:
        result.device = resolve_device(options.device or target.device)
    except DeviceError as err:
        result.error = {"type": "DeviceError", "message": str(err)}
        progress.update(target.name, "[red]failed: no GPU", done=True)
        return False
    result.cache_key = context.cache_key(target.name, result.device)
    progress.update(target.name, "capturing inputs")
    with recovering() as guard:  # a native panic (a tokenizer's) fails the target, not the run
        item.components = workbench.components(target, context.recipe) if workbench.unprepared is None else None
    log = options.out_dir / "logs" / f"{target.name}.log"  # the whole message and traceback (the report's line: a cut)
    if guard.error is not None:
        result.error = logged_error(guard.error, log, fresh=True)
    if item.components is None:
        result.error = result.error or workbench.unprepared_in(log)
        progress.update(target.name, "[red]failed: capture", done=True)
        return False
    result.expected_components = workbench.expected(target, item.components)
    result.findings += workbench.contract_notes(target)
    item.eager, item.eager_tried = None, False  # computed again for the components just captured
    progress.update(target.name, "waiting for a free export slot")
    return True


def _start(item: _Export, workbench: Workbench, context: RunContext, options: RunOptions, progress: Progress,
           calibration: list[Any], twins: Twins) -> _Export:
    """Fork the child that exports one target into its staging folder."""
    target, out_dir = item.target, options.out_dir
    log_path = fsutil.fresh_file(out_dir / "logs" / f"{target.name}.log")
    item.staging = fsutil.fresh_dir(out_dir / f"{STAGING_PREFIX}{target.name}")
    device, components, staging = item.result.device, item.components, item.staging

    def work() -> dict[str, Any]:
        return _export_work(workbench.model, target, components, context.recipe, staging, device, calibration,
                            context.source.folder)

    progress.update(target.name, f"exporting {target.export_format} ({len(components)} component(s))")
    with recovering():  # once in this process, not again in each child
        exporter_ready(target.export_format)
    item.started = time.time()
    item.run = Isolated(twins.sharing(target.name, work, item.result), log_path=log_path, timeout=target.timeout)
    return item


def _eager_side(item: _Export, context: RunContext, workbench: Workbench, progress: Progress, busy: int) -> None:
    """The eager side of a running target's validation and the imports loading its artifact needs, on the cores
    `busy` exports leave (left unset where it raised: validation computes it again and reports what failed)."""
    target, started, item.eager_tried = item.target, time.time(), True
    progress.update(target.name, f"exporting {target.export_format}; eager references meanwhile")
    with recovering(), threads_left(busy=busy):
        item.eager = workbench.eager_side(target, context, item.components, item.result.expected_components)
        import_loaders(target.export_format)  # what loading the artifact imports (ONNX's exporter: a second)
    item.result.timings["eager_ahead_s"] = round(time.time() - started, 3)
    progress.update(target.name, f"exporting {target.export_format} ({len(item.components)} component(s))")


def _finish(item: _Export, options: RunOptions, progress: Progress) -> bool:
    """Take a child's outcome: the staging folder moved into place (True), or the failure recorded (False)."""
    target, result = item.target, item.result
    outcome = item.run.result()
    result.timings["export_s"] = round(time.time() - item.started, 3)
    log_path = options.out_dir / "logs" / f"{target.name}.log"
    if not outcome.get("ok"):
        fsutil.remove(item.staging)
        result.status = outcome.get("status", FAILED)
        result.error = {"type": outcome.get("type"), "message": outcome.get("message"),
                        **{k: outcome[k] for k in ("root_cause", "upstream") if k in outcome},
                        "log_excerpt": log_excerpt(log_path)}
        progress.update(target.name, f"[red]{result.status}", done=True)
        return False
    result.findings += outcome.get("notes", [])
    result.quantization, item.inventory = outcome.get("quantization"), outcome.get("inventory")
    result.timings.update(trace_s=outcome.get("export_only_s"), save_s=outcome.get("save_s"))
    fsutil.move_into_place(item.staging, options.out_dir / target.name)
    item.exported = as_exported(outcome, options.out_dir / target.name) if options.hand_over else None
    progress.update(target.name, "exported; validation follows")
    return True


def _planned_again(item: _Export, workbench: Workbench, context: RunContext, options: RunOptions,
                   progress: Progress) -> bool:
    """A default runner program (the recipe left `layout` unset) whose export failed, not by time or a crash: the
    target planned again with the methods layout, the failure in its findings; True when it is to be exported again."""
    error = item.result.error
    if item.result.status != FAILED or not error:
        return False
    if not workbench.plan_methods_layout(item.target, llm_runner.export_refused(error)):
        return False
    item.result.error, item.result.findings, item.components = None, [], None  # a plan that fails keeps none
    return _prepare(item, workbench, context, options, progress)


def _validate(item: _Export, context: RunContext, workbench: Workbench, options: RunOptions, progress: Progress,
              last: bool = False) -> None:
    target, result = item.target, item.result
    final = options.out_dir / target.name
    progress.update(target.name, "validating")
    _validate_into(result, target, context, workbench, SavedTarget(final, True, item.inventory, result.device),
                   last=last, precomputed=item.eager)
    item.eager = None
    strip_after_validation(result, target, final)
    result.files = file_entries(final, options.out_dir)
    record_footprint(result, target, final, workbench.weights)
    hand_over(item, context, final)  # where the run keeps its exports for a later run (init's): RunOptions.hand_over
    if options.bench and result.status == PASSED:  # the first target to be timed: the benchmark's imports start now
        warm_up()
    colour = {PASSED: "green", UNVERIFIED: "yellow"}.get(result.status, "red")
    progress.update(target.name, f"[{colour}]{result.status}", done=True)
    gc.collect()  # the loaded programs and runtime sessions of this target are no longer needed


def _export_work(model: Any, target: Target, components: Any, recipe: Recipe, staging: Path, device: str,
                 calibration: list[Any], source_dir: Path | None = None) -> dict[str, Any]:
    """What the child process does: move to the target's device and dtype, quantize and export, save."""
    cast = export_cast(target.dtype, str(model.dtype).removeprefix("torch."))  # None: already in it, left as loaded
    if cast is not None or device != "cpu":
        dtype = getattr(torch, cast) if cast else None
        model = model.to(device=device, dtype=dtype)
        components = {name: (module.to(device=device, dtype=dtype), move_to(inputs, device, dtype))
                      for name, (module, inputs) in components.items()}
    notes: list[str] = []
    quantizing = Quantizing(model, target, recipe, calibration, notes)
    outcome = export_to(model, target, components, recipe, staging, notes, quantizing.quantizer_for(), source_dir)
    written = write_layout_files(staging, target, model, notes, outcome.pop("written"))  # each runtime's files
    quantization = quantizing.record_into(staging)
    inventory = take_inventory(staging, written, outcome.pop("copied"))
    return {"notes": notes, **outcome, "quantization": quantization, "inventory": inventory}


def _validate_into(result: TargetResult, target: Target, context: RunContext, workbench: Workbench,
                   saved: SavedTarget, last: bool = False, precomputed: EagerSide | None = None) -> None:
    started = time.time()
    with recovering() as guard:  # a native panic too: the target fails with its message, the run goes on
        rows = judge_dtype_files(target, saved.directory, lambda view, folder: validate_target(  # before weights go
            target=view, recipe=context.recipe, saved=replace(saved, directory=folder, inventory=None, proofs=False),
            components=workbench.components(target, context.recipe), subject=workbench.subject(target, context),
            expected_components=result.expected_components, precomputed=precomputed))
        validation = validate_target(
            target=target, recipe=context.recipe, saved=saved, components=workbench.components(target, context.recipe),
            subject=workbench.subject(target, context), expected_components=result.expected_components,
            # vision-language parity runs the model's own forward around the graphs, and a failed check of a model
            # small enough is arbitrated in float64 on every target alike: their weights stay
            release_model=(lambda: release_weights(workbench.model)) if last and workbench.sample.family not in
            MULTIMODAL_GENERATORS and not keeps_eager_weights(workbench.model) else None, precomputed=precomputed,
        )
    if guard.error is not None:
        result.status, result.error = FAILED, logged_error(guard.error, context.out_dir / "logs" / f"{target.name}.log",
                                                           prefix="validation could not run: ")
    else:
        result.record_validation(validation)
        record_dtype_files(result, rows, saved.directory, replace(validation, runtimes=[]).verdict)
    result.timings["validate_s"] = round(time.time() - started, 3)

"""The pipeline: load once, export every target in its own process, validate from disk, report.

```
prepare_run ──► reuse signed, unchanged targets ──► load the model once ──► for each target:
  (context)        (exporters.reuse)                  (sample inputs)         decompose ─► export in a child
                                                                                 (exporters.isolation) ─► staging
                                                                                 renamed into place
validate every new target from disk against the eager model ──► report.json + report.md
  (exporters.validate, eager references shared)                   (exporters.report)
```

Each target is exported in a forked child process (which inherits the loaded model), into a staging folder that is
renamed into place only when the export finished: a crash or a timeout in one target leaves nothing half-written
and does not stop the others. Validation runs after every export, in this process: the export children fork from a
parent that has loaded no runtime yet.
"""

from __future__ import annotations

import copy
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import fsutil
from .context import DEFAULT_TIMEOUT_S, RunContext, RunOptions, prepare_run, resolve_device
from .errors import DeviceError, describe_error
from .footprint import ModelWeights, record_footprint
from .hashing import file_entries
from .isolation import log_excerpt, run_isolated
from .progress import Progress
from .results import TargetResult
from .reuse import Signer, previous_report, reusable
from .status import FAILED, PASSED, UNVERIFIED

__all__ = ["RunOptions", "run_pipeline", "validate_existing"]
STAGING_PREFIX = ".staging-"


@dataclass
class Workbench:
    """The loaded model, its sample inputs, and what is shared across targets: decompositions, eager outputs."""

    model: Any
    sample: Any
    eager: Any
    weights: Any  # exporters.footprint.ModelWeights, read at load (validation may free the weights)
    decompositions: dict[tuple, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, context: RunContext, options: RunOptions, targets: list[Any]) -> Workbench:
        """Load the model once: in the targets' dtype when they all ask for the same one (a float16 target of a
        float32 checkpoint never holds a float32 copy); else in the checkpoint's, each export converting its own."""
        from .inputs import make_sample_inputs
        from .source import load_model, load_tokenizer
        from .validate import EagerCache

        started = time.time()
        dtypes = {target.dtype for target in targets}
        model = load_model(context.source, trust_remote_code=options.trust_remote_code,
                           dtype=dtypes.pop() if len(dtypes) == 1 else None)
        sample = make_sample_inputs(model, context.recipe.inputs, load_tokenizer(context.source.folder))
        context.family, context.load_s = sample.family, round(time.time() - started, 3)
        context.model_dtype = str(model.dtype).removeprefix("torch.")
        context.eager_cache = EagerCache()
        return cls(model, sample, context.eager_cache, ModelWeights.of(model))

    def plan(self, target: Any) -> Any:
        """The target with its mode decided (the recipe's, else from the model)."""
        from .inputs import default_mode

        target = target.model_copy(deep=True)
        target.mode = target.mode or default_mode(self.model)
        return target

    def components(self, target: Any, recipe: Any) -> Any:
        """The target's `{component: (module, forward inputs)}`, captured once per mode and decode layout; a merged
        target's one graph is upstream's multi-token decode (`exporters.merged`)."""
        from . import engine, merged

        target.merged = merged.wants_merged(target, self.sample.family, recipe.generation.cache_implementation)
        key = (target.mode, target.multi_token_decode or target.merged)
        if key not in self.decompositions:
            self.decompositions[key] = engine.decompose(
                self.model, target.mode, self.sample.forward, self.sample.generate, recipe=recipe,
                multi_token_decode=key[1], family=self.sample.family)
        return merged.plan(target, self.decompositions[key]) if target.merged else self.decompositions[key]


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
    context = prepare_run(model, options, known_weights=(earlier.get("source") or {}).get("weights_files"))
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
        if hit is not None:
            results.append(hit)
        else:
            to_run.append(target)
    if to_run:
        results += _export_and_validate(to_run, context, options)
    for result in results:
        if result.status == PASSED and not result.cached:
            result.signature = signer.sign(result.to_dict())
    return _write(results, context)


def _write(results: list[TargetResult], context: RunContext) -> dict[str, Any]:
    from .report import build_report, write_report

    order = {t.name: i for i, t in enumerate(context.targets)}
    results.sort(key=lambda r: order[r.name])
    report = build_report(results, context)
    write_report(report, context.out_dir)
    return report


def _new_result(target: Any, context: RunContext, options: RunOptions) -> TargetResult:
    return TargetResult(name=target.name, export_format=target.export_format, mode=target.mode, status=FAILED,
                        dtype=target.dtype, versions=context.versions, log=f"logs/{target.name}.log",
                        reproduce=_reproduce_command(context, options, target.name))


def _export_and_validate(targets: list[Any], context: RunContext, options: RunOptions) -> list[TargetResult]:
    bench = Workbench.load(context, options, targets)
    out_dir = options.out_dir
    results, exported = [], []
    with Progress(options.progress) as progress:
        for target in targets:
            target = bench.plan(target)
            result = _new_result(target, context, options)
            results.append(result)
            final = _export_target(target, result, bench, context, options, progress)
            if final is not None:
                exported.append((target, result, final))
        # Validation runs after every export: the export processes fork from a parent that has not yet loaded
        # ONNX Runtime sessions or programs, so they stay as small as a bare export (and no runtime's threads are
        # forked).
        for index, (target, result, final) in enumerate(exported):
            progress.update(target.name, "validating")
            # after the last target's eager references nothing needs the eager weights: freed before its artifact
            _validate_into(result, target, context, bench, final, trust_artifacts=True,
                           last=index == len(exported) - 1)
            _after_validation(result, target, final)
            result.files = file_entries(final, out_dir)
            record_footprint(result, target, final, bench.weights)
            progress.update(target.name, _stage_label(result.status), done=True)
            gc.collect()  # the loaded programs and runtime sessions of this target are no longer needed
    return results


def _stage_label(status: str) -> str:
    colour = {PASSED: "green", UNVERIFIED: "yellow"}.get(status, "red")
    return f"[{colour}]{status}"


def _export_target(target: Any, result: TargetResult, bench: Workbench, context: RunContext, options: RunOptions,
                   progress: Progress) -> Path | None:
    """Export one target in a child process into a staging folder, then move it into place. Its final folder, or
    None when it failed (the reason is on `result`)."""
    out_dir = options.out_dir
    log_path = fsutil.fresh_file(out_dir / "logs" / f"{target.name}.log")
    try:
        result.device = resolve_device(options.device or target.device)
    except DeviceError as err:
        result.error = {"type": "DeviceError", "message": str(err)}
        progress.update(target.name, "[red]failed: no GPU", done=True)
        return None
    result.cache_key = context.cache_key(target.name, result.device)
    progress.update(target.name, "capturing inputs")
    try:
        components = bench.components(target, context.recipe)
    except Exception as err:
        result.error = {"type": type(err).__name__, "message": describe_error(err)}
        progress.update(target.name, "[red]failed: capture", done=True)
        return None
    result.expected_components = _expected(target, bench.sample.family, components)
    staging = fsutil.fresh_dir(out_dir / f"{STAGING_PREFIX}{target.name}")
    device = result.device

    def work() -> dict[str, Any]:
        return _export_work(bench.model, target, components, context.recipe, staging, device)

    progress.update(target.name, f"exporting {target.export_format} ({len(components)} component(s))")
    started = time.time()
    outcome = run_isolated(work, log_path=log_path, timeout=target.timeout or options.timeout or DEFAULT_TIMEOUT_S)
    result.timings["export_s"] = round(time.time() - started, 3)
    if not outcome.get("ok"):
        fsutil.remove(staging)
        result.status = outcome.get("status", FAILED)
        result.error = {"type": outcome.get("type"), "message": outcome.get("message"),
                        "log_excerpt": log_excerpt(log_path)}
        progress.update(target.name, f"[red]{result.status}", done=True)
        return None
    result.findings += outcome.get("notes", [])
    result.timings.update(trace_s=outcome.get("export_only_s"), save_s=outcome.get("save_s"))
    final = out_dir / target.name
    fsutil.move_into_place(staging, final)
    progress.update(target.name, "exported; validation follows")
    return final


def _expected(target: Any, family: str, components: Any) -> list[str]:
    """The recipe's `expected_components`, else the family's minimum complete set."""
    from .components import minimum_components

    if target.expected_components is not None:
        return list(target.expected_components)
    return minimum_components(family, target.mode, list(components), merged=bool(target.merged))


def _export_work(model: Any, target: Any, components: Any, recipe: Any, staging: Path, device: str) -> dict[str, Any]:
    """What the child process does: move to the target's device and dtype, export every component, save."""
    import torch

    from . import engine
    from .upstream import cast_leaf_tensors

    if target.dtype is not None or device != "cpu":
        dtype = getattr(torch, target.dtype) if target.dtype else None
        model = model.to(device=device, dtype=dtype)
        components = {name: (module.to(device=device, dtype=dtype), cast_leaf_tensors(inputs, dtype=dtype, device=device))
                      for name, (module, inputs) in components.items()}
    notes: list[str] = []
    return {"notes": notes, **engine.export_to(model, target, components, recipe, staging, notes)}


def _validate_into(result: TargetResult, target: Any, context: RunContext, bench: Workbench, directory: Path,
                   trust_artifacts: bool, last: bool = False) -> None:
    from .engine import generation_config_for, release_weights
    from .validate import validate_target

    started = time.time()
    recipe = context.recipe
    try:
        validation = validate_target(
            target=target, recipe=recipe, directory=directory, components=bench.components(target, recipe),
            model=bench.model, family=bench.sample.family, generate_inputs=bench.sample.generate, eager=bench.eager,
            generation_config=generation_config_for(bench.model, recipe) if target.mode == "generation" else None,
            expected_components=result.expected_components, trust_artifacts=trust_artifacts,
            release_model=(lambda: release_weights(bench.model)) if last else None,
        )
    except Exception as err:
        result.status = FAILED
        result.error = {"type": type(err).__name__, "message": f"validation could not run: {describe_error(err)}"}
    else:
        result.record_validation(validation)
    result.timings["validate_s"] = round(time.time() - started, 3)


def _after_validation(result: TargetResult, target: Any, final: Path) -> None:
    """`export_params: false`: the weights are stripped once the artifact was validated with them."""
    if result.status == PASSED and target.export_format == "onnx" and not target.export_params:
        from .onnx_files import strip_weights

        stripped = strip_weights(final)
        result.findings.append(
            f"export_params: false — validated with weights, then {len(stripped)} weights were stripped: "
            "the published graph takes them as inputs"
        )


def _reproduce_command(context: RunContext, options: RunOptions, target: str) -> str:
    parts = ["hf-export", "run", context.model_arg, "--target", target]
    if context.source.revision:
        parts += ["--revision", context.source.revision]
    if options.config_path:
        parts += ["--config", str(options.config_path)]
    return " ".join(parts)


def validate_existing(model: str, options: RunOptions) -> dict[str, Any]:
    """Re-run every check on artifacts already saved in `options.out_dir` (no export) and rewrite the report.

    Artifacts in the folder were not produced by this process: pickled programs load only with
    `trust_remote_code`, nothing else in the folder ever runs, and the rewritten report does not let a later `run`
    reuse them (it is not signed). Export timings from an earlier report are kept.

    Raises the same errors as [`run_pipeline`].
    """
    out_dir = options.out_dir
    previous = {t.get("name"): t for t in previous_report(out_dir).get("targets") or [] if isinstance(t, dict)}
    context = prepare_run(model, options)
    bench = Workbench.load(context, options, context.targets)
    results = []
    for index, target in enumerate(context.targets):
        target = bench.plan(target)
        result = _new_result(target, context, options)
        result.reproduce = f"hf-export validate {model} {out_dir} --target {target.name}"
        result.device = resolve_device(options.device or target.device)
        result.cache_key = context.cache_key(target.name, result.device)
        result.timings = dict((previous.get(target.name) or {}).get("timings") or {})
        results.append(result)
        directory = out_dir / target.name
        if directory.is_symlink() or not (directory / "export.json").is_file():
            result.error = {"type": "MissingArtifact",
                            "message": f"{directory} holds no export (export.json missing): export it first"}
            continue
        try:
            result.expected_components = _expected(target, bench.sample.family, bench.components(target, context.recipe))
        except Exception as err:
            result.error = {"type": type(err).__name__, "message": describe_error(err)}
            continue
        _validate_into(result, target, context, bench, directory, trust_artifacts=options.trust_remote_code,
                       last=index == len(context.targets) - 1)
        result.files = file_entries(directory, out_dir)
        record_footprint(result, target, directory, bench.weights)
    return _write(results, context)

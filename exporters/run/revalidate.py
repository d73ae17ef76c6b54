"""`hf-export validate`: every check again on artifacts already saved in a folder, without exporting, and the report
rewritten (`exporters.run.pipeline` for the run that exports them).

Example:
    >>> report = validate_existing("examples/demo-model", RunOptions(out_dir=Path("demo-out")))  # doctest: +SKIP
    >>> report["status"]  # doctest: +SKIP
    'passed'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.capture import llm_runner, multimodal_runner
from exporters.capture.dtypes import reference_groups
from exporters.errors import ArtifactError, error_record, recoverable
from exporters.export.footprint import record_footprint
from exporters.hashing import file_entries
from exporters.layouts import waveform_as_recorded
from exporters.run.context import RunOptions, prepare_run, resolve_device
from exporters.run.outcomes import new_result, write_results
from exporters.run.pipeline import _validate_into
from exporters.run.reuse import previous_report
from exporters.run.workbench import Workbench
from exporters.upstream import read_manifest
from exporters.validate.subject import SavedTarget

__all__ = ["RunOptions", "validate_existing"]

RUNNER_LAYOUTS = (llm_runner.RUNNER, multimodal_runner.MULTIMODAL_RUNNER)  # a saved program in a runner's contract


def validate_existing(model: str, options: RunOptions) -> dict[str, Any]:
    """Re-run every check on artifacts already saved in `options.out_dir` (no export) and rewrite the report.

    Artifacts in the folder were not produced by this process: pickled programs load only with
    `trust_remote_code`, nothing else in the folder ever runs, and the rewritten report does not let a later `run`
    reuse them (it is not signed). Export timings from an earlier report are kept.

    Raises the same errors as [`run_pipeline`].
    """
    out_dir = options.out_dir
    previous = {t.get("name"): t for t in previous_report(out_dir).get("targets") or [] if isinstance(t, dict)}
    context = prepare_run(model, options, exporting=False)
    groups = reference_groups([t.dtype for t in context.targets], context.checkpoint_dtype)
    workbench = Workbench.load(context, options, dtype=groups[0][0])
    order = [(dtype, context.targets[i]) for dtype, members in groups for i in members]
    results = []
    for index, (dtype, target) in enumerate(order):
        if dtype != order[index - 1][0] and index:  # the next group's references in its dtype (as `run` does)
            workbench.convert(dtype)
        target = workbench.plan(target)
        result = new_result(target, context, options)
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
        if _saved_layout(directory) not in RUNNER_LAYOUTS:  # a default runner program that was exported as methods
            workbench.plan_methods_layout(target, llm_runner.NOT_RUNNER.format(
                why="the folder's program has the methods layout (its export.json)"))
            llm_runner.prompt_as_recorded(target, _manifest(directory))  # its prompt as exported, not as today
        waveform_as_recorded(target, _manifest(directory))  # a Moonshine encoder's waveform as exported
        try:
            components = workbench.components(target, context.recipe) if workbench.unprepared is None else None
        except BaseException as err:  # a capture that fails, a decode that could not run a second step
            if not recoverable(err):
                raise
            result.error = error_record(err)
            continue
        if components is None:
            result.error = dict(workbench.unprepared or {})
            continue
        result.expected_components = workbench.expected(target, components)
        result.findings += [note for note in workbench.contract_notes(target) if note in workbench.not_runner.values()]
        saved = SavedTarget(directory, trust_artifacts=options.trust_remote_code, device=result.device)
        _validate_into(result, target, context, workbench, saved, last=index == len(order) - 1)
        result.files = file_entries(directory, out_dir)
        record_footprint(result, target, directory, workbench.weights)
    return write_results(results, context)


def _saved_layout(directory: Path) -> str | None:
    """The layout a saved target's export.json records (`"runner"` for the LLM runner's program), else None (also
    for a manifest that does not read: validation reports that one)."""
    return _manifest(directory).get("layout")


def _manifest(directory: Path) -> dict[str, Any]:
    """A saved target's export.json, or {} where it does not read (validation reports that one)."""
    try:
        return read_manifest(directory)
    except ArtifactError:
        return {}

"""`hf-export init`: propose a recipe that is known to work, by probing the model with the real pipeline.

```
model ─► axes that vary in use (init_axes) ─► candidate recipe, one target per format
      ─► run_pipeline (real exports in isolated children, validation at unseen shapes) ─► read report.json
      ─► per target: passed → keep │ export failed → demote the dims it names (named → auto → static)
                                   │ a probe failed → narrow that dim's range (halve the gap) │ otherwise: left out
      ─► next round with the unsettled targets, until every format passed or was left out (or time ran out)
      ─► tolerances from the worst measured diff, the full-form recipe, a summary
```

No second exporter and no second validator: every candidate is a recipe run by `run_pipeline` into a work folder,
and every decision is read from its `report.json`. The recipe written is one that passed (its bounds are the ones
probed); only the tolerances are set afterwards, at a margin above the worst difference measured on those probes.

Example:
    >>> result = init_recipe("org/model", InitOptions(formats=["dynamo", "onnx"]))  # doctest: +SKIP
    >>> result.recipe["exports"][0]["name"]  # doctest: +SKIP
    'dynamo'
"""

from __future__ import annotations

import copy
import gc
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exporters import fsutil
from exporters.capture.dtypes import checkpoint_dtype, default_dtype
from exporters.capture.merged import MERGED
from exporters.capture.loading import load_model
from exporters.capture.source import SourceOptions, check_remote_code, load_tokenizer, read_config
from exporters.errors import InitError
from exporters.init.axes import AxisPlan, Dimension, find_dimensions, spec_entries
from exporters.init.classify import NOT_RETRIED
from exporters.init.decide import (
    COMPONENT_GRAPHS,
    DYNAMIC_GRAPH,
    MARGIN,
    MERGED_GRAPH,
    METHODS_GRAPH,
    PLAIN_TARGET_GRAPHS,
    RUNNER_GRAPH,
    FormatResult,
    decide,
    nice_ceil,
)
from exporters.init.summary import exported_words
from exporters.init.variants import try_variants
from exporters.recipe.load import parse_recipe_data
from exporters.recipe.model import FORMATS, SCHEMA_VERSION, GenerationSpec, Recipe
from exporters.run.context import tool_versions
from exporters.run.memory_plan import plan_memory
from exporters.run.pipeline import RunOptions, run_pipeline
from exporters.status import LEFT_OUT, NAMED, PASSED, PENDING
from exporters.validate.checks import DEFAULT_TOLERANCES

FLOOR_FRACTION = 0.1  # ... and at least this fraction of the format's default atol (identical kernels measure 0)
DEFAULT_MAX_SECONDS = 1800.0
DEFAULT_MAX_ROUNDS = 6
MIN_ROUND_SECONDS = 5.0


@dataclass(kw_only=True)
class InitOptions(SourceOptions):
    """What `hf-export init` was asked to do (where the model comes from: its `SourceOptions` part).

    Example:
        >>> options = InitOptions(formats=["dynamo"], max_seconds=600)
    """

    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    max_seconds: float = DEFAULT_MAX_SECONDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_probe_elements: int = 1_000_000
    work_dir: Path | None = None  # kept when given (round recipes, reports, logs); a temporary folder otherwise
    progress: Callable[[str], None] | None = None
    pipeline_progress: bool = False
    quantized: bool = True  # a decoder-only LLM's 4-bit variant beside fp32, where it passes (exporters.init.variants)
    # keep each checked export for the `run` that asks for it on this machine (exporters.run.handover); off where no
    # run follows here (the bot's proposals, the Action's init mode): the exports would only fill the disk for a day
    hand_over: bool = True


@dataclass
class InitResult:
    """The proposal: `recipe` (full form, JSON-ready; None when no format works), one `FormatResult` per format
    asked for, notes for everything that could not be made to work."""

    model: str
    family: str
    mode: str
    components: list[str]
    recipe: dict[str, Any] | None
    formats: list[FormatResult]
    notes: list[str]
    elapsed_s: float
    versions: dict[str, str]

    @property
    def passed(self) -> list[FormatResult]:
        return [f for f in self.formats if f.status == PASSED]


# ── Candidate recipes ─────────────────────────────────────────────────────────


def _axis_value(dimension: Dimension, state: str) -> Any:
    if state == NAMED:
        return {"name": dimension.name, "min": dimension.low, "max": dimension.high}
    return state  # "auto" | "static"


# the families whose plain ExecuTorch generation target the tool makes a runner's program (#52): MultimodalRunner's
# (vision- and audio-language) or the ASR runner's (speech seq2seq) where the model fits, else the methods layout with
# the reason; per-component settings would force the methods layout, which no runtime loads
RUNNER_FAMILIES = ("vision-language", "audio-language", "speech-seq2seq")


def default_graph(plan: AxisPlan, export_format: str) -> str:
    """The graphs init proposes first for a format: the tool's default where it applies, weights stored once (the
    merged graph for dynamo and ONNX, the ExecuTorch LLM runner's program; for a vision-language, audio-language or
    speech model the plain ExecuTorch target, MultimodalRunner's or the ASR runner's program; for a speech model's
    ONNX the plainest dynamic target, optimum's merged decoder and GenAI's graphs), else one graph per component. A
    model
    mixing window and full layers gets the merged graph for ONNX alone (`AxisPlan.merged_formats`), as its plainest
    recipe does (`exporters.capture.merged.windows_keep_apart`)."""
    if export_format == "executorch" and plan.mode == "generation" and plan.family in RUNNER_FAMILIES:
        return RUNNER_GRAPH  # the plain target: MultimodalRunner's or the ASR runner's program where the model fits
    if export_format == "onnx" and plan.mode == "generation" and plan.family == "speech-seq2seq":
        return DYNAMIC_GRAPH  # GenAI feeds the whole decoder prompt at any batch: `dynamic: true`'s contract
    if plan.merged is None or export_format not in plan.merged_formats:
        return COMPONENT_GRAPHS
    return RUNNER_GRAPH if export_format == "executorch" else MERGED_GRAPH


def first_dims(plan: AxisPlan, graph: str) -> list[Dimension]:
    """The dimensions a format starts from: the merged graph's, none for the runner program (its contract is the
    runner's: tokens of any length, a static cache) nor for the plainest dynamic target (`dynamic: true`'s), else
    the components'."""
    chosen = {MERGED_GRAPH: plan.merged or [], RUNNER_GRAPH: [], DYNAMIC_GRAPH: []}.get(graph, plan.dimensions)
    return copy.deepcopy(chosen)


def build_target(export_format: str, plan: AxisPlan, dims: list[Dimension], opset: int | None = None,
                 graph: str = COMPONENT_GRAPHS, dtype: str | None = None) -> dict:
    """One recipe target: the mode, the complete component set, each component's dynamic-shape contract. `graph`
    (`default_graph`): the merged graph (`model`) with its contract, the runner program (the plain target: the
    tool's default), or one graph per component. `dtype`: set where a dtype/kernel failure was retried in it."""
    target: dict[str, Any] = {"name": export_format, "export_format": export_format, "mode": plan.mode}
    if dtype is not None:
        target["dtype"] = dtype
    components = [MERGED] if graph == MERGED_GRAPH else list(plan.components)
    if plan.mode == "generation" and graph not in PLAIN_TARGET_GRAPHS:
        target["expected_components"] = [MERGED] if graph == MERGED_GRAPH else list(plan.expected)
    if export_format == "onnx" and opset is not None:
        target["opset_version"] = opset
    if export_format == "executorch":
        target["backend"] = "xnnpack"
    if graph in PLAIN_TARGET_GRAPHS:
        return {**target, "dynamic": True} if graph == DYNAMIC_GRAPH else target
    per_component: dict[str, dict[str, Any]] = {}
    for component in components:
        spec: dict[str, dict[str, Any]] = {}
        named = False
        for dimension in dims:
            state = dimension.state.get(component)
            if state is None:
                continue
            named |= state == NAMED
            for key, axes in spec_entries(dimension.axes[component], plan.leaves[component],
                                          _axis_value(dimension, state)).items():
                spec.setdefault(key, {}).update(axes)
        if spec and graph == MERGED_GRAPH and export_format == "onnx":  # the padding mask ONNX runtimes feed
            batch = spec.get("input_ids", {}).get("0", "static")
            spec["attention_mask"] = {"0": copy.deepcopy(batch), "1": "auto"}  # past + query: no single dim
        if spec:
            per_component[component] = {"dynamic_shapes": dict(sorted(spec.items()))}
            if named:  # named ranges need deferred asserts (docs/recipe.md)
                per_component[component]["prefer_deferred_runtime_asserts_over_guards"] = True
    if plan.mode == "model":
        target.update(per_component.get("model", {}))
    elif per_component:
        target["components"] = per_component
    return target


def build_recipe(plan: AxisPlan, targets: list[dict], validation: dict[str, Any]) -> dict[str, Any]:
    """The full-form recipe (schema-valid: it is parsed before it is returned)."""
    recipe: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "exports": targets,
        "inputs": {"batch_size": plan.inputs.batch_size, "sequence_length": plan.inputs.sequence_length,
                   "seed": plan.inputs.seed},
    }
    if plan.mode == "generation":
        # the cache is left to each target's default (exporters.capture.cache_settings): dynamic where a cache axis is declared
        recipe["generation"] = {"max_new_tokens": GenerationSpec().max_new_tokens}
    recipe["validation"] = validation
    parse_recipe_data(recipe)
    return recipe




# ── The search ────────────────────────────────────────────────────────────────


def init_recipe(model: str, options: InitOptions | None = None) -> InitResult:
    """Propose a recipe for `model` (a local folder or a Hub repo id): every format of `options.formats` is exported
    and validated by the real pipeline, round after round, until it passes or is left out.

    Returns the `InitResult`; raises `InitError` (holding the result) when no format passed, `ModelSourceError` /
    `RemoteCodeError` when the model cannot be loaded under the same rules as `hf-export run`, `MemoryPlanError`
    when even one export at a time would not fit (`exporters.run.memory_plan`).

    Example:
        >>> result = init_recipe("examples/demo-model", InitOptions(formats=["dynamo"]))  # doctest: +SKIP
        >>> [f.status for f in result.formats]  # doctest: +SKIP
        ['passed']
    """

    options = options or InitOptions()
    started = time.time()
    say = options.progress or (lambda _message: None)
    source = options.resolve(model)
    config = read_config(source.folder)
    check_remote_code(source, config, options.trust_remote_code)
    own = checkpoint_dtype(source.folder, config)  # before loading: even one format's round must fit (exit 2)
    plan_memory(source.folder, [(fmt, default_dtype(fmt, own)) for fmt in dict.fromkeys(options.formats)], own, 1,
                requested=True, notes=[], selects="formats")
    say(f"loading {source.display} and finding the axes that vary in use")
    loaded = load_model(source, trust_remote_code=options.trust_remote_code)
    base = Recipe(exports=[{"export_format": "dynamo"}])
    plan = find_dimensions(loaded, base, tokenizer=load_tokenizer(source.folder),
                           max_probe_elements=options.max_probe_elements)
    del loaded
    gc.collect()  # each round's pipeline loads its own copy
    results = [FormatResult(fmt, dims=first_dims(plan, graph), graph=graph)
               for fmt in dict.fromkeys(options.formats) for graph in [default_graph(plan, fmt)]]
    decomposed = f" ({', '.join(plan.components)} when decomposed)" if plan.components != [MERGED] else ""
    say(f"{plan.family} model, {plan.mode} mode{decomposed}; dimensions: "
        + (", ".join(f"{d.name} {d.low}..{d.high} ({d.limit})" for d in plan.dimensions) or "none"))
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="hf-export-init-"))
    work.mkdir(parents=True, exist_ok=True)
    passed = [r for r in results if r.status == PASSED]
    validation: dict[str, Any] = {}
    try:
        _rounds(str(source.folder), plan, results, options, work, started, say)
        passed = [r for r in results if r.status == PASSED]
        for result in passed:
            _finish_tolerance(result)
            result.target = build_target(result.export_format, plan, result.dims, result.opset_version, result.graph,
                                         result.dtype)
        validation = {"formats": {r.export_format: r.tolerance for r in passed},
                      "max_probe_elements": options.max_probe_elements}
        if options.quantized and passed:  # the variant LLMs are deployed in, where it keeps its budget
            try_variants(str(source.folder), plan.family, passed, lambda targets: build_recipe(
                plan, targets, validation), work, RunOptions(out_dir=work, trust_remote_code=options.trust_remote_code,
                                                            progress=options.pipeline_progress,
                                                            timeout=started + options.max_seconds - time.time()),
                say)
    finally:
        if options.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    recipe = build_recipe(plan, [r.target for r in passed], validation) if passed else None
    result = InitResult(model=model, family=plan.family, mode=plan.mode, components=plan.expected, recipe=recipe,
                        formats=results, notes=_notes(plan, results), elapsed_s=round(time.time() - started, 1),
                        versions=tool_versions())
    if not passed:
        reasons = "; ".join(f"{f.export_format}" + (f" [{f.failure.label}]" if f.failure else "") + f": {f.reason}"
                            for f in result.formats)
        raise InitError(f"no format could be exported and validated for {model} ({reasons})", result)
    return result


def _rounds(folder: str, plan: AxisPlan, results: list[FormatResult], options: InitOptions, work: Path,
            started: float, say: Callable[[str], None]) -> None:
    """Run rounds of the pipeline on the unsettled formats until each passed or was left out."""

    deadline = started + options.max_seconds
    number = 0
    while pending := [r for r in results if r.status == PENDING]:
        remaining = deadline - time.time()
        if remaining < MIN_ROUND_SECONDS:
            for result in pending:
                result.status = LEFT_OUT
                result.reason = (f"not settled within the time budget of {options.max_seconds:g} s "
                                 f"(after {result.rounds} round(s)): give it more time")
            return
        number += 1
        for result in pending:
            result.rounds += 1
        tolerances = {r.export_format: {"atol": r.atol_override} for r in pending if r.atol_override}
        targets = [build_target(r.export_format, plan, r.dims, graph=r.graph, dtype=r.dtype) for r in pending]
        recipe = build_recipe(plan, targets, {"formats": tolerances, "max_probe_elements": options.max_probe_elements})
        if options.work_dir is None and number > 1:  # a temporary folder keeps only the round at hand
            shutil.rmtree(work / f"round-{number - 1}", ignore_errors=True)
        folder_of_round = work / f"round-{number}"  # each round's recipe, report and logs, kept apart
        path, out = folder_of_round / "recipe.json", folder_of_round / "out"
        folder_of_round.mkdir(parents=True, exist_ok=True)
        fsutil.write_file(path, json.dumps(recipe, indent=2) + "\n")
        say(f"round {number}: exporting and validating " + ", ".join(map(exported_words, targets))
            + f" ({int(remaining)} s left)")
        run = RunOptions(out_dir=out, config_path=path, trust_remote_code=options.trust_remote_code,
                         progress=options.pipeline_progress, use_cache=False, bench=False,  # timings decide nothing here
                         timeout=max(remaining / len(pending), 1.0), hand_over=options.hand_over,  # run.handover
                         probe_dims_apart=True)  # decide.py reads each dim's verdict at each size
        report = run_pipeline(folder, run)
        by_name = {t["name"]: t for t in report["targets"]}
        for result in pending:
            known = {id(d): len(d.reasons) for d in result.dims}
            decide(result, by_name[result.export_format], options.max_rounds)
            if result.status == PASSED and result.graph == RUNNER_GRAPH:
                _note_methods_layout(result, by_name[result.export_format], out / result.export_format)
            if result.status == PASSED and result.export_format == "onnx":
                result.opset_version = _onnx_opset(out / "onnx")
            changes = [reason[:200] for d in result.dims for reason in d.reasons[known[id(d)]:]]
            if result.status == PENDING and result.atol_override:
                changes.append(f"atol {result.atol_override:g}")
            if result.status == PENDING and result.dtype and not changes:
                changes.append(f"dtype {result.dtype} ({result.failure.label if result.failure else 'dtype'})")
            if result.status == LEFT_OUT and result.graph != COMPONENT_GRAPHS and not (
                    result.failure and result.failure.kind in NOT_RETRIED):  # a graph change cures none of those
                changes = [_fall_back(result, plan)]
            failed = f" [{result.failure.label}]" if result.failure else ""
            say(f"  {result.export_format}: " + {PASSED: "passed", LEFT_OUT: f"left out{failed} — {result.reason}"}.get(
                result.status, "next round: " + "; ".join(changes)))


def _fall_back(result: FormatResult, plan: AxisPlan) -> str:
    """The default graph did not validate: the next round tries one graph per component, and the notes say why."""
    what = {MERGED_GRAPH: "the merged graph", DYNAMIC_GRAPH: "the plainest dynamic target (`dynamic: true`)"}.get(
        result.graph, "the ExecuTorch runner's program")
    note = (f"{what} (the default, weights stored once) did not validate ({(result.reason or '')[:300]}): proposed "
            f"{', '.join(plan.expected)} as separate graphs")
    result.notes.append(note)
    result.graph, result.status, result.reason = COMPONENT_GRAPHS, PENDING, None
    result.dims, result.atol_override = copy.deepcopy(plan.dimensions), None
    return note


# how each runner layout's findings begin where the plain target kept the methods layout (exporters.capture's
# llm_runner.NOT_RUNNER, asr_runner.NOT_ASR, multimodal_runner.NOT_MULTIMODAL)
METHODS_KEPT_FINDING = "the ExecuTorch program has a method per component (layout 'methods'), not "


def _note_methods_layout(result: FormatResult, target: dict, directory: Path) -> None:
    """The plain ExecuTorch target passed with the methods layout (the runner's program cannot hold this model): the
    proposal says so, with the run's reason, instead of promising the LLM runner's program."""
    try:
        layout = json.loads((directory / "export.json").read_text()).get("layout")
    except (OSError, ValueError, AttributeError):
        layout = None
    methods = target.get("expected_components") or []
    if layout == RUNNER_GRAPH and "encoder" in methods:  # a speech model's (exporters.capture.asr_runner)
        result.program = "the ExecuTorch ASR runner's program"
        result.notes.append(f"the plain ExecuTorch target is the ExecuTorch ASR runner's program (layout 'runner': "
                            f"{', '.join(methods)})")
        return
    if layout == RUNNER_GRAPH:
        return
    if layout == "multimodal_runner":  # a vision-language model's runner program (exporters.capture.multimodal_runner)
        result.program = "ExecuTorch MultimodalRunner's program"
        result.notes.append("the plain ExecuTorch target is ExecuTorch MultimodalRunner's program (layout "
                            f"'multimodal_runner': {', '.join(methods)})")
        return
    result.graph = METHODS_GRAPH
    reason = next((f for f in target.get("findings") or [] if METHODS_KEPT_FINDING in f), "")
    result.notes.append(reason or "the plain ExecuTorch target was exported with a method per component (layout "
                        "'methods'), not a runner's program")


def _onnx_opset(directory: Path) -> int | None:
    """The default-domain opset of the exported graphs (what the ONNX target was validated with)."""
    # onnx loads only where an ONNX file is read
    import onnx

    versions = set()
    for path in sorted(directory.glob("*.onnx")):
        graph = onnx.load(str(path), load_external_data=False)
        versions |= {entry.version for entry in graph.opset_import if entry.domain in ("", "ai.onnx")}
    return versions.pop() if len(versions) == 1 and 18 <= next(iter(versions)) <= 23 else None


def _finish_tolerance(result: FormatResult) -> None:
    """atol = MARGIN × the worst |diff| measured, rounded up, at least a tenth of the format's default; rtol 0, so
    the bound is exactly that. Looser than the default only when the probes needed it, and then it says so."""

    default_atol, _ = DEFAULT_TOLERANCES[result.export_format]
    worst = result.worst_abs_diff or 0.0
    floor = default_atol * FLOOR_FRACTION
    atol = nice_ceil(max(worst * MARGIN, floor, result.atol_override or 0.0))
    result.tolerance = {"atol": atol, "rtol": 0}
    result.tolerance_note = (f"worst |diff| {worst:.1e} over {result.probes} checks; atol {atol:g} = {MARGIN}× that, "
                             f"rounded up, at least {floor:g}; rtol 0")
    if atol > default_atol:
        result.tolerance_note += (f" — looser than the {result.export_format} default atol {default_atol:g}: the "
                                  "measured differences need it")


def _notes(plan: AxisPlan, results: list[FormatResult]) -> list[str]:
    """Everything init could not make work, and why: quantities that cannot vary, narrowed or static axes, left-out
    formats. The components' own dims are said unless every format got a merged graph found on another capture (a
    mix of window and full layers proposed for ONNX alone: its own cache's window bounds only the components)."""
    notes = list(plan.notes)
    apart = bool(plan.merged and results and plan.merged_formats != FORMATS
                 and all(result.graph == MERGED_GRAPH for result in results))
    for dimension in ([] if apart else plan.dimensions):
        notes += dimension.reasons
    seen = {reason for d in ([] if apart else plan.dimensions) for reason in d.reasons}
    for result in results:
        notes += [f"{result.export_format}: {reason}" for d in result.dims for reason in d.reasons
                  if reason not in seen]
        if result.status != PASSED:
            notes.append(f"{result.export_format}: left out — {result.reason}")
            continue
        notes += [f"{result.export_format}: {note}" for note in result.notes]
        if "looser" in result.tolerance_note:
            notes.append(f"{result.export_format}: tolerance {result.tolerance_note}")
    return notes

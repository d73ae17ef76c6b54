"""Numerical validation of saved artifacts against the eager model.

Every target is loaded back from disk with upstream's runner and compared with the eager model at the traced
inputs, at shapes it was not traced with (inside every declared dynamic range), and, for generation exports, by
greedy decoding driven by the exported components only. The eager side (every reference, computed once per run and
shared by the targets: `exporters.validate.eager_side`) may be computed before the artifact exists; this module
loads the artifact and compares.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from exporters.capture.components import read_glue
from exporters.capture.families import MULTIMODAL_GENERATORS
from exporters.capture.merged import MERGED
from exporters.errors import ArtifactError, RemoteCodeError, describe_error, recoverable
from exporters.recipe.model import Recipe
from exporters.recipe.budgets import resolve_budget, variant_kind
from exporters.report.results import Check, ComponentReport, OutputDiff, ValidationResult
from exporters.upstream import (
    counter_in_spec_components,
    leaf_tensors,
    load_exported,
    read_manifest,
    run_component,
    runner_for_file,
)
from exporters.validate.arbitration import Arbiter
from exporters.validate.eager_side import EagerSide, eager_side
from exporters.validate.folder_trust import may_read, screen_folder
from exporters.validate.greedy import Tolerances
from exporters.validate.native_log import native_messages
from exporters.validate.ort_schemas import ort_checker_schemas
from exporters.validate.parity import generation_parity
from exporters.validate.quality import judge, judge_generation, measure, tolerance_verdict
from exporters.validate.runtimes import (ProofsInFlight, RuntimeContext, RuntimeProof, checks_for, declined,
                                         references_for)
from exporters.validate.sliding import COUNTER_FINDING, sliding_cache_leaves, trailing_window
from exporters.validate.subject import EagerModel, SavedTarget
# DEFAULT_TOLERANCES: re-exported for the modules that read it from here
from exporters.validate.tolerances import DEFAULT_TOLERANCES, dtype_tolerance, tolerance_for  # noqa: F401

def compare_outputs(expected: Any, actual: Any, atol: float, rtol: float) -> list[OutputDiff]:
    """Per output leaf: max absolute and relative difference and a verdict; NaN or inf never passes."""

    want, got = leaf_tensors(expected), leaf_tensors(actual)
    sliding = sliding_cache_leaves(expected)
    diffs = []
    for name, reference in want.items():
        if name not in got:
            diffs.append(OutputDiff(name, None, None, atol, rtol, False, "missing from the artifact's outputs"))
            continue
        value, note = got[name], None
        window = trailing_window(value, reference) if name in sliding else None
        if window is not None:  # the exported sliding layer keeps its full history (exporters.validate.sliding)
            note = f"sliding-window cache: the artifact's last {reference.shape[-2]} of {value.shape[-2]} positions"
            value = window
        if tuple(value.shape) != tuple(reference.shape):
            diffs.append(
                OutputDiff(name, None, None, atol, rtol, False, f"shape {list(value.shape)} != {list(reference.shape)}")
            )
            continue
        if not reference.is_floating_point():
            equal = bool(torch.equal(value.to(reference.dtype).cpu(), reference.cpu()))
            diffs.append(OutputDiff(name, 0.0 if equal else None, 0.0 if equal else None, atol, rtol, equal,
                                    None if equal else "integer outputs differ"))
            continue
        diffs.append(_difference(name, reference, value, atol, rtol, note))
    return diffs


# Differences are computed a slice at a time: a 512-token prompt's logits over a 150k vocabulary are 300 MB, and the
# five full-size temporaries of a whole-tensor comparison made validation the run's largest allocation.
COMPARE_CHUNK_ELEMENTS = 1 << 22


def _difference(name: str, reference: torch.Tensor, value: torch.Tensor, atol: float, rtol: float,
                note: str | None) -> OutputDiff:
    """One floating output leaf against its reference (same shape): max absolute and relative difference, passed when
    every element is within `atol + rtol * |reference|`; NaN or inf in the artifact's output never passes.

    Example:
        >>> _difference("logits", torch.ones(3), torch.ones(3) + 1e-6, 1e-5, 1e-4, None).passed
        True
    """
    # float32 is exact enough for differences of float32-or-narrower outputs; float64 outputs keep float64.
    work = torch.float64 if reference.dtype == torch.float64 else torch.float32
    want, got = reference.detach().reshape(-1), value.detach().reshape(-1)
    if got.numel() == 0:
        return OutputDiff(name, 0.0, 0.0, atol, rtol, True, note)
    passed, largest_abs, largest_rel = True, [], []
    for start in range(0, got.numel(), COMPARE_CHUNK_ELEMENTS):
        val = got[start:start + COMPARE_CHUNK_ELEMENTS].cpu().to(work)
        if not torch.isfinite(val).all():
            return OutputDiff(name, math.inf, math.inf, atol, rtol, False, "non-finite values (NaN or inf)")
        ref = want[start:start + COMPARE_CHUNK_ELEMENTS].cpu().to(work)
        abs_diff = val.sub(ref).abs_()
        magnitude = ref.abs()
        passed = passed and bool(torch.isfinite(ref).all()) and bool((abs_diff <= atol + rtol * magnitude).all())
        largest_abs.append(abs_diff.max())
        largest_rel.append(abs_diff.div_(magnitude.clamp_min_(1e-12)).max())  # in place: no third slice
    # torch's max keeps a NaN (a non-finite reference) where Python's max would drop it
    max_abs, max_rel = float(torch.stack(largest_abs).max()), float(torch.stack(largest_rel).max())
    return OutputDiff(name, max_abs, max_rel, atol, rtol, passed, note)


def shapes_of(inputs: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(t.shape) for name, t in leaf_tensors(inputs).items()}


def structural_checks(export_format: str, directory: Path) -> list[str]:
    """Format checks on the saved files: `onnx.checker` with external data, the ExecuTorch methods."""
    notes = []

    manifest = read_manifest(directory)
    for name, entry in manifest["components"].items():
        path = directory / entry["file"]
        if export_format == "onnx":
            # onnx loads only where an ONNX file is read
            import onnx

            with ort_checker_schemas() as declared:  # a graph fused for ONNX Runtime holds its ops
                onnx.checker.check_model(str(path), full_check=False)
            uses = sorted({node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node
                           if node.domain in ("", "ai.onnx") and node.op_type in declared})
            own = f"; ONNX Runtime's {', '.join(uses)} checked against its own schema" if uses else ""
            notes.append(f"{name}: onnx.checker passed ({entry['file']}{own})")
        elif export_format == "executorch":
            # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
            from executorch.runtime import Runtime

            data = directory / entry["data_file"] if entry.get("data_file") else None
            methods = sorted(Runtime.get().load_program(path, data_path=data).method_names)
            method = entry.get("method", "forward")  # a program with a method per component names it
            if method not in methods:
                raise ValueError(f"{entry['file']} has no '{method}' method (methods: {methods})")
            weights = f", weights in {entry['data_file']}" if data else ""
            notes.append(f"{name}: ExecuTorch program loads, methods {methods}{weights}")
        elif export_format == "dynamo":
            notes.append(f"{name}: torch.export program loads ({entry['file']})")
    return notes


def specialized_axes(export_format: str, directory: Path, spec_by_component: dict[str, Any]) -> list[str]:
    """Declared-dynamic axes that the saved graph fixed to one size (read from the ONNX graph's input dims)."""
    if export_format != "onnx":
        return []
    # onnx loads only where an ONNX file is read
    import onnx

    findings = []
    manifest = read_manifest(directory)
    for name, entry in manifest["components"].items():
        bindings = spec_by_component.get(name) or []
        model = onnx.load(str(directory / entry["file"]), load_external_data=False)
        dims = {
            value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in model.graph.input
        }
        for binding in bindings:
            for path, axis in binding.axes:
                renamed = {leaf: graph for graph, leaf in (entry.get("inputs") or {}).items()}  # transformers.js
                graph_dims = dims.get(path) or dims.get(f"input.{path}") or dims.get(renamed.get(path, ""))
                if graph_dims is not None and axis < len(graph_dims) and isinstance(graph_dims[axis], int):
                    findings.append(
                        f"{name}: '{path}' axis {axis} is declared dynamic ('{binding.name}') but the exported "
                        f"graph fixed it to {graph_dims[axis]}"
                    )
    return findings


@dataclasses.dataclass
class Judging:
    """How a component's probes are judged beyond atol/rtol. `measured` (a quantized or half-precision target): each
    probe gets task metrics instead, collected there for the target's verdict (exporters.validate.quality); `ties`: a
    half-precision target's dtype tolerance, within which a differing top-1 is a tie; `arbiter` (a float32 target's):
    a failed comparison judged against eager in float64 ([`arbitrate`]); `rows`: per probe, the rows the metrics judge
    (a decoder fed an image's features: its text rows, `exporters.validate.judged_rows`), None for every row."""

    measured: list[tuple[str, str, dict[str, Any]]] | None = None
    ties: tuple[float, float] | None = None
    arbiter: Arbiter | None = None
    rows: list[torch.Tensor | None] | None = None


def probe_component(report: ComponentReport, runner: Any, probes: list, references: list[Any],
                    tolerance: tuple[float, float], findings: list[str], judging: Judging | None = None) -> None:
    """Run every probe through the artifact's `runner` and compare with its eager reference; one `Check` each.
    `probes` hold what the graph takes (`with_precomputed_inputs`); `judging`: see [`Judging`]."""
    judging = judging or Judging()
    measured, ties, arbiter = judging.measured, judging.ties, judging.arbiter
    atol, rtol = tolerance
    for index, ((probe_id, probe, skip), reference) in enumerate(zip(probes, references)):
        if probe is None:
            report.checks.append(Check(probe_id, {}, skipped=True, error=skip))
            continue
        check = Check(probe_id, shapes_of(probe))
        report.checks.append(check)
        if isinstance(reference, BaseException):
            check.skipped, check.error = True, f"the eager model cannot run this probe: {describe_error(reference)}"
            continue
        try:
            with native_messages():
                actual = run_component(runner, probe)
        except BaseException as err:
            if not recoverable(err):
                raise
            check.passed, check.error = False, describe_error(err)
            if probe_id != "traced":
                findings.append(f"{report.name}: the artifact does not run at {probe_id} (declared dynamic): it was "
                                f"specialized or bounded at export — {describe_error(err)[:300]}")
            continue
        if measured is not None:
            check.quality = measure(reference, actual, ties, judging.rows[index] if judging.rows else None)
            check.passed, check.error = not check.quality["problems"], "; ".join(check.quality["problems"]) or None
            measured.append((report.name, probe_id, check.quality))
            continue
        check.outputs = compare_outputs(reference, actual, atol, rtol)
        check.passed = all(o.passed for o in check.outputs)
        if not check.passed and arbiter is not None:
            arbitrate(check, report.name, arbiter.judge(index, reference, actual, atol, rtol, compare_outputs),
                      findings)


def arbitrate(check: Check, component: str, record: dict[str, Any], findings: list[str]) -> None:
    """A failed float32 check judged again against eager in float64 (`exporters.validate.arbitration`): where the
    artifact is within tolerance of float64, the check passes on those outputs, the float32 comparison kept beside
    them (`float32_outputs`); otherwise it stays failed, the float64 comparison recorded. Both said in a finding."""
    if "error" in record:
        check.float64 = record
        findings.append(f"{component}: at {check.probe} {record['error']}")
        return
    worst = max((o.max_abs_diff or 0.0 for o in record["eager_float32"]), default=0.0)
    artifact = max((o.max_abs_diff or 0.0 for o in record["outputs"]), default=0.0)
    within = "within" if all(o.passed for o in record["eager_float32"]) else "beyond"
    if record["passed"]:
        check.float64 = {"float32_outputs": check.outputs, "eager_float32": record["eager_float32"]}
        check.outputs = [dataclasses.replace(o, note="against eager in float64 (eager float32 failed the check)")
                         for o in record["outputs"]]
        check.passed = True
        findings.append(f"{component}: at {check.probe} the artifact failed the check against eager float32, which "
                        f"is itself off by {worst:.3g} from eager in float64 ({within} the tolerance); the artifact "
                        f"is within it of float64 (off by {artifact:.3g}) and is judged against float64")
        return
    check.float64 = {"outputs": record["outputs"], "eager_float32": record["eager_float32"]}
    findings.append(f"{component}: at {check.probe} the artifact is off by {artifact:.3g} from eager in float64 "
                    f"too, beyond the tolerance (eager float32 by {worst:.3g}, {within} it): not the reference's "
                    "rounding")


# ── One target ────────────────────────────────────────────────────────────────


def validate_target(
    *, target, recipe: Recipe, saved: SavedTarget, components, subject: EagerModel,
    expected_components: list[str] | None = None, release_model=None, precomputed: EagerSide | None = None,
) -> ValidationResult:
    """Load the saved target from `saved.directory` and run every check against `subject` (the eager model and
    what comes with it). `release_model`, when given, is called once the eager references are computed, before the
    artifact is loaded (the caller frees the eager weights there). `precomputed`: the target's eager side computed
    ahead ([`eager_side`], for the components it was to have); it is used where it holds for the target
    (`EagerSide.usable_for`), else computed here.

    `saved.trust_artifacts`: the folder's pickled programs (`.pt2`) may be loaded (this run wrote them, or the
    operator allowed it); nothing else in the folder ever runs (its config's `auto_map` is never read).
    `saved.device`: where the artifact runs (the target's); the eager references stay where the model is.
    `saved.proofs`: False where the folder's runtimes prove it elsewhere (a dtype file: `validate.dtype_files`).
    `saved.inventory`: what this run's export wrote and copied into the folder (`folder_trust.take_inventory`), all a
    runtime may read there; None for a folder this run did not write. A folder a runtime may not open
    (`folder_trust.screen_folder`) fails, unopened.
    """
    directory, trust_artifacts, device, inventory, proofs = (saved.directory, saved.trust_artifacts, saved.device,
                                                             saved.inventory, saved.proofs)
    model, family, generate_inputs = subject.model, subject.family, subject.generate_inputs
    generation_config, source_dir = subject.generation_config, subject.source_dir

    # Quantized and half-precision targets are judged by task metrics against the eager float32 model (never by a
    # looser atol), float32 ones by atol/rtol.
    kind = variant_kind(target.quantize, target.dtype)
    budget = resolve_budget(kind, target.validation) if kind != "fp32" else None
    measured: list[tuple[str, str, dict[str, Any]]] | None = [] if budget is not None else None
    # a half-precision program may order eager's near-equal scores either way: within the dtype's own tolerance (never
    # the recipe's atol), a differing top-1 is a tie (exporters.validate.quality.top1_ties)
    ties = dtype_tolerance(target.export_format, target.dtype) if kind == "half" else None
    eager_dtype = str(getattr(model, "dtype", "float32")).removeprefix("torch.")

    findings: list[str] = []
    if budget is not None and eager_dtype != "float32":
        findings.append(f"quality measured against the eager model in {eager_dtype}: a target in the checkpoint's "
                        "own precision, or in the only precision the run asks for, is compared with the model in "
                        "that precision (exporters.capture.dtypes)")
    errors: list[str] = []
    reports: list[ComponentReport] = []
    expected = list(expected_components if expected_components is not None else components)
    generation_expected = target.mode == "generation"
    saved_components: list[str] = []
    try:
        saved_components = list(read_manifest(directory)["components"])
    except ArtifactError as err:
        errors.append(str(err))
    missing = [name for name in expected if name not in saved_components]
    extra = [name for name in saved_components if name not in expected]
    if missing:
        errors.append(f"missing component(s) {missing}: expected {expected}, the saved export has {saved_components}")
    if extra:
        errors.append(f"unexpected component(s) {extra}: expected {expected}, the saved export has {saved_components}")
    if errors:
        return ValidationResult(reports, None, findings, errors, generation_expected)
    # Two phases: every eager reference first (probes, generation, the runtimes'; computed ahead by a run while the
    # export was running, `precomputed`), then the artifact, so the eager weights can be freed in between
    # (`release_model`, on a run's last target): the two are never in memory together.
    refused = screen_folder(directory, inventory)  # before any runtime opens the folder
    applicable = [check for check in checks_for(target, directory) if proofs and may_read(check, inventory)]
    if refused:
        why = "not run, the folder was refused: " + "; ".join(refused)
        return ValidationResult(reports, None, findings, refused, generation_expected,
                                runtimes=[RuntimeProof(check.runtime, "failed", why).to_dict() for check in applicable])
    side = precomputed if precomputed is not None and precomputed.usable_for(target) else None
    if side is None:
        side = eager_side(target=target, recipe=recipe, components=components, subject=subject,
                          expected_components=saved_components, runtime_checks=applicable)
    runtime_context = RuntimeContext(target, recipe, family, generate_inputs, generation_config, source_dir)
    ahead = dict(side.runtimes)  # a check that may apply but does not (no genai_config.json) is left out
    runtime_references = [(check, ahead[check]) for check in applicable if check in ahead]
    runtime_references += references_for([check for check in applicable if check not in ahead], model, runtime_context)
    planned, bindings_by_component, reference, others = side.planned, side.bindings, side.greedy, side.other_greedy
    if release_model is not None:
        release_model()

    # the runtimes prove the folder in their own children meanwhile; a target that fails our checks keeps no proof
    with ProofsInFlight(runtime_references, directory, runtime_context) as running:
        try:
            with native_messages():
                exported = load_exported(directory, device=device, config=model.config, allow_pickles=trust_artifacts)
                structural = structural_checks(target.export_format, directory)
        except (RemoteCodeError, ArtifactError) as err:
            errors.append(str(err))
            return ValidationResult(reports, None, findings, errors, generation_expected)
        except BaseException as err:
            if not recoverable(err):
                raise
            hint = ""
            if "ONNX Runtime build cannot run on cuda" in str(err):
                hint = (" — an ONNX target on `device` cuda is validated with ONNX Runtime's CUDA provider: install "
                        "onnxruntime-gpu (the pinned version) where it runs, or run it on cpu")
            errors.append(f"the saved artifact does not load: {describe_error(err)}{hint}")
            return ValidationResult(reports, None, findings, errors, generation_expected)
        counted = counter_in_spec_components(exported)
        if counted:
            findings.append(COUNTER_FINDING.format(components=", ".join(counted)))

        for name, probes, references in planned:
            tolerance = tolerance_for(recipe, target, name, target.dtype)
            report = ComponentReport(name, structural=[s for s in structural if s.startswith(f"{name}:")])
            arbiter = side.arbiters.get(name) if measured is None else None  # float32 targets only
            probe_component(report, exported.runners[name], probes, references, tolerance, findings,
                            Judging(measured, ties, arbiter, side.judged_rows.get(name)))
            reports.append(report)
            extra = getattr(target, "output_path", None)
            if extra and name == "model":  # the seed's extra single-graph file is an artifact too: checked the same way
                report = ComponentReport(f"model ({extra})", structural=[f"{extra}: loads in ONNX Runtime"])
                runner = runner_for_file(directory / extra, "onnx", exported.components[name].metadata)
                probe_component(report, runner, probes, references, tolerance, findings, Judging(measured, ties))
                reports.append(report)
        findings += specialized_axes(target.export_format, directory, bindings_by_component)

        generation = None
        if target.mode == "generation":
            merged = MERGED in components and family == "text"  # one graph gives every token's logits
            first = "lm_head" if family in MULTIMODAL_GENERATORS else MERGED if merged else "prefill"
            tolerances = Tolerances(tolerance_for(recipe, target, first, target.dtype),
                                    tolerance_for(recipe, target, MERGED if merged else "decode", target.dtype))
            generation = generation_parity(subject, components, exported, recipe.generation.max_new_tokens,
                                           tolerances, reference=reference, glue=read_glue(directory), others=others)
        verdict = None
        if budget is not None:
            judge_generation(generation, budget)
            verdict = judge(kind, budget, measured or [], generation)
        result = ValidationResult(reports, generation, findings, errors, generation_expected, verdict)
        if not result.errors and result.verdict != "failed":  # the runtimes' proofs count once our own checks hold
            result.runtimes = [p.to_dict() for p in running.result() + (declined(target, directory) if proofs else [])]
    if verdict is None:  # a float32 target: judged by atol/rtol and greedy identity
        generation_record = dataclasses.asdict(generation) if generation is not None else None
        result.tolerance = tolerance_verdict(result.component_records(), generation_record, result.verdict)
    return result

"""Numerical validation of saved artifacts against the eager model.

Every target is loaded back from disk with upstream's runner and compared with the eager model at the traced
inputs, at shapes it was not traced with (inside every declared dynamic range), and, for generation exports, by
greedy decoding driven by the exported components only. The eager reference for a probe is computed once per run
and shared by every target ([`EagerCache`]).
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import describe_error
from .recipe import DimSpec, Recipe, Tolerance
from .results import Check, ComponentReport, OutputDiff, ValidationResult
from .upstream import leaf_tensors, run_component

# Defaults per format at float32: torch programs run the same kernels as eager; ONNX Runtime and XNNPACK fuse and
# reorder reductions, so they get more room. Lower precisions get more room again.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "dynamo": (1e-5, 1e-4),
    "onnx": (1e-4, 1e-3),
    "executorch": (1e-3, 1e-3),
}
LOW_PRECISION_TOLERANCE = (1e-2, 1e-2)
# Logits a probe may produce (tokens x vocabulary); each is held by the eager reference and the artifact's output.
MAX_PROBE_LOGITS = 1 << 26


def tolerance_for(recipe: Recipe, target, component: str, dtype: str | None) -> tuple[float, float]:
    """Format default, then recipe-wide, then per format, per target and per component overrides (most specific
    wins)."""
    atol, rtol = DEFAULT_TOLERANCES.get(target.export_format, (1e-4, 1e-3))
    if dtype in ("float16", "bfloat16"):
        atol, rtol = max(atol, LOW_PRECISION_TOLERANCE[0]), max(rtol, LOW_PRECISION_TOLERANCE[1])
    layers: list[Tolerance | None] = [
        Tolerance(atol=recipe.validation.atol, rtol=recipe.validation.rtol),
        recipe.validation.formats.get(target.export_format),
        target.validation,
        target.components[component].validation if component in target.components else None,
    ]
    for layer in layers:
        if layer is None:
            continue
        atol = layer.atol if layer.atol is not None else atol
        rtol = layer.rtol if layer.rtol is not None else rtol
    return atol, rtol


def _leaves(outputs: Any) -> dict[str, torch.Tensor]:
    return leaf_tensors(outputs)


def compare_outputs(expected: Any, actual: Any, atol: float, rtol: float) -> list[OutputDiff]:
    """Per output leaf: max absolute and relative difference and a verdict; NaN or inf never passes."""
    want, got = _leaves(expected), _leaves(actual)
    diffs = []
    for name, reference in want.items():
        if name not in got:
            diffs.append(OutputDiff(name, None, None, atol, rtol, False, "missing from the artifact's outputs"))
            continue
        value = got[name]
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
        # float32 is exact enough for differences of float32-or-narrower outputs, and halves the memory of float64
        # on large logits; float64 outputs keep float64.
        work = torch.float64 if reference.dtype == torch.float64 else torch.float32
        ref, val = reference.detach().cpu().to(work), value.detach().cpu().to(work)
        if not torch.isfinite(val).all():
            diffs.append(OutputDiff(name, math.inf, math.inf, atol, rtol, False, "non-finite values (NaN or inf)"))
            continue
        if val.numel() == 0:
            diffs.append(OutputDiff(name, 0.0, 0.0, atol, rtol, True))
            continue
        abs_diff = (val - ref).abs()
        magnitude = ref.abs()
        passed = bool(torch.isfinite(ref).all()) and bool((abs_diff <= atol + rtol * magnitude).all())
        max_abs = float(abs_diff.max())
        max_rel = float(abs_diff.div_(magnitude.clamp_min_(1e-12)).max())  # in place: no third large tensor
        diffs.append(OutputDiff(name, max_abs, max_rel, atol, rtol, passed))
    return diffs


def shapes_of(inputs: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(t.shape) for name, t in _leaves(inputs).items()}


def _fingerprint(inputs: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(_leaves(inputs).items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for name, value in sorted(inputs.items()):
        if not isinstance(value, torch.Tensor) and isinstance(value, (bool, int, float, str, type(None))):
            digest.update(f"{name}={value!r}".encode())
    return digest.hexdigest()


class EagerCache:
    """Eager outputs by (module, inputs): computed once per run, shared by every target that probes the same thing."""

    def __init__(self) -> None:
        self._outputs: dict[tuple[int, str], Any] = {}
        self.hits = 0
        self.misses = 0

    def run(self, module: torch.nn.Module, inputs: dict[str, Any]) -> Any:
        key = (id(module), _fingerprint(inputs))
        if key in self._outputs:
            self.hits += 1
            return self._outputs[key]
        self.misses += 1
        with torch.no_grad():
            outputs = module(**copy.deepcopy(inputs))
        self._outputs[key] = outputs
        return outputs


# ── Probes ────────────────────────────────────────────────────────────────────


def _is_arange(tensor: torch.Tensor, axis: int) -> bool:
    if tensor.is_floating_point() or tensor.shape[axis] < 2:
        return False
    moved = tensor.movedim(axis, -1).reshape(-1, tensor.shape[axis])
    start = moved[:, :1]
    return bool(torch.equal(moved, start + torch.arange(moved.shape[-1])))


def resize_along(tensor: torch.Tensor, axis: int, size: int, generator: torch.Generator, config) -> torch.Tensor:
    """`tensor` cut or grown along `axis` to `size`, grown with values of the same kind (a constant stays that
    constant — masks, token types —, positions keep counting, token ids stay in the vocabulary, floats stay at their
    scale)."""
    current = tensor.shape[axis]
    if size == 0:  # freshly allocated: a zero-length slice keeps strides that ExecuTorch aborts on
        shape = list(tensor.shape)
        shape[axis] = 0
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if size <= current:
        return tensor.narrow(axis, 0, size).clone()
    extra_shape = list(tensor.shape)
    extra_shape[axis] = size - current
    if tensor.dtype == torch.bool or (not tensor.is_floating_point() and tensor.numel() > 0
                                      and bool((tensor == tensor.flatten()[0]).all())):
        # masks stay masks, token types stay the one type: a constant integer input grows with its value
        extra = torch.full(extra_shape, tensor.flatten()[0].item() if tensor.numel() else 1, dtype=tensor.dtype)
    elif _is_arange(tensor, axis):
        last = tensor.narrow(axis, current - 1, 1)
        steps = torch.arange(1, size - current + 1).reshape([-1 if d == axis else 1 for d in range(tensor.dim())])
        extra = (last + steps).to(tensor.dtype)
    elif not tensor.is_floating_point():
        from .inputs import random_token_ids

        extra = random_token_ids(config, tuple(extra_shape), generator).to(tensor.dtype)
    else:
        scale = float(tensor.float().std()) if tensor.numel() > 1 else 1.0
        extra = (torch.randn(extra_shape, generator=generator) * (scale or 1.0)).to(tensor.dtype)
    return torch.cat([tensor, extra.to(tensor.device)], dim=axis)


def _set_leaf(inputs: dict[str, Any], path: str, value: torch.Tensor) -> None:
    """Replace the tensor at dotted `path` (upstream leaf naming) inside `inputs`."""
    parts = path.split(".")
    node: Any = inputs
    for part in parts[:-1]:
        if isinstance(node, dict):
            node = node[part]
        elif isinstance(node, (list, tuple)):
            node = node[int(part)]
        else:
            node = getattr(node, part)
    last = parts[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        setattr(node, last, value)


@dataclass
class DimBinding:
    """A dynamic dimension and the (leaf path, axis) pairs it binds in one component's inputs."""

    name: str
    low: int | None
    high: int | None
    axes: list[tuple[str, int]]
    traced: int


def dim_bindings(spec: dict[str, Any] | None, inputs: dict[str, Any], dynamic: bool, family: str) -> list[DimBinding]:
    """The dynamic dims of a component: named dims from the recipe, or for `dynamic: true` the sequence axis of
    text inputs (the axis users vary; batch is specialized at size 1 by `Dim.AUTO`)."""
    from .shapes import axis_specs, spec_key

    leaves = _leaves(inputs)
    bindings: dict[str, DimBinding] = {}
    if spec:
        for path, tensor in leaves.items():
            key = spec_key(spec, path)
            if key is None:
                continue
            for axis, value in axis_specs(spec[key], tensor.dim(), key).items():
                if isinstance(value, DimSpec):
                    binding = bindings.setdefault(
                        value.name, DimBinding(value.name, value.min, value.max, [], int(tensor.shape[axis]))
                    )
                    binding.axes.append((path, axis))
        return list(bindings.values())
    if dynamic and family in ("text", "seq2seq", "vision-language"):
        ids = leaves.get("input_ids")
        if ids is not None and ids.dim() == 2 and ids.shape[1] > 1:
            seq = int(ids.shape[1])
            axes = [(p, 1) for p, t in leaves.items() if t.dim() == 2 and t.shape[1] == seq and p != "position_ids"]
            axes += [(p, 1) for p, t in leaves.items() if p == "position_ids" and t.dim() == 2 and t.shape[1] == seq]
            return [DimBinding("sequence (dynamic: true)", None, None, axes, seq)]
    return []


def probe_sizes(binding: DimBinding, max_positions: int | None) -> list[int]:
    """Lower bound, a value in between and the upper bound of a dim (sizes it was not traced with)."""
    low = binding.low if binding.low is not None else 2
    high = binding.high if binding.high is not None else binding.traced * 2 + 3
    if max_positions is not None:
        high = min(high, max_positions)
    sizes = [low, (low + high) // 2, high]
    floor = 0 if binding.low == 0 else 1  # a declared minimum of 0 (an empty cache) is probed too
    return sorted({s for s in sizes if s >= floor})


def make_probes(
    inputs: dict[str, Any], bindings: list[DimBinding], config, limit: int, max_positions: int | None, seed: int = 0,
    logits_per_token: int = 0,
) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """`(probe id, inputs or None, skip reason)`: the traced inputs, then each dim at each probe size.

    Probes whose inputs exceed `limit` elements are skipped with the reason, and so are probes of a language model
    (`logits_per_token`: its vocabulary size) whose logits would exceed `MAX_PROBE_LOGITS`: a 32k-token prompt is a
    small input but 20 GB of logits on a 150k vocabulary, computed twice (eager and artifact)."""
    traced_total = sum(t.numel() for t in _leaves(inputs).values())
    probes: list[tuple[str, dict[str, Any] | None, str | None]] = [
        ("traced", inputs, None) if traced_total <= limit else
        ("traced", None, f"inputs of {traced_total} elements exceed max_probe_elements ({limit})")
    ]
    generator = torch.Generator().manual_seed(seed)
    for binding in bindings:
        for size in probe_sizes(binding, max_positions):
            probe_id = f"{binding.name}={size}"
            probe = copy.deepcopy(inputs)
            leaves = _leaves(probe)
            total = 0
            for path, axis in binding.axes:
                resized = resize_along(leaves[path], axis, size, generator, config)
                _set_leaf(probe, path, resized)
                total += resized.numel()
            if total > limit:
                probes.append((probe_id, None, f"inputs of {total} elements exceed max_probe_elements ({limit})"))
                continue
            ids = _leaves(probe).get("input_ids")
            logits = ids.numel() * logits_per_token if ids is not None else 0
            if logits > MAX_PROBE_LOGITS:
                probes.append((probe_id, None, f"its logits ({logits} elements) exceed what validation computes "
                                               f"({MAX_PROBE_LOGITS}, {MAX_PROBE_LOGITS * 4 >> 20} MiB in float32)"))
                continue
            probes.append((probe_id, probe, None))
    return probes


def structural_checks(export_format: str, directory: Path) -> list[str]:
    """Format checks on the saved files: `onnx.checker` with external data, the ExecuTorch methods."""
    notes = []
    from .upstream import read_manifest

    manifest = read_manifest(directory)
    for name, entry in manifest["components"].items():
        path = directory / entry["file"]
        if export_format == "onnx":
            import onnx

            onnx.checker.check_model(str(path), full_check=False)
            notes.append(f"{name}: onnx.checker passed ({entry['file']})")
        elif export_format == "executorch":
            from executorch.runtime import Runtime

            methods = sorted(Runtime.get().load_program(path).method_names)
            method = entry.get("method", "forward")  # a program with a method per component names it
            if method not in methods:
                raise ValueError(f"{entry['file']} has no '{method}' method (methods: {methods})")
            notes.append(f"{name}: ExecuTorch program loads, methods {methods}")
        elif export_format == "dynamo":
            notes.append(f"{name}: torch.export program loads ({entry['file']})")
    return notes


def specialized_axes(export_format: str, directory: Path, spec_by_component: dict[str, Any]) -> list[str]:
    """Declared-dynamic axes that the saved graph fixed to one size (read from the ONNX graph's input dims)."""
    if export_format != "onnx":
        return []
    import onnx

    from .upstream import read_manifest

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


# ── One target ────────────────────────────────────────────────────────────────


def validate_target(
    *, target, recipe: Recipe, directory: Path, components, model, family: str, generate_inputs: dict[str, Any],
    eager: EagerCache, generation_config=None, expected_components: list[str] | None = None,
    trust_artifacts: bool = True, release_model=None,
) -> ValidationResult:
    """Load the saved target from `directory` and run every check. `release_model`, when given, is called once the
    eager references are computed, before the artifact is loaded (the caller frees the eager weights there).

    `trust_artifacts`: the folder's pickled programs (`.pt2`) may be loaded (this run wrote them, or the operator
    allowed it); nothing else in the folder ever runs (its config's `auto_map` is never read).
    """
    from .engine import component_shape_spec
    from .errors import ArtifactError, RemoteCodeError
    from .inputs import vocab_size
    from .merged import MERGED, prompt_inputs
    from .upstream import load_exported, read_manifest

    findings: list[str] = []
    errors: list[str] = []
    reports: list[ComponentReport] = []
    expected = list(expected_components if expected_components is not None else components)
    generation_expected = target.mode == "generation"
    saved: list[str] = []
    try:
        saved = list(read_manifest(directory)["components"])
    except ArtifactError as err:
        errors.append(str(err))
    missing = [name for name in expected if name not in saved]
    extra = [name for name in saved if name not in expected]
    if missing:
        errors.append(f"missing component(s) {missing}: expected {expected}, the saved export has {saved}")
    if extra:
        errors.append(f"unexpected component(s) {extra}: expected {expected}, the saved export has {saved}")
    if errors:
        return ValidationResult(reports, None, findings, errors, generation_expected)
    # Two phases: every eager reference first (probes, generation tokens), then the artifact, so the eager weights
    # can be released in between (`release_model`, on a run's last target): the two are never in memory together.
    max_positions = getattr(getattr(model.config, "text_config", None) or model.config, "max_position_embeddings", None)
    logits_per_token = vocab_size(model.config) if target.mode == "generation" else 0
    bindings_by_component = {}
    planned: list[tuple[str, ComponentReport, list[tuple[Check, dict[str, Any], Any]]]] = []
    for name, (module, inputs) in components.items():
        if name not in saved:
            continue
        spec = component_shape_spec(target, name)
        override = target.components.get(name)
        dynamic = override.dynamic if override is not None and override.dynamic is not None else target.dynamic
        bindings = dim_bindings(spec, inputs, dynamic, family) if recipe.validation.probe_unseen_shapes else []
        bindings_by_component[name] = bindings
        probes = make_probes(inputs, bindings, model.config, recipe.validation.max_probe_elements, max_positions,
                             recipe.inputs.seed, logits_per_token)
        if target.mode == "generation" and name == MERGED and "input_ids" in generate_inputs:
            probes.append(("prompt (past=0)", prompt_inputs(inputs, generate_inputs["input_ids"]), None))
        report, runs = ComponentReport(name), []
        for probe_id, probe, skip in probes:
            check = Check(probe_id, {} if probe is None else shapes_of(probe), skipped=probe is None, error=skip)
            report.checks.append(check)
            if probe is None:
                continue
            try:
                runs.append((check, probe, eager.run(module, probe)))
            except Exception as err:
                check.skipped, check.error = True, f"the eager model cannot run this probe: {describe_error(err)}"
        planned.append((name, report, runs))
    reference = None
    if target.mode == "generation":
        from .parity import eager_reference

        reference = eager_reference(model, components, generate_inputs, recipe.generation.max_new_tokens,
                                    generation_config, family)
    if release_model is not None:
        release_model()

    try:
        exported = load_exported(directory, config=model.config, allow_pickles=trust_artifacts)
        structural = structural_checks(target.export_format, directory)
    except (RemoteCodeError, ArtifactError) as err:
        errors.append(str(err))
        return ValidationResult(reports, None, findings, errors, generation_expected)
    except Exception as err:
        errors.append(f"the saved artifact does not load: {describe_error(err)}")
        return ValidationResult(reports, None, findings, errors, generation_expected)
    for name, report, runs in planned:
        report.structural = [s for s in structural if s.startswith(f"{name}:")]
        atol, rtol = tolerance_for(recipe, target, name, target.dtype)
        for check, probe, expected in runs:
            try:
                actual = run_component(exported.runners[name], probe)
            except Exception as err:
                check.passed, check.error = False, describe_error(err)
                if check.probe != "traced":
                    findings.append(
                        f"{name}: the artifact does not run at {check.probe} (declared dynamic): it was specialized "
                        f"or bounded at export — {describe_error(err)[:300]}"
                    )
                continue
            check.outputs = compare_outputs(expected, actual, atol, rtol)
            check.passed = all(o.passed for o in check.outputs)
        reports.append(report)
    findings += specialized_axes(target.export_format, directory, bindings_by_component)

    generation = None
    if target.mode == "generation":
        from .parity import generation_parity

        generation = generation_parity(model, components, exported, generate_inputs, recipe.generation.max_new_tokens,
                                       generation_config, family, reference=reference)
    return ValidationResult(reports, generation, findings, errors, generation_expected)

"""The pipeline: load once, export every target in its own process, validate, report.

```
recipe ──► plan ──► export (per target × component) ──► validate ──► report
```

Each target is exported in a forked child process (which inherits the loaded model), into a staging folder that is
renamed into place only when the export finished: a crash or a timeout in one target leaves nothing half-written
and does not stop the others. Validation runs in this process, sharing the eager references across targets.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .errors import DeviceError, RecipeError
from .recipe import Recipe, find_recipe, load_recipe_file

STATUS_PASSED, STATUS_FAILED, STATUS_CRASHED, STATUS_TIMED_OUT = "passed", "failed", "crashed", "timed_out"
DEFAULT_TIMEOUT_S = 3600.0


@dataclass
class RunOptions:
    """What `hf-export run` was asked to do.

    Example:
        >>> options = RunOptions(out_dir=Path("out"), targets=["onnx"])
    """

    out_dir: Path
    targets: list[str] = field(default_factory=list)
    config_path: Path | None = None
    device: str | None = None
    revision: str | None = None
    token: str | None = None
    endpoint: str | None = None
    trust_remote_code: bool = False
    progress: bool = True
    timeout: float | None = None
    use_cache: bool = True


@dataclass
class TargetResult:
    """One target's outcome, as it goes into report.json."""

    name: str
    export_format: str
    mode: str
    status: str
    device: str = "cpu"
    dtype: str | None = None
    components: list[dict[str, Any]] = field(default_factory=list)
    expected_components: list[str] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    generation: dict[str, Any] | None = None
    findings: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    log: str | None = None
    reproduce: str | None = None
    cache_key: str | None = None
    cached: bool = False
    total_bytes: int | None = None
    weights_stored_bytes: int | None = None
    parameter_bytes: int | None = None


def tool_versions() -> dict[str, str]:
    """Versions of this tool and the heavy stack, recorded in every report."""
    from importlib import metadata

    versions = {"export-action": __version__, "python": sys.version.split()[0]}
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch", "huggingface_hub"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(path: Path, name: str, known: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """`{path, size, sha256, mtime_ns}` of a file; the hash is reused from `known` when size and mtime match (the
    way make and git decide a file is unchanged), so a rerun does not re-read gigabytes."""
    stat = path.stat()
    previous = (known or {}).get(name)
    if previous and previous.get("size") == stat.st_size and previous.get("mtime_ns") == stat.st_mtime_ns:
        digest = previous["sha256"]
    else:
        digest = sha256_file(path)
    return {"path": name, "size": stat.st_size, "sha256": digest, "mtime_ns": stat.st_mtime_ns}


def file_entries(directory: Path, base: Path, known: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every file under `directory`: path relative to `base`, size, sha256 (and mtime, for reruns)."""
    return [_entry(path, str(path.relative_to(base)), known)
            for path in sorted(p for p in directory.rglob("*") if p.is_file())]


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")


def weights_fingerprint(folder: Path, known: list[dict[str, Any]] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """A hash of the model's weights, configs and tokenizer (an export's inputs besides the recipe and the tools),
    and the per-file entries it came from."""
    by_name = {entry["path"]: entry for entry in known or []}
    entries = [_entry(path, path.name, by_name) for path in sorted(folder.iterdir())
               if path.is_file() and path.suffix in WEIGHT_SUFFIXES and path.name != "export_config.json"]
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry['path']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest(), entries


def resolve_device(requested: str) -> str:
    """`cpu`, or `cuda` when asked for (an error here without a GPU) or when `auto` finds one."""
    import torch

    if requested == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                "the target asks for device 'cuda' but no CUDA GPU is visible here (torch.cuda.is_available() is "
                "False): run it on a GPU runner (see examples/workflows/matrix.yml), or set device to 'cpu' or 'auto'"
            )
        return "cuda"
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def load_run_recipe(folder: Path, config_path: Path | None) -> tuple[Recipe, Path, list[str]]:
    if config_path is not None:
        return load_recipe_file(config_path), config_path, []
    found = find_recipe(folder)
    if found is None:
        raise RecipeError(
            f"no export recipe in {folder}: add an export_config.json (see docs/recipe.md) or an 'export_config' "
            "field in config.json, or pass --config FILE"
        )
    return found


# ── Child process ─────────────────────────────────────────────────────────────


def _redirect_output(log_path: Path) -> None:
    """Send everything the child prints (upstream warnings, torch logs) to the target's log file."""
    import logging

    handle = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(handle, 1)
    os.dup2(handle, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    for logger in (logging.getLogger(), logging.getLogger("transformers"), logging.getLogger("torch")):
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)


def _export_in_child(work: Callable[[], dict[str, Any]], result_path: Path, log_path: Path) -> None:
    _redirect_output(log_path)
    try:
        import torch

        # The parent's OpenMP pool does not survive fork: a parallel region in the child would wait forever on its
        # threads (the reason DataLoader workers do the same). Tracing and lowering are single-threaded Python anyway.
        torch.set_num_threads(1)
        info = work()
        result = {"ok": True, **info}
    except BaseException as err:  # everything is reported; the parent decides the status
        result = {
            "ok": False,
            "type": type(err).__name__,
            "message": str(err)[:4000],
            "traceback": traceback.format_exc(limit=-15),
        }
        print(result["traceback"], file=sys.stderr)
    result_path.write_text(json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_isolated(work: Callable[[], dict[str, Any]], *, log_path: Path, timeout: float) -> dict[str, Any]:
    """Run `work` in a forked process. Returns its result dict, or `{"ok": False, "status": crashed|timed_out}`."""
    result_path = log_path.with_suffix(".result.json")
    result_path.unlink(missing_ok=True)
    context = multiprocessing.get_context("fork")
    process = context.Process(target=_export_in_child, args=(work, result_path, log_path), daemon=True)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return {"ok": False, "status": STATUS_TIMED_OUT, "type": "TimeoutError",
                "message": f"the export ran past its timeout of {timeout:g} s and was stopped"}
    if not result_path.exists():
        code = process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return {"ok": False, "status": STATUS_CRASHED, "type": "Crash",
                "message": f"the exporting process died ({how}) before finishing; see the log"}
    result = json.loads(result_path.read_text())
    result_path.unlink()
    return result


def log_excerpt(log_path: Path, limit: int = 3000) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]


# ── The run ───────────────────────────────────────────────────────────────────


def cache_key(weights: str, recipe: Recipe, target_name: str, versions: dict[str, str]) -> str:
    """What a target's artifacts depend on: the weights, the recipe's target (and shared settings), the tools."""
    material = json.dumps(
        {"weights": weights, "target": recipe.target_sha256(target_name), "versions": versions}, sort_keys=True
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _previous_report(out_dir: Path) -> dict[str, Any]:
    try:
        report = json.loads((out_dir / "report.json").read_text())
        return report if isinstance(report, dict) else {}
    except (OSError, ValueError):
        return {}


def _previous_results(out_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        return {t["name"]: t for t in _previous_report(out_dir).get("targets", [])}
    except (KeyError, TypeError):
        return {}


def _cached_result(previous: dict[str, Any] | None, key: str, out_dir: Path) -> dict[str, Any] | None:
    """The previous passing result for this cache key, if its files are still there, unchanged."""
    if not previous or previous.get("cache_key") != key or previous.get("status") != STATUS_PASSED:
        return None
    directory = out_dir / previous["name"]
    if not directory.is_dir():
        return None
    files = previous.get("files") or []
    current = file_entries(directory, out_dir, known={f["path"]: f for f in files})

    def identity(entries):
        return [(f["path"], f["size"], f["sha256"]) for f in entries]

    if identity(current) != identity(files):
        return None
    return previous


class Progress:
    """A rich progress line per target (stage and elapsed time); silent when disabled or not a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress as RichProgress
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = RichProgress(
                SpinnerColumn(), TextColumn("[bold]{task.fields[target]}"), TextColumn("{task.description}"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def update(self, target: str, stage: str, done: bool = False) -> None:
        if self._progress is None:
            return
        if target not in self._tasks:
            self._tasks[target] = self._progress.add_task(stage, target=target, total=1)
        self._progress.update(self._tasks[target], description=stage, completed=1 if done else 0)


def run_pipeline(model: str, options: RunOptions) -> dict[str, Any]:
    """Run a model's recipe end to end; write `OUT/<target>/`, `OUT/report.json` and `OUT/report.md`.

    Returns the report dict. Raises `RecipeError` (bad recipe), `ModelSourceError` / `RemoteCodeError` (cannot load
    the model); a failing target is reported, not raised.

    Example:
        >>> report = run_pipeline("examples/demo-model", RunOptions(out_dir=Path("out")))  # doctest: +SKIP
        >>> report["status"]
        'passed'
    """
    from .source import check_remote_code, read_config, resolve_source

    started = time.time()
    source = resolve_source(model, revision=options.revision, token=options.token, endpoint=options.endpoint)
    recipe, recipe_file, warnings = load_run_recipe(source.folder, options.config_path)
    check_remote_code(source, read_config(source.folder), options.trust_remote_code)
    names = [t.name for t in recipe.exports]
    unknown = [n for n in options.targets if n not in names]
    if unknown:
        raise RecipeError(f"--target {unknown} not in the recipe; its targets are {names}", file=str(recipe_file))
    selected = [t for t in recipe.exports if not options.targets or t.name in options.targets]
    out_dir = options.out_dir
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    versions = tool_versions()
    earlier = _previous_report(out_dir)
    weights, weights_files = weights_fingerprint(source.folder, (earlier.get("source") or {}).get("weights_files"))
    previous = _previous_results(out_dir)
    keys = {t.name: cache_key(weights, recipe, t.name, versions) for t in selected}
    results: list[TargetResult | dict[str, Any]] = []
    to_run = []
    for target in selected:
        hit = _cached_result(previous.get(target.name), keys[target.name], out_dir) if options.use_cache else None
        if hit is not None:
            results.append({**hit, "cached": True})
        else:
            to_run.append(target)
    context = {
        "source": source, "recipe": recipe, "recipe_file": recipe_file, "warnings": warnings, "versions": versions,
        "weights": weights, "weights_files": weights_files, "started": started, "model_arg": model,
    }
    if to_run:
        results += _run_targets(to_run, options, context, keys)
    order = {t.name: i for i, t in enumerate(selected)}
    results.sort(key=lambda r: order[r["name"] if isinstance(r, dict) else r.name])
    from .report import build_report, write_report

    report = build_report(results, context, options)
    write_report(report, out_dir)
    return report


def _run_targets(targets, options: RunOptions, context: dict[str, Any], keys: dict[str, str]) -> list[TargetResult]:
    from . import engine
    from .inputs import default_mode, make_sample_inputs
    from .source import load_model, load_tokenizer
    from .validate import EagerCache, describe_error

    source, recipe = context["source"], context["recipe"]
    load_started = time.time()
    # One load, in the targets' dtype when they all ask for the same one (a float16 target of a float32 checkpoint
    # never holds a float32 copy); mixed dtypes load the checkpoint's and each export process converts its own.
    dtypes = {target.dtype for target in targets}
    model = load_model(source, trust_remote_code=options.trust_remote_code,
                       dtype=dtypes.pop() if len(dtypes) == 1 else None)
    tokenizer = load_tokenizer(source.folder)
    sample = make_sample_inputs(model, recipe.inputs, tokenizer)
    context["family"], context["model_dtype"] = sample.family, str(model.dtype).removeprefix("torch.")
    context["load_s"] = round(time.time() - load_started, 3)
    eager = EagerCache()
    context["eager_cache"] = eager
    decompositions: dict[tuple[str, bool], Any] = {}
    results = []
    out_dir = options.out_dir
    exported: list[tuple[Any, TargetResult, Path, Any]] = []
    with Progress(options.progress) as progress:
        for target in targets:
            target = target.model_copy(deep=True)
            if target.mode is None:
                target.mode = default_mode(model)
            result = TargetResult(
                name=target.name, export_format=target.export_format, mode=target.mode, status=STATUS_FAILED,
                dtype=target.dtype, versions=context["versions"], cache_key=keys[target.name],
                log=f"logs/{target.name}.log",
                reproduce=_reproduce_command(context, options, target.name),
            )
            results.append(result)
            log_path = out_dir / "logs" / f"{target.name}.log"
            log_path.write_text("")
            try:
                result.device = resolve_device(options.device or target.device)
            except DeviceError as err:
                result.error = {"type": "DeviceError", "message": str(err)}
                progress.update(target.name, "[red]failed: no GPU", done=True)
                continue
            progress.update(target.name, "capturing inputs")
            try:
                components = _components(model, target, recipe, sample, decompositions)
            except Exception as err:
                result.error = {"type": type(err).__name__, "message": describe_error(err)}
                progress.update(target.name, "[red]failed: capture", done=True)
                continue
            result.expected_components = _expected(target, sample.family, components)
            staging = out_dir / f".staging-{target.name}"
            shutil.rmtree(staging, ignore_errors=True)
            notes: list[str] = []

            def work(target=target, components=components, staging=staging, notes=notes) -> dict[str, Any]:
                return _export_work(model, target, components, recipe, staging, notes)

            progress.update(target.name, f"exporting {target.export_format} ({len(components)} component(s))")
            export_started = time.time()
            outcome = run_isolated(work, log_path=log_path, timeout=target.timeout or options.timeout or DEFAULT_TIMEOUT_S)
            result.timings["export_s"] = round(time.time() - export_started, 3)
            if not outcome.get("ok"):
                shutil.rmtree(staging, ignore_errors=True)
                result.status = outcome.get("status", STATUS_FAILED)
                result.error = {
                    "type": outcome.get("type"), "message": outcome.get("message"),
                    "log_excerpt": log_excerpt(log_path),
                }
                progress.update(target.name, f"[red]{result.status}", done=True)
                continue
            result.findings += outcome.get("notes", [])
            result.timings.update(trace_s=outcome.get("export_only_s"), save_s=outcome.get("save_s"))
            final = out_dir / target.name
            if final.is_symlink():  # replaced, never followed
                final.unlink()
            shutil.rmtree(final, ignore_errors=True)
            os.replace(staging, final)
            progress.update(target.name, "exported; validation follows")
            exported.append((target, result, final, components))
        # Validation runs after every export: the export processes fork from a parent that has not yet loaded
        # ONNX Runtime sessions or programs, so they stay as small as a bare export (and no runtime's threads are
        # forked).
        for index, (target, result, final, components) in enumerate(exported):
            progress.update(target.name, "validating")
            validate_started = time.time()
            last = index == len(exported) - 1  # nothing needs the eager weights after its references
            _validate_into(result, target, recipe, final, components, model, sample, eager,
                           release_model=(lambda: release_weights(model)) if last else None)
            result.timings["validate_s"] = round(time.time() - validate_started, 3)
            if result.status == STATUS_PASSED and target.export_format == "onnx" and not target.export_params:
                from .onnx_files import strip_weights

                stripped = strip_weights(final)
                result.findings.append(
                    f"export_params: false — validated with weights, then {len(stripped)} weights were stripped: "
                    "the published graph takes them as inputs"
                )
            result.files = file_entries(final, out_dir)
            _record_footprint(result, target, final, model, components)
            progress.update(target.name, "[green]passed" if result.status == STATUS_PASSED else "[red]failed",
                            done=True)
            gc.collect()  # the loaded programs and runtime sessions of this target are no longer needed
    return results


def _components(model, target, recipe, sample, decompositions: dict) -> Any:
    """The target's components: one decomposition per (mode, multi-token decode), shared by targets; a merged
    target takes its one graph from it (and gets its dynamic-shape contract, when the recipe gives none)."""
    from . import engine, merged

    target.merged = merged.wants_merged(target, sample.family, recipe.generation.cache_implementation)
    key = (target.mode, target.multi_token_decode or target.merged)
    if key not in decompositions:
        decompositions[key] = engine.decompose(model, target.mode, sample.forward, sample.generate, recipe=recipe,
                                               multi_token_decode=key[1], family=sample.family)
    if not target.merged:
        return decompositions[key]
    config = getattr(model.config, "text_config", None) or model.config
    return merged.plan(target, decompositions[key], getattr(config, "max_position_embeddings", None))


def _record_footprint(result: TargetResult, target, directory: Path, model, components) -> None:
    """Total and weight bytes of the saved target, and a finding when the weights are stored more than once."""
    from .footprint import duplication_finding, footprint, parameter_bytes, tied_embeddings

    try:
        sizes = footprint(directory, target.export_format)
    except Exception as err:  # a size we cannot read is reported, never guessed
        result.findings.append(f"could not measure the stored weights: {type(err).__name__}: {err}")
        result.total_bytes = sum(entry["size"] for entry in result.files)
        return
    result.total_bytes = sizes["total_bytes"]
    result.weights_stored_bytes = sizes["weights_stored_bytes"]
    result.parameter_bytes = parameter_bytes(model, target.dtype)
    finding = duplication_finding(result.weights_stored_bytes, result.parameter_bytes, target.export_format,
                                  list(components), tied_embeddings(model))
    if finding and (target.export_format != "onnx" or target.export_params):
        result.findings.append(finding)


def _expected(target, family: str, components) -> list[str]:
    """The recipe's `expected_components`, else the family's minimum complete set."""
    from .components import minimum_components

    if target.expected_components is not None:
        return list(target.expected_components)
    return minimum_components(family, target.mode, list(components), merged=bool(target.merged))


def _export_work(model, target, components, recipe, staging: Path, notes: list[str]) -> dict[str, Any]:
    """What the child process does: move to the target's device and dtype, export every component, save."""
    import torch

    from . import engine

    device = resolve_device(target.device)
    if target.dtype is not None or device != "cpu":
        dtype = getattr(torch, target.dtype) if target.dtype else None
        model = model.to(device=device, dtype=dtype)
        components = {
            name: (module.to(device=device, dtype=dtype), _cast_inputs(inputs, device, dtype))
            for name, (module, inputs) in components.items()
        }
    return {"notes": notes, **engine.export_to(model, target, components, recipe, staging, notes)}


def _cast_inputs(inputs: dict[str, Any], device: str, dtype) -> dict[str, Any]:
    from transformers.exporters.utils import cast_leaf_tensors

    return cast_leaf_tensors(inputs, dtype=dtype, device=device)


def release_weights(model) -> None:
    """Free the eager model's weights (their shapes and dtypes stay, for the report): called by validation between
    its eager references and the artifact, so a run holds one of the two at a time."""
    try:
        model.to("meta")
    except Exception:  # a model that cannot move keeps its weights: more memory, same results
        return
    gc.collect()


def _validate_into(result: TargetResult, target, recipe, directory: Path, components, model, sample, eager,
                   trust_artifacts: bool = True, release_model=None) -> None:
    from .engine import generation_config_for
    from .validate import describe_error, validate_target

    try:
        validation = validate_target(
            target=target, recipe=recipe, directory=directory, components=components, model=model,
            family=sample.family, generate_inputs=sample.generate, eager=eager,
            generation_config=generation_config_for(model, recipe) if target.mode == "generation" else None,
            expected_components=result.expected_components, trust_artifacts=trust_artifacts,
            release_model=release_model,
        )
    except Exception as err:
        result.status = STATUS_FAILED
        result.error = {"type": type(err).__name__, "message": f"validation could not run: {describe_error(err)}"}
        return
    result.components = [
        {"name": c.name, "passed": c.passed, "structural": c.structural,
         "checks": [dataclasses.asdict(check) for check in c.checks]}
        for c in validation.components
    ]
    result.generation = dataclasses.asdict(validation.generation) if validation.generation else None
    result.findings += validation.findings
    if validation.errors:
        result.error = {"type": "ValidationError", "message": "; ".join(validation.errors)}
    result.status = STATUS_PASSED if validation.passed else STATUS_FAILED
    if not validation.passed and result.error is None:
        failing = [c.name for c in validation.components if not c.passed]
        reasons = []
        if failing:
            reasons.append(f"outputs differ from the eager model beyond tolerance in {failing}")
        if validation.generation is not None and validation.generation.status == "failed":
            generation = validation.generation
            detail = generation.reason or f"first divergence {generation.first_divergence}"
            reasons.append(f"generation parity failed: {detail}")
        result.error = {"type": "ValidationError", "message": "; ".join(reasons)}


def _reproduce_command(context: dict[str, Any], options: RunOptions, target: str) -> str:
    source = context["source"]
    parts = ["hf-export", "run", context["model_arg"], "--target", target]
    if source.revision:
        parts += ["--revision", source.revision]
    if options.config_path:
        parts += ["--config", str(options.config_path)]
    return " ".join(parts)


def validate_existing(model: str, options: RunOptions) -> dict[str, Any]:
    """Re-run every check on artifacts already saved in `options.out_dir` (no export) and rewrite the report.

    Export timings from an earlier report are kept.
    """
    from . import engine
    from .inputs import default_mode, make_sample_inputs
    from .source import check_remote_code, load_model, load_tokenizer, read_config, resolve_source
    from .validate import EagerCache, describe_error

    started = time.time()
    source = resolve_source(model, revision=options.revision, token=options.token, endpoint=options.endpoint)
    recipe, recipe_file, warnings = load_run_recipe(source.folder, options.config_path)
    check_remote_code(source, read_config(source.folder), options.trust_remote_code)
    out_dir = options.out_dir
    names = [t.name for t in recipe.exports]
    unknown = [n for n in options.targets if n not in names]
    if unknown:
        raise RecipeError(f"--target {unknown} not in the recipe; its targets are {names}", file=str(recipe_file))
    selected = [t for t in recipe.exports if not options.targets or t.name in options.targets]
    previous = _previous_results(out_dir)
    versions = tool_versions()
    context = {"source": source, "recipe": recipe, "recipe_file": recipe_file, "warnings": warnings,
               "versions": versions, "started": started, "model_arg": model}
    context["weights"], context["weights_files"] = weights_fingerprint(source.folder)
    loaded = time.time()
    dtypes = {target.dtype for target in selected}
    model_obj = load_model(source, trust_remote_code=options.trust_remote_code,
                           dtype=dtypes.pop() if len(dtypes) == 1 else None)
    sample = make_sample_inputs(model_obj, recipe.inputs, load_tokenizer(source.folder))
    context["family"], context["load_s"] = sample.family, round(time.time() - loaded, 3)
    context["model_dtype"] = str(model_obj.dtype).removeprefix("torch.")
    eager = EagerCache()
    context["eager_cache"] = eager
    decompositions: dict[tuple[str, bool], Any] = {}
    results = []
    for index, target in enumerate(selected):
        target = target.model_copy(deep=True)
        target.mode = target.mode or default_mode(model_obj)
        earlier = previous.get(target.name, {})
        result = TargetResult(
            name=target.name, export_format=target.export_format, mode=target.mode, status=STATUS_FAILED,
            dtype=target.dtype, versions=versions, timings=dict(earlier.get("timings") or {}),
            reproduce=f"hf-export validate {model} {out_dir} --target {target.name}",
            cache_key=cache_key(context["weights"], recipe, target.name, versions),
        )
        results.append(result)
        directory = out_dir / target.name
        if not (directory / "export.json").is_file():
            result.error = {"type": "MissingArtifact",
                            "message": f"{directory} holds no export (export.json missing): export it first"}
            continue
        try:
            components = _components(model_obj, target, recipe, sample, decompositions)
        except Exception as err:
            result.error = {"type": type(err).__name__, "message": describe_error(err)}
            continue
        result.expected_components = _expected(target, sample.family, components)
        validate_started = time.time()
        # Artifacts in OUT_DIR were not produced by this process: pickled programs load only when the operator says so.
        _validate_into(result, target, recipe, directory, components, model_obj, sample, eager,
                       trust_artifacts=options.trust_remote_code,
                       release_model=(lambda: release_weights(model_obj)) if index == len(selected) - 1 else None)
        result.timings["validate_s"] = round(time.time() - validate_started, 3)
        result.files = file_entries(directory, out_dir)
        _record_footprint(result, target, directory, model_obj, components)
    from .report import build_report, write_report

    report = build_report(results, context, options)
    write_report(report, out_dir)
    return report

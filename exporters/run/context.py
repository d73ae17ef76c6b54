"""What a run is asked to do (`RunOptions`) and what it knows before exporting anything (`RunContext`).

`prepare_run` is the opening every run shares (`run`, `validate`, `init`): find the model and its recipe, refuse
remote code unless allowed, pick the targets, plan the memory (`exporters.run.memory_plan`: a run that cannot fit stops
here, before anything is loaded), record the tools and fingerprint the weights.

Example:
    >>> options = RunOptions(out_dir=Path("out"), targets=["onnx"])
    >>> options.targets, options.use_cache
    (['onnx'], True)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exporters.recipe.model_limits import check_cache_len, positions_in
from exporters.capture.dtypes import checkpoint_dtype, default_dtype, dtype_finding
from exporters.capture.generation_settings import derived_settings, repo_generation_config
from exporters.capture.source import ModelSource, SourceOptions, check_remote_code, read_config
from exporters.errors import DeviceError
from exporters.hashing import weights_fingerprint
from exporters.recipe.load import find_recipe, load_recipe_file, missing_recipe
from exporters.recipe.model import Recipe, Target
from exporters.run.memory_plan import plan_memory
from exporters.run.resources import usable_cores
from exporters.version import __version__, code_fingerprint, installed_version, untested_stack

DEFAULT_TIMEOUT_S = 3600.0
STACK = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch", "huggingface_hub")


@dataclass(kw_only=True)
class RunOptions(SourceOptions):
    """What a run was asked to do (the CLI's, the Action's and the bot's settings, in the library's words); where the
    model comes from is its `SourceOptions` part.

    Example:
        >>> RunOptions(out_dir=Path("out"), device="cpu").device
        'cpu'
    """

    out_dir: Path
    targets: list[str] = field(default_factory=list)
    config_path: Path | None = None
    device: str | None = None  # overrides every target's device, in the export as in the report
    progress: bool = True
    timeout: float | None = None
    use_cache: bool = True
    jobs: int | None = None  # exports at once; None: from the cores and the memory (exporters.run.resources)
    bench: bool = True  # time every passing artifact (exporters.validate.benchmark)
    hand_over: bool = False  # keep each passed export for the `run` that asks for it (init: exporters.run.handover)
    probe_dims_apart: bool = False  # one probe per dynamic dim and size (init: which dim fails at which size)


@dataclass
class RunContext:
    """Everything a run knows before it exports: the model's source, the recipe, the selected targets, the tools,
    the weights' fingerprint; filled in as the run goes (`family`, `load_s`, `eager_cache`)."""

    model_arg: str
    out_dir: Path
    source: ModelSource
    recipe: Recipe
    recipe_file: Path
    targets: list[Target]
    warnings: list[str]
    versions: dict[str, str]
    weights: str
    weights_files: list[dict[str, Any]]
    started: float = field(default_factory=time.time)
    family: str | None = None
    load_s: float | None = None
    eager_cache: Any = None
    model_dtype: str | None = None  # the dtype the model was loaded in
    checkpoint_dtype: str | None = None  # the dtype the checkpoint's weights are stored in (None: not told)
    jobs: int | None = None  # exports run at once
    memory: dict[str, Any] | None = None  # the memory plan: estimate, memory available, jobs (report.json `memory`)
    machine: dict[str, Any] | None = None  # where the artifacts were timed (exporters.validate.benchmark.machine_info)
    probe_dims_apart: bool = False  # RunOptions.probe_dims_apart

    def cache_key(self, target_name: str, device: str) -> str:
        """What a target's artifacts depend on: the weights and code, the recipe's target (and shared settings),
        the tools (this product's own sources too: [`code_fingerprint`]), the device and the model's revision."""
        material = json.dumps({
            "weights": self.weights, "target": self.recipe.target_sha256(target_name), "versions": self.versions,
            "code": code_fingerprint(), "device": device, "revision": self.source.revision,
        }, sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest()


def tool_versions() -> dict[str, str]:
    """Versions of this tool, Python and the heavy stack, recorded in every report.

    Example:
        >>> sorted(tool_versions())[:3]
        ['executorch', 'export-action', 'huggingface_hub']
    """

    versions = {"export-action": __version__, "python": sys.version.split()[0]}
    for package in STACK:
        versions[package] = installed_version(package) or "not installed"
    return versions


def cuda_available() -> bool:
    """Whether a CUDA GPU is visible, asked without initializing CUDA in this process.

    Exports run in children forked from this process, and a child cannot use CUDA once its parent initialized it
    ("Cannot re-initialize CUDA in forked subprocess"): NVML answers instead (PyTorch's documented switch).
    """
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

    return torch.cuda.is_available()


def resolve_device(requested: str) -> str:
    """`cpu`, or `cuda` when asked for (a `DeviceError` without a GPU) or when `auto` finds one.

    Example:
        >>> resolve_device("cpu")
        'cpu'
    """
    if requested == "cuda":
        if not cuda_available():
            raise DeviceError(
                "the target asks for `device` 'cuda' but no CUDA GPU is visible here (torch.cuda.is_available() is "
                "False): run it on a GPU runner (see examples/workflows/matrix.yml), or set the device to 'cpu' or "
                "'auto'", option="device"
            )
        return "cuda"
    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    return "cpu"


def load_run_recipe(folder: Path, config_path: Path | None) -> tuple[Recipe, Path, list[str]]:
    """The recipe a run uses: the `config` file when given, else the model folder's own (with its warnings)."""
    if config_path is not None:
        return load_recipe_file(config_path), config_path, []
    found = find_recipe(folder)
    if found is None:
        raise missing_recipe(str(folder), option="config")
    return found


def prepare_run(model: str, options: RunOptions, exporting: bool = True) -> RunContext:
    """The opening every run shares: source, recipe, remote-code check, target selection, memory plan, versions,
    fingerprint.

    Args:
        model: a local model folder or a Hub repo id.
        options: the run's options (`targets`, `config_path`, `revision`, `token`, `trust_remote_code`...).
        exporting: False for a run that only validates (its memory planned as one job).

    Raises:
        RecipeError: no recipe, an invalid one, or a `target` that is not in it.
        ModelSourceError: the model cannot be found or read.
        RemoteCodeError: the model needs code from its repo and `trust_remote_code` is off.
        MemoryPlanError: the run's estimated peak memory does not fit, even one export at a time.

    Example:
        >>> import tempfile, json
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
        >>> _ = (folder / "export_config.json").write_text('{"export_format": "onnx"}')
        >>> context = prepare_run(str(folder), RunOptions(out_dir=folder / "out"))
        >>> [t.name for t in context.targets], len(context.weights)
        (['onnx'], 64)
    """
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # see cuda_available: before anything asks torch
    source = options.resolve(model)
    recipe, recipe_file, warnings = load_run_recipe(source.folder, options.config_path)
    config = read_config(source.folder)
    check_remote_code(source, config, options.trust_remote_code)
    check_cache_len(recipe, positions_in(config))  # before anything is loaded or allocated
    derived = derived_settings(repo_generation_config(source.folder))  # said even when every target is reused
    if derived and any(t.mode in (None, "generation") for t in recipe.select(options.targets)):
        warnings = [*warnings, derived]  # about the model: once, for every generation target
    checkpoint = checkpoint_dtype(source.folder, config)
    targets = [_with_default_dtype(target, checkpoint, warnings) for target in recipe.select(options.targets)]
    warnings = list(warnings)
    jobs = (options.jobs or max(1, min(usable_cores(), len(targets)))) if exporting else 1
    memory = plan_memory(source.folder, [(t.export_format, t.dtype) for t in targets], checkpoint, jobs,
                         requested=options.jobs is not None, notes=warnings)
    planned = memory.estimate_bytes is not None and memory.available_bytes is not None
    weights, weights_files = weights_fingerprint(source.folder)
    versions = tool_versions()
    warnings += [untested] if (untested := untested_stack(versions)) else []
    return RunContext(model_arg=model, out_dir=Path(options.out_dir), source=source, recipe=recipe, recipe_file=Path(recipe_file), targets=targets,
                      warnings=warnings, versions=versions, weights=weights, weights_files=weights_files,
                      checkpoint_dtype=checkpoint, memory=memory.to_dict(), probe_dims_apart=options.probe_dims_apart,
                      # unplanned: the pipeline decides from the loaded weights (`exporters.run.resources`)
                      jobs=memory.jobs if exporting and planned else options.jobs)


def _with_default_dtype(target: Target, checkpoint: str | None, warnings: list[str]) -> Target:
    """`target`, or a copy in the dtype its runtime runs when the recipe sets none (`exporters.capture.dtypes`); a
    cast is said in `warnings`. An ONNX target's unset opset is torch.onnx's default, what it exports at for None
    (export.json records the opset the graph has; an export `init` checked is handed over: exporters.run.handover)."""
    if target.export_format == "onnx" and target.opset_version is None:
        from torch.onnx import _constants as onnx_constants  # deferred: torch.onnx is loaded for ONNX targets only

        target = target.model_copy(update={"opset_version": onnx_constants.ONNX_DEFAULT_OPSET})
    dtype = default_dtype(target.export_format, checkpoint) if target.dtype is None else None
    if dtype is None:
        return target
    if dtype != checkpoint:
        warnings.append(f"{target.name}: {dtype_finding(target.export_format, checkpoint, dtype)}")
    return target.model_copy(update={"dtype": dtype})

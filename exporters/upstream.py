"""The one adapter to upstream `transformers.exporters`: everything this project takes from it goes through here.

Upstream is experimental and changes between releases (5.24 renamed cache kwargs and made `.pt2` loading need
`trust_remote_code`); pinning it (constraints.txt) and importing it in this module only means the next release is
adapted in one place. A test fails if another module imports `transformers.exporters`.

What is here: the registry (`exporter_class`, `config_class`), decomposition (`decompose_for_generation`,
`decompose_multimodal`), pytree helpers (`leaf_tensors`, `cast_leaf_tensors`, `pytree_flatten`,
`register_cache_pytrees`), the saved-export format (`ExportedModel`, `read_manifest`, `write_manifest`) and a loader
that never runs code from an artifact folder unless the operator allowed it ([`load_exported`]), and what upstream's
save and load do not cover: one ExecuTorch program with a method per component (`export_executorch_methods`,
`executorch_method_runner`), ONNX Runtime sessions that read the weights in place (`lean_session_options`), graphs
whose inputs were renamed for transformers.js (`RenamedRunner`).

Example:
    >>> exporter_class("onnx").program_suffix
    '.onnx'
    >>> sorted(formats_from_files(["decode.pte", "prefill.pte"]))
    ['executorch']
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from transformers.exporters import ExportedComponent, ExportedModel
from transformers.exporters.auto import EXPORT_BACKENDS, get_exporter_class
from transformers.exporters.auto import AutoExportConfig as UpstreamAutoExportConfig
from transformers.exporters.auto import AutoHfExporter as UpstreamAutoHfExporter
from transformers.exporters.exporter_dynamo import _pytree_flatten, register_cache_pytrees_for_model
from transformers.exporters.metadata import ExportMetadata, register_treespec_types
from transformers.exporters.utils import (
    cast_leaf_tensors,
    decompose_for_generation,
    decompose_multimodal,
    get_leaf_tensors,
)

from .errors import ArtifactError, RemoteCodeError

try:
    from transformers.exporters.utils import _OUTPUT_FLAGS as OUTPUT_FLAGS
except ImportError:  # pragma: no cover - older upstream
    OUTPUT_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states")

__all__ = [
    "EXPORT_BACKENDS",
    "OUTPUT_FLAGS",
    "ExportedComponent",
    "ExportedModel",
    "RenamedRunner",
    "UpstreamAutoExportConfig",
    "UpstreamAutoHfExporter",
    "cast_leaf_tensors",
    "config_class",
    "decompose_for_generation",
    "decompose_multimodal",
    "executorch_method_runner",
    "export_executorch_methods",
    "exporter_class",
    "formats_from_files",
    "lean_session_options",
    "leaf_tensors",
    "load_exported",
    "metadata_dict",
    "move_to",
    "pytree_flatten",
    "quiet_torch_serde",
    "read_manifest",
    "register_cache_pytrees",
    "run_component",
    "runner_for_file",
    "write_manifest",
]

MANIFEST_FILE = "export.json"
# The file suffix of each format's programs: what a folder holds is decided from its files, not from what a
# manifest claims.
SUFFIX_FORMATS = {".pt2": "dynamo", ".onnx": "onnx", ".pte": "executorch", ".xml": "openvino"}


def exporter_class(export_format: str):
    """Upstream's exporter class for a format (`KeyError`/`ValueError` naming the registered ones otherwise)."""
    return get_exporter_class(export_format)


def config_class(export_format: str):
    """Upstream's config class for a format."""
    return exporter_class(export_format).config_class


def leaf_tensors(obj: Any) -> dict[str, torch.Tensor]:
    """`{dotted path: tensor}` for every tensor leaf of `obj` (upstream's leaf naming, the names ONNX inputs get)."""
    return get_leaf_tensors(obj)


def pytree_flatten(value: Any):
    """Upstream's flattening of a cache or model output object into leaves."""
    return _pytree_flatten(value)


def register_cache_pytrees() -> None:
    """Make transformers' cache classes pytree nodes (needed before walking or tracing inputs that hold a cache)."""
    register_cache_pytrees_for_model(torch.nn.Module())


# torch 2.13's `.pt2` loader logs a warning whose format string has no placeholder for its argument: the logging
# call itself fails ("--- Logging error ---" on stderr, an exception under pytest). See docs/upstream-gaps.md.
TORCH_SERDE_LOGGER = "torch._export.serde.serialize"


@contextlib.contextmanager
def quiet_torch_serde() -> Iterator[None]:
    """Silence the broken warning of torch's `.pt2` deserializer while loading."""
    logger = logging.getLogger(TORCH_SERDE_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def formats_from_files(names: list[str]) -> set[str]:
    """The formats the program files `names` are, by suffix (`unknown:<suffix>` for anything else)."""
    return {SUFFIX_FORMATS.get(PurePosixPath(n).suffix, f"unknown:{PurePosixPath(n).suffix}") for n in names}


def read_manifest(directory: Path) -> dict[str, Any]:
    """A saved export's `export.json`, checked: every component names a plain file inside `directory` that exists,
    and the files' suffixes agree with the manifest's format. Raises `ArtifactError` saying what is wrong."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        components = manifest["components"]
        export_format = manifest["export_format"]
        files = [entry["file"] for entry in components.values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ArtifactError(f"{directory} holds no readable export manifest ({MANIFEST_FILE}): "
                            f"{type(err).__name__}: {err}") from None
    for name in files:
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        # One subfolder at most (the transformers.js layout's `onnx/model.onnx`), nothing that leaves the folder
        if (not parts or len(parts) > 2 or "\\" in name or name.startswith("/")
                or any(part in ("", ".", "..") for part in parts)):
            raise ArtifactError(f"{directory / MANIFEST_FILE} names {name!r}: a component file must be a file name "
                                "inside the export folder (or one subfolder of it)")
        path = directory / name
        if any(p.is_symlink() for p in (path, path.parent)) or not path.is_file():
            raise ArtifactError(f"{path} is missing or not a regular file")
    found = formats_from_files(files)
    if found != {export_format}:
        raise ArtifactError(f"{directory / MANIFEST_FILE} says export_format {export_format!r} but its program files "
                            f"{sorted(files)} are {sorted(found)}: the folder was not written by this tool")
    return manifest


def _retarget(obj: Any, device: torch.device, seen: set[int]) -> None:
    """Set the `device` attribute of transformers' cache objects inside `obj` (their layers record where their
    tensors live, and upstream's pytree flattening puts that attribute in the traced input spec)."""
    if id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for value in obj.values():
            _retarget(value, device, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _retarget(value, device, seen)
    elif type(obj).__module__.startswith("transformers.") and hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            if name == "device" and isinstance(value, (torch.device, str)):
                setattr(obj, name, device)
            else:
                _retarget(value, device, seen)


def move_to(obj: Any, device: str | torch.device, dtype: torch.dtype | None = None) -> Any:
    """`obj` (inputs, outputs, caches; changed in place) with its tensors on `device` and its floating tensors in
    `dtype` (kept when None), and its caches' recorded device set to match: a cache whose layers say `cpu` while
    their tensors are on the GPU moves them back at every step, and does not match a program traced on the GPU.

    Example:
        >>> move_to({"ids": torch.ones(2, dtype=torch.long), "x": torch.ones(2)}, "cpu", torch.float16)["x"].dtype
        torch.float16
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    moved = cast_leaf_tensors(obj, dtype=dtype, device=device)
    _retarget(moved, device, set())
    return moved


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write a manifest in upstream's format (`ExportedModel.save_pretrained` writes the same file)."""
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def run_component(runner: Any, inputs: dict[str, Any]) -> Any:
    """Run one exported component's runner on the kwargs it was traced with (flags like `use_cache` were traced as
    constants, so they are dropped).

    Inputs made for the eager model (on the CPU, in its dtype) are moved to the program's device and floating inputs
    cast to the precision it was exported at; outputs come back on the CPU, where the eager references are.
    """
    traced = runner.metadata.kwargs
    feed = {name: value for name, value in copy.deepcopy(inputs).items() if name in traced}
    device, dtype = torch.device(runner.device), runner.dtype
    leaves = list(get_leaf_tensors(feed).values())
    if any(t.device != device or (t.is_floating_point() and t.dtype != dtype) for t in leaves):
        feed = move_to(feed, device, dtype)
    outputs = runner(**feed)
    if device.type != "cpu":
        outputs = move_to(outputs, "cpu")
    return outputs


def runner_for_file(path: Path, export_format: str, metadata: Any, device: str | None = None) -> Any:
    """A runner for one program file written beside an export (the seed's `output_path` copy), with the metadata
    of the component it copies."""
    from transformers.exporters.auto import get_runner_class

    exporter = exporter_class(export_format)
    return get_runner_class(export_format).from_program(exporter.load_program(path), metadata, device)


def load_exported(directory: Path, *, device: str | None = None, config: Any = None,
                  allow_pickles: bool = False) -> ExportedModel:
    """Load a saved export with upstream's program loaders and runners, without running code from the folder.

    Upstream `ExportedModel.from_pretrained(trust_remote_code=True)` both unpickles `.pt2` programs and loads the
    folder's `config.json` with its `auto_map` code: here the programs are loaded one by one, a pickled format only
    when `allow_pickles` (this run wrote the files, or the operator allowed it), and the folder's config is never
    read (`config`, the eager model's, is attached instead).

    Args:
        directory: the folder `ExportedModel.save_pretrained` wrote.
        device: where the runners run (the backend's default when None).
        config: the model config to attach (the caller's own object; nothing is read from the folder).
        allow_pickles: load formats whose programs are pickles (`.pt2`).

    Raises:
        ArtifactError: the manifest is missing, unreadable, or disagrees with the files.
        RemoteCodeError: the programs are pickled and `allow_pickles` is False (option `trust_remote_code`).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    export_format = manifest["export_format"]
    exporter = exporter_class(export_format)
    if exporter.requires_trust_remote_code and not allow_pickles:
        raise RemoteCodeError(
            f"refusing to load the {export_format} programs in {directory}: they are pickles, loading them runs "
            "code, and this run did not produce them; allow it with `trust_remote_code` only if you trust where "
            "they came from", option="trust_remote_code")
    components = {}
    programs: dict[str, Any] = {}  # a file shared by components (one method each) is loaded once
    with quiet_torch_serde():
        for name, entry in manifest["components"].items():
            metadata = ExportMetadata.from_dict(entry.get("metadata") or {})
            for spec in (metadata.in_spec, metadata.out_spec):
                if spec is not None:
                    register_treespec_types(spec)  # imports transformers' own cache/output classes only
            if entry["file"] not in programs:
                programs[entry["file"]] = exporter.load_program(directory / entry["file"])
            components[name] = ExportedComponent(programs[entry["file"]], metadata)
    generation_config = None
    if (directory / "generation_config.json").is_file():
        from transformers import GenerationConfig

        generation_config = GenerationConfig.from_pretrained(directory)
    model = ExportedModel(components, export_format, config=config, generation_config=generation_config)
    if EXPORT_BACKENDS[export_format].runner is None:
        return model
    if export_format == "onnx":
        model.to(device, session_options=lean_session_options())
    elif any("method" in entry for entry in manifest["components"].values()):
        model._runners = {name: executorch_method_runner(components[name].program, components[name].metadata,
                                                         entry.get("method", "forward"))
                          for name, entry in manifest["components"].items()}
    else:
        model.to(device)
    if manifest.get("layout") == "transformers.js":  # inputs renamed: bind them by upstream's leaf names
        model._runners = {name: RenamedRunner(runner, manifest["components"][name]["inputs"])
                          for name, runner in model._runners.items()}
    return model


# ── What upstream's save and load do not cover (docs/upstream-gaps.md #8, #12, #13) ────────────────────────────


def lean_session_options():
    """ONNX Runtime options for validation sessions: weights read in place from the external-data file instead of
    repacked into a second copy (`session.disable_prepacking`), no memory arena kept at its high-water mark. A
    session then costs the graph's activations, not another copy of the model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    return options


class RenamedRunner:
    """Upstream's ONNX runner for a graph whose inputs were renamed (the transformers.js layout): kwargs flattened to
    upstream's leaf names, fed under the graph's names. Outputs keep their order, so upstream unflattens them."""

    def __init__(self, runner: Any, inputs: dict[str, str]):
        self._runner = runner
        self._inputs = inputs  # graph input name -> upstream leaf path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs: Any) -> Any:
        leaves = leaf_tensors(kwargs)
        feed = {graph: leaves[path] for graph, path in self._inputs.items() if path in leaves}
        return self._runner(share_inputs=share_inputs, share_outputs=share_outputs, **feed)


class _CapturedLowering:
    """What upstream's ExecuTorch exporter would have lowered: its prepared program and the lowering arguments."""

    def __init__(self, program: Any, kwargs: dict[str, Any]):
        self.program, self.kwargs, self.backend_config = program, kwargs, None

    def to_executorch(self, config: Any = None) -> _CapturedLowering:
        self.backend_config = config
        return self


def export_executorch_methods(exporter: Any, components: dict[str, tuple[Any, dict]],
                              configs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`(ExecutorchProgramManager, {method: ExportMetadata})`: every component traced and prepared by upstream's
    `ExecutorchExporter.export_program` (backend preparation, patches, FX fixes) with its lowering captured, then all
    lowered together by one `to_edge_transform_and_lower({name: program})` under the same patches: one program, one
    method per component, XNNPACK's content-keyed weights stored once."""
    from transformers.exporters import exporter_executorch
    from transformers.exporters.utils import apply_patches

    captured: dict[str, _CapturedLowering] = {}
    metadata: dict[str, Any] = {}
    real = exporter_executorch.to_edge_transform_and_lower
    exporter_executorch.to_edge_transform_and_lower = lambda program, **kwargs: _CapturedLowering(program, kwargs)
    try:
        for name, (module, inputs) in components.items():
            try:
                program, meta = exporter.export_program(module, copy.deepcopy(inputs), configs[name])
            except Exception as err:
                raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}") from err
            meta.export_config = json.loads(configs[name].to_json_string())
            captured[name], metadata[name] = program, meta
    finally:
        exporter_executorch.to_edge_transform_and_lower = real
    first = next(iter(captured.values()))
    backend = next(iter(configs.values())).backend
    with apply_patches("executorch"), apply_patches(f"executorch.{backend}"):
        edge = real({name: c.program for name, c in captured.items()},
                    partitioner={name: c.kwargs["partitioner"] for name, c in captured.items()},
                    compile_config=first.kwargs["compile_config"], transform_passes=first.kwargs["transform_passes"])
        del captured
        return edge.to_executorch(config=first.backend_config), metadata


def executorch_method_runner(program: Any, metadata: Any, method: str) -> Any:
    """Upstream's ExecuTorch runner on one method of a loaded program (upstream's own runs `forward` only)."""
    from transformers.exporters.metadata import load_treespec
    from transformers.exporters.runners.base import ModelRunner
    from transformers.exporters.runners.runner_executorch import ExecutorchModelRunner

    runner = ExecutorchModelRunner.__new__(ExecutorchModelRunner)
    ModelRunner.__init__(runner, metadata)
    runner.method = program.load_method(method)
    runner.in_spec = load_treespec(metadata.in_spec)
    return runner


def metadata_dict(metadata: Any) -> dict[str, Any]:
    """An `ExportMetadata` as upstream's manifest stores it."""
    import dataclasses

    return dataclasses.asdict(metadata)

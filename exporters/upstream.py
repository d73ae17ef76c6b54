"""The one adapter to upstream `transformers.exporters`: everything this project takes from it goes through here.

Upstream is experimental and changes between releases (5.24 renamed cache kwargs and made `.pt2` loading need
`trust_remote_code`); pinning it (constraints.txt) and importing it in this module only means the next release is
adapted in one place. A test fails if another module imports `transformers.exporters`.

What is here: the registry (`exporter_class`, `config_class`), decomposition (`decompose_for_generation`,
`decompose_multimodal`), pytree helpers (`leaf_tensors`, `cast_leaf_tensors`, `pytree_flatten`,
`register_cache_pytrees`), the saved-export format (`ExportedModel`, `read_manifest`) and a loader that never runs
code from an artifact folder unless the operator allowed it ([`load_exported`]).

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
    "UpstreamAutoExportConfig",
    "UpstreamAutoHfExporter",
    "cast_leaf_tensors",
    "config_class",
    "decompose_for_generation",
    "decompose_multimodal",
    "exporter_class",
    "formats_from_files",
    "leaf_tensors",
    "load_exported",
    "move_to",
    "pytree_flatten",
    "quiet_torch_serde",
    "read_manifest",
    "register_cache_pytrees",
    "run_component",
    "runner_class",
    "onnxruntime_quantizer",
    "pt2e_quantizer",
    "capture_calibration_inputs",
    "xnnpack_dynamic_quant_partitioners",
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
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise ArtifactError(f"{directory / MANIFEST_FILE} names {name!r}: a component file must be a plain file "
                                "name inside the export folder")
        path = directory / name
        if path.is_symlink() or not path.is_file():
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


def runner_class(export_format: str):
    """Upstream's runner class for a format (importing it imports the format's runtime)."""
    from transformers.exporters.auto import get_runner_class

    return get_runner_class(export_format)


# ── Quantizers (`transformers.exporters.quantizers`; chosen by `exporters.quantize`) ──


def onnxruntime_quantizer(static: bool, options: dict[str, Any], calibration: list[dict] | None):
    """`OnnxRuntimeQuantizer` with an `OnnxRuntimeStaticConfig` or an `OnnxRuntimeDynamicConfig`."""
    from transformers.exporters.quantizers import (
        OnnxRuntimeDynamicConfig,
        OnnxRuntimeQuantizer,
        OnnxRuntimeStaticConfig,
    )

    config = OnnxRuntimeStaticConfig(**options) if static else OnnxRuntimeDynamicConfig(**options)
    return OnnxRuntimeQuantizer(config, calibration_dataset=calibration)


def pt2e_quantizer(torchao_quantizer: Any, calibration: list[dict] | None):
    """`PT2EQuantizer` around a torchao / ExecuTorch PT2E quantizer."""
    from transformers.exporters.quantizers import PT2EQuantizer

    return PT2EQuantizer(torchao_quantizer, calibration_dataset=calibration)


def capture_calibration_inputs(model: Any, generate_samples: list[dict], generation_config: Any,
                               multi_token_decode: bool) -> dict[str, list[dict]]:
    """`{component: [forward kwargs, ...]}` from generate-style calibration samples (upstream's capture)."""
    from transformers.exporters.quantizers.utils import capture_calibration_inputs as capture

    with torch.no_grad():
        return capture(model, [copy.deepcopy(s) for s in generate_samples], generation_config=generation_config,
                       multi_token_decode=multi_token_decode)


@contextlib.contextmanager
def xnnpack_dynamic_quant_partitioners() -> Iterator[None]:
    """Lower ExecuTorch programs with the dynamically quantized linears delegated first, then the rest (ExecuTorch's
    own LLM export does this for 8da4w). `ExecutorchConfig` has no partitioner option and its single
    `XnnpackPartitioner` fails on a PT2E-quantized decoder with a cache ("Invalid partition, found dependency
    cycles"): docs/upstream-gaps.md #9. Process-local: exports run in their own child process."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )
    from transformers.exporters import exporter_executorch

    table = exporter_executorch._BACKEND_PREPARE
    original = table["xnnpack"]

    def prepare(model, sample_inputs):
        model, sample_inputs, _ = original(model, sample_inputs)
        return model, sample_inputs, [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()]

    table["xnnpack"] = prepare
    try:
        yield
    finally:
        table["xnnpack"] = original


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
    with quiet_torch_serde():
        for name, entry in manifest["components"].items():
            metadata = ExportMetadata.from_dict(entry.get("metadata") or {})
            for spec in (metadata.in_spec, metadata.out_spec):
                if spec is not None:
                    register_treespec_types(spec)  # imports transformers' own cache/output classes only
            components[name] = ExportedComponent(exporter.load_program(directory / entry["file"]), metadata)
    generation_config = None
    if (directory / "generation_config.json").is_file():
        from transformers import GenerationConfig

        generation_config = GenerationConfig.from_pretrained(directory)
    model = ExportedModel(components, export_format, config=config, generation_config=generation_config)
    if EXPORT_BACKENDS[export_format].runner is not None:
        model.to(device)
    return model

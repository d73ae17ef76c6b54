"""The core of the adapter: the registry, decomposition, the saved-export format and the safe loader.

Example:
    >>> exporter_class("onnx").program_suffix
    '.onnx'
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
from transformers import GenerationConfig
from transformers.exporters import ExportedComponent, ExportedModel
from transformers.exporters.auto import EXPORT_BACKENDS, get_exporter_class, get_runner_class
from transformers.exporters.auto import AutoExportConfig as UpstreamAutoExportConfig
from transformers.exporters.auto import AutoHfExporter as UpstreamAutoHfExporter
from transformers.exporters.metadata import ExportMetadata, load_treespec, register_treespec_types
from transformers.exporters.utils import (
    _find_multimodal_submodules,
    decompose_for_generation,
    decompose_multimodal,
    precompute_export_inputs,
)

from exporters.errors import ArtifactError, RemoteCodeError
from exporters.upstream.beyond import (
    RenamedRunner,
    executorch_method_runner,
    lean_session_options,
    prepacks_alike,
    share_identical_weights,
)
from exporters.upstream.internals import pt2_read_once
from exporters.upstream.llm_runner import register_custom_ops, register_quantized_kernels
from exporters.upstream.onnx_decompositions import torchlib_registry_ready
from exporters.upstream.pytree import leaf_tensors, move_to

try:
    from transformers.exporters.utils import _OUTPUT_FLAGS as OUTPUT_FLAGS
except ImportError:  # pragma: no cover - older upstream
    OUTPUT_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states")


__all__ = [
    "TORCH_SERDE_LOGGER",
    "EXPORT_BACKENDS",
    "ExportedComponent",
    "ExportedModel",
    "MANIFEST_FILE",
    "OUTPUT_FLAGS",
    "STEP_COUNTERS",
    "SUFFIX_FORMATS",
    "UpstreamAutoExportConfig",
    "UpstreamAutoHfExporter",
    "config_class",
    "counter_in_spec_components",
    "decompose_for_generation",
    "decompose_multimodal",
    "exporter_class",
    "fit_traced_spec",
    "formats_from_files",
    "load_exported",
    "multimodal_submodules",
    "prepare_traced_inputs",
    "quiet_torch_serde",
    "read_manifest",
    "run_component",
    "runner_class",
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


# torch 2.13's `.pt2` loader logs a warning whose format string has no placeholder for its argument: the logging
# call itself fails ("--- Logging error ---" on stderr, an exception under pytest). See docs/upstream-gaps.md.
TORCH_SERDE_LOGGER = "torch._export.serde.serialize"


@contextlib.contextmanager
def quiet_torch_serde() -> Iterator[None]:
    """Silence the broken warning of torch's `.pt2` deserializer while loading."""
    logger = logging.getLogger(TORCH_SERDE_LOGGER)
    with contextlib.ExitStack() as stack:
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.ERROR)
        yield


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


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write a manifest in upstream's format (`ExportedModel.save_pretrained` writes the same file)."""
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def run_component(runner: Any, inputs: dict[str, Any]) -> Any:
    """Run one exported component's runner on the kwargs it was traced with (flags like `use_cache` were traced as
    constants, so they are dropped); a `.pt2` or `.pte` program is fed the way a runtime feeds flat buffers
    ([`fit_traced_spec`]).

    Inputs made for the eager model (on the CPU, in its dtype) are moved to the program's device and floating inputs
    cast to the precision it was exported at; outputs come back on the CPU, where the eager references are.
    """
    traced = runner.metadata.kwargs
    feed = {name: value for name, value in copy.deepcopy(inputs).items() if name in traced}
    device, dtype = torch.device(runner.device), runner.dtype
    leaves = list(leaf_tensors(feed).values())
    if any(t.device != device or (t.is_floating_point() and t.dtype != dtype) for t in leaves):
        feed = move_to(feed, device, dtype)
    feed, _ = fit_traced_spec(runner, feed)
    outputs = runner(**feed)
    if device.type != "cpu":
        outputs = move_to(outputs, "cpu")
    return outputs


def runner_class(export_format: str):
    """Upstream's runner class for a format (importing it imports the format's runtime)."""

    return get_runner_class(export_format)


def import_loaders(export_format: str) -> None:
    """Import the exporter class that loading an export of this format goes through (ONNX's pulls in onnxscript's
    function library: a second), so that a process can do it while it would otherwise wait. Not the runner's
    runtime: importing ONNX Runtime starts a native thread, and export children may still fork from this process.

    Example:
        >>> import_loaders("onnx")  # doctest: +SKIP
    """
    exporter_class(export_format)


def exporter_ready(export_format: str) -> None:
    """What a process that forks export children of this format loads first, so that each child copies it instead
    of loading it again: the exporter's modules (ExecuTorch's compiler: 2 s) and, for ONNX, torch.onnx's registry
    of torchlib's functions (0.5 s). A process that will fork them may call it early (it loads nothing else).

    Example:
        >>> exporter_ready("executorch")  # doctest: +SKIP
    """
    import_loaders(export_format)
    if export_format == "onnx":
        torchlib_registry_ready()


def runner_for_file(path: Path, export_format: str, metadata: Any, device: str | None = None) -> Any:
    """A runner for one program file written beside an export (the seed's `output_path` copy), with the metadata
    of the component it copies."""

    exporter = exporter_class(export_format)
    return get_runner_class(export_format).from_program(exporter.load_program(path), metadata, device)


# A sliding-window cache layer carries how many tokens it has seen in its pytree context, not as a tensor
# (`cumulative_length` of a dynamic layer, `cumulative_length_int` of a static one): a program traced at one step
# refuses the cache of any other step ("Trying to flatten user inputs with exported input tree spec"). The dynamic
# graph reads that count nowhere (upstream traces it as a full layer); the static one chose its code path from it at
# trace time (window full or not), which generation parity then checks token by token. See docs/upstream-gaps.md.
STEP_COUNTERS = ("cumulative_length", "cumulative_length_int")


def _without_counters(context: Any) -> Any:
    if isinstance(context, dict):
        return {k: _without_counters(v) for k, v in context.items() if k not in STEP_COUNTERS}
    if isinstance(context, (list, tuple)):
        return [_without_counters(v) for v in context]
    return context


def _same_but_counters(given: Any, traced: Any) -> bool:
    """Whether two pytree specs differ at most in the step counters of cache contexts."""
    if given.type is not traced.type or given.num_children != traced.num_children:
        return False
    if given.context != traced.context and _without_counters(given.context) != _without_counters(traced.context):
        return False
    return all(_same_but_counters(a, b) for a, b in zip(given.children(), traced.children()))


def fit_traced_spec(runner: Any, feed: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`feed` for a `.pt2` or `.pte` program the way a runtime feeding flat buffers gives it: tensors contiguous,
    and rebuilt on the traced input spec when it differs from it only in a cache layer's step counter (upstream's
    torch.export and ExecuTorch runners check the whole spec; ONNX Runtime, which binds flat tensors by name, is fed
    as is). Returns the feed and whether the spec was rebuilt; anything else that differs is left for the program
    to accept or refuse."""
    in_spec = getattr(getattr(runner, "metadata", None), "in_spec", None)
    # The torch.export and ExecuTorch runners check their input spec; ONNX Runtime binds tensors by name.
    if in_spec is None or not (hasattr(runner, "traced_kwarg_order") or hasattr(runner, "in_spec")):
        return feed, False
    feed = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.contiguous(), feed)
    traced = load_treespec(in_spec)
    full = {**runner.metadata.in_constants, **feed}
    ordered = {name: full[name] for name in traced.child(1).context if name in full}
    if len(ordered) != len(full):
        return feed, False
    leaves, given = torch.utils._pytree.tree_flatten(((), ordered))
    if given == traced or given.num_leaves != traced.num_leaves or not _same_but_counters(given, traced):
        return feed, False
    _, kwargs = torch.utils._pytree.tree_unflatten(leaves, traced)
    return {name: kwargs[name] for name in feed}, True


def counter_in_spec_components(exported: ExportedModel) -> list[str]:
    """The `.pt2` / `.pte` components whose traced input spec holds a cache layer's step counter."""
    if str(exported.export_format) not in ("dynamo", "executorch"):
        return []
    return [name for name, component in exported.components.items()
            if any(counter in (component.metadata.in_spec or "") for counter in STEP_COUNTERS)]


# Granite Speech's stages, by upstream's names: its speech encoder and Q-Former projector (see multimodal_submodules).
_SPEECH_STAGES = {"audio_encoder": "encoder", "language_model": "language_model", "multi_modal_projector": "projector"}


def multimodal_submodules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Upstream's own finder of a multimodal model's stages: `{"image_encoder" | "audio_encoder" |
    "multi_modal_projector" | "connector" | ... | "language_model" | "lm_head": module}`, empty when the model is not
    multimodal (no modality encoder beside a language model).

    Upstream asks `get_encoder("audio")`, which knows `audio_tower`-style names only: a speech encoder and projector
    held as `encoder` / `projector` beside `language_model` on a config with `encoder_config` (Granite Speech) are
    found here under upstream's stage names (docs/upstream-gaps.md)."""
    found = _find_multimodal_submodules(model)
    base = getattr(model, "base_model", model)
    named = {stage: getattr(base, attribute, None) for stage, attribute in _SPEECH_STAGES.items()}
    if found or getattr(model.config, "encoder_config", None) is None or \
            not all(isinstance(module, torch.nn.Module) for module in named.values()):
        return found
    head = getattr(model, "lm_head", None)
    return {**named, **({"lm_head": head} if isinstance(head, torch.nn.Module) else {})}


def prepare_traced_inputs(module: torch.nn.Module, inputs: dict[str, Any]) -> None:
    """Upstream's precomputation of the data-dependent inputs an export traces with (`cu_seqlens`, vision position
    ids from `grid_thw`, ...), in place: what a runtime computes before calling such a graph."""
    with torch.no_grad():
        precompute_export_inputs(module, inputs)


def load_exported(directory: Path, *, device: str | None = None, config: Any = None,
                  allow_pickles: bool = False) -> ExportedModel:
    """Load a saved export with upstream's program loaders and runners, without running code from the folder.

    Upstream `ExportedModel.from_pretrained` with `trust_remote_code` set both unpickles `.pt2` programs and loads the
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
    if manifest.get("custom_ops"):  # the runner layout's llama:: kernels (exporters.upstream.llm_runner)
        register_custom_ops()
    if export_format == "executorch" and manifest.get("quantization"):  # a quantized table's embedding kernels
        register_quantized_kernels()
    components = {}
    programs: dict[str, Any] = {}  # a file shared by components (one method each) is loaded once
    weights: dict[str, Any] = {}  # split .pt2 programs each carry the weights: held once (share_identical_weights)
    with quiet_torch_serde(), pt2_read_once():  # torch's deserializer reads each type and size once
        for name, entry in manifest["components"].items():
            metadata = ExportMetadata.from_dict(entry.get("metadata") or {})
            for spec in (metadata.in_spec, metadata.out_spec):
                if spec is not None:
                    register_treespec_types(spec)  # imports transformers' own cache/output classes only
            if entry["file"] not in programs:
                programs[entry["file"]] = _load_program(exporter, directory, entry)
                share_identical_weights(programs[entry["file"]], weights)
            components[name] = ExportedComponent(programs[entry["file"]], metadata)
    generation_config = None
    if (directory / "generation_config.json").is_file():

        generation_config = GenerationConfig.from_pretrained(directory)
    model = ExportedModel(components, export_format, config=config, generation_config=generation_config)
    if EXPORT_BACKENDS[export_format].runner is None:
        return model
    if export_format == "onnx":
        model.to(device, session_options=lean_session_options(prepack=prepacks_alike(programs.values())))
    elif any("method" in entry for entry in manifest["components"].values()):
        model._runners = {name: executorch_method_runner(components[name].program, components[name].metadata,
                                                         entry.get("method", "forward"))
                          for name, entry in manifest["components"].items()}
    else:
        model.to(device)
    renamed = {name: entry["inputs"] for name, entry in manifest["components"].items()
               if isinstance(entry.get("inputs"), dict)}  # the runtimes' names: bound by upstream's leaf names
    if renamed:
        entries = manifest["components"]
        model._runners = {name: RenamedRunner(runner, renamed[name], entries[name].get("branch")) if name in renamed
                          else runner for name, runner in model._runners.items()}
    return model


def _load_program(exporter: Any, directory: Path, entry: dict[str, Any]) -> Any:
    """A component's program; an ExecuTorch program whose weights live in a `.ptd` beside it (`data_file`) is loaded
    with them (upstream's loader reads the `.pte` alone)."""
    data_file = entry.get("data_file")
    if data_file is None:
        return exporter.load_program(directory / entry["file"])
    data_path = (directory / data_file).resolve()
    if data_path.parent != directory.resolve() or not data_path.is_file():
        raise ArtifactError(f"{directory}: the manifest names data file {data_file!r}, which is not a file of the "
                            "folder")
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(directory / entry["file"], data_path=data_path)
    program.path = str(directory / entry["file"])
    return program

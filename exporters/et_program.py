"""One ExecuTorch program for all the components of a target: one method per component (`prefill`, `decode`, ...)
sharing the constant data, as ExecuTorch's multi-method programs do (and optimum-executorch writes them).

Each component is traced and prepared by upstream's own `ExecutorchExporter.export_program` (backend preparation,
patches, FX fixes), with its lowering call captured instead of run; the captured programs are then lowered together
by one `to_edge_transform_and_lower({name: program})`, under the same upstream patches. XNNPACK keys its weights by
content (sha256) in the program's named data, so a weight shared by two methods is stored once.

Upstream `ExportedModel.from_pretrained` (transformers 5.24) loads a `.pte` per component and runs its `forward`
method only (docs/upstream-gaps.md #6): [`load_methods`] loads such a target with upstream's runner, one per method.

Part of the adapter to upstream (`exporters.engine`): everything here reaches into `transformers.exporters`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path
from typing import Any

PROGRAM_FILE = "model.pte"


@dataclasses.dataclass
class _Captured:
    """What upstream's `export_program` would have lowered: the program and the lowering arguments."""

    program: Any
    kwargs: dict[str, Any]
    backend_config: Any = None

    def to_executorch(self, config=None):
        self.backend_config = config
        return self


@contextlib.contextmanager
def _capture_lowering(module):
    """Make upstream's exporter hand back its prepared `ExportedProgram` instead of lowering it."""
    real = module.to_edge_transform_and_lower
    module.to_edge_transform_and_lower = lambda program, **kwargs: _Captured(program, kwargs)
    try:
        yield
    finally:
        module.to_edge_transform_and_lower = real


def export_methods(exporter, components: dict[str, tuple[Any, dict]], configs: dict[str, Any]):
    """`(ExecutorchProgramManager, {method: ExportMetadata})`: every component traced by upstream's exporter, then
    lowered together into one program with a method per component."""
    import json

    from transformers.exporters import exporter_executorch
    from transformers.exporters.utils import apply_patches

    captured: dict[str, _Captured] = {}
    metadata: dict[str, Any] = {}
    with _capture_lowering(exporter_executorch):
        for name, (module, inputs) in components.items():
            config = configs[name]
            try:
                program, meta = exporter.export_program(module, copy.deepcopy(inputs), config)
            except Exception as err:
                raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}") from err
            meta.export_config = json.loads(config.to_json_string())
            captured[name], metadata[name] = program, meta
    first = next(iter(captured.values()))
    backend = next(iter(configs.values())).backend
    with apply_patches("executorch"), apply_patches(f"executorch.{backend}"):
        edge = exporter_executorch.to_edge_transform_and_lower(
            {name: c.program for name, c in captured.items()},
            partitioner={name: c.kwargs["partitioner"] for name, c in captured.items()},
            compile_config=first.kwargs["compile_config"],
            transform_passes=first.kwargs["transform_passes"],
        )
        del captured
        program = edge.to_executorch(config=first.backend_config)
    return program, metadata


def save_methods(program, metadata: dict[str, Any], directory: Path, config, generation_config) -> None:
    """Write `model.pte` and a manifest in upstream's format whose components name their method too."""
    from .engine import write_manifest

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / PROGRAM_FILE, "wb") as handle:
        program.write_to_file(handle)
    components = {name: {"file": PROGRAM_FILE, "method": name, "metadata": dataclasses.asdict(meta)}
                  for name, meta in metadata.items()}
    write_manifest(directory, {"schema_version": 1, "export_format": "executorch", "components": components})
    if config is not None:
        config.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)


def method_runner(program, metadata, method: str):
    """Upstream's ExecuTorch runner on one method of `program` (upstream's runs `forward` only)."""
    from transformers.exporters.metadata import load_treespec
    from transformers.exporters.runners.base import ModelRunner
    from transformers.exporters.runners.runner_executorch import ExecutorchModelRunner

    runner = ExecutorchModelRunner.__new__(ExecutorchModelRunner)
    ModelRunner.__init__(runner, metadata)
    runner.method = program.load_method(method)
    runner.in_spec = load_treespec(metadata.in_spec)
    return runner


def load_methods(directory: Path, manifest: dict[str, Any]):
    """An upstream `ExportedModel` for a multi-method ExecuTorch target, each component run by its method. The
    program file is loaded once, whatever the number of methods."""
    from transformers import AutoConfig, GenerationConfig
    from transformers.exporters import ExportedComponent, ExportedModel
    from transformers.exporters.metadata import ExportMetadata, register_treespec_types
    from transformers.exporters.exporter_executorch import ExecutorchExporter

    programs: dict[str, Any] = {}
    components, runners = {}, {}
    for name, entry in manifest["components"].items():
        metadata = ExportMetadata.from_dict(entry["metadata"])
        for spec in (metadata.in_spec, metadata.out_spec):
            if spec is not None:
                register_treespec_types(spec)
        if entry["file"] not in programs:
            programs[entry["file"]] = ExecutorchExporter.load_program(directory / entry["file"])
        program = programs[entry["file"]]
        components[name] = ExportedComponent(program, metadata)
        runners[name] = method_runner(program, metadata, entry.get("method", "forward"))
    config = AutoConfig.from_pretrained(directory) if (directory / "config.json").is_file() else None
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    exported = ExportedModel(components, "executorch", config=config, generation_config=generation_config)
    exported._runners = runners  # upstream's `to()` would load `forward` of each component's program
    return exported


def method_names(path: Path) -> list[str]:
    """The methods of a saved `.pte`."""
    from executorch.runtime import Runtime

    return sorted(Runtime.get().load_program(path).method_names)

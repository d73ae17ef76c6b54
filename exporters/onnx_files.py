"""The seed's ONNX file options that upstream dropped, applied for real to the saved model files.

- `external_data: false` embeds the weights in the `.onnx` protobuf (the `.onnx.data` sidecar is left empty, because
  upstream's loader lists it for every component);
- `keep_initializers_as_inputs: true` also lists every weight as a graph input (with its stored value as default);
- `output_path` writes a copy of the single-graph model, weights embedded, at that path inside the target's folder;
- `export_params: false` strips the weights: they become graph inputs the caller supplies (applied after validation,
  which runs with the weights).
"""

from __future__ import annotations

import json
from pathlib import Path


def _component_files(directory: Path) -> list[Path]:
    manifest = json.loads((directory / "export.json").read_text())
    return [directory / entry["file"] for entry in manifest["components"].values()]


def apply_onnx_file_options(target, directory: Path) -> None:
    import onnx_ir

    for path in _component_files(directory):
        if target.external_data and not target.keep_initializers_as_inputs:
            continue
        model = onnx_ir.load(str(path))
        if target.keep_initializers_as_inputs:
            inputs = {value.name for value in model.graph.inputs}
            for name, value in model.graph.initializers.items():
                if name not in inputs:
                    model.graph.inputs.append(value)
        sidecar = path.with_name(path.name + ".data")
        if target.external_data:
            tmp = path.with_name(path.name + ".tmp")
            onnx_ir.save(model, str(tmp), external_data=sidecar.name + ".tmp")
            Path(str(tmp)).replace(path)
            sidecar.with_name(sidecar.name + ".tmp").replace(sidecar)
            _rename_external_location(path, sidecar.name + ".tmp", sidecar.name)
        else:
            onnx_ir.save(model, str(path))
            sidecar.write_bytes(b"")
    if target.output_path:
        files = _component_files(directory)
        if len(files) != 1:
            raise ValueError(
                f"output_path names one file, but this export has {len(files)} components; drop output_path or use "
                "mode: model"
            )
        import onnx_ir

        destination = directory / target.output_path
        destination.parent.mkdir(parents=True, exist_ok=True)
        onnx_ir.save(onnx_ir.load(str(files[0])), str(destination))


def _rename_external_location(path: Path, old: str, new: str) -> None:
    """Point the graph's external-data entries from `old` to `new` (the sidecar was renamed into place)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save(model, str(path))


def strip_weights(directory: Path) -> list[str]:
    """`export_params: false`: turn every initializer into a graph input without a value. Returns their names."""
    import onnx_ir

    stripped: list[str] = []
    for path in _component_files(directory):
        model = onnx_ir.load(str(path))
        inputs = {value.name for value in model.graph.inputs}
        for name, value in list(model.graph.initializers.items()):
            if name not in inputs:
                model.graph.inputs.append(value)
            value.const_value = None
            stripped.append(name)
        model.graph.initializers.clear()
        onnx_ir.save(model, str(path))
        path.with_name(path.name + ".data").write_bytes(b"")
    return stripped

"""ONNX file handling after upstream saved a target: the seed's file options that upstream dropped, applied for real to
the saved model files, and one copy of the weights for all the components of a target.

- `external_data: false` embeds the weights in the `.onnx` protobuf (the `.onnx.data` sidecar is left empty, because
  upstream's loader lists it for every component);
- `keep_initializers_as_inputs: true` also lists every weight as a graph input (with its stored value as default);
- `output_path` writes a copy of the single-graph model, weights embedded, at that path inside the target's folder;
- `export_params: false` strips the weights: they become graph inputs the caller supplies (applied after validation,
  which runs with the weights).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# Past this, a protobuf cannot hold the weights: they stay in a sidecar file whatever the recipe asks.
PROTOBUF_LIMIT = int(1.8 * 2**30)


def _component_files(directory: Path) -> list[Path]:
    manifest = json.loads((directory / "export.json").read_text())
    return [directory / entry["file"] for entry in manifest["components"].values()]


def _save(model, path: Path, *, embedded: bool) -> None:
    """Write `model` (weights in memory) to `path`: embedded, or in `<name>.data` beside it."""
    # onnx loads only where an ONNX file is read
    import onnx

    sidecar = path.with_name(path.name + ".data")
    sidecar.unlink(missing_ok=True)  # onnx appends external data to an existing file
    if embedded and model.ByteSize() < PROTOBUF_LIMIT:
        onnx.save_model(model, str(path))
        return
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=sidecar.name, size_threshold=0)


def _add_initializers_as_inputs(model) -> None:
    # onnx loads only where an ONNX file is read
    import onnx

    listed = {value.name for value in model.graph.input}
    for tensor in model.graph.initializer:
        if tensor.name not in listed:
            model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))


def apply_onnx_file_options(target, directory: Path) -> None:
    """Apply `external_data`, `keep_initializers_as_inputs` and `output_path` to a saved ONNX export."""
    # onnx loads only where an ONNX file is read
    import onnx

    for path in _component_files(directory):
        if target.external_data and not target.keep_initializers_as_inputs:
            continue
        model = onnx.load(str(path))  # with its weights, read from the sidecar
        if target.keep_initializers_as_inputs:
            _add_initializers_as_inputs(model)
        _save(model, path, embedded=not target.external_data)
        sidecar = path.with_name(path.name + ".data")
        if not sidecar.exists():
            sidecar.write_bytes(b"")  # upstream's loader lists the sidecar of every component
    if target.output_path:
        files = _component_files(directory)
        if len(files) != 1:
            raise ValueError(
                f"output_path names one file, but this export has {len(files)} components; drop output_path or use "
                "mode: model"
            )
        destination = directory / target.output_path
        destination.parent.mkdir(parents=True, exist_ok=True)
        if not destination.resolve().is_relative_to(directory.resolve()):
            raise ValueError(f"output_path {target.output_path!r} leads outside the target's folder (through a link)")
        _save(onnx.load(str(files[0])), destination, embedded=True)


def strip_weights(directory: Path, output_path: str | None = None) -> list[str]:
    """`export_params: false`: every initializer becomes a graph input without a value, in every component and in
    the `output_path` copy. Returns the stripped names (of the components)."""
    # onnx loads only where an ONNX file is read
    import onnx

    stripped: list[str] = []
    files = _component_files(directory)
    for path in [*files, *([directory / output_path] if output_path else [])]:
        model = onnx.load(str(path), load_external_data=False)
        _add_initializers_as_inputs(model)
        if path in files:
            stripped += [tensor.name for tensor in model.graph.initializer]
        del model.graph.initializer[:]
        _save(model, path, embedded=True)
        if path in files:
            path.with_name(path.name + ".data").write_bytes(b"")  # upstream's loader lists every component's sidecar
    return stripped


def external_data_of(tensor) -> dict[str, str] | None:
    # onnx loads only where an ONNX file is read
    import onnx

    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {entry.key: entry.value for entry in tensor.external_data}


def _set_external(tensor, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _read_range(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)


def share_external_data(directory: Path, more: tuple[str, ...] = ()) -> int:
    """Store the weights of every component of an export once: the first component's sidecar holds them, and the
    other components' graphs point at the same tensors there (same bytes, same offsets); a tensor no earlier
    component has is appended to it. Their own sidecars are left empty (upstream's loader lists the sidecar of
    every component). `more`: graphs a layout wrote beside the components (file names in `directory`), shared
    likewise. One tensor is in memory at a time. Returns the bytes saved.

    Example:
        >>> share_external_data(Path("out/onnx"))  # doctest: +SKIP
        1981808640
    """

    # onnx loads only where an ONNX file is read
    import onnx

    files = _component_files(directory) + [directory / name for name in more]
    base = files[0].with_name(files[0].name + ".data")
    stored: dict[tuple[str, int], int] = {}  # (sha256, length) -> offset in `base`
    for tensor in initializers(onnx.load(str(files[0]), load_external_data=False)):
        info = external_data_of(tensor)
        if info is not None and info.get("location") == base.name:
            offset, length = int(info.get("offset", 0)), int(info["length"])
            stored.setdefault((hashlib.sha256(_read_range(base, offset, length)).hexdigest(), length), offset)
    saved = 0
    for path in files[1:]:
        model = onnx.load(str(path), load_external_data=False)
        own = path.with_name(path.name + ".data")
        for tensor in initializers(model):
            info = external_data_of(tensor)
            if info is None or info.get("location") != own.name:
                continue
            data = _read_range(own, int(info.get("offset", 0)), int(info["length"]))
            key = (hashlib.sha256(data).hexdigest(), len(data))
            if key in stored:
                saved += len(data)
            else:
                with base.open("ab") as handle:
                    stored[key] = handle.tell()
                    handle.write(data)
            _set_external(tensor, base.name, stored[key], len(data))
        onnx.save_model(model, str(path))
        own.write_bytes(b"")
    return saved


def initializers(model):
    """Every initializer of the model, subgraphs included."""
    # onnx loads only where an ONNX file is read
    import onnx

    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)


def gather_external_data(model, source: Path, target: Path) -> bool:
    """Copy every external tensor of `model` (its data in files of folder `source`) into `target`, each stored
    range once, and point the model's tensors there (`location` is `target`'s name: save the graph beside it).
    Returns whether the model has external tensors; `target` is written only when it has."""
    tensors = [(tensor, info) for tensor in initializers(model) if (info := external_data_of(tensor)) is not None]
    if not tensors:
        return False
    written: dict[tuple[str, int, int], int] = {}
    with target.open("wb") as handle:
        for tensor, info in tensors:
            where = (info["location"], int(info.get("offset", 0)), int(info["length"]))
            if where not in written:
                written[where] = handle.tell()
                handle.write(_read_range(source / where[0], where[1], where[2]))
            _set_external(tensor, target.name, written[where], where[2])
    return True

"""How many bytes a saved target takes, and how many of them are weights: read from the files' own structure (ONNX
initializers and their external-data ranges, the `.pte` constant and named-data segments, the `.pt2` weight and
constant records), so a weight stored twice is counted twice and a range shared by two graphs once.

Only metadata is read (protobufs without their external data, the `.pte` flatbuffer header, zip directories):
a multi-gigabyte artifact is never loaded into memory.

Example:
    >>> footprint(Path("out/onnx"), "onnx")  # doctest: +SKIP
    {'total_bytes': 1981962240, 'weights_stored_bytes': 1981808640}
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from exporters.export.artifact_dtype import artifact_dtype, typed_bytes
from exporters.export.onnx_files import external_data_of, initializers
from exporters.upstream import pte_weight_bytes


def total_bytes(directory: Path) -> int:
    """Bytes of every file under `directory` (what an upload of the target sends)."""
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())


def _onnx_weights(directory: Path) -> int:
    # onnx loads only where an ONNX file is read
    import onnx

    ranges: set[tuple[Path, int, int]] = set()
    embedded = 0
    for path in sorted(directory.rglob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        for tensor in initializers(model):
            info = external_data_of(tensor)
            if info is None:
                embedded += len(tensor.raw_data) or typed_bytes(tensor)
            else:
                location = (path.parent / info["location"]).resolve()
                ranges.add((location, int(info.get("offset", 0)), int(info["length"])))
    return embedded + sum(length for _, _, length in ranges)


def _pt2_weights(path: Path) -> int:
    with zipfile.ZipFile(path) as archive:
        return sum(info.file_size for info in archive.infolist()
                   if ("data/weights/" in info.filename or "data/constants/" in info.filename)
                   and not info.filename.endswith(".json"))


def weights_stored_bytes(directory: Path, export_format: str) -> int:
    """Bytes of tensor data the target's files store (each shared range counted once)."""
    directory = Path(directory)
    if export_format == "onnx":
        return _onnx_weights(directory)
    if export_format == "executorch":  # a `.ptd` beside a program holds its weights, each tensor once
        return (sum(pte_weight_bytes(path) for path in sorted(directory.rglob("*.pte")))
                + sum(path.stat().st_size for path in sorted(directory.rglob("*.ptd"))))
    if export_format == "dynamo":
        return sum(_pt2_weights(path) for path in sorted(directory.rglob("*.pt2")))
    raise ValueError(f"unknown export format {export_format!r}")


def footprint(directory: Path, export_format: str) -> dict[str, int]:
    """`{"total_bytes", "weights_stored_bytes"}` of a saved target."""
    return {"total_bytes": total_bytes(directory),
            "weights_stored_bytes": weights_stored_bytes(directory, export_format)}


@dataclass(frozen=True)
class ModelWeights:
    """What a footprint is compared with, read from the model when it is loaded (validation may free it later).

    Example:
        >>> ModelWeights(count=1000, dtype="float32", tied=False).bytes("float16")
        2000
    """

    count: int  # parameters, tied ones once
    dtype: str
    tied: bool  # the output projection is the input embedding table

    @classmethod
    def of(cls, model) -> ModelWeights:
        return cls(sum(p.numel() for p in model.parameters()), str(model.dtype).removeprefix("torch."),
                   tied_embeddings(model))

    def bytes(self, dtype: str | None = None) -> int:
        """Parameter bytes in `dtype` (the model's own when None)."""

        return self.count * torch.empty((), dtype=getattr(torch, dtype or self.dtype)).element_size()


def tied_embeddings(model) -> bool:
    """Whether the model's output projection is its input embedding table (one tensor, two uses)."""
    try:
        output = model.get_output_embeddings()
        return output is not None and output.weight is model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return False


def duplication_finding(stored: int, parameters: int, export_format: str, components: list[str],
                        tied: bool = False) -> str | None:
    """What the report says when the artifacts store the weights more than once (5% slack for buffers and
    constants a graph adds, like rotary tables)."""
    if parameters <= 0 or stored <= 1.05 * parameters:
        return None
    ratio = stored / parameters
    why = ""
    if export_format == "dynamo" and len(components) > 1:
        why = (f": each of {components} is a separate .pt2 holding its own copy (torch.export's .pt2 format stores "
               "one program with its weights, and upstream saves one per component); the merged graph ('merged': true, the "
               "default of a decoder-only model with a dynamic cache) stores one copy")
    elif export_format == "executorch" and tied:
        why = (": the model ties its embedding table to its output projection, and the embedding lookup (not "
               "delegated) and XNNPACK's projection keep different tensors of it (a quantized projection is no "
               "longer the table, so model.ptd cannot hold it once; docs/upstream-gaps.md #13)")
    return f"the artifacts store {ratio:.2f}x the model's parameter bytes ({stored} of {parameters}){why}"


def record_footprint(result, target, directory: Path, weights: ModelWeights) -> None:
    """Set a target result's `total_bytes`, `weights_stored_bytes` and `parameter_bytes`, with a finding when the
    weights are stored more than once."""
    try:
        sizes = footprint(directory, target.export_format)
    except Exception as err:  # a size that cannot be read is reported, never guessed
        result.findings.append(f"could not measure the stored weights: {type(err).__name__}: {err}")
        result.total_bytes = total_bytes(directory)
        return
    result.total_bytes, result.weights_stored_bytes = sizes["total_bytes"], sizes["weights_stored_bytes"]
    try:
        result.artifact_dtype = artifact_dtype(directory, target.export_format)
    except Exception as err:  # a dtype that cannot be read is reported, never guessed from the recipe
        result.findings.append(f"could not read the artifact's dtype: {type(err).__name__}: {err}")
    result.parameter_bytes = weights.bytes(target.dtype)
    stripped = target.export_format == "onnx" and not target.export_params
    finding = duplication_finding(result.weights_stored_bytes, result.parameter_bytes, target.export_format,
                                  result.expected_components, weights.tied)
    if finding and not stripped:
        result.findings.append(finding)

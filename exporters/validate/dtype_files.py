"""Each dtype file of a transformers.js folder judged against eager with its own variant's budget.

```
folder onnx/model.onnx + model_q4.onnx + ...      (exporters.layouts.transformers_js.dtypes: export.json "dtype_files")
  for each dtype file: export.json naming that file for the while (`_naming`)
     ──► validate(view target, folder) : the target's checks with the variant's quantize / dtype, so its kind's budget
                                        judges it (exporters.validate.quality), no runtime proof (the folder's own
                                        proof loads every dtype file: exporters.layouts.transformers_js.proof)
  ──► rows {dtype, file, variant, bytes, status, quality} ──► TargetResult.dtype_files; one failing file fails the target
```

export.json is restored once each file is judged, before the folder's own validation and proofs read it.

Example:
    >>> view_settings({"variant": "q4f16", "kind": "int4", "quantize": {"method": "onnxruntime-int4"}})
    {'dtype': 'float16', 'quantize': OnnxRuntimeInt4Quantize(method='onnxruntime-int4', block_size=32, accuracy_level=4, symmetric=True, quantize_embeddings=False, shared_embeddings=True)}
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import TypeAdapter

from exporters import fsutil
from exporters.recipe.variants import QuantizeSpec
from exporters.status import FAILED, PASSED, UNVERIFIED

DTYPE_FILES = "dtype_files"  # export.json's key (exporters.layouts.transformers_js.dtypes)


def listed_dtype_files(directory: Path) -> dict[str, dict[str, Any]]:
    """The dtype files a folder's export.json lists, `{}` where none."""
    try:
        files = json.loads((Path(directory) / "export.json").read_text(encoding="utf-8")).get(DTYPE_FILES) or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def view_settings(entry: dict[str, Any]) -> dict[str, Any]:
    """The target settings a dtype file is judged with: its precision and quantize method, as its variant sets."""
    quantize = TypeAdapter(QuantizeSpec).validate_python(entry["quantize"]) if entry.get("quantize") else None
    half = entry.get("variant") in ("fp16", "q4f16")
    return {"dtype": "float16" if half else None, "quantize": quantize}


def judge_dtype_files(target: Any, directory: Path,
                      validate: Callable[[Any, Path], Any]) -> list[dict[str, Any]]:
    """A row per dtype file of `directory` (none where it lists none), each judged by `validate(view_target,
    directory)` (a `ValidationResult`) while export.json names that file."""
    rows = []
    for dtype, entry in listed_dtype_files(directory).items():
        with _naming(directory, entry.get("files") or {"onnx/model.onnx": entry["file"]}):
            result = validate(target.model_copy(update={**view_settings(entry), "variants": None}), directory)
        status, quality = result.verdict, result.quality
        error = "; ".join(result.errors) or None
        several = entry.get("files") if len(_files(entry)) > 1 else None  # each graph's file, where there are more
        rows.append({"dtype": dtype, "variant": entry.get("variant"), "file": entry["file"],
                     **({"files": several} if several else {}),
                     "bytes": sum(_bytes(directory, file) for file in _files(entry)), "status": status,
                     "quality": quality, **({"error": error[:500]} if error else {})})
    return rows


def record_dtype_files(result: Any, rows: list[dict[str, Any]], directory: Path, own_status: str) -> None:
    """The rows into `result.dtype_files`, led by the folder's own fp32 graph (`own_status`: its own checks' verdict,
    the folder's proofs aside: they load every file); a failed or unverified file makes the target so, saying
    which."""
    if not rows:
        return
    graphs = {fp32: dtype_file for row in rows for fp32, dtype_file in (row.get("files") or {}).items()}
    own_files = sorted(graphs) or ["onnx/model.onnx"]
    own = {"dtype": "fp32", "variant": "fp32", "file": _main_file(own_files),
           "bytes": sum(_bytes(directory, file) for file in own_files), "status": own_status, "quality": result.quality}
    try:  # what transformers.js loads without a `dtype` (the first variant listed: dtypes.py)
        default = json.loads((directory / "config.json").read_text(encoding="utf-8"))["transformers.js_config"]["dtype"]
    except (OSError, ValueError, KeyError, TypeError):
        default = "fp32"
    result.dtype_files = [{**row, "default": row["dtype"] == default} for row in (own, *rows)]
    failed = [row for row in rows if row["status"] == FAILED]
    unverified = [row for row in rows if row["status"] == UNVERIFIED]
    if failed:
        result.status = FAILED
        said = "; ".join(f"{row['file']} ({row['dtype']}): {_why(row)}" for row in failed)
        message = f"dtype file(s) outside their budget: {said}"
        result.error = {"type": "ValidationError",
                        "message": f"{result.error['message']}; {message}" if result.error else message}
    elif unverified and result.status == PASSED:
        result.status = UNVERIFIED
        result.unverified += [f"{row['file']} ({row['dtype']}): no quality metric could be measured"
                              for row in unverified]


def _files(entry: dict[str, Any]) -> list[str]:
    """Every file of a dtype (a folder of several graphs lists each in `files`)."""
    files = entry.get("files")
    return sorted(files.values()) if isinstance(files, dict) and files else [entry["file"]]


def _main_file(files: list[str]) -> str:
    """The fp32 graph the folder's own row is named by: the decoder's (as exporters.layouts.transformers_js.dtypes)."""
    return next((file for file in files if file.endswith(("/decoder_model_merged.onnx", "/model.onnx"))), files[-1])


def _why(row: dict[str, Any]) -> str:
    quality = row.get("quality") or {}
    return str(row.get("error") or quality.get("decided_by") or "its checks failed")


def _bytes(directory: Path, file: str) -> int:
    """The graph and its data file together."""
    return sum(path.stat().st_size for path in (directory / file, directory / f"{file}_data") if path.is_file())


@contextmanager
def _naming(directory: Path, files: dict[str, str]) -> Iterator[None]:
    """`directory`'s export.json naming each component's dtype file (`files`: fp32 graph -> dtype file) while the block runs, restored after it (validation runs
    in this one process, no runtime child is open meanwhile, and a view folder of links would be refused: ONNX's
    external data loader refuses hard links, the folder screen symbolic ones)."""
    path = directory / "export.json"
    original = path.read_text(encoding="utf-8")
    manifest = json.loads(original)
    for entry in manifest["components"].values():
        entry["file"] = files.get(entry["file"], entry["file"])
    manifest.pop(DTYPE_FILES, None)
    try:
        fsutil.write_file(path, json.dumps(manifest, indent=2) + "\n")
        yield
    finally:
        fsutil.write_file(path, original)

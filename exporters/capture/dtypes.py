"""The dtype each target's artifact is written in when the recipe does not say: one that its runtime runs.

Most checkpoints on the Hub are bfloat16 or float16. Their runtimes differ: ONNX Runtime's CPU provider has no
bfloat16 kernels for most operators (`Mul(14)` is refused at load), and ExecuTorch's XNNPACK delegate runs float32
(its half-precision kernels are for fp16 devices), while a torch.export program runs in the checkpoint's own dtype
wherever torch runs. So, for a target without `dtype`:

| format | default dtype |
|---|---|
| `onnx` | float32 (a half-precision checkpoint is cast, and a finding says so) |
| `executorch` | float32 (likewise) |
| `dynamo` | the checkpoint's own |

The checkpoint's dtype is read from `config.json` (`dtype`, or the legacy `torch_dtype`), else from the first
safetensors header. The model is then loaded once, in the dtype the first targets are compared in
([`reference_groups`]): a target in the checkpoint's own half precision is validated against the model in that
precision (as shipped), a float32 target against float32 (the weights cast in place between the two, losslessly).

Example:
    >>> default_dtype("onnx", "bfloat16"), default_dtype("dynamo", "bfloat16"), default_dtype("onnx", "float32")
    ('float32', 'bfloat16', None)
    >>> reference_groups(["float32", "bfloat16", "float32"], "bfloat16")
    [('bfloat16', [1]), ('float32', [0, 2])]
    >>> reference_groups(["float16"], "float32"), reference_groups([None, "float16"], "float32")
    ([('float16', [0])], [('float32', [0, 1])])
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["CPU_ONLY_FLOAT", "HALF", "checkpoint_dtype", "default_dtype", "dtype_finding", "export_cast",
           "reference_groups", "safetensors_header"]

HALF = ("bfloat16", "float16")
# Formats whose CPU runtimes need float32 artifacts (see the module).
CPU_ONLY_FLOAT = ("onnx", "executorch")
# safetensors' dtype codes, as its header writes them
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
_HEADER_LIMIT = 100 << 20


def checkpoint_dtype(folder: Path, config: dict[str, Any]) -> str | None:
    """The dtype the checkpoint's floating-point weights are stored in, or None when it cannot be told."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in (*HALF, "float32"):
                return value.removeprefix("torch.")
    return _safetensors_dtype(Path(folder))


def safetensors_header(path: Path) -> dict[str, Any] | None:
    """A safetensors file's JSON header (its first 8 bytes give its length; the tensors are never read), None when
    it does not read, is a link or is over 100 MiB."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > _HEADER_LIMIT:
                return None
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def _safetensors_dtype(folder: Path) -> str | None:
    """The dtype of the first floating-point tensor in the folder's first safetensors file (its header only)."""
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file() and not p.is_symlink())
    header = safetensors_header(files[0]) if files else None
    for name, entry in (header or {}).items():
        if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in _SAFETENSORS_DTYPES:
            return _SAFETENSORS_DTYPES[entry["dtype"]]
    return None


def default_dtype(export_format: str, checkpoint: str | None) -> str | None:
    """The dtype a target of `export_format` is written in when its recipe sets none; None: the checkpoint's own,
    no cast."""
    if checkpoint in HALF:
        return "float32" if export_format in CPU_ONLY_FLOAT else checkpoint
    return None


def export_cast(target: str | None, model: str) -> str | None:
    """The dtype an export casts the eager model (held in `model`) to for a target in `target` (None: the
    checkpoint's own); None where the model is already held in it, so it is exported as loaded.

    Casting a model to the dtype it is held in is not a no-op: `Module.to` rounds every floating buffer, among them
    the float32 ones `from_pretrained` keeps in a half-precision model and eager computes with (RoPE's `inv_freq`:
    a bfloat16 `inv_freq` puts the rotary angle of position 2048 off by whole radians, and a bfloat16 LLaVA's
    exported language model missed its hidden-state cosine budget against the eager model at long prompts).

    Example:
        >>> export_cast("bfloat16", "bfloat16"), export_cast("float32", "bfloat16"), export_cast(None, "float32")
        (None, 'float32', None)
    """
    return target if target not in (None, model) else None


def dtype_finding(export_format: str, checkpoint: str, dtype: str) -> str:
    """The sentence a report carries when the default cast a target's weights."""
    runtime = {"onnx": "ONNX Runtime's CPU provider has no bfloat16 kernels for most operators",
               "executorch": "ExecuTorch's XNNPACK delegate runs float32"}.get(export_format, "its runtime's default")
    return (f"the checkpoint is {checkpoint}; the {export_format} artifact is written in {dtype} ({runtime}): set "
            f"`dtype` on the target to choose another where its runtime runs it")


def reference_groups(dtypes: list[str | None], checkpoint: str | None) -> list[tuple[str | None, list[int]]]:
    """The targets (by index into `dtypes`, each resolved; None: the checkpoint's own) grouped by the dtype their
    eager references are computed in, the group to load first first: `[(dtype, indices), ...]`.

    Targets that share one dtype: one group, the model loaded in it (a float16 target of a float32 checkpoint never
    holds a float32 copy). Else a half-precision checkpoint's own dtype is compared with eager in that dtype (a
    bfloat16 program against the bfloat16 model, as shipped), every other target with eager in float32. Between
    the two the model is converted in place, which is lossless: every float32 weight came from a half-precision one.
    """
    if len(set(dtypes)) == 1:
        return [(dtypes[0], list(range(len(dtypes))))]
    own = checkpoint if checkpoint in HALF else None
    groups: dict[str | None, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        key = own if own is not None and dtype in (None, own) else "float32"
        groups.setdefault(key, []).append(index)
    return sorted(groups.items(), key=lambda group: group[0] != own)

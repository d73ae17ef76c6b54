"""Loading the model (once per run): the class config.json names, in eval mode, in the dtype asked for.

Apart from `exporters.capture.source` (where the model's files come from) because loading imports the adapter to
upstream (`checkpoint_read_not_mapped`, and with it `transformers.exporters` and torch's compiler: ~2 CPU-s and
130 MiB), which a process that only reads a model folder (the `--version`, a folder's inventory, the Action's
recipe check) never needs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import transformers

from exporters.capture.dtypes import checkpoint_dtype
from exporters.capture.source import ModelSource, check_remote_code, needs_remote_code, read_config
from exporters.errors import ModelSourceError, first_line, recoverable
from exporters.upstream import checkpoint_read_not_mapped

__all__ = ["load_model"]


def load_model(source: ModelSource, *, trust_remote_code: bool = False, dtype: str | None = None):
    """Load the model class named by config.json's `architectures`, in eval mode (in `dtype`, e.g. `"float16"`,
    when given: the weights are converted while loading, never held twice).

    When the load converts (`dtype` is not the checkpoint's own), the safetensors shards are read, not memory-mapped
    (`exporters.upstream.checkpoint_read_not_mapped`): a mapped shard stays resident beside the converted weights until
    the load ends (a bfloat16 checkpoint loaded in float32 peaked at 1.66x the float32 weights), while a read tensor is
    dropped once converted (peak: the loaded weights plus the few tensors in flight; benchmarks/bench_load_memory.py).
    A load in the checkpoint's own dtype stays mapped: its tensors are the shards' pages, never copied.

    Example:
        >>> load_model(resolve_source("examples/demo-model"), dtype="float32").dtype  # doctest: +SKIP
        torch.float32
    """

    config = read_config(source.folder)
    check_remote_code(source, config, trust_remote_code)
    architectures = config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        if needs_remote_code(config):
            model_class = transformers.AutoModel
        elif architectures:
            raise ModelSourceError(
                f"config.json names architecture {architectures[0]!r}, which transformers "
                f"{transformers.__version__} does not have"
            )
        else:
            model_class = transformers.AutoModel
    kwargs: dict[str, Any] = {"trust_remote_code": True} if trust_remote_code and needs_remote_code(config) else {}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    try:
        converts = dtype is not None and dtype != checkpoint_dtype(source.folder, config)
        with checkpoint_read_not_mapped() if converts else contextlib.nullcontext():
            model = model_class.from_pretrained(source.folder, **kwargs)
    except BaseException as err:  # a corrupt or truncated checkpoint: safetensors' own error, or a native panic
        if not recoverable(err):
            raise
        detail = str(err) if isinstance(err, (OSError, ValueError)) else f"{type(err).__name__}: {first_line(str(err))}"
        raise ModelSourceError(f"cannot load the model from {source.display}: {detail}; check that its weight files "
                               "are complete (re-download or re-save them)") from None
    return model.eval()

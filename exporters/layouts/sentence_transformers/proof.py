"""sentence-transformers' proof: the side environment's Python runs the layout's encoding script (`ENCODE`, the card's
snippet with this folder in it) on the folder alone, and its embeddings of two sentences must be the eager model's,
pooled and normalized as the folder's own modules say.

```
reference(model)                                        prove(folder)
the repo's tokenizer -> eager last_hidden_state         side python: SentenceTransformer(folder, backend="onnx")
-> 1_Pooling's modes -> Normalize (where listed)        .encode(sentences): ids, embeddings, the graph it read
(before the model is released)                          == eager's ids, allclose to eager's embeddings
```

The eager side is computed here from the product's model and the folder's pooling config (the product's
environment never imports sentence-transformers). The child asks its own transformers whether it knows the model
type first (`KNOWS`): a family it does not hold is `declined`. No side environment, or one without
sentence-transformers: `unverified`, saying how to create it. sentence-transformers refusing the folder, reading
another graph than ours (its own export) or encoding other numbers: `failed`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exporters.capture.source import load_tokenizer
from exporters.layouts.base import read_json
from exporters.layouts.child import KNOWS, RuntimeContext, RuntimeProof, child_timeout, run_in_child, side_python
from exporters.layouts.sentence_transformers import (MODULES_FILE, SENTENCES, encode_script, modules_in, pooling_modes,
                                                     unsupported)

GRAPH = "model.onnx"  # what sentence-transformers' ONNX backend loads first from a folder
ONNX_TOLERANCE = (1e-4, 1e-3)  # the project's default for an ONNX artifact (exporters.validate.tolerances)
LOW_PRECISION_TOLERANCE = (1e-2, 1e-2)
NO_MODULES = "not run: the repo ships no sentence-transformers modules (modules.json)"
# Before the script: a side environment without sentence-transformers is one where it is not installed
HAS = r"""
import json, sys
try:
    import sentence_transformers
except ImportError:
    json.dump({"missing": True}, open(json.loads(sys.argv[1])["result"], "w"))
    sys.exit(0)
"""
EMIT = """from pathlib import Path

features = model.tokenize(sentences)
json.dump({"embeddings": embeddings.tolist(), "ids": features["input_ids"].tolist(),
           "modules": [type(module).__name__ for module in model], "version": sentence_transformers.__version__,
           "graph": str(Path(model[0].auto_model.path).resolve())}, open(spec["result"], "w"))"""
OPTIONS = ', device="cpu", local_files_only=True'  # the folder alone, on the CPU, never the Hub


def reference(layout: Any, model: Any, context: RuntimeContext) -> dict[str, Any]:
    """The eager model's sentence embeddings of `SENTENCES`: the repo's tokenizer (as the folder's), the model's
    last hidden state, the pooling modes of its `1_Pooling/config.json`, then normalization where `modules.json`
    lists it; a repo without sentence-transformers modules gets none."""
    source = Path(context.source_dir) if context.source_dir is not None else None
    if source is None or not (source / MODULES_FILE).is_file():
        return {"unverified": NO_MODULES}
    why = unsupported(source)
    if why:
        return {"declined": why}
    tokenizer = load_tokenizer(source)
    if tokenizer is None:
        return {"unverified": "not run: the repo's tokenizer does not load, and sentence-transformers encodes text"}
    longest = read_json(source / "sentence_bert_config.json").get("max_seq_length")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt", truncation=isinstance(longest, int),
                      max_length=longest if isinstance(longest, int) else None)
    takes = inspect.signature(model.forward).parameters
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(**{name: value.to(device) for name, value in batch.items() if name in takes})
    hidden = getattr(out, "last_hidden_state", None)
    if hidden is None:
        return {"unverified": "not run: the model gives no last_hidden_state (sentence-transformers' token "
                              "embeddings)"}
    modules = modules_in(source)
    pooled = pool(hidden.float().cpu(), batch["attention_mask"], _modes(source, modules))
    normalized = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    if normalized:
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return {"ids": batch["input_ids"].tolist(), "embeddings": pooled.tolist(), "tolerance": _tolerance(context),
            "modules": [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules], "normalized": normalized,
            "pooling": _modes(source, modules)}


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: list[str]) -> torch.Tensor:
    """sentence-transformers' `Pooling` of token embeddings `hidden` (batch, tokens, width) under `mask`, each mode's
    vector concatenated in `modes`' order (`cls` takes the first real token, as it does)."""
    mask = mask.to(hidden.dtype)
    weights = mask.unsqueeze(-1)
    total, count = (hidden * weights).sum(1), weights.sum(1).clamp(min=1e-9)
    vectors = []
    for mode in modes:
        if mode == "cls":
            vectors.append(hidden[torch.arange(hidden.shape[0]), mask.to(torch.int).argmax(1)])
        elif mode == "max":
            vectors.append(hidden.masked_fill(weights == 0, float("-inf")).max(1).values)
        elif mode == "mean":
            vectors.append(total / count)
        else:  # mean_sqrt_len_tokens (`unsupported` let no other mode through)
            vectors.append(total / torch.sqrt(count))
    return torch.cat(vectors, dim=-1)


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """`SentenceTransformer(folder, backend="onnx")` encodes `SENTENCES` in the side environment: the same ids as
    the eager side's tokenizer, the folder's graph (not one it exported itself), embeddings within the target's
    tolerance of eager's."""
    for status in ("unverified", "declined"):
        if status in reference:
            return RuntimeProof(layout.runtime, status, reference[status])
    python = side_python()
    if python is None:
        return layout.not_here()
    script = HAS + KNOWS + encode_script('spec["folder"]', SENTENCES, EMIT, options=OPTIONS)
    answer, why = run_in_child(script, {"folder": str(directory)}, folder=directory,
                               timeout_s=child_timeout(context), python=str(python))
    if answer is None:
        return RuntimeProof(layout.runtime, "failed", f"sentence-transformers failed: {why}")
    if "missing" in answer:
        return layout.not_here()
    if "declined" in answer:
        return RuntimeProof(layout.runtime, "declined", answer["declined"])
    return _compare(layout.runtime, directory, reference, answer)


def _compare(runtime: str, directory: Path, reference: dict[str, Any], answer: dict[str, Any]) -> RuntimeProof:
    """The child's answer against the eager side: which graph it read, its modules, its ids, its embeddings."""
    if answer["graph"] != str((directory / GRAPH).resolve()):
        return RuntimeProof(runtime, "failed", f"sentence-transformers read {answer['graph']}, not the folder's "
                                               f"{GRAPH}")
    if answer["modules"] != reference["modules"]:
        return RuntimeProof(runtime, "failed", f"sentence-transformers built the modules {answer['modules']}, "
                                               f"modules.json lists {reference['modules']}")
    if answer["ids"] != reference["ids"]:
        return RuntimeProof(runtime, "failed", "sentence-transformers' tokenizer gave other ids than the repo's: "
                                               f"{answer['ids']} vs {reference['ids']}")
    atol, rtol = reference["tolerance"]
    got, want = np.array(answer["embeddings"]), np.array(reference["embeddings"])
    if got.shape != want.shape or not np.allclose(got, want, atol=atol, rtol=rtol):
        worst = float(np.abs(got - want).max()) if got.shape == want.shape else float("nan")
        return RuntimeProof(runtime, "failed", f"embeddings of shape {list(got.shape)} differ from eager's "
                                               f"{list(want.shape)} by up to {worst:.3g} (atol {atol:g}, rtol {rtol:g})")
    pooling = "+".join(reference["pooling"]) + (", normalized" if reference["normalized"] else "")
    return RuntimeProof(runtime, "passed", f"{len(want)} sentences, {want.shape[1]}-dim embeddings within atol "
                                           f"{atol:g} of eager ({pooling}; sentence-transformers {answer['version']}, "
                                           "ONNX backend)")


def _modes(source: Path, modules: list[dict[str, Any]]) -> list[str]:
    """The pooling modes of the folder's `Pooling` module (sentence-transformers' default, mean, without one)."""
    entry = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    return pooling_modes(read_json(source / str(entry.get("path", "")) / "config.json")) if entry else []


def _tolerance(context: RuntimeContext) -> tuple[float, float]:
    """The ONNX default (wider for a half-precision target), then the recipe's and the target's own tolerances."""
    atol, rtol = LOW_PRECISION_TOLERANCE if context.target.dtype in ("float16", "bfloat16") else ONNX_TOLERANCE
    validation = context.recipe.validation
    for layer in (validation, validation.formats.get("onnx"), context.target.validation):
        if layer is not None:
            atol = layer.atol if layer.atol is not None else atol
            rtol = layer.rtol if layer.rtol is not None else rtol
    return float(atol), float(rtol)

"""A quantized (or half-precision) ONNX target's runtime proof, shared by GenAI's and optimum's: the runtime's greedy
tokens against ONNX Runtime's own greedy generation of the same graph, token for token ("runs in this runtime"), and
the agreement with float eager judged by the variant's budget, `min_greedy_match` ("keeps eager's numbers").

MatMulNBits' int8 activations (accuracy level 4, GenAI's CPU default) flip a random model's near ties, so a correct
int4 folder can differ from float eager in one token while passing its budget; ONNX Runtime's own run of the graph
(an `InferenceSession` on the folder's file, default session options as GenAI's and optimum's, the accuracy level
the graph's `MatMulNBits` nodes carry) is the reference the runtime must reproduce exactly, run once for both
runtimes' proofs of a folder ([`ort_greedy_once`]). A float32 target keeps the exact comparison with eager (the
callers decide: [`quantized_kind`] is None for it).

```
eager (float) ─── min_greedy_match of the budget ───┐
ONNX Runtime greedy of the graph ── token for token ─┴─ the runtime's greedy (GenAI, optimum)
```

Example:
    >>> feeds_supported(["input_ids", "attention_mask", "past_key_values.0.key"])
    True
    >>> feeds_supported(["inputs_embeds", "attention_mask"])
    False
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exporters.layouts.child import RuntimeContext, RuntimeProof
from exporters.layouts.greedy import GenaiReference, common_prefix, compared_of, until_eos
from exporters.recipe.budgets import resolve_budget, variant_kind

PAST = "past_key_values."
KNOWN = ("input_ids", "attention_mask", "position_ids")


def quantized_kind(context: RuntimeContext | None) -> str | None:
    """The target's variant kind (`int4`, `int8`, `half`) where it is not float32, else None."""
    target = getattr(context, "target", None)
    if target is None:
        return None
    kind = variant_kind(getattr(target, "quantize", None), getattr(target, "dtype", None))
    return None if kind == "fp32" else str(kind)


def feeds_supported(names: list[str]) -> bool:
    """Whether a merged decoder's inputs are ones this greedy loop feeds (token ids, mask, positions, the past)."""
    return "input_ids" in names and all(name in KNOWN or name.startswith(PAST) for name in names)


def ort_greedy(graph: Path, reference: GenaiReference, batch_of_one: bool) -> tuple[list[list[int]], str] | None:
    """ONNX Runtime's greedy generation of the merged decoder `graph` over `reference`'s prompts (a left-padded batch,
    or each prompt alone where the graph's batch is fixed at 1), each row up to its first eos, and what ran (the
    accuracy level of its `MatMulNBits`); None where the graph takes inputs this loop does not feed."""
    # onnxruntime loads only where a quantized ONNX target is proven
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    inputs = {value.name: value for value in session.get_inputs()}
    if not feeds_supported(list(inputs)) or any(
            not (isinstance(value.shape[1], int) and isinstance(value.shape[3], int))
            for name, value in inputs.items() if name.startswith(PAST)):
        return None
    batches = [[p] for p in reference.prompts] if batch_of_one else [reference.prompts]
    rows: list[list[int]] = []
    for prompts in batches:
        rows += _generate(session, inputs, prompts, reference)
    return [until_eos(row, reference.eos) for row in rows], _accuracy(graph)


def ort_greedy_once(graph: Path, reference: GenaiReference, batch_of_one: bool,
                    context: RuntimeContext | None) -> tuple[list[list[int]], str] | None:
    """[`ort_greedy`] computed once per graph file (its path, size and modification time) and prompts for a
    `context`: GenAI's and optimum's proofs of one quantized folder ask ONNX Runtime's greedy of the same graph over
    the same batch, and each opened its own session of it before (a second load of the graph, 16 more steps). Each
    caller gets its own copy of the rows; None where the loop cannot feed or run the graph (validation ran it: the
    exact comparison with eager decides)."""
    stat = graph.stat()
    key = ("ort_greedy", str(graph.resolve()), stat.st_size, stat.st_mtime_ns, batch_of_one,
           tuple(map(tuple, reference.prompts)), reference.pad, tuple(reference.eos), reference.steps)
    kept = context.eager_once if context is not None else {}
    if key not in kept:
        try:
            kept[key] = ort_greedy(graph, reference, batch_of_one)
        except Exception:  # a graph this loop cannot run: the exact comparison with eager decides
            kept[key] = None
    own = kept[key]
    return None if own is None else ([list(row) for row in own[0]], own[1])


def _generate(session: Any, inputs: dict[str, Any], prompts: list[list[int]],
              reference: GenaiReference) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = np.array([[reference.pad] * (width - len(p)) + p for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    # an empty past: [batch, key/value heads, 0, head size], the heads and head size the graph fixes
    past = {name: np.zeros((len(prompts), value.shape[1], 0, value.shape[3]),
                           dtype=np.float16 if "float16" in value.type else np.float32)
            for name, value in inputs.items() if name.startswith(PAST)}
    outputs = [output.name for output in session.get_outputs()]
    got: list[list[int]] = [[] for _ in prompts]
    for _ in range(reference.steps):
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -ids.shape[1]:]
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
        result = dict(zip(outputs, session.run(outputs, {name: feed[name] for name in inputs})))
        logits = result["logits"][:, -1].copy()
        logits[:, [t for t in reference.eos if t < logits.shape[-1]]] = -np.inf  # eos held off, as eager's min_new_tokens
        tokens = logits.argmax(-1)
        for row, token in enumerate(tokens.tolist()):
            got[row].append(int(token))
        past = {name: result["present." + name[len(PAST):]] for name in past}
        ids, mask = tokens[:, None].astype(np.int64), np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], 1)
    return got


def _accuracy(graph: Path) -> str:
    """The accuracy levels the graph's `MatMulNBits` carry, as the proof's detail says what ran."""
    # onnx loads only where a quantized ONNX target is proven (the graph alone: no weights)
    import onnx

    levels = sorted({attribute.i for node in onnx.load(str(graph), load_external_data=False).graph.node
                     if node.op_type == "MatMulNBits" for attribute in node.attribute
                     if attribute.name == "accuracy_level"})
    return f", MatMulNBits accuracy level {'/'.join(map(str, levels))} as the graph says" if levels else ""


def judge(runtime: str, name: str, got: list[list[int]], reference: GenaiReference, graph: Path,
          batch_of_one: bool, batch: str, context: RuntimeContext) -> RuntimeProof | None:
    """The proof of a quantized target from the runtime's tokens `got` (runtime `name`, e.g. "GenAI"): token for
    token against ONNX Runtime's greedy of `graph`, and eager's tokens judged by the variant's `min_greedy_match`.
    None for a float32 target or a graph this loop cannot feed (the caller then compares with eager exactly)."""
    kind = quantized_kind(context)
    if kind is None:
        return None
    own = ort_greedy_once(graph, reference, batch_of_one, context)
    if own is None:
        return None
    ort_rows, what = own
    total = sum(len(r) for r in ort_rows)
    if got != ort_rows:
        equal = sum(common_prefix(want, have) for want, have in zip(ort_rows, got))
        return RuntimeProof(runtime, "failed", f"{equal}/{total} tokens equal ONNX Runtime's own greedy of the same "
                                               f"graph ({batch}{what}): {name} {got}, ONNX Runtime {ort_rows}")
    # the budget is judged on the recipe's prompt (the first row), as validation's generation parity judges it; the
    # shorter prompt's row (there to exercise the padding, held to ONNX Runtime's run above) is reported, not judged
    shared = [common_prefix(want, have) for want, have in zip(reference.new_tokens, got)]
    matched, available = shared[0], len(reference.new_tokens[0])
    required = min(int(resolve_budget(kind, context.target.validation).get("min_greedy_match", 0)), available)
    others = ", ".join(f"{m}/{len(w)}" for m, w in zip(shared[1:], reference.new_tokens[1:]))
    eager = (f"float eager's greedy before the first difference: {matched}/{available} tokens of the recipe's prompt "
             f"(≥{required} asked, the {kind} budget's min_greedy_match)"
             + (f", the shorter prompt's {others} (not judged)" if others else ""))
    if matched < required:
        return RuntimeProof(runtime, "failed", f"{name} runs the graph as ONNX Runtime does, but {eager}: {name} "
                                               f"{got}, eager {reference.new_tokens}")
    return RuntimeProof(runtime, "passed", f"{total}/{total} tokens equal ONNX Runtime's own greedy of the same graph "
                                           f"({batch}{what}); {eager}", compared_of(ort_rows, reference.eos),
                        reference.steps * len(reference.prompts), f"{name} and ONNX Runtime stopped at eos")

"""optimum's proof: the side environment's Python runs the layout's generation script (`GENERATE`, the card's
snippet with this folder and eager's prompts in it) on the folder alone, greedy over a left-padded batch of two
prompts of different lengths, each row token for token against eager greedy `generate` (`exporters.layouts.greedy`),
both held off eos by `min_new_tokens` (every one of `max_new_tokens` compared);
a quantized or half-precision target against ONNX Runtime's own greedy of the same graph, and eager's tokens by its
budget (`exporters.layouts.ort_greedy`).

The child first asks its own transformers whether it knows the folder's model type: a family optimum's transformers
4.x does not hold is `declined` (optimum cannot take it; the artifact's verdict stands); so is a model whose cache
optimum sizes otherwise than the graph holds it (`PAST_FED`: GLM-4-MoE's grouped-query keys). No side environment:
`unverified`, saying how to create it. optimum refusing the folder or generating other tokens: `failed`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.layouts.child import KNOWS, RuntimeContext, RuntimeProof, child_timeout, run_in_child, side_python
from exporters.layouts.greedy import GenaiReference, batch_reference, common_prefix, compared_of, until_eos
from exporters.layouts import ort_greedy
from exporters.layouts.optimum import generate_script
from exporters.upstream import read_manifest

OPTIMUM_DEFAULT_PAD = 0
EMIT = 'json.dump({"new": new}, open(spec["result"], "w"))'
# ORTModelForCausalLM sizes the first call's empty past itself, from the config by its own per-model-type rules (it
# reads `num_key_value_heads` only for the types it lists: GLM-4-MoE's grouped-query past gets `num_attention_heads`
# heads). Where that is not the graph's past, optimum cannot run the model, whose graph the eager check vouches for:
# declined, with optimum's sizes and the graph's, before it generates.
PAST_FED = r"""for name in model.key_value_input_names:
    head = getattr(model, "qk_head_dim" if name.endswith(".key") else "v_head_dim", None) \
        or getattr(model, "embed_size_per_head", None)
    shape = list(model.input_shapes.get(name, ()))
    if len(shape) == 4 and isinstance(shape[1], int) and isinstance(shape[3], int) \
            and (shape[1], shape[3]) != (model.num_key_value_heads, head):
        why = (f"cannot take this model: optimum's ORTModelForCausalLM feeds the first call an empty past of "
               f"{model.num_key_value_heads} heads x {head} (sized from the config by its own rules for model type "
               f"{model.config.model_type!r}), where the graph's {name} holds {shape[1]} heads x {shape[3]} (the "
               "model's key/value heads)")
        json.dump({"declined": why}, open(spec["result"], "w"))
        sys.exit(0)
"""


def reference(layout: Any, model: Any, context: RuntimeContext) -> GenaiReference:
    """Eager greedy `generate` over the left-padded batch of two prompts (`greedy.batch_reference`)."""
    return batch_reference(model, context, OPTIMUM_DEFAULT_PAD)


def _batch_of_one(directory: Path) -> bool:
    """Whether the folder's graph takes `input_ids` of batch 1 only."""
    try:
        entry = read_manifest(directory)["components"]["model"]
        # onnx loads only where an optimum folder is proven (the graph alone: no weights)
        import onnx

        graph = onnx.load(str(directory / entry["file"]), load_external_data=False).graph
        dim = next(value for value in graph.input if value.name == "input_ids").type.tensor_type.shape.dim[0]
    except Exception:  # a folder optimum cannot read: its own error says why
        return False
    return dim.HasField("dim_value") and dim.dim_value == 1


def eos_literal(eos: list[int]) -> str:
    """The eos ids as the Python literal the generation script passes to `generate` (`None` when the model has none:
    JSON's `null` is no Python name).

    Example:
        >>> eos_literal([2, 7]), eos_literal([])
        ('[2, 7]', 'None')
    """
    return repr([int(token) for token in eos] or None)


def prove(layout: Any, directory: Path, reference: GenaiReference, context: RuntimeContext) -> RuntimeProof:
    """optimum's greedy generation from the folder alone, in the side environment, against `reference`."""
    python = side_python()
    if python is None:
        return layout.not_here()
    # a graph whose batch is fixed at 1 (ONNX Runtime's GroupQueryAttention fusion) runs each prompt alone
    one = _batch_of_one(directory)
    batches = [[p] for p in reference.prompts] if one else [reference.prompts]
    rows: list[list[int]] = []
    for prompts in batches:
        script = generate_script("spec['folder']", prompts, reference.pad, reference.steps,
                                 eos_literal(reference.eos), EMIT, proof=PAST_FED)
        answer, why = run_in_child(KNOWS + script, {"folder": str(directory)}, folder=directory,
                                   timeout_s=child_timeout(context), python=str(python))
        if answer is None:
            return RuntimeProof(layout.runtime, "failed", f"optimum failed: {why}")
        if "declined" in answer:
            return RuntimeProof(layout.runtime, "declined", answer["declined"])
        rows += answer["new"]
    got = [until_eos(row, reference.eos) for row in rows]
    total = sum(len(r) for r in reference.new_tokens)
    prompts = " and ".join(str(len(p)) for p in reference.prompts)
    batch = f"batch of {len(batches[0])}, prompts of {prompts} tokens, ORTModelForCausalLM"
    graph = directory / read_manifest(directory)["components"]["model"]["file"]
    quantized = ort_greedy.judge(layout.runtime, layout.runtime, got, reference, graph, one, batch, context)
    if quantized is not None:
        return quantized
    if got != reference.new_tokens:
        equal = sum(common_prefix(want, have) for want, have in zip(reference.new_tokens, got))
        return RuntimeProof(layout.runtime, "failed", f"{equal}/{total} tokens equal eager greedy (batch of "
                                                      f"{len(batches[0])}, prompts of {prompts} tokens): optimum {got}, "
                                                      f"eager {reference.new_tokens}")
    return RuntimeProof(layout.runtime, "passed", f"{total}/{total} tokens (batch of {len(batches[0])}, prompts of {prompts} "
                                                  "tokens, ORTModelForCausalLM)",
                        compared_of(reference.new_tokens, reference.eos), reference.steps * len(reference.prompts),
                        "eager and optimum stopped at eos")

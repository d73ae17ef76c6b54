"""ONNX Runtime GenAI's proof of a merged decoder ONNX folder: `og.Model(folder)` from the folder alone (its
`genai_config.json`, the graph), a greedy `og.Generator` over a padded batch of two prompts of different lengths,
token for token against eager greedy `generate` (a quantized or half-precision target: against ONNX Runtime's own
greedy of the same graph, and eager's tokens judged by its budget's `min_greedy_match`: `exporters.layouts.ort_greedy`).

```
reference(model)                                   prove(folder)
eager generate, left-padded batch of two ────────► og.Model(folder) + og.Generator, right-padded with pad_token_id
(before the model is released)                     (GenAI pads right and derives mask and positions from the pad id)
```

GenAI reads rows by `pad_token_id`: a prompt token equal to it would be taken for padding, so the proof's prompts
never hold it (a token that is neither the pad id nor an eos id takes its place, in eager and GenAI alike). Each row
is compared up to and including its first eos. A graph whose batch is fixed at 1 (ONNX Runtime's
`GroupQueryAttention`, which `ort_fusions` fuses into a merged graph only at a batch of 1) runs each prompt alone.
Both sides generate the full `max_new_tokens`: eager's `min_new_tokens` and GenAI's `min_length` hold eos off, so a
model whose eos comes first is still compared over every token
instead. GenAI runs in a child process (a native abort there fails this proof, not the run). Not installed:
`unverified`; GenAI refusing the folder or generating other tokens: `failed`, with GenAI's own message.

Example:
    >>> GENAI_DEFAULT_PAD
    0
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.genai.config import GENAI_CONFIG
from exporters.layouts.greedy import GenaiReference, batch_reference, common_prefix, compared_of, until_eos
from exporters.layouts import ort_greedy

# GenAI's own pad_token_id when genai_config.json leaves it out (a model without a pad token): 0 (`int pad_token_id{}`
# in onnxruntime-genai's config.h), which the eager side of this proof pads with then
GENAI_DEFAULT_PAD = 0

# GenAI runs in a child (a native abort there ends this proof, not the run): greedy over the right-padded rows.
CHILD = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og
spec = json.loads(sys.argv[1])
model = og.Model(spec["folder"])
answer = []
for batch in spec["batches"]:
    params = og.GeneratorParams(model)
    # min_length: eos held off to the end, as eager's min_new_tokens (`greedy.batch_reference`)
    params.set_search_options(do_sample=False, num_beams=1, max_length=batch["max_length"],
                              min_length=batch["max_length"], batch_size=len(batch["rows"]))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(batch["rows"], dtype=np.int32))
    got = [[] for _ in batch["rows"]]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in enumerate(generator.get_next_tokens().tolist()):
            if not got[row] or got[row][-1] not in spec["eos"]:  # a finished row is padded: not compared
                got[row].append(int(token))
    answer += got
with open(spec["result"], "w") as handle:
    json.dump(answer, handle)
"""


def graph_batch(directory: Path, genai: dict[str, Any]) -> int | None:
    """The batch size the folder's decoder graph (named by its `genai_config.json`, `genai`) is fixed at (its
    `input_ids`' first dim), None where it is dynamic or unreadable (GenAI then says what is wrong)."""
    try:
        path = directory / genai["model"]["decoder"]["filename"]
        # onnx loads only where a GenAI folder is proven (the graph alone: no weights)
        import onnx

        inputs = {value.name: value for value in onnx.load(str(path), load_external_data=False).graph.input}
        dim = inputs[genai["model"]["decoder"]["inputs"].get("input_ids", "input_ids")].type.tensor_type.shape.dim[0]
    except Exception:  # a folder GenAI cannot read: its own error says why
        return None
    return dim.dim_value if dim.HasField("dim_value") else None


def reference(layout: Any, model: Any, context: RuntimeContext) -> GenaiReference:
    """Eager greedy `generate` over the left-padded batch of two prompts (`greedy.batch_reference`), padded with
    GenAI's own default where the model has no pad token."""
    return batch_reference(model, context, GENAI_DEFAULT_PAD)


def cannot_prove(layout: Any, directory: Path) -> RuntimeProof | None:
    """Why GenAI cannot prove `directory` here (not installed, no `genai_config.json`), None when it can: the
    check every GenAI proof (text, Whisper, Qwen-VL) makes first."""
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return layout.not_here()
    if not (directory / GENAI_CONFIG).is_file():
        return RuntimeProof(layout.runtime, "failed", f"no {GENAI_CONFIG} in the folder")
    return None


def prove(layout: Any, directory: Path, reference: GenaiReference, context: RuntimeContext) -> RuntimeProof:
    """GenAI's greedy generation from the folder alone, in a child, token for token against `reference`."""
    if (refused := cannot_prove(layout, directory)) is not None:
        return refused
    genai = json.loads((directory / GENAI_CONFIG).read_text(encoding="utf-8"))
    pad = genai["model"].get("pad_token_id", GENAI_DEFAULT_PAD)
    if pad != reference.pad:
        return RuntimeProof(layout.runtime, "failed", f"{GENAI_CONFIG} has pad_token_id {pad}, the model "
                            f"{reference.pad}")
    width = max(len(p) for p in reference.prompts)
    prompts = " and ".join(str(len(p)) for p in reference.prompts)
    one = graph_batch(directory, genai) == 1
    if one:  # the batch fixed at 1 (GroupQueryAttention's fusion): each prompt alone
        batches = [{"rows": [p], "max_length": len(p) + reference.steps} for p in reference.prompts]
        batch = f"each prompt alone, the graph's batch is fixed at 1; prompts of {prompts} tokens"
    else:
        rows = [p + [reference.pad] * (width - len(p)) for p in reference.prompts]  # GenAI pads right
        batches = [{"rows": rows, "max_length": width + reference.steps}]
        batch = f"batch of {len(rows)}, prompts of {prompts} tokens"
    got, why = run_in_child(CHILD, {"folder": str(directory), "batches": batches, "eos": reference.eos},
                            folder=directory, timeout_s=child_timeout(context))
    if got is None:
        return RuntimeProof(layout.runtime, "failed", f"ONNX Runtime GenAI failed: {why}")
    got = [until_eos(row, reference.eos) for row in got]
    quantized = ort_greedy.judge(layout.runtime, "GenAI", got, reference,
                                 directory / genai["model"]["decoder"]["filename"], one, batch, context)
    if quantized is not None:
        return quantized
    total = sum(len(r) for r in reference.new_tokens)
    equal = sum(common_prefix(want, have) for want, have in zip(reference.new_tokens, got))
    if got != reference.new_tokens:
        return RuntimeProof(layout.runtime, "failed",
                            f"{equal}/{total} tokens equal eager greedy ({batch}): GenAI {got}, eager "
                            f"{reference.new_tokens}")
    return RuntimeProof(layout.runtime, "passed", f"{total}/{total} tokens ({batch})",
                        compared_of(reference.new_tokens, reference.eos), reference.steps * len(reference.prompts),
                        "eager and GenAI stopped at eos")



"""optimum's layout: a merged decoder ONNX graph under the names optimum feeds (`input_ids`, `attention_mask`,
`position_ids`, `past_key_values.{i}.key/value`), loaded by `ORTModelForCausalLM.from_pretrained(folder)`.

| module      | what it holds                                                                                   |
|-------------|-------------------------------------------------------------------------------------------------|
| `__init__`  | [`Optimum`]: when it applies, the side environment it runs in, the generation script its proof runs and its card shows (`GENERATE`, one template) |
| `proof.py`  | the side environment's Python runs `GENERATE` on the folder alone, against eager greedy          |

optimum needs transformers 4.x: it runs in its own side environment (`HF_EXPORT_OPTIMUM_PYTHON`, else the project's
`.cache/optimum-venv`, which `make test-deps` creates from tests/optimum/constraints.txt), never the product's. A
model type that environment's transformers does not know is a family optimum cannot take: `declined`, the artifact's
verdict stands.

Example:
    >>> print(generate_script('"folder"', [[1, 2, 3]], 0, 4, "None", "print(new)").splitlines()[0])
    import torch
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template
from typing import Any

from exporters.layouts.base import Layout, components_in, latent_cache, may_feed, not_fed
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.layouts.card import revision_argument, subfolder

MERGED = "model"  # the one component of a merged decoder export (exporters.capture.merged.MERGED)
# Greedy generation over a left-padded batch: the proof runs it on the target folder with eager's prompts, the card
# shows it with the published folder. Values enter only through json.dumps or as our ints.
GENERATE = Template("""import torch
from optimum.onnxruntime import ORTModelForCausalLM

model = ORTModelForCausalLM.from_pretrained($where, use_cache=True, use_io_binding=False)
${check}prompts = $prompts$comment
pad = $pad
width = max(map(len, prompts))
ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # padded on the left
mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=$steps,$minimum do_sample=False,
                        pad_token_id=pad, eos_token_id=$eos)
new = output[:, width:].tolist()
$emit
""")


def generate_script(where: str, prompts: list[list[int]], pad: int, steps: int, eos: str, emit: str,
                    comment: str = "", proof: str | None = None) -> str:
    """`GENERATE` filled: `where` the `from_pretrained` arguments (JSON strings), the rest our ints and lines;
    `proof`: the proof's script (none in the card), whose lines run on the loaded `model` before it generates and
    which holds eos off (`min_new_tokens`: every one of `steps` is compared with eager's)."""
    return GENERATE.substitute(where=where, prompts=json.dumps([[int(t) for t in p] for p in prompts]), pad=int(pad),
                               steps=int(steps), eos=eos, emit=emit, comment=comment, check=proof or "",
                               minimum="" if proof is None else f" min_new_tokens={int(steps)},")


class Optimum(Layout):
    """optimum's `ORTModelForCausalLM` generating from a merged decoder ONNX folder, in the side environment."""

    runtime = "optimum"
    install = ("create the side environment with optimum-onnx (`make test-deps`: .cache/optimum-venv, pinned by "
               "tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python that has optimum-onnx")

    def may_apply(self, target: Any, components: list[str]) -> bool:
        return target.export_format == "onnx" and target.mode == "generation" and list(components) == [MERGED] \
            and getattr(target, "layout", "upstream") != TRANSFORMERS_JS

    def applies(self, target: Any, directory: Path) -> bool:
        components = components_in(directory)
        # the graph under the runtimes' names (a graph with an input optimum does not feed keeps upstream's)
        return self.may_apply(target, list(components)) and isinstance(components[MERGED].get("inputs"), dict)

    def may_decline(self, target: Any, components: list[str]) -> bool:
        return self.may_apply(target, components) or (
            may_feed(target, components) and getattr(target, "layout", "upstream") != TRANSFORMERS_JS)

    def declines(self, target: Any, directory: Path) -> str | None:
        # one merged graph under its names; optimum sizes the empty past from heads and head_dim
        return not_fed(directory) or latent_cache(directory)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        where = f"{json.dumps(repo_id)}{revision_argument(revision)}, subfolder={json.dumps(subfolder(target))}"
        return "python", generate_script(where, [[1, 2, 3]], 0, 32, "None", "print(new)",
                                         "  # your prompts' token ids")

"""The ExecuTorch LLM runner's proof: executorch's own `TextLLMRunner` (the C++ runner behind its iOS/Android apps,
through the pybinding of the pinned executorch) generates from `model.pte` and the folder's `tokenizer.json` alone,
greedily, the same text as eager `generate()` on the same prompt.

```
reference(): the prompt (the recipe's, else the sample's text; one user turn in the repo's chat template where it
             has one, as the card's snippet gives it: exporters.capture.chat_prompt) tokenized by the folder's
             tokenizer, no specials added (a template's own, its bos, read as the runner's tokenizer reads them)
             └─ eager greedy generate, max_new_tokens ─► ids up to and with the first eos (the first prompt that
                                                         generates any before eos)
prove():     a subprocess (the pybinding aborts the process on some errors) runs
             TextLLMRunner(model.pte, tokenizer.json[, model.ptd]).generate(prompt, temperature 0)
             └─ pieces ─► ids ─► compared with eager's ids, token for token (a quantized or half-precision program:
                                 the tokens before the first divergence, at least `min_greedy_match` of them)
```

The pybinding hands the generated tokens to Python only as decoded pieces (`token_callback(str)`; its `Stats` count
tokens, they hold no id), so each piece is mapped back to the ids of the folder's tokenizer whose own decoding is that
piece: a piece only one id decodes to is that id, and must be eager's; a piece several ids decode to (byte fallback,
a vocabulary with duplicates) matches only when eager's id is among them, and the detail counts those. A piece that is
one byte of a longer UTF-8 character (a byte-fallback `<0xC2>`) cannot reach Python alone (the binding decodes each
piece as text): the runner is then asked for eager's tokens before it, and the detail says where the comparison
stopped. An eager reference that generated nothing (eos first, for every prompt tried) proves nothing: the proof is
`unverified`. The runner stops at the eos ids the program names (its `GenerationConfig` has no setting to go past
them): where eager stopped before `max_new_tokens`, the proof says over how many of them it compared ([`token_count`];
`RuntimeProof.judged` flags it, and a proof over fewer than two is `unverified`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from exporters.capture.chat_prompt import text_prompt
from exporters.recipe.budgets import resolve_budget, variant_kind
from exporters.upstream import read_manifest
from exporters.layouts.executorch_llm import runner_child_imports
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.greedy import greedy_settings, pieces_by_id, pieces_matched, until_eos

# the card's snippet makes the same runner (its RUNNER_IMPORTS load the same kernel libraries: `runner_child_imports`)
CHILD = r"""
import json, sys
spec = json.loads(sys.argv[1])
""" + runner_child_imports("TextLLMRunner") + r"""
args = [spec["program"], spec["tokenizer"]] + ([spec["data"]] if spec["data"] else [])
runner = TextLLMRunner(*args)
pieces, stats = [], {}
def on_stats(s):
    stats.update(prompt_tokens=s.num_prompt_tokens, generated=s.num_generated_tokens)
config = GenerationConfig(echo=False, max_new_tokens=spec["max_new_tokens"], temperature=0.0)
runner.generate(spec["prompt"], config, token_callback=pieces.append, stats_callback=on_stats)
with open(spec["result"], "w") as handle:
    json.dump({"pieces": pieces, "stats": stats}, handle)
"""

# What a token's lone decoding holds when the token is one byte of a longer UTF-8 character (a byte-fallback
# `<0xC2>`, a byte-level piece): the runner decodes it to those raw bytes, which its pybinding cannot pass to Python
PART_OF_A_CHARACTER = "\ufffd"


def reference(layout: Any, model: Any, context: RuntimeContext) -> dict[str, Any]:
    """The prompt and eager's greedy tokens as the runner shows them (see the module)."""
    if context.source_dir is None or not (Path(context.source_dir) / "tokenizer.json").is_file():
        return {"unverified": "the model folder has no tokenizer.json, which the runner reads"}
    tokenizer = Tokenizer.from_file(str(Path(context.source_dir) / "tokenizer.json"))
    sample = tokenizer.decode(context.generate_inputs["input_ids"][0].tolist(), skip_special_tokens=True)
    # each as the card's snippet gives it to the runner: one user turn in the repo's chat template, where it has one
    chat = AutoTokenizer.from_pretrained(context.source_dir, local_files_only=True, trust_remote_code=False)
    prompts = [text_prompt(chat, p) for p in dict.fromkeys([context.recipe.inputs.prompt, sample]) if p]
    config, eos = greedy_settings(model, context)
    vocabulary: list[str] = []
    ids_of: dict[str, list[int]] = {}
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 generation_config=config)
        # eager's tokens up to and with its first EOS: the runner hands the EOS it stops at over as a piece too
        # (executorch's TextTokenGenerator calls token_callback before its EOS test), so stopping is compared too
        shown = until_eos(out[0, len(ids):].tolist(), sorted(eos))
        if not vocabulary:
            vocabulary, ids_of = pieces_by_id(tokenizer)
        whole = next((i for i, t in enumerate(shown) if PART_OF_A_CHARACTER in vocabulary[t]), len(shown))
        if whole and shown[0] not in eos:  # an EOS first is no token to compare
            cut = {"cut": tokenizer.id_to_token(shown[whole])} if whole < len(shown) else {}
            return {"prompt": prompt, "prompt_tokens": len(ids), "tokens": shown[:whole], "ids_of": ids_of,
                    "eos": sorted(eos), "asked": context.recipe.generation.max_new_tokens,
                    "pieces": [vocabulary[t] for t in shown[:whole]], **cut}
    tried = " and ".join(repr(p[:80]) for p in prompts)
    return {"unverified": f"eager greedy generation stopped at once (eos first, or first a byte of a character "
                          f"the runner's Python binding cannot hand over alone) for the prompt(s) {tried}: no "
                          "token to compare the runner's with; set `inputs.prompt` to one the model continues"}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """`TextLLMRunner` on the folder alone, in a child, compared with `reference` (see the module)."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if importlib.util.find_spec("executorch.extension.llm.runner") is None:
        return layout.not_here()
    entry = read_manifest(directory)["components"]["model"]
    tokenizer = directory / "tokenizer.json"
    if not tokenizer.is_file():
        return RuntimeProof(layout.runtime, "failed", "the target folder has no tokenizer.json for the runner")
    spec = {"program": str(directory / entry["file"]), "tokenizer": str(tokenizer),
            "data": str(directory / entry["data_file"]) if entry.get("data_file") else None,
            "prompt": reference["prompt"],
            "max_new_tokens": len(reference["tokens"]) if "cut" in reference
            else context.recipe.generation.max_new_tokens}
    answer, why = run_in_child(CHILD, spec, folder=directory, timeout_s=child_timeout(context))
    if answer is None:
        return RuntimeProof(layout.runtime, "failed", f"the runner failed: {why}")
    got = answer["pieces"]
    if not reference["tokens"]:  # nothing to compare: never a pass
        return RuntimeProof(layout.runtime, "unverified", "eager generated no token to compare the runner's with")
    read = answer["stats"].get("prompt_tokens")
    if read is not None and read != reference["prompt_tokens"]:  # its C++ tokenizer split the prompt otherwise
        return RuntimeProof(layout.runtime, "failed", f"the runner's tokenizer read the prompt as {read} tokens, "
                                                   f"transformers' as {reference['prompt_tokens']}: "
                                                   f"{reference['prompt'][:80]!r}")
    want, ids_of = reference["tokens"], reference["ids_of"]
    equal, by_text = pieces_matched(got, want, ids_of)
    shared = f"; {by_text} of them by a piece several ids decode to" if by_text else ""
    if "cut" in reference:
        shared += (f"; compared up to eager's token {reference['cut']!r}, a byte of a UTF-8 character the runner's "
                   "Python binding cannot hand over alone")
    counted = token_count(reference)
    if equal == len(want) == len(got):
        return RuntimeProof(layout.runtime, "passed", f"{equal}/{len(want)} tokens{shared}", *counted)
    required = required_match(context.target, len(want))
    if required is not None and equal >= required:
        return RuntimeProof(layout.runtime, "passed", f"{equal}/{len(want)} tokens before the first divergence "
                                                   f"(min_greedy_match {required}){shared}", *counted)
    wanted = f" (min_greedy_match {required})" if required is not None else ""
    ran = [ids_of.get(piece, ["?"])[0] if len(ids_of.get(piece, [])) == 1 else piece for piece in got]
    return RuntimeProof(layout.runtime, "failed", f"{equal}/{len(want)} tokens equal{wanted}: the runner generated "
                                               f"{str(ran)[:200]} ({''.join(got)[:200]!r}), eager "
                                               f"{str(want)[:200]} ({''.join(reference['pieces'])[:200]!r})")


def token_count(reference: dict[str, Any]) -> tuple[int, int | None, str]:
    """The new tokens the proof compares (eager's before its eos), of those asked, and why fewer: the runner stops
    at eos (executorch's `GenerationConfig` has `echo`, `max_new_tokens`, `seq_len`, `temperature`, `num_bos`,
    `num_eos`, `warming`: nothing that generates past it), or at a byte the binding cannot hand over (`cut`).

    Example:
        >>> token_count({"tokens": [5, 2], "eos": [2], "asked": 8})
        (1, 8, 'eager and the runner stopped at eos; the runner cannot be told to go past it')
    """
    tokens = reference["tokens"]
    compared = len(tokens) - (1 if tokens and tokens[-1] in reference.get("eos", ()) else 0)
    ended = ("compared up to a byte of a UTF-8 character the runner's Python binding cannot hand over"
             if "cut" in reference else "eager and the runner stopped at eos; the runner cannot be told to go past it")
    return compared, reference.get("asked"), ended


def required_match(target: Any, available: int) -> int | None:
    """The tokens a quantized or half-precision program's greedy text must share with eager's before the first
    divergence (its budget's `min_greedy_match`, capped at what eager produced, as generation parity judges it); None
    for a float32 program, which must match token for token."""
    kind = variant_kind(target.quantize, target.dtype)
    if kind == "fp32":
        return None
    return min(int(resolve_budget(kind, target.validation).get("min_greedy_match", 0)), available)


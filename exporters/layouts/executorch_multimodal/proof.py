"""ExecuTorch MultimodalRunner's proof: executorch's own `MultimodalRunner` (through the pybinding of the pinned
executorch) generates from `model.pte`, the folder's `tokenizer.json`, an image (or an audio's log-mel features) and
a prompt, greedily, the same tokens as eager `generate()` on the same inputs.

```
reference(): the sample's inputs (the processor's prompt ids with its run of image tokens, its float pixel_values
             [1, 3, H, W] of a synthesized image) └─ eager greedy generate, max_new_tokens ─► ids (eos left out)
prove():     a subprocess runs MultimodalRunner(model.pte, tokenizer.json[, model.ptd]).generate([tokens before,
             make_image_input(pixels), tokens after], temperature 0) (the card's lines: STEP, IMAGE_INPUTS, GENERATE;
             what the binding's generate_hf does for one image; the text in pieces of the program's get_max_seq_len,
             a sliding window's where it is a ring buffer) └─ pieces ─► ids ─► compared with eager's, token for token
             an audio-language program: runner.generate([tokens before, make_audio_input(input_features), tokens
             after]) (the runner's C++ prefiller runs `audio_encoder` on an audio input:
             extension/llm/runner/multimodal_prefiller.cpp)
```

LLaVA-NeXT and LLaVA-OneVision: the processor's pixels of one image with its `image_sizes` go in as one image input, its
tiles stacked (`IMAGE_INPUTS`), after the card's check that the processor's `image_sizes` are the program's one
`image_size` (`SIZE_CHECK`: another size is refused); eager `generate()` reads the `image_sizes`.

Idefics3 and SmolVLM: the processor's `[1, n, 3, H, W]` (one image, or its tiles and the whole image where it splits
the image, each its own run of image tokens) go to the runner as n image inputs `[1, 3, H, W]` in the prompt's order
(the generate_hf of the binding takes one image and one run); eager `generate()` reads the processor's
`pixel_attention_mask` (all ones) with them, and runs its dynamic cache (its static-cache `generate()` fails
upstream: docs/upstream-gaps.md #57).

A prompt with several images (the processor's `pixel_values [n, 3, H, W]`, a run of image tokens each; Idefics3's
tiles of each image) goes in the same way, each image at its run in the prompt's order, and the detail counts them
("8/8 tokens from two images and a prompt"): the recipe's sample holds one image, tests prove two (LLaVA, Idefics3).

Like the text runner, MultimodalRunner stops at the program's eos ids and cannot be told to go past them: where eager
stopped before `max_new_tokens` (the tiny SmolVLM's byte-level tokenizer: after one token), the proof says over how
many it compared (`token_count`), and one over fewer than two is `unverified` (`RuntimeProof.judged`).

The binding hands each generated token to Python as its decoded piece; a piece maps back to the ids of the folder's
tokenizer that decode to it, and matches where eager's id is among them (as the text runner's proof,
`exporters.layouts.executorch_llm.proof`).
"""

from __future__ import annotations

import copy
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from exporters.capture.multimodal_runner import chunked_audio, two_chunk_prompt, two_chunks
from exporters.capture.token_ids import image_token_id
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.greedy import greedy_settings, pieces_by_id, pieces_matched
from exporters.layouts.executorch_llm import RUNTIME_WITHOUT_COMPILER, runner_child_imports
from exporters.layouts.executorch_llm.proof import required_match, token_count
from exporters.layouts.executorch_multimodal import (AUDIO_IMPORTS, AUDIO_INPUTS, GENERATE, IMAGE_IMPORTS,
                                                    IMAGE_INPUTS, SIZE, SIZE_CHECK, STEP)
from exporters.upstream import read_manifest
from exporters.upstream.idefics_image import GLOBAL_IMAGE, eager_cache

# the card's snippet makes the same runner and the same call (GENERATE; its RUNNER_IMPORTS load the same kernel
# libraries: `runner_child_imports`; the runtime without the compiler's package: RUNTIME_WITHOUT_COMPILER); the
# processor's output as the dict it is (IMAGE_INPUTS reads keys only: no transformers in the child)
CHILD = RUNTIME_WITHOUT_COMPILER + r"""
import json, sys
import torch
spec = json.loads(sys.argv[1])
""" + runner_child_imports("MultimodalRunner") + r"""
args = [spec["program"], spec["tokenizer"]] + ([spec["data"]] if spec["data"] else [])
runner = MultimodalRunner(*args)
inputs = torch.load(spec["inputs"], weights_only=True)
image_token_id = spec["image_token_id"]
pieces, stats = [], {}
def on_stats(s):
    stats.update(prompt_tokens=s.num_prompt_tokens, generated=s.num_generated_tokens)
""" + IMAGE_IMPORTS + STEP.format(program='spec["program"]') + SIZE + SIZE_CHECK + IMAGE_INPUTS + GENERATE.format(
    max_new_tokens='spec["max_new_tokens"]', callback=", pieces.append, on_stats") + r"""
with open(spec["result"], "w") as handle:
    json.dump({"pieces": pieces, "stats": stats}, handle)
"""
MEDIA = {1: "an image", 2: "two images"}  # the proof's detail: "8/8 tokens from two images and a prompt (...)"
# the card's audio snippet makes the same input list and the same call (AUDIO_INPUTS, GENERATE), its imports
# the same kernel libraries
AUDIO_CHILD = r"""
import json, sys
import torch
spec = json.loads(sys.argv[1])
""" + runner_child_imports("MultimodalRunner") + AUDIO_IMPORTS + r"""
args = [spec["program"], spec["tokenizer"]] + ([spec["data"]] if spec["data"] else [])
runner = MultimodalRunner(*args)
saved = torch.load(spec["inputs"], weights_only=True)
before, after, input_features = saved["before"], saved["after"], saved["input_features"]
pieces, stats = [], {}
def on_stats(s):
    stats.update(prompt_tokens=s.num_prompt_tokens, generated=s.num_generated_tokens)
""" + AUDIO_INPUTS + GENERATE.format(max_new_tokens='spec["max_new_tokens"]', callback=", pieces.append, on_stats") + r"""
with open(spec["result"], "w") as handle:
    json.dump({"pieces": pieces, "stats": stats}, handle)
"""


def reference(layout: Any, model: Any, context: RuntimeContext) -> dict[str, Any]:
    """The sample's image and prompt, and eager's greedy tokens as the runner shows them (see the module)."""
    if context.source_dir is None or not (Path(context.source_dir) / "tokenizer.json").is_file():
        return {"unverified": "the model folder has no tokenizer.json, which the runner reads"}
    tokenizer = Tokenizer.from_file(str(Path(context.source_dir) / "tokenizer.json"))
    audio = "input_features" in context.generate_inputs
    # Gemma 3's token types too: eager's prefill attends both ways among the image's tokens, as the program does
    # Qwen2-Audio's feature mask too: eager counts the frames with it (the program's audio takes them all)
    # Idefics3's pixel mask too (all ones: `exporters.capture.multimodal_runner`): eager reads the processor's mask,
    # the runner's one image none
    # LLaVA-NeXT's and LLaVA-OneVision's image_sizes too: eager reads them, the program has them baked in (its one size)
    wanted = ("input_ids", "attention_mask", "token_type_ids", "feature_attention_mask", "pixel_attention_mask",
              "image_sizes", "input_features" if audio else "pixel_values")
    inputs = {k: v for k, v in context.generate_inputs.items() if k in wanted}
    made = _reference(model, context, tokenizer, inputs, audio)
    if audio and chunked_audio(model):  # its audio_encoder takes any number of chunks: two, from the runner too
        made["longer"] = _reference(model, context, tokenizer, _two_chunk_inputs(inputs, made["image_token_id"]),
                                    audio)
    return made


def _two_chunk_inputs(inputs: dict[str, Any], token: int) -> dict[str, Any]:
    """The sample's prompt and features as two chunks of audio (`two_chunks`), the audio tokens' run twice as long."""
    ids = two_chunk_prompt(inputs["input_ids"], token)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "input_features": two_chunks(inputs["input_features"])}


def _reference(model: Any, context: RuntimeContext, tokenizer: Tokenizer, inputs: dict[str, Any],
               audio: bool) -> dict[str, Any]:
    """Eager's greedy tokens from `inputs` as the runner shows them, and the inputs the runner is given."""
    config, eos = greedy_settings(model, context)
    config = eager_cache(model, config)  # Idefics3's static-cache generate() fails upstream: its dynamic cache
    with torch.no_grad():
        out = model.generate(**copy.deepcopy(inputs), generation_config=config)
    ids = inputs["input_ids"]
    generated = out[0, ids.shape[1]:].tolist()
    shown = generated[:next((i for i, t in enumerate(generated) if t in eos), len(generated))]
    vocabulary, ids_of = pieces_by_id(tokenizer)
    token = model.config.audio_token_id if audio else image_token_id(model.config)
    source = "input_features" if audio else "pixel_values"
    sizes = {"image_sizes": inputs["image_sizes"].clone()} if "image_sizes" in inputs else {}
    images = {} if audio else {"images": _images(ids[0].tolist(), int(token), tokenizer.token_to_id(GLOBAL_IMAGE))}
    return {"input_ids": ids.clone(), source: inputs[source].detach().float().clone(), **sizes, **images,
            "image_token_id": int(token), "prompt_tokens": int(ids.shape[1]), "tokens": shown,
            "asked": context.recipe.generation.max_new_tokens,
            "eos": sorted(eos), "ids_of": ids_of, "pieces": [vocabulary[t] for t in shown]}


def _images(ids: list[int], token: int, global_image: int | None) -> int:
    """How many images the prompt holds: its runs of image tokens, or, where the processor splits each image into
    tiles (Idefics3, SmolVLM: a run per tile, then one after `<global-img>` for the whole image), its `<global-img>`s."""
    if global_image is not None and global_image in ids:
        return ids.count(global_image)
    return sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))


def _audio_inputs(reference: dict[str, Any]) -> dict[str, Any]:
    """The runner's input list's parts: the prompt's ids before and after its run of audio tokens, the features."""
    ids = reference["input_ids"][0].tolist()
    where = [i for i, t in enumerate(ids) if t == reference["image_token_id"]]
    return {"before": ids[:where[0]], "after": ids[where[-1] + 1:], "input_features": reference["input_features"]}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """`MultimodalRunner` on the folder alone, in a child, compared with `reference` (see the module); an audio
    encoder that takes any number of chunks, from two chunks too (`reference["longer"]`)."""
    proof = _prove(layout, directory, reference, context)
    if proof.status != "passed" or "longer" not in reference:
        return proof
    longer = _prove(layout, directory, reference["longer"], context)
    if longer.status != "passed":
        return RuntimeProof(layout.runtime, longer.status, f"from two chunks of audio: {longer.detail}")
    shorter = min(proof, longer, key=lambda p: p.compared or 0)  # the fewer tokens compared is the flag's
    return RuntimeProof(layout.runtime, "passed", f"{proof.detail}; {longer.detail.replace('an audio', 'two chunks of audio')}",
                        shorter.compared, shorter.asked, shorter.ended)


def _prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """One generation of the runner from `reference`'s inputs, compared with its tokens."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if importlib.util.find_spec("executorch.extension.llm.runner") is None:
        return layout.not_here()
    if not reference["tokens"]:
        return RuntimeProof(layout.runtime, "unverified", "eager generated eos first: no token to compare the "
                                                          "runner's with; set `inputs.prompt` to one it continues")
    entry = read_manifest(directory)["components"]["text_decoder"]
    tokenizer = directory / "tokenizer.json"
    if not tokenizer.is_file():
        return RuntimeProof(layout.runtime, "failed", "the target folder has no tokenizer.json for the runner")
    with tempfile.TemporaryDirectory() as scratch:
        inputs = Path(scratch) / "inputs.pt"
        audio = "input_features" in reference
        torch.save(_audio_inputs(reference) if audio else {
            name: reference[name] for name in ("input_ids", "pixel_values", "image_sizes") if name in reference}, inputs)
        spec = {"program": str(directory / entry["file"]), "tokenizer": str(tokenizer),
                "data": str(directory / entry["data_file"]) if entry.get("data_file") else None,
                "inputs": str(inputs), "image_token_id": reference["image_token_id"],
                "max_new_tokens": len(reference["tokens"])}
        answer, why = run_in_child(AUDIO_CHILD if audio else CHILD, spec, folder=directory,
                                   timeout_s=child_timeout(context))
    if answer is None:
        return RuntimeProof(layout.runtime, "failed", f"the runner failed: {why}")
    want, ids_of = reference["tokens"], reference["ids_of"]
    got = answer["pieces"]
    read = answer["stats"].get("prompt_tokens")
    if read is not None and read != reference["prompt_tokens"]:
        return RuntimeProof(layout.runtime, "failed", f"the runner read the prompt and its media as {read} positions, "
                                                   f"eager as {reference['prompt_tokens']}")
    equal, _ = pieces_matched(got, want, ids_of)
    required = required_match(context.target, len(want))  # a quantized program: its budget's greedy tokens
    if equal == len(want) == len(got) or (required is not None and equal >= required):
        media = "an audio" if "input_features" in reference else (
            MEDIA.get(reference["images"], f"{reference['images']} images"))  # the prompt's images (`_images`)
        if "image_sizes" in reference:  # the one size the program takes
            media = "one image of {}x{}".format(*reference["image_sizes"].reshape(-1).tolist()[:2])
        budget = f" before the first divergence (min_greedy_match {required})" if equal < len(want) else ""
        return RuntimeProof(layout.runtime, "passed", f"{equal}/{len(want)} tokens{budget} from {media} and a prompt "
                                                   f"({reference['prompt_tokens']} positions)", *token_count(reference))
    wanted = f" (min_greedy_match {required})" if required is not None else ""
    return RuntimeProof(layout.runtime, "failed", f"{equal}/{len(want)} tokens equal{wanted}: the runner generated "
                                               f"{''.join(got)[:200]!r}, eager {''.join(reference['pieces'])[:200]!r}")

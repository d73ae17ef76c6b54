"""The ExecuTorch speech layout's proof: ExecuTorch's own Python runtime (`executorch.runtime`) loads `model.pte`
(and `model.ptd`) from the folder alone and runs optimum-executorch's transcription loop (`TRANSCRIBE`, the card's
code: `encoder` once, `text_decoder` one token per call at its cache position, argmax) on the spectrogram (or the
waveform, as `[1, 1, samples]`) eager ran on; the tokens must be eager `generate()`'s, token for token.

```
reference(): eager greedy generate(input_features | input_values) with the runner's token selection (argmax
             alone: the model's suppressed-token lists off) ─► the decoder prompt generate() starts from, the new
             tokens
prove():     the encoder's input to a scratch file ─► a child runs TRANSCRIBE(prompt, max_new_tokens) ─► new
             tokens
             └─ compared with eager's, token for token (up to and including eos)
```

The ASR runner (C++ `Seq2SeqRunner`) has no Python binding in the pinned executorch: its method names, inputs and
metadata are what `TRANSCRIBE` calls, and the detail says which loop ran.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.asr_runner import program_input, speech_source
from exporters.capture.generation_settings import greedy
from exporters.capture.token_ids import decoder_start_id, special_token_ids
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.greedy import common_prefix
from exporters.layouts.executorch_llm import QUANTIZED_KERNELS, RUNTIME_WITHOUT_COMPILER
from exporters.layouts.executorch_llm.proof import required_match, token_count
from exporters.layouts.executorch_speech import transcribe_script
from exporters.upstream import read_manifest

# the card's TRANSCRIBE, its features read from the scratch file the proof wrote
SETUP = """import json, sys
spec = json.loads(sys.argv[1])"""
FEATURES = """features = torch.load(spec["features"], weights_only=True)"""
# a quantized program's kernels (its 8-bit embedding table's), loaded as the LLM runners' children load them
QUANTIZED_LOADER = """import glob, importlib.util, os
import torch
_executorch = importlib.util.find_spec("executorch").submodule_search_locations[0]
""" + QUANTIZED_KERNELS
EMIT = """with open(spec["result"], "w") as handle:
    json.dump({"new": new}, handle)"""


def reference(layout: Any, model: Any, context: RuntimeContext) -> dict[str, Any]:
    """The decoder prompt and eager's greedy new tokens, selected as the runner selects them (see the module)."""
    source = speech_source(context.generate_inputs)
    features = context.generate_inputs.get(source) if source else None
    if not isinstance(features, torch.Tensor):
        return {"unverified": "the sample has no spectrogram `input_features` nor waveform `input_values` for the "
                              "program's encoder"}
    config = greedy(context.generation_config or model.generation_config,
                    max_new_tokens=context.recipe.generation.max_new_tokens)
    config.suppress_tokens, config.begin_suppress_tokens = None, None  # the runner takes the argmax alone
    with torch.no_grad():
        out = model.generate(**{source: features[:1].clone()}, generation_config=config,
                             return_dict_in_generate=True, output_scores=True)
    generated = len(out.scores)
    prompt = out.sequences[0, :out.sequences.shape[1] - generated].tolist() or [decoder_start_id(model)]
    eos = special_token_ids(config, model.config).eos
    tokens = out.sequences[0, out.sequences.shape[1] - generated:].tolist()
    first_eos = next((i for i, t in enumerate(tokens) if t in eos), None)
    tokens = tokens if first_eos is None else tokens[:first_eos + 1]
    return {"prompt": prompt, "tokens": tokens, "steps": context.recipe.generation.max_new_tokens,
            "eos": sorted(eos), "asked": context.recipe.generation.max_new_tokens}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """`TRANSCRIBE` on the folder alone, in a child, compared with `reference` (see the module)."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if importlib.util.find_spec("executorch.runtime") is None:
        return layout.not_here()
    if not reference["tokens"]:
        return RuntimeProof(layout.runtime, "unverified", "eager generated no token to compare the program's with")
    entry = read_manifest(directory)["components"]["encoder"]
    data = ', data_path=spec["data"]' if entry.get("data_file") else ""
    kernels = QUANTIZED_LOADER if context.target.quantize is not None else ""  # an 8-bit table's kernels
    code = RUNTIME_WITHOUT_COMPILER + kernels + transcribe_script('spec["program"]', data, FEATURES,
                                                                  reference["prompt"], reference["steps"], EMIT,
                                                                  setup=SETUP)
    with tempfile.TemporaryDirectory(prefix="asr-proof-") as scratch:
        features = Path(scratch) / "features.pt"
        torch.save(program_input(context.generate_inputs)[:1].detach().contiguous().clone(), features)
        spec = {"program": str(directory / entry["file"]), "features": str(features),
                "data": str(directory / entry["data_file"]) if entry.get("data_file") else None}
        answer, why = run_in_child(code, spec, folder=directory, timeout_s=child_timeout(context))
    if answer is None:
        return RuntimeProof(layout.runtime, "failed", f"ExecuTorch's runtime failed: {why}")
    got, want = answer["new"], reference["tokens"]
    loop = "executorch.runtime, optimum-executorch's loop: encoder once, text_decoder per token, argmax"
    compared, asked, _ = token_count(reference)  # the loop, as the card's, stops at eos
    counted = (compared, asked, "eager and the program's loop stopped at eos")
    if got == want:
        return RuntimeProof(layout.runtime, "passed", f"{len(want)}/{len(want)} tokens ({loop})", *counted)
    equal, required = common_prefix(want, got), required_match(context.target, len(want))
    if required is not None and equal >= required:  # a quantized program: its budget's greedy tokens
        return RuntimeProof(layout.runtime, "passed", f"{equal}/{len(want)} tokens before the first divergence "
                                                   f"(min_greedy_match {required}; {loop})", *counted)
    wanted = f" (min_greedy_match {required})" if required is not None else ""
    return RuntimeProof(layout.runtime, "failed", f"{equal}/{len(want)} tokens equal{wanted}: the program generated "
                                               f"{str(got)[:200]}, eager {str(want)[:200]} ({loop})")

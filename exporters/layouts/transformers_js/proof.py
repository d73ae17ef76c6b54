"""transformers.js's proof: Node.js runs the layout's generation script (`HEADER` + `BODY`, the card's snippet with
this folder and eager's prompt in it) on the folder alone, once per dtype file in one child (each loaded with its
`dtype`): the folder's own dtype must give eager's greedy tokens, each further dtype file (a variant: `dtypes.py`) at
least the greedy tokens its variant's quality budget asks (`min_greedy_match`).

```
reference(model)                                      prove(folder)
eager generate(prompt, max_new_tokens = min_new_tokens = n)   node script.mjs (node_modules: the pinned transformers.js)
(before the model is released)                        AutoModelForCausalLM.from_pretrained(folder) .generate(...)
```

Node runs as every runtime child does (`exporters.layouts.child.run_script`): the allow-listed environment, the
memory limit, the target's timeout. No Node or no transformers.js: `unverified`, saying how to install them. A speech
encoder-decoder (Whisper) is transcribed by `speech_proof.py`, a vision- or audio-language model's three graphs
generate in `image_text_proof.py` / `audio_text_proof.py`; a folder of another kind (a text encoder-decoder, an encoder,
an image model) is not run by this proof yet: `unverified`, saying so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_script
from exporters.layouts.transformers_js import (DTYPES, audio_text_proof, home, image_text_proof, layout_dtype,
                                              proof_script, speech, speech_proof)
from exporters.layouts.transformers_js.dtypes import dtype_files_in, equal_new
from exporters.recipe.budgets import resolve_budget
from exporters.upstream import read_manifest

DEFAULT_NEW_TOKENS = 8
NOT_YET = ("not run here: the product's transformers.js proof runs a decoder's generation (one merged graph) and a "
           "speech encoder-decoder's transcription; this "
           "folder's kind is proven in the project's tests only (tests/transformers_js/)")
COLLECT = "results[dtype] = Array.from(output.data, Number);"  # in each dtype's block (`proof_script`)
EMIT = ("import { writeFileSync } from 'node:fs';\n"
        "writeFileSync(JSON.parse(process.argv[2]).result, JSON.stringify(results));\n")


def reference(layout: Any, model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens (the script's `min_new_tokens` too) on the
    sample prompt; a folder this proof does not run yet (not a decoder's generation) gets none."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    if context.target.mode == "generation" and speech.is_speech(model.config.to_dict()):  # Whisper: speech.py
        if model.config.model_type in speech.UNFED_TYPES:
            return {"declined": speech.UNFED.format(model_type=model.config.model_type)}
        return speech_proof.reference(model, context, steps)
    if context.target.mode == "generation" and "pixel_values" in context.generate_inputs:  # image_text.py
        return image_text_proof.reference(model, context, steps)
    if context.target.mode == "generation" and "input_features" in context.generate_inputs:  # audio_text.py
        return audio_text_proof.reference(model, context, steps)
    if context.target.mode != "generation" or "input_ids" not in context.generate_inputs \
            or getattr(model.config, "is_encoder_decoder", False):
        return {"unverified": NOT_YET}
    ids = [int(i) for i in context.generate_inputs["input_ids"][0].tolist()]
    prompt = torch.tensor([ids], device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps,
                             min_new_tokens=steps, do_sample=False, num_beams=1)
    return {"prompt": ids, "steps": steps, "tokens": out[0].tolist()}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """One Node child generates with every dtype file of `directory` in turn (see the module); the folder's own
    dtype must give eager's tokens, each further dtype file the greedy tokens its variant's budget asks."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if "declined" in reference:  # a folder transformers.js cannot generate from (speech.UNFED_TYPES)
        return RuntimeProof(layout.runtime, "declined", f"cannot take this model: {reference['declined']}")
    modules = home() / "node_modules"
    if shutil.which("node") is None or not (modules / "@huggingface" / "transformers").is_dir():
        return layout.not_here()
    if reference.get("speech"):
        return speech_proof.prove(layout, directory, reference, context, modules, _version(modules))
    if reference.get("image_text"):
        return image_text_proof.prove(layout, directory, reference, context, modules, _version(modules))
    if reference.get("audio_text"):
        return audio_text_proof.prove(layout, directory, reference, context, modules, _version(modules))
    if list(read_manifest(directory)["components"]) != ["model"]:
        return RuntimeProof(layout.runtime, "unverified", NOT_YET)
    target = context.target
    files = {dtype: entry for dtype, entry in dtype_files_in(directory).items() if dtype in DTYPES}
    own = "fp32" if files else layout_dtype(target.dtype, getattr(target.quantize, "method", None))
    dtypes = [own, *[dtype for dtype in files if dtype != own]]
    script = proof_script(json.dumps(str(directory.parent)), json.dumps(directory.name), reference["prompt"],
                          reference["steps"], dtypes, COLLECT) + EMIT
    got, why = run_script(["node"], script, {}, folder=directory, timeout_s=child_timeout(context) * len(dtypes),
                          links={"node_modules": modules})
    if not isinstance(got, dict):
        return RuntimeProof(layout.runtime, "failed", f"transformers.js failed: {why}")
    want, prompt = reference["tokens"], reference["prompt"]
    new = len(want) - len(prompt)
    said, failed = [], []
    for dtype in dtypes:
        tokens = got.get(dtype)
        equal = equal_new(want, tokens, len(prompt))
        if dtype == own:
            required = new
        else:
            kind = str(files[dtype].get("kind"))
            required = min(new, int(resolve_budget(kind, target.validation).get("min_greedy_match", new)))
        said.append(f"{dtype} {equal}/{new} tokens" + ("" if required == new else f" (≥{required} asked)"))
        if equal < required:
            failed.append(f"dtype {dtype}: {equal}/{new} tokens equal eager greedy, {required} asked: "
                          f"transformers.js {tokens}, eager {want}")
    if failed:
        return RuntimeProof(layout.runtime, "failed", "; ".join(failed))
    head, *rest = said
    head = head.removeprefix(f"{own} ")
    extra = f"; dtype {', '.join(rest)}" if rest else ""
    return RuntimeProof(layout.runtime, "passed", f"{head} (transformers.js {_version(modules)}, Node.js){extra}",
                        new, reference["steps"], "transformers.js and eager generated fewer than min_new_tokens")


def _version(modules: Path) -> str:
    """The installed transformers.js's version (its package.json), as the label says what ran."""
    try:
        return str(json.loads((modules / "@huggingface" / "transformers" / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "of unknown version"

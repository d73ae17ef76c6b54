"""ONNX Runtime GenAI's proof of a Whisper folder (`whisper.py`'s graphs): `og.Model(folder)` from the folder alone
transcribes the sample's spectrogram, token for token against eager greedy `generate()`.

```
reference(model)                                   prove(folder), in a child
eager generate(input_features, decoder          ─► og.NamedTensors: audio_features (the same spectrogram),
  start token, max = min = n new tokens)             input_ids (eager's decoder prompt); og.Generator.set_inputs,
                                                     greedy with max_length = min_length = prompt + n
```

GenAI takes the spectrogram as features (`set_inputs`): no audio is decoded, so the proof compares GenAI's
generation loop, not two feature extractors. Not installed: `unverified`; GenAI refusing the folder or generating
other tokens: `failed`, with GenAI's own message.

Example:
    >>> "set_inputs" in CHILD
    True
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.genai.proof import cannot_prove
from exporters.layouts.greedy import DEFAULT_NEW_TOKENS

# GenAI runs in a child (a native abort there ends this proof, not the run)
CHILD = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og
spec = json.loads(sys.argv[1])
features = json.load(open(spec["features"]))
model = og.Model(spec["folder"])
params = og.GeneratorParams(model)
length = len(spec["prompt"]) + spec["steps"]
params.set_search_options(do_sample=False, num_beams=1, max_length=length, min_length=length, batch_size=1)
generator = og.Generator(model, params)
inputs = og.NamedTensors()
inputs["audio_features"] = np.array(features["data"], dtype=np.float32).reshape(features["shape"])
inputs["input_ids"] = np.array([spec["prompt"]], dtype=np.int32)
generator.set_inputs(inputs)
while not generator.is_done():
    generator.generate_next_token()
with open(spec["result"], "w") as handle:
    json.dump([int(t) for t in generator.get_sequence(0).tolist()], handle)
"""


def reference(model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens from the decoder's start token on the sample's
    spectrogram (its first row)."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    features = context.generate_inputs.get("input_features")
    if not isinstance(features, torch.Tensor):
        return {"unverified": "the sample has no spectrogram `input_features` for GenAI's Whisper"}
    features = features[:1].detach().float()
    prompt = [int(model.config.decoder_start_token_id)]
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_features=features.to(device), decoder_input_ids=torch.tensor([prompt], device=device),
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1)
    return {"speech": True, "prompt": prompt, "steps": steps, "tokens": out[0, -steps:].tolist(),
            "features": {"shape": list(features.shape), "data": features.flatten().tolist()}}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """GenAI transcribes the reference's spectrogram from the folder alone, in a child; its new tokens must be
    eager's."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if (refused := cannot_prove(layout, directory)) is not None:
        return refused
    with tempfile.TemporaryDirectory(prefix="genai-whisper-") as scratch:
        features = Path(scratch) / "features.json"
        features.write_text(json.dumps(reference["features"]), encoding="utf-8")
        got, why = run_in_child(CHILD, {"folder": str(directory), "features": str(features),
                                        "prompt": reference["prompt"], "steps": reference["steps"]},
                                folder=directory, timeout_s=child_timeout(context))
    if got is None:
        return RuntimeProof(layout.runtime, "failed", f"ONNX Runtime GenAI failed: {why}")
    want, steps = reference["tokens"], reference["steps"]
    new = got[len(reference["prompt"]):]
    if new != want:
        equal = next((i for i, (a, b) in enumerate(zip(want, new)) if a != b), min(len(want), len(new)))
        return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy: GenAI {new}, "
                                                      f"eager {want}")
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (a spectrogram of "
                                                  f"{reference['features']['shape'][-1]} frames, og.Generator)")

"""ONNX Runtime GenAI's proof of a Whisper folder (`whisper.py`'s graphs): `og.Model(folder)` from the folder alone
transcribes the sample's spectrogram from `generate()`'s own decoder prompt, token for token against eager greedy
`generate()`.

```
reference(model)                                   prove(folder), in a child
eager generate(input_features), the repo's      ─► where the folder has a tokenizer: GenAI's own processor
  generation config greedy (a multilingual one's     (audio_processor_config.json) on a tone and the prompt's text
  language pinned, task, no timestamps) and the      ─► its input_ids must be eager's prompt, its audio_features
  suppressed-token lists off (GenAI has none)        eager's shape
  ─► decoder prompt, n new tokens               ─► og.NamedTensors: audio_features (eager's spectrogram), input_ids
                                                     (eager's prompt); og.Generator.set_inputs, greedy with
                                                     max_length = min_length = prompt + n
```

The decoder prompt is the one `generate()` builds from the repo's `generation_config.json` (`<|startoftranscript|>
<|en|><|transcribe|><|notimestamps|>` for a multilingual Whisper, the start token alone for a model without them),
so GenAI is fed what a user of GenAI's Whisper example feeds. GenAI takes eager's spectrogram as features
(`set_inputs`): the comparison is of GenAI's generation loop and the graphs, not of two feature extractors (ONNX
Runtime Extensions' differs from transformers' at the frames where the audio starts and ends). GenAI applies no
suppressed-token lists (no such setting in its config or search), so eager's are off, as in the ExecuTorch speech
proof. Not installed: `unverified`; GenAI refusing the folder or generating other tokens: `failed`, with GenAI's own
message.

Example:
    >>> "set_inputs" in CHILD and "create_multimodal_processor" in CHILD
    True
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.generation_settings import greedy
from exporters.capture.token_ids import decoder_start_id
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.genai.proof import cannot_prove
from exporters.layouts.greedy import DEFAULT_NEW_TOKENS

# GenAI runs in a child (a native abort there ends this proof, not the run)
CHILD = r"""
import json, sys, wave
import numpy as np
import onnxruntime_genai as og
spec = json.loads(sys.argv[1])
features = json.load(open(spec["features"]))
model = og.Model(spec["folder"])
processed = None
if spec["prompt_text"] is not None:  # GenAI's own processor: the prompt's text and a tone (its features' shape)
    rate = 16000
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate) * 32767).astype(np.int16)
    with wave.open(spec["wav"], "wb") as handle:
        handle.setnchannels(1); handle.setsampwidth(2); handle.setframerate(rate); handle.writeframes(tone.tobytes())
    try:
        made = model.create_multimodal_processor()(spec["prompt_text"], audios=og.Audios.open(spec["wav"]))
    except Exception as error:  # the processor's config or the tokenizer: said as such
        raise SystemExit(f"GenAI's processor (audio_processor_config.json, the tokenizer) failed: {error}")
    processed = {"ids": [int(t) for t in made["input_ids"].as_numpy().flatten()],
                 "shape": list(made["audio_features"].as_numpy().shape)}
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
    json.dump({"tokens": [int(t) for t in generator.get_sequence(0).tolist()], "processed": processed}, handle)
"""


def reference(model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens on the sample's spectrogram (its first row), from
    the decoder prompt `generate()` builds from the repo's generation config (see the module)."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    features = context.generate_inputs.get("input_features")
    if not isinstance(features, torch.Tensor):
        return {"unverified": "the sample has no spectrogram `input_features` for GenAI's Whisper"}
    features = features[:1].detach().float()
    config = greedy(context.generation_config or model.generation_config, max_new_tokens=steps)
    config.min_new_tokens = steps
    suppressed = bool(config.suppress_tokens or config.begin_suppress_tokens)
    config.suppress_tokens, config.begin_suppress_tokens = None, None  # GenAI has no suppressed-token lists
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_features=features.to(device), generation_config=config,
                             return_dict_in_generate=True, output_scores=True)
    sequence = out.sequences[0].tolist()
    generated = len(out.scores)
    prompt = sequence[:len(sequence) - generated] or [decoder_start_id(model)]
    return {"speech": True, "prompt": prompt, "steps": steps, "tokens": sequence[len(sequence) - generated:],
            "suppressed_off": suppressed,
            "features": {"shape": list(features.shape), "data": features.flatten().tolist()}}


def prompt_text(directory: Path, prompt: list[int]) -> str | None:
    """The decoder prompt as the text GenAI's processor tokenizes (each id one of the folder's tokenizer's added
    tokens, `<|startoftranscript|>`...; read as data), None where the folder has no tokenizer or an id is not one."""
    path = directory / "tokenizer.json"
    try:
        added = {int(token["id"]): token["content"]
                 for token in json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(token in added for token in prompt):
        return None
    return "".join(added[token] for token in prompt)


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """GenAI transcribes the reference's spectrogram from the folder alone, in a child, its processor making the
    prompt's ids where the folder has a tokenizer; its new tokens must be eager's."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if (refused := cannot_prove(layout, directory)) is not None:
        return refused
    prompt = reference["prompt"]
    text = prompt_text(directory, prompt)
    with tempfile.TemporaryDirectory(prefix="genai-whisper-") as scratch:
        features = Path(scratch) / "features.json"
        features.write_text(json.dumps(reference["features"]), encoding="utf-8")
        got, why = run_in_child(CHILD, {"folder": str(directory), "features": str(features), "prompt": prompt,
                                        "steps": reference["steps"], "prompt_text": text,
                                        "wav": str(Path(scratch) / "tone.wav")},
                                folder=directory, timeout_s=child_timeout(context))
    if got is None:
        return RuntimeProof(layout.runtime, "failed", f"ONNX Runtime GenAI failed: {why}")
    want, steps, shape = reference["tokens"], reference["steps"], reference["features"]["shape"]
    processed = got["processed"]
    if processed is not None and (processed["ids"] != prompt or processed["shape"] != shape):
        return RuntimeProof(layout.runtime, "failed", f"GenAI's processor made input_ids {processed['ids']} from "
                                                      f"{text!r} and audio_features of shape {processed['shape']}: "
                                                      f"eager's are {prompt} and {shape}")
    new = got["tokens"][len(prompt):]
    if new != want:
        equal = next((i for i, (a, b) in enumerate(zip(want, new)) if a != b), min(len(want), len(new)))
        return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy: GenAI {new}, "
                                                      f"eager {want}")
    shown = f", decoder prompt {prompt}" if len(prompt) > 1 else ""
    made = "; GenAI's processor made the prompt's ids from its text" if processed is not None else ""
    off = "; eager's suppressed-token lists off (GenAI has none)" if reference.get("suppressed_off") else ""
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (a spectrogram of {shape[-1]} frames"
                                                  f"{shown}, og.Generator){made}{off}")

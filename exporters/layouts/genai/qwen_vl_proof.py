"""ONNX Runtime GenAI's proof of a Qwen2.5-VL or Qwen2-VL folder (`qwen_vl.py`'s graphs): `og.Model(folder)` from
the folder alone generates from the sample's image and prompt, token for token against eager greedy `generate()`.

```
reference(model)                                   prove(folder), in a child
eager generate(input_ids, pixel_values,         ─► 1. GenAI's processor on an image of any size with the prompt
  image_grid_thw; max = min = n new tokens)            "<|vision_start|><|image_pad|><|vision_end|>…": pixels of the
                                                       sample's shape and as many image tokens
                                                    2. og.NamedTensors: the sample's input_ids, pixel_values,
                                                       image_grid_thw, num_image_tokens; og.Generator.set_inputs,
                                                       greedy with max_length = min_length = prompt + n
```

The generation is fed the sample's own processor inputs (GenAI's processor is checked for the shapes it makes): the
proof compares GenAI's vision, embedding and decoder graphs and its 3-D positions with the model's. Not installed:
`unverified`; GenAI refusing the folder or generating other tokens: `failed`, with GenAI's own message.

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

from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_in_child
from exporters.layouts.genai.proof import cannot_prove
from exporters.layouts.greedy import DEFAULT_NEW_TOKENS

PROMPT = "<|vision_start|><|image_pad|><|vision_end|>describe the image"  # GenAI expands the image's tokens

# GenAI runs in a child (a native abort there ends this proof, not the run)
CHILD = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og
from PIL import Image
spec = json.loads(sys.argv[1])
sample = json.load(open(spec["sample"]))
model = og.Model(spec["folder"])
made = None
if spec["processor"]:
    image = spec["result"] + ".png"
    Image.new("RGB", (61, 37), (200, 120, 40)).save(image)  # any size: the processor resizes it
    processed = model.create_multimodal_processor()(spec["prompt"], images=og.Images.open(image))
    ids = processed["input_ids"].as_numpy()
    made = {"pixels": list(processed["pixel_values"].as_numpy().shape),
            "image_tokens": int((ids == spec["image_token"]).sum())}
params = og.GeneratorParams(model)
length = len(sample["ids"]) + spec["steps"]
params.set_search_options(do_sample=False, num_beams=1, max_length=length, min_length=length, batch_size=1)
generator = og.Generator(model, params)
inputs = og.NamedTensors()
inputs["input_ids"] = np.array([sample["ids"]], dtype=np.int32)
inputs["pixel_values"] = np.array(sample["pixels"], dtype=np.float32).reshape(sample["shape"])
inputs["image_grid_thw"] = np.array(sample["grid"], dtype=np.int64)
inputs["num_image_tokens"] = np.array([sample["image_tokens"]], dtype=np.int64)
generator.set_inputs(inputs)
while not generator.is_done():
    generator.generate_next_token()
with open(spec["result"], "w") as handle:
    json.dump({"tokens": [int(t) for t in generator.get_sequence(0).tolist()], "processed": made}, handle)
"""


def reference(model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens from the sample's prompt and image (its first
    row)."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    inputs = context.generate_inputs
    ids, pixels, grid = (inputs.get(name) for name in ("input_ids", "pixel_values", "image_grid_thw"))
    if not all(isinstance(value, torch.Tensor) for value in (ids, pixels, grid)) or grid.shape[0] != 1:
        return {"qwen_vl": True, "unverified": "the sample has no prompt and one image (input_ids, pixel_values, "
                                               "image_grid_thw) for GenAI's Qwen2.5-VL or Qwen2-VL"}
    ids, pixels = ids[:1], pixels.detach().float()
    device = next(model.parameters()).device
    extra = {name: inputs[name][:1].to(device) for name in ("mm_token_type_ids",) if isinstance(inputs.get(name),
                                                                                                  torch.Tensor)}
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                             pixel_values=pixels.to(device, model.dtype), image_grid_thw=grid.to(device),
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1, **extra)
    token = int(model.config.image_token_id)
    return {"qwen_vl": True, "steps": steps, "tokens": out[0, ids.shape[1]:].tolist(), "image_token": token,
            "sample": {"ids": ids[0].tolist(), "shape": list(pixels.shape), "pixels": pixels.flatten().tolist(),
                       "grid": grid.tolist(), "image_tokens": int((ids[0] == token).sum())}}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """GenAI generates from the reference's image and prompt from the folder alone, in a child; its processor must
    make pixels of the sample's shape and as many image tokens, its new tokens must be eager's."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if (refused := cannot_prove(layout, directory)) is not None:
        return refused
    processor = (directory / "tokenizer.json").is_file()  # GenAI's processor tokenizes the prompt
    sample = reference["sample"]
    with tempfile.TemporaryDirectory(prefix="genai-qwen-vl-") as scratch:
        path = Path(scratch) / "sample.json"
        path.write_text(json.dumps(sample), encoding="utf-8")
        got, why = run_in_child(CHILD, {"folder": str(directory), "sample": str(path), "steps": reference["steps"],
                                        "prompt": PROMPT, "image_token": reference["image_token"],
                                        "processor": processor}, folder=directory, timeout_s=child_timeout(context))
    if got is None:
        return RuntimeProof(layout.runtime, "failed", f"ONNX Runtime GenAI failed: {why}")
    made = got["processed"]
    if made is not None and (made["pixels"] != sample["shape"] or made["image_tokens"] != sample["image_tokens"]):
        return RuntimeProof(layout.runtime, "failed", f"GenAI's processor made pixels {made['pixels']} and "
                            f"{made['image_tokens']} image tokens; the model was traced on {sample['shape']} and "
                            f"{sample['image_tokens']}")
    want, steps = reference["tokens"], reference["steps"]
    new = got["tokens"][len(sample["ids"]):]
    if new != want:
        equal = next((i for i, (a, b) in enumerate(zip(want, new)) if a != b), min(len(want), len(new)))
        return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy: GenAI {new}, "
                                                      f"eager {want}")
    checked = "its processor's pixels and image tokens as the sample's, og.Generator" if made is not None else \
        "og.Generator; its processor not checked: no tokenizer.json"
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens from an image and a prompt ({checked})")

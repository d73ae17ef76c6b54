"""ONNX Runtime GenAI's proof of a Qwen2.5-VL, Qwen2-VL or Qwen3-VL folder (`qwen_vl.py`'s graphs): `og.Model(folder)` from
the folder alone generates from the sample's image and prompt, and from the same prompt with a second image, token
for token against eager greedy `generate()`.

```
reference(model)                                   prove(folder), in a child
eager generate(input_ids, pixel_values,         ─► 1. GenAI's processor on one image of any size, then two, with
  image_grid_thw; max = min = n new tokens)            "<|vision_start|><|image_pad|><|vision_end|>" per image and a
  for the sample (one image) and for the               prompt: pixels of the samples' shapes and as many image tokens
  sample with its image block twice (the         2. og.NamedTensors per sample: input_ids, pixel_values,
  second image: its patches reversed)                  image_grid_thw ([images, 3]), num_image_tokens (per image);
                                                       og.Generator.set_inputs, greedy, max = min = prompt + n
```

The generation is fed the samples' own processor inputs (GenAI's processor is checked for the shapes it makes): the
proof compares GenAI's vision, embedding and decoder graphs and its 3-D positions with the model's. With two images
GenAI runs the vision graph once per image (its `QwenVisionState` slices `pixel_values` by `image_grid_thw`, which
the graph therefore declares) and places each image's features at its tokens. Not installed: `unverified`; GenAI
refusing the folder or generating other tokens: `failed`, with GenAI's own message.

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

MARKER, TEXT = "<|vision_start|><|image_pad|><|vision_end|>", "describe the image"  # GenAI expands each image's tokens

# GenAI runs in a child (a native abort there ends this proof, not the run); a sample names its image inputs besides
# the ids and pixels (Qwen-VL's `image_grid_thw`, Mistral 3's `image_sizes`, and `num_image_tokens`), all int64
CHILD = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og
from PIL import Image
spec = json.loads(sys.argv[1])
model = og.Model(spec["folder"])
made = []
if spec["processor"]:
    paths = [spec["result"] + f".{n}.png" for n in range(2)]
    Image.new("RGB", (61, 37), (200, 120, 40)).save(paths[0])  # any size: the processor resizes it
    Image.new("RGB", (23, 50), (10, 90, 220)).save(paths[1])
    for count in (1, 2):  # one image, then two in one prompt
        processed = model.create_multimodal_processor()(spec["marker"] * count + spec["text"],
                                                        images=og.Images.open(*paths[:count]))
        ids = processed["input_ids"].as_numpy()
        made.append({"pixels": list(processed["pixel_values"].as_numpy().shape),
                     "image_tokens": int((ids == spec["image_token"]).sum())})
answer = []
for path in spec["samples"]:
    sample = json.load(open(path))
    params = og.GeneratorParams(model)
    length = len(sample["ids"]) + spec["steps"]
    params.set_search_options(do_sample=False, num_beams=1, max_length=length, min_length=length, batch_size=1)
    generator = og.Generator(model, params)
    inputs = og.NamedTensors()
    inputs["input_ids"] = np.array([sample["ids"]], dtype=np.int32)
    inputs["pixel_values"] = np.array(sample["pixels"], dtype=np.float32).reshape(sample["shape"])
    for name, value in sample["image_inputs"].items():  # image_grid_thw or image_sizes, num_image_tokens
        inputs[name] = np.array(value, dtype=np.int64)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    answer.append([int(t) for t in generator.get_sequence(0).tolist()])
with open(spec["result"], "w") as handle:
    json.dump({"tokens": answer, "processed": made or None}, handle)
"""


def _generate(model: Any, steps: int, ids: torch.Tensor, pixels: torch.Tensor, grid: torch.Tensor,
              image_token: int, typed: bool) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from one prompt and its images, with the sample the child
    feeds GenAI (`typed`: the model's forward takes `mm_token_type_ids`, 1 at each image token)."""
    device = next(model.parameters()).device
    extra = {"mm_token_type_ids": (ids == image_token).long().to(device)} if typed else {}
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                             pixel_values=pixels.to(device, model.dtype), image_grid_thw=grid.to(device),
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1, **extra)
    per_image = [int(t * h * w) // int(model.config.vision_config.spatial_merge_size) ** 2 for t, h, w in grid.tolist()]
    return {"tokens": out[0, ids.shape[1]:].tolist(),
            "sample": {"ids": ids[0].tolist(), "shape": list(pixels.shape), "pixels": pixels.flatten().tolist(),
                       "image_tokens": int((ids[0] == image_token).sum()),
                       "image_inputs": {"image_grid_thw": grid.tolist(), "num_image_tokens": per_image}}}


def two_images(ids: torch.Tensor, pixels: torch.Tensor, grid: torch.Tensor, image_token: int) -> tuple[Any, ...] | None:
    """The sample's prompt with a second image after its first (the same `<|vision_start|>...<|vision_end|>` block
    again, its patches in reverse order: another image of the same grid), None where the prompt's image tokens are
    not one run between two markers."""
    row = ids[0].tolist()
    at = [i for i, token in enumerate(row) if token == image_token]
    if not at or at != list(range(at[0], at[-1] + 1)) or at[0] == 0 or at[-1] + 1 >= len(row):
        return None
    block = row[at[0] - 1:at[-1] + 2]
    doubled = torch.tensor([row[:at[-1] + 2] + block + row[at[-1] + 2:]], dtype=ids.dtype)
    return doubled, torch.cat([pixels, pixels.flip(0)]), torch.cat([grid, grid])


def reference(model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens from the sample's prompt and image (its first
    row), and from the same prompt with a second image (`two_images`)."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    inputs = context.generate_inputs
    ids, pixels, grid = (inputs.get(name) for name in ("input_ids", "pixel_values", "image_grid_thw"))
    if not all(isinstance(value, torch.Tensor) for value in (ids, pixels, grid)) or grid.shape[0] != 1:
        return {"qwen_vl": True, "unverified": "the sample has no prompt and one image (input_ids, pixel_values, "
                                               "image_grid_thw) for GenAI's Qwen-VL"}
    ids, pixels, grid = ids[:1].cpu(), pixels.detach().float().cpu(), grid.cpu()
    token, typed = int(model.config.image_token_id), isinstance(inputs.get("mm_token_type_ids"), torch.Tensor)
    runs = [_generate(model, steps, ids, pixels, grid, token, typed)]
    if (doubled := two_images(ids, pixels, grid, token)) is not None:
        runs.append(_generate(model, steps, *doubled, token, typed))
    return {"qwen_vl": True, "steps": steps, "image_token": token, "runs": runs}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """GenAI generates from the reference's prompts (one image, then two) from the folder alone, in a child; its
    processor must make pixels of the samples' shapes and as many image tokens, its new tokens must be eager's."""
    return prove_runs(layout, directory, reference, context, MARKER, TEXT)


def prove_runs(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext, marker: str,
               text: str) -> RuntimeProof:
    """The proof of a GenAI vision-language folder (Qwen-VL's, Mistral 3's): `CHILD` generates from each of the
    reference's runs (their samples name their image inputs) in GenAI from the folder alone, its processor (where
    the folder has a tokenizer) on `marker` + `text`; the processor's pixels and image-token count must be the
    sample's, the new tokens eager's."""
    if "unverified" in reference:
        return RuntimeProof(layout.runtime, "unverified", reference["unverified"])
    if (refused := cannot_prove(layout, directory)) is not None:
        return refused
    processor = (directory / "tokenizer.json").is_file()  # GenAI's processor tokenizes the prompt
    runs, steps = reference["runs"], reference["steps"]
    with tempfile.TemporaryDirectory(prefix="genai-vlm-") as scratch:
        paths = []
        for n, run in enumerate(runs):
            paths.append(Path(scratch) / f"sample{n}.json")
            paths[-1].write_text(json.dumps(run["sample"]), encoding="utf-8")
        got, why = run_in_child(CHILD, {"folder": str(directory), "samples": [str(p) for p in paths], "steps": steps,
                                        "marker": marker, "text": text,
                                        "image_token": reference["image_token"], "processor": processor},
                                folder=directory, timeout_s=child_timeout(context))
    if got is None:
        return RuntimeProof(layout.runtime, "failed", f"ONNX Runtime GenAI failed: {why}")
    for made, run in zip(got["processed"] or [], runs):
        sample = run["sample"]
        if made["pixels"] != sample["shape"] or made["image_tokens"] != sample["image_tokens"]:
            return RuntimeProof(layout.runtime, "failed", f"GenAI's processor made pixels {made['pixels']} and "
                                f"{made['image_tokens']} image tokens; the model was traced on {sample['shape']} and "
                                f"{sample['image_tokens']}")
    for count, (tokens, run) in enumerate(zip(got["tokens"], runs), start=1):
        new, want = tokens[len(run["sample"]["ids"]):], run["tokens"]
        if new != want:
            equal = next((i for i, (a, b) in enumerate(zip(want, new)) if a != b), min(len(want), len(new)))
            images = "an image" if count == 1 else f"{count} images"
            return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy from {images} "
                                                          f"and a prompt: GenAI {new}, eager {want}")
    checked = "its processor's pixels and image tokens as the sample's, og.Generator" if processor else \
        "og.Generator; its processor not checked: no tokenizer.json"
    more = f"; {steps}/{steps} from two images in one prompt" if len(runs) > 1 else ""
    return RuntimeProof(layout.runtime, "passed",
                        f"{steps}/{steps} tokens from an image and a prompt ({checked}){more}")

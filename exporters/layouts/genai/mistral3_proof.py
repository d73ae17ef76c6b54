"""ONNX Runtime GenAI's proof of a Mistral 3 folder (`mistral3.py`'s graphs): `og.Model(folder)` from the folder
alone generates from the sample's image and prompt, and from the same prompt with a second image, token for token
against eager greedy `generate()`.

```
reference(model)                                   prove(folder), in a child
eager generate(input_ids, pixel_values,         ─► 1. GenAI's processor on one image of any size, then two, with
  image_sizes; max = min = n new tokens)              "[IMG]" per image and a prompt: pixels of the samples' shapes
  for the sample (one image) and for the              and as many `[IMG]` tokens (rows ended by [IMG_BREAK] and
  sample with its image's tokens twice (the           [IMG_END] besides)
  second image: the first upside down)           2. og.NamedTensors per sample: input_ids, pixel_values,
                                                      image_sizes ([images, 2]), num_image_tokens;
                                                      og.Generator.set_inputs, greedy, max = min = prompt + n
```

The generation is fed the samples' own inputs (GenAI's processor is checked for the shapes it makes): the proof
compares GenAI's vision, embedding and decoder graphs with the model's. With two images GenAI runs the vision graph
once per image (`PixtralVisionState` slices `pixel_values` by `image_sizes`) and places each image's features at its
tokens. Not installed: `unverified`; GenAI refusing the folder or generating other tokens: `failed`, with GenAI's own
message.

Example:
    >>> MARKER
    '[IMG]'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from exporters.layouts.child import RuntimeContext, RuntimeProof
from exporters.layouts.genai.qwen_vl_proof import prove_runs
from exporters.layouts.greedy import DEFAULT_NEW_TOKENS
from exporters.upstream.fixed_image import pixtral_grid, pixtral_span

MARKER, TEXT = "[IMG]", "describe the image"  # GenAI expands each `[IMG]` to its image's rows


def _generate(model: Any, steps: int, ids: torch.Tensor, pixels: torch.Tensor, image_token: int) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from one prompt and its images (each of the pixels' size),
    with the sample the child feeds GenAI."""
    device = next(model.parameters()).device
    sizes, count = [list(pixels.shape[2:])] * pixels.shape[0], int((ids[0] == image_token).sum())
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                             pixel_values=pixels.to(device, model.dtype), image_sizes=torch.tensor(sizes, device=device),
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1)
    return {"tokens": out[0, ids.shape[1]:].tolist(),
            "sample": {"ids": ids[0].tolist(), "shape": list(pixels.shape), "pixels": pixels.flatten().tolist(),
                       "image_tokens": count, "image_inputs": {"image_sizes": sizes, "num_image_tokens": [count]}}}


def two_images(ids: torch.Tensor, pixels: torch.Tensor, image_token: int,
               ended: bool = False) -> tuple[torch.Tensor, ...] | None:
    """The sample's prompt with a second image right after its first (the tokens from its first `[IMG]` to its last
    again; `ended`: the prompt is in the processor's rows, so the `[IMG_END]` after the last too, each image's whole
    span as GenAI's processor lays out two), the second image the first upside down; None where the prompt has no
    image token.

    Example:
        >>> two_images(torch.tensor([[1, 9, 9, 7, 9, 9, 8, 5]]), torch.zeros(1, 1, 2, 2), 9, ended=True)[0].tolist()
        [[1, 9, 9, 7, 9, 9, 8, 9, 9, 7, 9, 9, 8, 5]]
    """
    row = ids[0].tolist()
    at = [i for i, token in enumerate(row) if token == image_token]
    if not at:
        return None
    last = at[-1] + (1 if ended else 0)
    block = row[at[0]:last + 1]
    doubled = torch.tensor([row[:last + 1] + block + row[last + 1:]], dtype=ids.dtype)
    return doubled, torch.cat([pixels, pixels.flip(2)])


def reference(model: Any, context: RuntimeContext) -> dict[str, Any]:
    """Eager greedy generation of exactly `max_new_tokens` tokens from the sample's prompt and image (its first
    row), and from the same prompt with a second image (`two_images`)."""
    steps = int(getattr(context.recipe.generation, "max_new_tokens", None) or DEFAULT_NEW_TOKENS)
    inputs = context.generate_inputs
    ids, pixels = inputs.get("input_ids"), inputs.get("pixel_values")
    if not all(isinstance(value, torch.Tensor) for value in (ids, pixels)) or pixels.dim() != 4 \
            or pixels.shape[0] != 1:
        return {"mistral3": True, "unverified": "the sample has no prompt and one image (input_ids, pixel_values "
                                                "[1, 3, H, W]) for GenAI's Mistral 3"}
    ids, pixels, token = ids[:1].cpu(), pixels.detach().float().cpu(), int(model.config.image_token_id)
    runs = [_generate(model, steps, ids, pixels, token)]
    rows, cols = pixtral_grid(model.config, list(pixels.shape[-2:]))
    ended = pixtral_span(ids[0].tolist(), token, rows, cols) is not None  # the processor's rows, [IMG_END] last
    if (doubled := two_images(ids, pixels, token, ended)) is not None:
        runs.append(_generate(model, steps, *doubled, token))
    return {"mistral3": True, "steps": steps, "image_token": token, "runs": runs}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext) -> RuntimeProof:
    """GenAI generates from the reference's prompts (one image, then two) from the folder alone, in a child; its
    processor must make pixels of the samples' shapes and as many `[IMG]` tokens, its new tokens must be eager's
    (`qwen_vl_proof.prove_runs`, its child fed `image_sizes`, with this family's prompt)."""
    return prove_runs(layout, directory, reference, context, MARKER, TEXT)

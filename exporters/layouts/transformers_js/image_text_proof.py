"""transformers.js's vision-language proof (the layout is `image_text.py`): eager greedy `generate()` on the sample's
prompt and image, then Node running `GENERATE` on the folder alone: its processor on an image of the processor's size
must give pixels of the sample's shape and as many image tokens, and generation from the sample's own ids and pixels
must give eager's tokens (a Mistral 3's processor must lay the image's tokens out in the rows of the sample's prompt,
`[IMG]` x cols then `[IMG_BREAK]`, the last row ending `[IMG_END]`: the break rows are the prompt's own embeddings,
and the features go at its `[IMG]` tokens alone); with dtype files (`dtypes.py`), the folder is loaded once per
dtype, each file giving at least the greedy tokens its variant's budget asks.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.image_text_models import takes_pixtral_rows
from exporters.capture.token_ids import image_token_id
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_script
from exporters.layouts.transformers_js.dtypes import judged, proof_runs, said_runs
from exporters.layouts.transformers_js.image_text import PROOF_EMIT, PROOF_FEED, generate_script


def reference(model: Any, context: RuntimeContext, steps: int) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from the sample's prompt and image (see the module)."""
    ids, pixels = context.generate_inputs.get("input_ids"), context.generate_inputs.get("pixel_values")
    if not isinstance(ids, torch.Tensor) or not isinstance(pixels, torch.Tensor):
        return {"unverified": "the sample has no prompt and image for transformers.js's image-text-to-text model"}
    grid = context.generate_inputs.get("image_grid_thw")  # Qwen-VL's: one image's patches (all rows) and its grid
    ids, pixels = ids[:1], (pixels if isinstance(grid, torch.Tensor) else pixels[:1]).detach().float()
    device = next(model.parameters()).device
    token = image_token_id(model.config)
    mask = context.generate_inputs.get("pixel_attention_mask")  # Idefics3's, where the processor makes one
    extra = {"pixel_attention_mask": mask[:1].to(device)} if isinstance(mask, torch.Tensor) else {}
    if isinstance(grid, torch.Tensor):  # the model's forward takes the image's token types beside its grid
        extra = {"image_grid_thw": grid[:1].to(device), "mm_token_type_ids": (ids == token).long().to(device)}
    types = context.generate_inputs.get("token_type_ids")  # Gemma 3, PaliGemma: the prefill's bidirectional block
    typed = {"token_type_ids": types[:1].to(device)} if isinstance(types, torch.Tensor) else {}
    sizes = context.generate_inputs.get("image_sizes")  # Mistral 3's: eager reads them, the graph has them baked in
    typed.update({"image_sizes": sizes[:1].to(device)} if isinstance(sizes, torch.Tensor) else {})
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                             pixel_values=pixels.to(device, model.dtype), max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False, num_beams=1, **extra, **typed)
    sample = {"ids": ids[0].tolist(), "shape": list(pixels.shape), "pixels": pixels.flatten().tolist()}
    if isinstance(grid, torch.Tensor):
        sample["grid"] = [int(v) for v in grid[0].tolist()]
    elif extra:
        sample.update(mask=[int(bool(v)) for v in mask[:1].flatten().tolist()], mask_shape=list(mask[:1].shape))
    if takes_pixtral_rows(model) and token is not None:  # Mistral 3: its image's rows, as the processor lays them
        at = [i for i, value in enumerate(sample["ids"]) if value == token]
        sample["span"] = sample["ids"][at[0]:at[-1] + 2]  # the [IMG] rows, their [IMG_BREAK]s and the [IMG_END]
    return {"image_text": True, "steps": steps, "tokens": out[0].tolist(),
            "image_tokens": int((ids[0] == token).sum()) if token is not None else None, "sample": sample}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext,
          modules: Path, version: str) -> RuntimeProof:
    """Node runs `GENERATE` on `directory` with the sample's ids and pixels, once per dtype the folder holds (see the
    module; `dtypes.proof_runs`): its own graphs must give eager's tokens, each dtype file its budget's."""
    steps, done = reference["steps"], []
    for dtype, asked in proof_runs(directory, context.target.validation, steps):
        on = f" with dtype {dtype}" if dtype and dtype != "fp32" else ""
        script = generate_script(json.dumps(str(directory.parent)), json.dumps(directory.name), steps, PROOF_FEED,
                                 PROOF_EMIT, dtype=dtype)
        with tempfile.TemporaryDirectory(prefix="tjs-image-text-") as scratch:
            sample = Path(scratch) / "sample.json"
            sample.write_text(json.dumps(reference["sample"]), encoding="utf-8")
            got, why = run_script(["node"], script, {"sample": str(sample)}, folder=directory,
                                  timeout_s=child_timeout(context), links={"node_modules": modules})
        if not isinstance(got, dict):
            return RuntimeProof(layout.runtime, "failed", f"transformers.js failed{on}: {why}")
        processed = got.get("processed") or {}
        shape, token = reference["sample"]["shape"], reference.get("image_tokens")
        made = sum(1 for i in processed.get("ids") or [] if token is not None and i == _image_token_id(directory))
        grid = reference["sample"].get("grid")
        if processed.get("pixels") != shape or (token is not None and made != token) or (
                grid is not None and processed.get("grid") != grid):
            made_grid = f" (grid {processed.get('grid')}, the model's {grid})" if grid is not None else ""
            return RuntimeProof(layout.runtime, "failed", (
                f"transformers.js's processor made pixels {processed.get('pixels')} and {made} image tokens{made_grid}; "
                f"the model takes {shape} and {token}"))
        span = reference["sample"].get("span")
        if span and not _holds(processed.get("ids") or [], span):
            return RuntimeProof(layout.runtime, "failed", (
                f"transformers.js's processor laid the image's tokens out as {_around(processed.get('ids') or [], span)}"
                f"; the model's prompt has {span} (PixtralProcessor's rows)"))
        equal, short = judged(reference["tokens"], got.get("tokens"), len(reference["sample"]["ids"]), steps,
                              asked, on)
        if short:
            return RuntimeProof(layout.runtime, "failed", short)
        done.append((dtype, equal, asked))
    grid = ", grid and 3-D positions" if reference["sample"].get("grid") else ""  # Qwen-VL's
    grid += " in PixtralProcessor's rows" if reference["sample"].get("span") else ""  # Mistral 3's
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (transformers.js {version}, Node.js, "
                                                  f"AutoModelForImageTextToText, its processor's image tokens{grid})"
                                                  + said_runs(done, steps))


def _image_token_id(directory: Path) -> int | None:
    """The image token id of the folder's config, read as data."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    token = config.get("image_token_id", config.get("image_token_index"))
    return token if isinstance(token, int) else None


def _holds(ids: list[int], span: list[int]) -> bool:
    """Whether `ids` hold `span` as one run.

    Example:
        >>> _holds([1, 9, 9, 7, 9, 9, 8, 5], [9, 9, 7, 9, 9, 8]), _holds([1, 9, 9, 9, 9, 8], [9, 9, 7, 9, 9, 8])
        (True, False)
    """
    return any(ids[at:at + len(span)] == span for at in range(len(ids) - len(span) + 1))


def _around(ids: list[int], span: list[int]) -> list[int]:
    """The ids from the first of `span`'s first id on, as long as `span` (what the processor laid out in its place)."""
    at = ids.index(span[0]) if span[0] in ids else 0
    return ids[at:at + len(span)]

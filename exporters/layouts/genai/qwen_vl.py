"""ONNX Runtime GenAI's Qwen2.5-VL folder: the three graphs its `qwen2_5_vl` model runs, with their names and
signatures as its model builder writes them, traced from the eager model beside the export's own components, then
`genai_config.json` (`vision`, `embedding` and `decoder` sections) and the image processor's `processor_config.json`.
A Qwen2-VL gets the same folder, typed `qwen2_5_vl` (GenAI 0.18 has no `qwen2_vl`): its language side is the same
(M-RoPE, 3-D positions, the same image tokens; GenAI's positions give an image's tokens temporal index 0 either
way), its processor the same image processor, and its own tower (no window attention) is inside the vision graph.
A Qwen3-VL gets it typed `qwen3_vl` (GenAI runs it as Qwen2.5-VL: the same `QwenVisionState`, positions and image
tokens; its interleaved M-RoPE and QK norms are inside the decoder graph), its tower's DeepStack features carried in
the same rows as the merged features (`widened`: GenAI names no input for them).

```
genai_vision.onnx     pixel_values [patches, 3·2·p·p],     -> image_features [patches / merge², width]
                      image_grid_thw [1, 3] (one image per run: GenAI runs a prompt's images one by one)
                      (the image fixed at the traced grid: the tower's rotary positions and, for Qwen2.5-VL,
                      its window index, for Qwen3-VL its position table's interpolation, are computed for it, as
                      the export's own image encoder is traced; width: hidden, or for Qwen3-VL hidden x (1 +
                      its DeepStack features), those features after the merged ones)
genai_embedding.onnx  input_ids [batch, seq], image_features -> inputs_embeds [batch, seq, width]
                      (the image's features in place of its image tokens, in order, as the model's forward does;
                      a token's row padded with zeros to the width)
genai_decoder.onnx    inputs_embeds, attention_mask, position_ids [3, batch, seq] (GenAI computes the 3-D
                      M-RoPE positions), past_key_values.{i}.key/value -> logits, present.{i}.key/value
                      (a Qwen3-VL's DeepStack features split off and each added after its layer)
```

GenAI's processor (`processor_config.json`, ONNX Runtime Extensions' transforms) resizes every image to the traced
size, rescales, normalizes with the model's image processor's mean and std and cuts the patches; GenAI's own code
expands `<|vision_start|><|image_pad|><|vision_end|>` in the prompt to the image's tokens. Only a square traced grid
is written (its side is the square root of the image encoder's patch count): any other gets no folder and a note.

Example:
    >>> side_of(16, merge=2), side_of(12, merge=2)
    (4, None)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from transformers import DynamicCache, GenerationConfig

from exporters import fsutil
# GenAI's vision graph: the tower at the traced grid; a Qwen3-VL's DeepStack features in the features' rows
from exporters.capture.qwen_vl import FixedGridVision, deepstack_added, widened
from exporters.export.onnx_files import share_external_data
from exporters.layouts.genai.config import GENAI_CONFIG, genai_config
from exporters.upstream import read_manifest

# the model types this module writes and the GenAI model type each folder is written as (its Qwen-VL family:
# src/models/model_type.h; GenAI's own code reads no vision tower: the tower is inside genai_vision.onnx)
QWEN_VL_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen2_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}
FAMILY = {"qwen2_5_vl": "Qwen2.5-VL", "qwen2_vl": "Qwen2-VL", "qwen3_vl": "Qwen3-VL"}
VISION, EMBEDDING, DECODER = "genai_vision.onnx", "genai_embedding.onnx", "genai_decoder.onnx"
PROCESSOR = "processor_config.json"
IMAGE_ENCODER = "image_encoder"  # the export's vision component (its traced patch count fixes GenAI's grid)
# CLIP's mean and std: Qwen2-VL's image processor's defaults, used where the folder's processor names none
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# Qwen3-VL's image processor's defaults, and the name GenAI's test model gives its processor
HALF = {"qwen3_vl": ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])}
PROCESSOR_NAME = {"qwen2_5_vl": "qwen2_5_image_processor", "qwen3_vl": "qwen3_vl_image_processor"}
SESSION = {"log_id": "onnxruntime-genai", "provider_options": []}


def side_of(patches: int, merge: int) -> int | None:
    """The side (in patches) of the square grid of `patches`, None where it is not square or not a multiple of the
    spatial `merge`."""
    side = math.isqrt(patches)
    return side if side * side == patches and side % merge == 0 else None


class EmbedsDecoder(torch.nn.Module):
    """GenAI's decoder graph: the model on `inputs_embeds` with its positions after a past of any length (the past
    as flat key and value tensors, layer by layer), returning the logits and the grown past."""

    def __init__(self, model: Any, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        # a Qwen3-VL's DeepStack features (`widened`) added to the states after its first layers, as eager does
        with deepstack_added(self.model, inputs_embeds) as embeds:
            out = self.model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
        grown = [tensor for layer in out.past_key_values.layers for tensor in (layer.keys, layer.values)]
        return (out.logits, *grown)


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            dynamic_shapes: Any = None) -> None:
    with torch.no_grad():
        torch.onnx.export(module.eval(), args, str(path), dynamo=True, input_names=inputs, output_names=outputs,
                          dynamic_shapes=dynamic_shapes, external_data=True, optimize=True, verbose=False)


def write_vision(directory: Path, model: Any, side: int) -> None:
    """`genai_vision.onnx`: the tower at the square grid of `side` patches (see the module)."""
    vision, device = model.config.vision_config, next(model.parameters()).device
    grid = torch.tensor([[1, side, side]], device=device)
    pixels = torch.zeros(side * side, 3 * vision.temporal_patch_size * vision.patch_size ** 2, device=device)
    path = directory / VISION
    _export(FixedGridVision(model, grid), (pixels,), path, ["pixel_values"], ["image_features"])
    # GenAI runs a prompt's images one by one only where the vision graph declares `image_grid_thw` (QwenVisionState
    # slices pixel_values by it; without it, every image's patches go to one run): declared for one image, unread
    # (the grid is the traced one, to which GenAI's processor resizes every image)
    graph = onnx.load(str(path), load_external_data=False)
    graph.graph.input.append(helper.make_tensor_value_info("image_grid_thw", TensorProto.INT64, [1, 3]))
    fsutil.write_file(path, graph.SerializeToString())


def write_decoder(directory: Path, model: Any, mrope: bool = True) -> None:
    """`genai_decoder.onnx`: the embeddings decoder under GenAI's names, its query and past lengths dynamic; its
    positions [3, batch, seq] (M-RoPE's, `mrope`) or [batch, seq] (a plain RoPE's: Mistral 3, `mistral3.py`)."""
    text = model.config.text_config
    layers, heads = int(text.num_hidden_layers), int(text.num_key_value_heads)
    head_size = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    past_len, query = 3, 2  # traced on a past and a query long enough to stay dynamic
    like = {"dtype": next(model.parameters()).dtype, "device": next(model.parameters()).device}
    embeds = torch.zeros(1, query, widened(model.config), **like)
    mask = torch.ones(1, past_len + query, dtype=torch.long, device=like["device"])
    positions = torch.arange(past_len, past_len + query, device=like["device"]).view(1, 1, -1)
    positions = positions.expand(3, 1, -1).clone() if mrope else positions[0]
    past = tuple(torch.zeros(1, heads, past_len, head_size, **like) for _ in range(2 * layers))
    names = [f".{layer}.{part}" for layer in range(layers) for part in ("key", "value")]  # k0, v0, k1, ...
    query_dim = torch.export.Dim("sequence_length", min=1)
    dynamic = ({1: query_dim}, {1: torch.export.Dim("total_sequence_length", min=1)}, {2 if mrope else 1: query_dim},
               tuple({2: torch.export.Dim("past_sequence_length", min=0)} for _ in past))
    _export(EmbedsDecoder(model, layers), (embeds, mask, positions, *past), directory / DECODER,
            ["inputs_embeds", "attention_mask", "position_ids"] + [f"past_key_values{n}" for n in names],
            ["logits"] + [f"present{n}" for n in names], dynamic)


def write_embedding(directory: Path, model: Any) -> None:
    """`genai_embedding.onnx`: the token table's rows (padded with zeros to the features' width, `widened`), each
    image token's replaced by the next image feature; an image token past the last feature (GenAI feeds no features
    after the prompt: a generated `[IMG]`) keeps its table row, as eager's decode step embeds it."""
    weight = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    hidden = widened(model.config)
    node = helper.make_node
    widen = hidden > weight.shape[1]  # only a model with DeepStack features (Qwen3-VL) has wider rows
    nodes = [node("Gather", ["embed_tokens.weight", "input_ids"], ["rows" if widen else "embeds"]),
             *([node("Pad", ["rows", "pads"], ["embeds"])] if widen else []),
             node("Equal", ["input_ids", "image_token_id"], ["is_image"]),
             node("Reshape", ["is_image", "minus_one"], ["is_image_flat"]),
             node("Cast", ["is_image_flat"], ["is_image_int"], to=TensorProto.INT64),
             node("CumSum", ["is_image_int", "zero"], ["count"]),
             node("Sub", ["count", "one"], ["row"]),
             node("Shape", ["image_features"], ["features"], end=1),
             node("Concat", ["image_features", "zero_row"], ["padded"], axis=0),
             node("Where", ["is_image_flat", "row", "features"], ["row_or_zero"]),
             node("Gather", ["padded", "row_or_zero"], ["picked_flat"], axis=0),
             node("Shape", ["embeds"], ["embeds_shape"]),
             node("Reshape", ["picked_flat", "embeds_shape"], ["picked"]),
             # an image token past the last feature (one generated after the prompt: GenAI feeds no features then)
             # keeps its table row, as eager's decode step embeds it
             node("Less", ["row", "features"], ["has_feature"]),
             node("And", ["is_image_flat", "has_feature"], ["placed_flat"]),
             node("Shape", ["input_ids"], ["ids_shape"]),
             node("Reshape", ["placed_flat", "ids_shape"], ["placed"]),
             node("Unsqueeze", ["placed", "minus_one"], ["placed_column"]),
             node("Where", ["placed_column", "picked", "embeds"], ["inputs_embeds"])]
    constants = [numpy_helper.from_array(weight, "embed_tokens.weight"),
                 numpy_helper.from_array(np.array(model.config.image_token_id, dtype=np.int64), "image_token_id"),
                 numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
                 numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
                 numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
                 numpy_helper.from_array(np.zeros((1, hidden), dtype=np.float32), "zero_row"),
                 *([numpy_helper.from_array(np.array([0, 0, 0, 0, 0, hidden - weight.shape[1]], dtype=np.int64),
                                            "pads")] if widen else [])]
    graph = helper.make_graph(nodes, "embedding", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("image_features", TensorProto.FLOAT, ["num_image_tokens", hidden])],
        [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", hidden])],
        constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(directory / EMBEDDING),
              save_as_external_data=True, location=EMBEDDING + ".data")
    (directory / (EMBEDDING + ".data")).chmod(0o644)  # as the folder's other files (onnx writes it private)


def processor_config(directory: Path, model: Any, side: int) -> dict[str, Any]:
    """GenAI's image processor (ONNX Runtime Extensions' transforms, as its test models' Qwen2.5-VL config names
    them): every image resized to the traced `side` patches square, rescaled, normalized with the folder's
    processor's mean and std (else CLIP's), cut into patches."""
    vision, kind = model.config.vision_config, QWEN_VL_TYPES[model.config.model_type]
    mean, std = HALF.get(kind, (CLIP_MEAN, CLIP_STD))
    source = directory / "preprocessor_config.json"
    known = json.loads(source.read_text(encoding="utf-8")) if source.is_file() else {}
    pixels = side * vision.patch_size
    steps = [("decode_image", "DecodeImage", {"color_space": "RGB"}), ("convert_to_rgb", "ConvertRGB", None),
             ("resize", "Resize", {"width": pixels, "height": pixels, "smart_resize": 0, "keep_aspect_ratio": 0}),
             ("rescale", "Rescale", {"rescale_factor": float(known.get("rescale_factor", 1 / 255))}),
             ("normalize", "Normalize", {"mean": known.get("image_mean", mean), "std": known.get("image_std", std),
                                         kind: 1}),
             ("patch_image", "PatchImage", {"patch_size": vision.patch_size,
                                            "temporal_patch_size": vision.temporal_patch_size,
                                            "merge_size": vision.spatial_merge_size})]
    transforms = [{"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}
                  for name, kind, attrs in steps]
    return {"processor": {"name": PROCESSOR_NAME[kind], "transforms": transforms}}


def qwen_vl_genai_config(model: Any, generation_config: Any) -> dict[str, Any]:
    """`genai_config.json` for the three graphs: the text decoder's fields (`config.genai_config`) on
    `inputs_embeds`, and the `embedding` and `vision` sections GenAI's builder writes."""
    config = model.config
    content = genai_config(config, generation_config, DECODER)
    described = content["model"]
    inputs = {name: value for name, value in described["decoder"]["inputs"].items() if name != "input_ids"}
    described["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    described["decoder"]["hidden_size"] = widened(config)  # GenAI's features' and embeddings' width
    vision = config.vision_config
    described.update({
        "type": QWEN_VL_TYPES[config.model_type], "image_token_id": int(config.image_token_id),
        "video_token_id": int(config.video_token_id), "vision_start_token_id": int(config.vision_start_token_id),
        "embedding": {"filename": EMBEDDING, "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                      "outputs": {"inputs_embeds": "inputs_embeds"}, "session_options": SESSION},
        "vision": {"filename": VISION, "config_filename": PROCESSOR,
                   "spatial_merge_size": int(vision.spatial_merge_size), "patch_size": int(vision.patch_size),
                   "tokens_per_second": float(getattr(vision, "tokens_per_second", 2)),
                   # read only by GenAI's own split vision pipeline (decoder.pipeline), not this folder's one graph
                   **({"window_size": int(vision.window_size)} if hasattr(vision, "window_size") else {}),
                   "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
                   "outputs": {"image_features": "image_features"}, "session_options": SESSION}})
    return content


def unwritten(target: Any, family: str = "Qwen2.5-VL") -> str | None:
    """Why a target gets no GenAI graphs although its model type is one GenAI runs: its graphs are float32 here
    (the embedding graph's table and GenAI's features are float32), so a float16 or quantized target gets none.

    Example:
        >>> from types import SimpleNamespace
        >>> unwritten(SimpleNamespace(dtype="float16", quantize=None))[:43]
        "GenAI's Qwen2.5-VL graphs are written for a"
    """
    if getattr(target, "dtype", None) not in (None, "float32") or getattr(target, "quantize", None) is not None:
        return (f"GenAI's {family} graphs are written for a float32 target without quantize (this target: dtype "
                f"{getattr(target, 'dtype', None)}, quantize {'set' if getattr(target, 'quantize', None) else 'none'})")
    return None


def write_qwen_vl_files(directory: Path, target: Any, model: Any, notes: list[str]) -> None:
    """GenAI's three graphs, `genai_config.json` and `processor_config.json` in `directory` (see the module); a
    target they are not written for (`unwritten`) or a traced image that is not a square grid gets none, and a note
    says why."""
    family = FAMILY[model.config.model_type]
    if why := unwritten(target, family):
        notes.append(f"ONNX Runtime GenAI: no {family} folder written: {why}")
        return
    entry = read_manifest(directory)["components"].get(IMAGE_ENCODER, {})
    shape = (entry.get("metadata", {}).get("kwargs", {}).get("hidden_states") or {}).get("shape") or [0]
    merge = int(model.config.vision_config.spatial_merge_size)
    side = side_of(int(shape[0]), merge)
    if side is None:
        notes.append(f"ONNX Runtime GenAI: no {family} folder written: the image encoder was traced on "
                     f"{shape[0]} patches, not a square grid of a multiple of {merge} patches a side")
        return
    write_vision(directory, model, side)
    write_embedding(directory, model)
    write_decoder(directory, model)
    share_external_data(directory, (VISION, EMBEDDING, DECODER))  # the components' weights, stored once
    fsutil.write_file(directory / PROCESSOR, json.dumps(processor_config(directory, model, side), indent=2) + "\n")
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    content = qwen_vl_genai_config(model, generation_config)
    fsutil.write_file(directory / GENAI_CONFIG, json.dumps(content, indent=4) + "\n")
    notes.append(f"ONNX Runtime GenAI: its {family} graphs ({VISION}, {EMBEDDING}, {DECODER}) traced beside the "
                 f"components, the image fixed at {side * model.config.vision_config.patch_size} pixels square "
                 "(GenAI's processor resizes every image to it)")

"""ONNX Runtime GenAI's `phi4mm` (Phi-4-multimodal) as GenAI 0.18 runs it, and why this product writes no such folder
for transformers' `Phi4MultimodalForCausalLM` (model type `phi4_multimodal`): the reason its "runs in" cell gives.

GenAI's `phi4mm` is a multi-modal model (src/models/model_type.h: IsMMM) run by `MultiModalLanguageModel`
(src/models/multi_modal.cpp) from four graphs named in `genai_config.json` and two processor configs:

```
vision     pixel_values [images, crops, 3, 448, 448], image_attention_mask [images, crops, 32, 32],
           image_sizes [images, 2]                                     -> image_features [image tokens, hidden]
speech     audio_embeds [audios, frames, 80], audio_attention_mask, audio_sizes [audios],
           audio_projection_mode [1] (0 text, 1 vision, 2 speech, 3 both: set by the processor from the payload)
                                                                       -> audio_features [audio tokens, hidden]
embedding  input_ids, image_features, audio_features                   -> inputs_embeds
decoder    inputs_embeds, attention_mask, past_key_values.{i}.key/value -> logits, present.{i}.key/value
```

Its processor (`PhiMultiModalProcessor`, src/models/phi_multimodal_processor.cpp) rewrites each `<|image_N|>` of the
prompt to `<|endoftext10|>` and each `<|audio_N|>` to `<|endoftext11|>`, tokenizes, and repeats the hard-coded ids
`constexpr int32_t image_special_token_id = 200010` and `audio_special_token_id = 200011` by the image's
`num_img_tokens` and the audio's `audio_sizes`. The image side is ONNX Runtime Extensions' `Phi4VisionDynamicPreprocess`
and `Phi4VisionProcessor` (shared/api/image_transforms_phi_4.hpp): 448-pixel crops (`dyhd_base_resolution_{448}`,
up to `dynamic_hd_{36}`), a global 448-pixel image first, masks of `base_resolution / 14` patches a side, and
`num_img_tokens = 256 + 1 + (kept patches of the 2x2-pooled mask) + (its rows) + 16`: a 448-pixel crop of 14-pixel
patches pooled 2x2 (16 x 16 = 256 global tokens and 16 row separators), as transformers' own image processor counts.
GenAI's model builder makes the decoder only for Microsoft's remote-code `Phi4MMForCausalLM` (models/builder.py), with
that checkpoint's vision LoRA merged (models/builders/phi.py `Phi4MMModel`: `lora_A.vision`); its vision, speech and
embedding graphs come from modified remote-code modeling files (examples/python/phi-4-multi-modal.md). transformers'
native model has no LoRA layers (the checkpoint's adapters load through PEFT) and runs the same geometry by default
(crop 448, patch 14, image token 200010, audio token 200011); GenAI's runtime generates from graphs traced from it as
eager does (benchmarks/genai_phi4mm_probe.py: the tiny model's tower, HD assembly and projection at one 448-pixel
image, the embedding and decoder graphs, fed the processor's tensors: 8/8 tokens, a shifted projection 0/8).

Example:
    >>> phi4mm_declined({"model_type": "phi4_multimodal", "vision_config": {"image_token_id": 200010,
    ...     "crop_size": 448, "image_size": 448, "patch_size": 14}, "audio_config": {"audio_token_id": 200011}})[:53]
    "GenAI runs Phi-4-multimodal as its 'phi4mm' type from"
"""

from __future__ import annotations

from typing import Any

MODEL_TYPE = "phi4_multimodal"  # transformers' (Phi4MultimodalConfig.model_type)
GENAI_TYPE = "phi4mm"  # GenAI's (src/models/model_type.h: IsMMM)
# GenAI's hard-coded ids (src/models/phi_multimodal_processor.cpp) and ONNX Runtime Extensions' crop geometry
# (shared/api/image_transforms_phi_4.hpp: `dyhd_base_resolution_{448}`, masks of `base_resolution / 14`, 256 + 16)
IMAGE_TOKEN, AUDIO_TOKEN = 200010, 200011
CROP, PATCH = 448, 14

WRITTEN_BY_GENAI = (
    f"GenAI runs Phi-4-multimodal as its {GENAI_TYPE!r} type from its builder's vision, speech, embedding and decoder "
    "graphs of Microsoft's remote-code checkpoint (onnxruntime_genai/models/builder.py builds `Phi4MMForCausalLM` "
    "only, its decoder with that checkpoint's vision LoRA merged: builders/phi.py `Phi4MMModel`, `lora_A.vision`; the "
    "other graphs from modified remote-code modeling files, examples/python/phi-4-multi-modal.md). Its runtime also "
    "runs graphs traced from transformers' `Phi4MultimodalForCausalLM` (benchmarks/genai_phi4mm_probe.py: 8/8 tokens "
    "from one 448-pixel image), but this product does not write them: it does not export the model's image and audio "
    "stages (exporters/capture/modalities.py refuses the model)")


def mismatches(config: dict[str, Any]) -> list[str]:
    """What in `config` (a Phi-4-multimodal's `config.json`, read as data) GenAI's `phi4mm` hard-codes otherwise:
    the image and audio token ids, the crop and patch sizes; empty for the real checkpoint's geometry.

    Example:
        >>> mismatches({"vision_config": {"image_token_id": 250, "crop_size": 448, "image_size": 448,
        ...             "patch_size": 14}, "audio_config": {"audio_token_id": 200011}})[0][:40]
        'its image token id is 250 (audio 200011)'
    """
    vision, audio = config.get("vision_config") or {}, config.get("audio_config") or {}
    found = []
    image, heard = vision.get("image_token_id"), audio.get("audio_token_id")
    if (image, heard) != (IMAGE_TOKEN, AUDIO_TOKEN):
        found.append(f"its image token id is {image!r} (audio {heard!r}), where GenAI's processor expands "
                     f"`<|image_N|>` to the id it hard-codes (`constexpr int32_t image_special_token_id = "
                     f"{IMAGE_TOKEN}`, audio {AUDIO_TOKEN}: src/models/phi_multimodal_processor.cpp)")
    crop, size, patch = vision.get("crop_size"), vision.get("image_size"), vision.get("patch_size")
    if (crop, size, patch) != (CROP, CROP, PATCH):
        found.append(f"its image tower takes {size!r}-pixel crops (crop_size {crop!r}) of {patch!r}-pixel patches, "
                     f"where GenAI's image processor cuts {CROP}-pixel crops of {PATCH}-pixel patches and counts "
                     "their tokens as such (`return 256 + 1 + num_img_tokens + 16`: ONNX Runtime Extensions' "
                     "shared/api/image_transforms_phi_4.hpp)")
    return found


def phi4mm_declined(config: dict[str, Any]) -> str:
    """Why GenAI does not run this product's ONNX folder of a Phi-4-multimodal (its `config.json`, read as data):
    GenAI's `phi4mm` layout is not written (see the module), and what in this model GenAI hard-codes otherwise."""
    found = mismatches(config)
    return WRITTEN_BY_GENAI + (f"; and this model differs from what GenAI hard-codes: {'; '.join(found)}"
                               if found else "")

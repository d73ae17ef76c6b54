"""transformers.js's vision-language and audio-language layouts: their three graphs (which targets and models get
them, and why not: `exporters.capture.image_text_models`).

An ONNX generation target of a vision-language model with `"layout": "transformers.js"` is written as transformers.js's
`ImageTextToText` models load it (`AutoModelForImageTextToText`: LLaVA, Idefics3, SmolVLM, Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, Gemma 3, PaliGemma, Mistral 3), three graphs (Gemma 3's features, embeddings and decoder input one channel wider, marking the
image's rows: [`marked`]; its sliding-window layers' caches as long as the full layers': [`_full_cache`]):

```
vision_encoder        pixel_values [batch, 3, H, W]  -> image_features [1, n, hidden]   the image fixed at the sample's
                      (Idefics3, SmolVLM: [1, tiles, 3, H, W] and its bool pixel_attention_mask; Qwen2-VL,
                      Qwen2.5-VL: [patches, 3·t·p·p] and image_grid_thw [1, 3] -> [patches / merge², hidden], the
                      tower traced at the sample's square grid: `exporters.capture.qwen_vl`; Qwen3-VL's features
                      and embed_tokens' rows are hidden x (1 + DeepStack features) wide, the decoder adding each part
                      after its layer: `qwen_vl.widened`; Mistral 3: one square image's pixels, its image_sizes
                      baked in, -> the features of its [IMG] tokens, which its processor lays out in rows ended by
                      [IMG_BREAK] and [IMG_END]: those rows are embed_tokens', as in the model's forward)
embed_tokens          input_ids [batch, seq]         -> inputs_embeds [batch, seq, hidden]
decoder_model_merged  inputs_embeds, attention_mask, position_ids, past_key_values.{i}.key/value
                                                     -> logits, present.{i}.key/value   (the prompt on an empty cache)
                      (Qwen2-VL, Qwen2.5-VL: position_ids [3, batch, seq], M-RoPE's temporal, height and width rows,
                      which transformers.js computes as the model's get_rope_index does)
```

transformers.js embeds the prompt, puts the image's features in place of the image tokens (`image_token_index`),
runs the merged decoder on the embeddings, then each new token through `embed_tokens` and the decoder: what the
model's own forward does for these families. The layout's files (`exporters.layouts.transformers_js.image_text`)
move the graphs under `onnx/` with the names transformers.js binds. A model outside that contract keeps the
vision-language components (the upstream layout) and transformers.js's "runs in" cell says why
(`image_text_models.refused`).
Validation probes the decoder with that merged prompt ([`prompt_embeddings`]), at every probe's shape
([`prompt_windows`]), so a quantized decoder is judged on what it is fed.

An audio-language model (transformers.js's `AudioTextToText` models, `AutoModelForAudioTextToText`: Voxtral, Granite
Speech) is the same three graphs with `audio_encoder` in place of `vision_encoder`:

```
audio_encoder         audio_values [num_chunks, mel bins, frames] -> audio_features [1, n, hidden]   any number of
                      chunks of the sample's length (the model's `get_audio_features`: tower, frame stacking,
                      projector; transformers.js's processor splits longer audio into chunks)
                      (Granite Speech: input_features [1, frames, 2 x mel bins], any number of frames, probed at
                      lengths it was not traced with: [`frames_bindings`])
```

Voxtral's audio tokens per chunk are transformers.js's processor's constant (`image_text_models.refused_audio`).
Granite Speech's `GraniteSpeechProcessor` makes one `input_features [1, frames, 2 x mel bins]` as long as the audio
and lays out as many audio tokens as its projector's windows give ([`takes_any_length`]): its audio encoder keeps
the frames dynamic (traced on [`longer_audio`], `exporters.upstream.granite_speech_frames_dynamic`).

Example:
    >>> components_for("vision-language")
    ['vision_encoder', 'embed_tokens', 'decoder_model_merged']
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

from exporters.capture.cache_settings import has_sliding_layers
from exporters.capture.image_attention import marks_image_rows
from exporters.capture.image_text_models import TRACED_PAST, TRACED_QUERY, takes_pixtral_rows
from exporters.capture.merged import contract, empty_cache, with_contract
from exporters.capture.probes import DimBinding
from exporters.capture.qwen_vl import GridVisionEncoder, WidenedEmbedding, deepstack_added, deepstack, is_mrope, widened
from exporters.capture.token_ids import features_in_place, image_token_id
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.recipe.model import ComponentOverride
from exporters.upstream.fixed_image import PixtralVision
from exporters.upstream.multimodal_runner import (AudioEncoder, MarkedTokenEmbedding, MarkedVisionEncoder,
                                                  TokenEmbedding, VisionEncoder)

VISION_ENCODER, EMBED_TOKENS, DECODER = "vision_encoder", "embed_tokens", "decoder_model_merged"
COMPONENTS = [VISION_ENCODER, EMBED_TOKENS, DECODER]
AUDIO_ENCODER = "audio_encoder"
AUDIO_COMPONENTS = [AUDIO_ENCODER, EMBED_TOKENS, DECODER]


def components_for(family: str) -> list[str]:
    """The layout's three graphs for `family`: an audio encoder's for an audio-language model, else a vision one's.

    Example:
        >>> components_for("audio-language")
        ['audio_encoder', 'embed_tokens', 'decoder_model_merged']
    """
    return list(AUDIO_COMPONENTS if family == "audio-language" else COMPONENTS)


class MaskedImageEncoder(torch.nn.Module):
    """`vision_encoder(pixel_values [1, tiles, 3, H, W], pixel_attention_mask [1, tiles, H, W] bool)`: Idefics3's
    and SmolVLM's `get_image_features` (tower, pixel shuffle, connector), every tile's features as one sequence."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor) -> torch.Tensor:
        features = self.model.get_image_features(pixel_values=pixel_values, pixel_attention_mask=pixel_attention_mask)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output object
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), dim=0)
        return features.reshape(1, -1, features.shape[-1])


def marked(model: Any) -> bool:
    """Whether the layout marks `model`'s image rows (Gemma 3): `embed_tokens` and `vision_encoder` give one channel
    more than the hidden size, 0 on a text row and 1 on an image's (`exporters.upstream.multimodal_runner`'s
    `MarkedTokenEmbedding`, `MarkedVisionEncoder`), which transformers.js merges as any features (its
    `Gemma3ForConditionalGeneration` is its LLaVA class: the decoder takes embeddings, a mask and positions, no
    token types); `decoder_model_merged` reads the channel as the processor's `token_type_ids` of the rows it is fed,
    so the prompt's image attends both ways among its tokens, as transformers' mask from them ([`EmbedsDecoder`]).

    Example:
        >>> from types import SimpleNamespace
        >>> marked(SimpleNamespace(config=SimpleNamespace(model_type="gemma3")))
        True
    """
    return marks_image_rows({"model_type": getattr(model.config, "model_type", None)})


class EmbedsDecoder(torch.nn.Module):
    """`decoder_model_merged`: the model's forward on `inputs_embeds` with a cache (no image: its features are in
    the embeddings already), returning the logits and the grown cache. A marked model's ([`marked`]) last channel
    is cut and given as `token_type_ids` (1 on the image's rows): transformers builds Gemma 3's mask from them (its
    image block both ways, the rest causal; a cached key is text, as in eager's later steps, which pass none).
    PaliGemma's: the rows of one call are one block attending both ways (transformers' mask for its prefix, the whole
    prompt, which transformers.js runs as one call on an empty cache; a later call is one new token, where the block
    is the causal row), its mask made here and given to the model as it is."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past_key_values: Any) -> Any:
        # a Qwen3-VL's DeepStack features in the rows (exporters.capture.qwen_vl); any other model's rows as they are
        added = deepstack_added(self.model, inputs_embeds) if deepstack_of(self.model) else nullcontext(inputs_embeds)
        types = {}
        if marked(self.model):  # Gemma 3: the image's rows marked in the last channel
            inputs_embeds, types = inputs_embeds[..., :-1], {"token_type_ids": (inputs_embeds[..., -1] > 0.5).long()}
            added = nullcontext(inputs_embeds)
        if getattr(self.model.config, "model_type", None) == "paligemma":  # the call's rows: one block both ways
            attention_mask = create_causal_mask(self.model.config.get_text_config(), inputs_embeds, attention_mask,
                                                past_key_values, position_ids, block_sequence_ids=torch.zeros_like(
                                                    inputs_embeds[..., 0], dtype=torch.long))
        with added as embeds:
            out = self.model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, use_cache=True, **types)
        return {"logits": out.logits, "past_key_values": out.past_key_values}


def deepstack_of(model: Any) -> int:
    """A Qwen-VL's DeepStack features' count (Qwen3-VL's), 0 for any other model."""
    return deepstack(model.config) if is_mrope(model.config) else 0


def _full_cache(model: Any) -> DynamicCache:
    """The traced decoder's first cache: one layer per model layer as its config says, except where the model's own
    cache keeps a sliding window in some layer (Gemma 3; `capture.cache_settings.has_sliding_layers`, the rule of the
    text decoders' ONNX capture): every layer then keeps every position (transformers.js feeds back each present as
    it came and one `attention_mask` for all layers), the window held by transformers' sliding mask alone, as eager's
    sliding layers drop only keys that mask hides."""
    return DynamicCache() if has_sliding_layers(model.config) else DynamicCache(config=model.config)


def embeds_inputs(embeds: torch.Tensor, start: int, cache: Any, positions: torch.Tensor | None = None,
                  mrope: bool = False) -> dict[str, Any]:
    """The decoder's call for `embeds` at positions `start…` after `cache` (what transformers.js feeds): `positions`
    where given, else the text's [batch, length] (`mrope`: the same in each of Qwen-VL's 3 rows).

    Example:
        >>> sorted(embeds_inputs(torch.zeros(1, 2, 4), 3, None))
        ['attention_mask', 'inputs_embeds', 'past_key_values', 'position_ids']
        >>> list(embeds_inputs(torch.zeros(1, 2, 4), 3, None, mrope=True)["position_ids"].shape)
        [3, 1, 2]
    """
    batch, length = embeds.shape[:2]
    if positions is None:
        positions = torch.arange(start, start + length).unsqueeze(0).expand(batch, -1).clone()
        positions = positions.unsqueeze(0).expand(3, -1, -1).clone() if mrope else positions
    return {"inputs_embeds": embeds, "attention_mask": torch.ones(batch, start + length, dtype=torch.long),
            "position_ids": positions, "past_key_values": cache}


def image_inputs(generate_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The vision encoder's inputs from the sample: its pixels, and Idefics3's pixel mask as transformers.js's
    processor makes it (bool)."""
    if isinstance(generate_inputs.get("image_grid_thw"), torch.Tensor):  # Qwen-VL: one image's patches and grid
        return {"pixel_values": generate_inputs["pixel_values"].clone(),
                "image_grid_thw": generate_inputs["image_grid_thw"][:1].clone()}
    inputs = {"pixel_values": generate_inputs["pixel_values"][:1].clone()}
    if isinstance(generate_inputs.get("pixel_attention_mask"), torch.Tensor):
        inputs["pixel_attention_mask"] = generate_inputs["pixel_attention_mask"][:1].bool()
    return inputs


def audio_inputs(generate_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The audio encoder's inputs from the sample: one chunk's log-mel features."""
    return {"input_features": generate_inputs["input_features"][:1].clone()}


def takes_any_length(model: Any) -> bool:
    """Whether the audio encoder takes features as long as the audio (Granite Speech: its processor makes one
    `[1, frames, 2 x bins]` of any length and lays out the audio tokens its length gives), not chunks of one length.

    Example:
        >>> from types import SimpleNamespace
        >>> takes_any_length(SimpleNamespace(config=SimpleNamespace(model_type="granite_speech")))
        True
    """
    return getattr(model.config, "model_type", None) == "granite_speech"


def frames_bindings(target: Any, name: str, module: Any, inputs: dict[str, Any]) -> list[DimBinding]:
    """Granite Speech's audio encoder's frames (kept dynamic by `Dim.AUTO`: a named `Dim` fails on guards torch
    cannot prove, such as one block of its Conformer being no different from several), which validation probes at
    lengths it was not traced with, as for `dynamic: true` (one frame, a middle length and twice the traced one plus
    3): the traced length alone would vouch for no other. Empty for any other component.

    Example:
        >>> frames_bindings(None, "embed_tokens", None, {})
        []
    """
    model = getattr(module, "model", None)
    if name != AUDIO_ENCODER or model is None or not takes_any_length(model) or "input_features" not in inputs \
            or getattr(target, "layout", None) != TRANSFORMERS_JS:
        return []
    return [DimBinding("audio frames (any length)", 1, None, [("input_features", 1)],
                       int(inputs["input_features"].shape[1]), declared=False, positional=False)]


def longer_audio(features: torch.Tensor) -> torch.Tensor:
    """Features half again as long as the sample's along the frames (`[1, frames, bins]`): the sample's, then its
    first half again. Granite Speech's audio encoder is traced on them, so its Conformer's blocks and its projector's
    windows number more than one and the last of each is part-filled (the sample fills whole blocks), and stay
    symbolic.

    Example:
        >>> longer_audio(torch.arange(4.).reshape(1, 4, 1)).flatten().tolist()
        [0.0, 1.0, 2.0, 3.0, 0.0, 1.0]
    """
    return torch.cat([features, features[:, :features.shape[1] // 2]], dim=1).contiguous()


def image_encoder(model: Any, generate_inputs: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The vision encoder graph's module and traced inputs: LLaVA's pixels alone, or Idefics3's with its mask (Mistral
    3's alone, at one size: its features at the prompt's `[IMG]` tokens, in order; the `[IMG_BREAK]` and `[IMG_END]`
    rows are the prompt's own embeddings); an audio-language model's audio encoder and its features."""
    if "input_features" in generate_inputs:
        return AudioEncoder(model).eval(), audio_inputs(generate_inputs)
    inputs = image_inputs(generate_inputs)
    if "image_grid_thw" in inputs:  # Qwen-VL: the tower at the sample's grid (exporters.capture.qwen_vl)
        return GridVisionEncoder(model, inputs["image_grid_thw"]).eval(), inputs
    if takes_pixtral_rows(model):  # Mistral 3: the tower at the sample's size, its image_sizes baked in
        size = [int(side) for side in inputs["pixel_values"].shape[-2:]]
        return PixtralVision(model, size, batched=True).eval(), inputs
    module = MaskedImageEncoder(model) if "pixel_attention_mask" in inputs else VisionEncoder(model)
    module = MarkedVisionEncoder(model) if marked(model) else module  # Gemma 3: its rows marked 1
    return module.eval(), inputs


def _positions_3d(override: ComponentOverride) -> ComponentOverride:
    """The merged decoder's contract with Qwen-VL's positions [3, batch, query]: the batch and query axes one on."""
    spec = override.model_dump(exclude_none=True)
    axes = spec["dynamic_shapes"].get("position_ids") or {}
    spec["dynamic_shapes"]["position_ids"] = {str(int(axis) + 1): dim for axis, dim in axes.items()}
    return ComponentOverride.model_validate(spec)


def capture(target: Any, model: Any, generate_inputs: dict[str, Any]) -> dict[str, tuple[Any, dict]]:
    """The three graphs and the inputs each is traced with (`target.components` completed with their contracts):
    the prompt's ids, the image's pixels (or the audio's features), the prompt's embeddings after a cache of its
    first tokens."""
    ids = generate_inputs["input_ids"][:1]
    embed = (WidenedEmbedding(model.get_input_embeddings(), widened(model.config)) if deepstack_of(model)
             else (MarkedTokenEmbedding if marked(model) else TokenEmbedding)(model.get_input_embeddings())).eval()
    decoder = EmbedsDecoder(model).eval()
    mrope = is_mrope(model.config)  # Qwen-VL: positions [3, batch, query]
    with torch.no_grad():
        embeds = embed(ids[:, :TRACED_PAST + TRACED_QUERY])
        cache = decoder(**embeds_inputs(embeds[:, :TRACED_PAST], 0, _full_cache(model), mrope=mrope))
    step = embeds_inputs(embeds[:, TRACED_PAST:].clone(), TRACED_PAST, copy.deepcopy(cache["past_key_values"]),
                         mrope=mrope)
    with_contract(target, DECODER, _positions_3d(contract(target, step)) if mrope else contract(target, step))
    with_contract(target, EMBED_TOKENS, ComponentOverride.model_validate({"dynamic_shapes": {"input_ids": {
        "0": {"name": "batch_size", "min": 1}, "1": {"name": "sequence_length", "min": 1}}}}))
    encoder = AUDIO_ENCODER if "input_features" in generate_inputs else VISION_ENCODER
    module, inputs = image_encoder(model, generate_inputs)
    if encoder == AUDIO_ENCODER and takes_any_length(model):  # Granite Speech: frames as long as the audio
        with_contract(target, encoder, ComponentOverride.model_validate({"dynamic_shapes": {"input_features": {
            "1": "auto"}}}))
        inputs = {"input_features": longer_audio(inputs["input_features"])}
    elif encoder == AUDIO_ENCODER:  # any number of chunks: the processor splits longer audio into chunks
        with_contract(target, encoder, ComponentOverride.model_validate({"dynamic_shapes": {"input_features": {
            "0": {"name": "num_chunks", "min": 1}}}}))
    else:
        with_contract(target, encoder, ComponentOverride(dynamic=False))
    return {encoder: (module, inputs),
            EMBED_TOKENS: (embed, {"input_ids": ids.clone()}),
            DECODER: (decoder, step)}


def prompt_embeddings(model: Any, components: dict[str, tuple[Any, dict]], generate_inputs: dict[str, Any]) -> Any:
    """The sample's prompt as transformers.js feeds `decoder_model_merged` (`[1, prompt, hidden]`): the eager
    `embed_tokens` of its ids with the eager encoder's image (audio) features in place of its image (audio) tokens,
    the merge `exporters.validate.multimodal_runner.image_text_driver` does with the graphs; None where the features
    do not fill those tokens one for one."""
    ids = generate_inputs["input_ids"][:1]
    audio = AUDIO_ENCODER in components
    token = model.config.audio_token_id if audio else image_token_id(model.config)
    encoder = components[AUDIO_ENCODER if audio else VISION_ENCODER][0]
    with torch.no_grad():
        embeds = components[EMBED_TOKENS][0](ids).clone()
        features = encoder(**(audio_inputs(generate_inputs) if audio else image_inputs(generate_inputs)))
    return embeds if features_in_place(embeds, ids, features, token) else None


def prompt_windows(decoder: Any, traced: dict[str, Any], probes: list, prompt: Any) -> list:
    """`probes` of `decoder_model_merged` (`exporters.capture.probes.make_probes`: their shapes, then random
    embeddings and caches at the sample's scale) made of the real `prompt` ([`prompt_embeddings`]) at the same shapes:
    a probe of `past` cached and `query` new positions feeds row r the prompt's window starting at r modulo the
    windows that fit, its first `past` embeddings cached by the eager decoder, the rest as the query. A quantized
    decoder's top-1 and KL are then measured on what it is fed (image features and the text after them), not on
    noise, where a trained model's argmaxes are as fragile as a random one's. The traced probe, and a probe longer
    than the prompt, stay as they are."""
    length = prompt.shape[1]
    made = []
    for probe_id, probe, skip in probes:
        if probe is None or probe_id == "traced" or probe["position_ids"].dim() != 2:
            made.append((probe_id, probe, skip))
            continue
        batch, query = probe["inputs_embeds"].shape[:2]
        past = probe["attention_mask"].shape[1] - query
        if past + query > length:
            made.append((probe_id, probe, skip))
            continue
        rows = torch.cat([prompt[:, row % (length - past - query + 1):][:, :past + query] for row in range(batch)])
        cache = empty_cache(traced["past_key_values"], batch)
        if past:
            with torch.no_grad():
                cache = decoder(**embeds_inputs(rows[:, :past].contiguous(), 0, cache))["past_key_values"]
        made.append((probe_id, embeds_inputs(rows[:, past:].contiguous(), past, cache), skip))
    return made

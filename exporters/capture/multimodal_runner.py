"""ExecuTorch's `MultimodalRunner` layout: which vision- and audio-language targets get it, and its three components.

A vision-language (or audio-language) ExecuTorch generation target is, by default (`layout` unset or `"runner"`), one program in the
contract of executorch's `MultimodalRunner` (extension/llm/runner, with its Python binding) and optimum-executorch:
`token_embedding`, `vision_encoder`, `text_decoder` (the KV cache inside), constant metadata methods
(`exporters.upstream.multimodal_runner`). The target's layout is then `"multimodal_runner"`. It fits a LLaVA-style
model: one image whose features (`get_image_features`) take the place of one run of image tokens in the prompt, the
processor's pixels `[1, 3, H, W]` the only image input, a text model the static cache holds whole, a prompt read
causally or both ways among one image's tokens only (Gemma 3: the program marks the image's rows,
`exporters.capture.image_attention`); Idefics3, SmolVLM and Idefics2 where their processor's images `[1, n, 3, H, W]` (one,
or its tiles and the whole image, each its own run of image tokens: each an image input of the runner) have a pixel
mask of ones (`exporters.upstream.idefics_image`); LLaVA-NeXT and LLaVA-OneVision, whose processor's one image comes
with its `image_sizes` (any-resolution tiles), at the one image size the program is traced at: its tiles stacked as
one image input of the runner, the sizes baked in (`exporters.upstream.fixed_image`); Mistral 3 (Pixtral's tower) at
its one image size too, where the prompt holds its processor's rows of image tokens ([IMG_BREAK] after each, [IMG_END]
after the last: [`pixtral_span_of`]), the whole span one image whose features `vision_encoder` emits with those two
tokens' embeddings between them. A model outside that (several
images' `image_sizes`, a Pixtral prompt without its processor's rows ([`PIXTRAL_ROWS`]), a pixel mask that
leaves pixels out, other token
types, Qwen-VL's 3-D rotary positions and patches ([`MROPE_REFUSED`]), PaliGemma's bidirectional prefix) keeps the
methods layout, the report saying why ([`refused`]). Sliding-window layers shorter than the cache (Gemma 3) are held
in ring buffers of twice their window, as the LLM runner's program holds them (ExecuTorch's LLM custom ops), one
`text_decoder` call taking at most the window (`get_max_seq_len`): each image's run of tokens must fit it (the
runner prefills an image in one call), and the runner's text inputs are split to it
(`exporters.layouts.executorch_multimodal`); an audio-language model's keep the methods layout. An audio-language model fits where it is Voxtral-shaped:
`audio_encoder` is its `get_audio_features` (or, Qwen2-Audio, its audio tower then its projector, where the sample's
feature mask counts every frame) on the extractor's log-mel features `[1, bins, frames]`, whose embeddings take the
place of the one run of audio tokens (`audio_token_id`).

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
    >>> wants_multimodal_runner(target, "vision-language", "static", batch_size=1)
    True
    >>> wants_multimodal_runner(target, "text", "static", batch_size=1)
    False
    >>> target.layout = "multimodal_runner"
    >>> wants_multimodal_runner(target, "text", "static", batch_size=1)
    Traceback (most recent call last):
    ...
    exporters.errors.TargetPlanError: layout 'multimodal_runner' is for vision-language and audio-language models; this is a text model: use layout 'runner' or 'methods'
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.families import MULTIMODAL_GENERATORS, a_model_of
from exporters.capture.image_attention import marks_image_rows, runner_declined
from exporters.capture.llm_runner import WINDOW_WITHOUT_CUSTOM_OPS, custom_ops_of, program_reasons
from exporters.capture.qwen_vl import is_mrope
from exporters.capture.token_ids import features_in_place, image_token_id
from exporters.errors import TargetPlanError
from exporters.upstream import llm_runner, multimodal_runner
from exporters.upstream.fixed_image import IMAGE_SIZES, pixtral_grid, pixtral_span, stacked_tiles, takes_image_sizes
from exporters.upstream.idefics_image import PIXEL_MASK, takes_pixel_mask

MULTIMODAL_RUNNER = "multimodal_runner"
TOKEN_EMBEDDING, VISION_ENCODER, TEXT_DECODER = multimodal_runner.METHODS
AUDIO_ENCODER = multimodal_runner.AUDIO_ENCODER
COMPONENTS = list(multimodal_runner.METHODS)
AUDIO_COMPONENTS = list(multimodal_runner.AUDIO_METHODS)
# the sample inputs a LLaVA-style forward reads (anything else: a layout the runner's one image cannot carry)
IMAGE_INPUTS = {"input_ids", "attention_mask", "pixel_values"}
IMAGE_COUNTS = "batch_num_images"  # LLaVA-OneVision's processor's images per prompt ([`_one_image_each`])
AUDIO_INPUTS = {"input_ids", "attention_mask", "input_features"}  # Voxtral's: the features, the prompt
# Qwen2-Audio's mask of the features' frames: the runner's audio has none, so every frame must count
FEATURE_MASK = "feature_attention_mask"


def components_of(family: str) -> list[str]:
    """The program's methods for a `family` model: `audio_encoder` in place of `vision_encoder` for audio.

    Example:
        >>> components_of("audio-language")
        ['token_embedding', 'audio_encoder', 'text_decoder']
    """
    return list(AUDIO_COMPONENTS if family == "audio-language" else COMPONENTS)
# Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's text model (ExecuTorch's MultimodalRunner, extension/llm/runner
# multimodal_prefiller.cpp: text_decoder(embeddings, cache positions); optimum-executorch's multimodal task finds no
# vision_tower or vision_model in them either)
MROPE_REFUSED = ("its text model's rotary positions are 3-D (M-RoPE: each image token at its temporal, row and column "
                 "index in the image's grid, the text after the image at positions shifted by the grid), while the "
                 "runner calls text_decoder with the embeddings and their 1-D cache positions only, and its "
                 "vision_encoder with the image's pixels only, not the patches and grid (image_grid_thw) this "
                 "model's vision tower reads")
# how the runner keeps a text_decoder call within a ring-buffer layer's window (the report's ring note)
FED_AS_INPUTS = ("each text input of the runner must be no longer (the card's snippet splits the prompt's text to "
                 "it), and each image fits one call")
NOT_MULTIMODAL = ("the ExecuTorch program has a method per component (layout 'methods'), not ExecuTorch "
                  "MultimodalRunner's layout: {why}")


def wants_multimodal_runner(target: Any, family: str, cache_implementation: str, batch_size: int = 1) -> bool:
    """Whether a vision-language ExecuTorch generation target is planned in the multimodal runner's layout: its
    recipe asks (`layout` "runner" or "multimodal_runner") or leaves `layout` unset, with a static cache at batch 1,
    no component settings of the methods layout, XNNPACK (quantized or not: `exporters.export.quantize`; whether the model fits is
    [`refused`]'s). Raises [`TargetPlanError`] when the recipe asked for it and a setting rules it out."""
    if target.export_format != "executorch" or target.mode != "generation":
        return False
    layout = getattr(target, "layout", None)
    if family not in MULTIMODAL_GENERATORS:
        if layout == MULTIMODAL_RUNNER:
            raise TargetPlanError(f"layout 'multimodal_runner' is for vision-language and audio-language models; "
                                  f"this is {a_model_of(family)}: use layout 'runner' or 'methods'", option="layout")
        return False
    if layout == "methods":
        return False
    reasons = _settings_reasons(target, cache_implementation, batch_size)
    if not reasons:
        return True
    if layout is not None:
        raise TargetPlanError(f"layout {layout!r} cannot be exported for this {family} model: "
                              f"{'; '.join(reasons)}; use layout 'methods'", option="layout")
    return False


def _settings_reasons(target: Any, cache_implementation: str, batch_size: int) -> list[str]:
    reasons = program_reasons(target, cache_implementation, batch_size)
    if target.components or target.dynamic_shapes or getattr(target, "merged", None) is not None:
        reasons.append("the target sets per-component settings or dynamic_shapes of the methods layout")
    return reasons


def settings_refused(target: Any, family: str, cache_implementation: str, batch_size: int = 1) -> str | None:
    """Why a vision- or audio-language ExecuTorch generation target whose recipe leaves `layout` unset keeps the
    methods layout for its own settings ([`wants_multimodal_runner`]'s reasons: per-component settings,
    ...), said in its findings as [`refused`]'s reasons are; None where they do not rule the runner out."""
    if target.export_format != "executorch" or target.mode != "generation" or family not in MULTIMODAL_GENERATORS \
            or getattr(target, "layout", None) is not None:
        return None
    reasons = _settings_reasons(target, cache_implementation, batch_size)
    return NOT_MULTIMODAL.format(why="; ".join(reasons)) if reasons else None


def refused(target: Any, model: Any, generate_inputs: dict[str, Any], max_cache_len: int) -> str | None:
    """Why the model does not fit the runner's contract (see the module), as the report says it where the layout
    was the default; None when it fits. Raises [`TargetPlanError`] when the recipe asked for the layout."""
    if AUDIO_ENCODER in multimodal_runner.methods_of(model):
        return _asked(target, _audio_refused(model, generate_inputs, max_cache_len))
    config = model.config.to_dict()
    # Gemma 3's token types mark its image's tokens, which the program marks itself (`marks_image_rows`)
    extra = sorted(set(generate_inputs) - IMAGE_INPUTS - ({"token_type_ids"} if marks_image_rows(config) else set())
                   - ({PIXEL_MASK} if takes_pixel_mask(model) else set())
                   - ({IMAGE_SIZES} if takes_image_sizes(model) else set()) - _one_image_each(generate_inputs))
    pixels = runner_image_inputs(generate_inputs)
    ids = runner_prompt(model, generate_inputs)  # Pixtral's rows: its span one run
    image_token = image_token_id(model.config)
    if not hasattr(model, "get_image_features"):
        why = f"{type(model).__name__} has no get_image_features (the vision_encoder method)"
    elif bidirectional := runner_declined(config):
        why = bidirectional
    elif is_mrope(model.config):
        why = MROPE_REFUSED
    elif extra:
        why = f"its image inputs include {extra}, which the runner's one image (pixels only) cannot carry"
    elif masked := _mask_refused(generate_inputs) or _sizes_refused(model, generate_inputs):
        why = masked
    elif not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or (pixels.shape[0] != 1 and PIXEL_MASK not in
                                                                        generate_inputs):
        shape = list(pixels.shape) if isinstance(pixels, torch.Tensor) else None
        why = f"its pixels are not one image [1, 3, H, W] (shape {shape})"
    elif image_token is None or ids is None or len(_runs(ids[0].tolist(), int(image_token))) != pixels.shape[0]:
        why = (f"its prompt does not hold one run of image tokens per image ({pixels.shape[0]}: the runner puts "
               "each image's features in its run)")
    else:
        why = _ring_refused(target, model, ids, int(image_token), max_cache_len)
    return _asked(target, why)


def _one_image_each(generate_inputs: dict[str, Any]) -> set[str]:
    """`{IMAGE_COUNTS}` where the sample's processor counted one image a prompt (LLaVA-OneVision's processor: `[1]`),
    which its `get_image_features` reads as it reads none (the image tiled, as the program's traced call does);
    else nothing (several images a prompt: the runner's program is not traced for them)."""
    counts = generate_inputs.get(IMAGE_COUNTS)
    return {IMAGE_COUNTS} if isinstance(counts, torch.Tensor) and bool((counts == 1).all()) else set()


def runner_images(pixels: Any) -> Any:
    """The runner's images `[n, 3, H, W]`, each one image input `[1, 3, H, W]` in the prompt's order, of an
    Idefics3-style sample's `[1, n, 3, H, W]` (one image, or the processor's tiles and the whole image:
    `do_image_splitting`); other pixels as they are.

    Example:
        >>> runner_images(torch.zeros(1, 5, 3, 4, 4)).shape, runner_images(torch.zeros(1, 3, 4, 4)).shape
        (torch.Size([5, 3, 4, 4]), torch.Size([1, 3, 4, 4]))
    """
    if isinstance(pixels, torch.Tensor) and pixels.dim() == 5 and pixels.shape[0] == 1:
        return pixels[0]
    return pixels


def runner_image_inputs(generate_inputs: dict[str, Any]) -> Any:
    """The runner's image inputs `[n, 3, H, W]` of a sample (see [`runner_images`]); an image with its
    `image_sizes` (LLaVA-NeXT's tiles) one input, its tiles stacked down the height
    (`exporters.upstream.fixed_image`).

    Example:
        >>> runner_image_inputs({"pixel_values": torch.zeros(1, 2, 3, 4, 4), "image_sizes": torch.tensor([[4, 4]])}).shape
        torch.Size([1, 3, 8, 4])
    """
    pixels = generate_inputs.get("pixel_values")
    if IMAGE_SIZES in generate_inputs and isinstance(pixels, torch.Tensor) and pixels.dim() in (4, 5) \
            and pixels.shape[0] == 1:
        return stacked_tiles(pixels)
    return runner_images(pixels)


# Mistral 3 (Pixtral's tower): its processor (PixtralProcessor) lays one image's tokens out in rows, an [IMG_BREAK]
# after each and [IMG_END] after the last; the program emits that span whole (`exporters.upstream.fixed_image`), so the
# prompt must hold it (a synthesized sample whose tokenizer has no [IMG_BREAK] and [IMG_END] has one run, which is not
# the processor's prompt: never proven on it)
PIXTRAL_ROWS = ("its processor (PixtralProcessor) lays the image's tokens out in rows, an [IMG_BREAK] token after each "
                "row and [IMG_END] after the last, and the sample's prompt does not hold that layout (at least two rows "
                "of the image's grid; a tokenizer without [IMG_BREAK] and [IMG_END] cannot make it), where the "
                "runner's program emits the whole span as one image")


def pixtral_span_of(model: Any, ids: Any, sizes: Any) -> tuple[int, int, int, int] | None:
    """A Pixtral tower's `([IMG_BREAK] id, [IMG_END] id, rows, cols)` where the prompt `ids` holds its one image of
    `sizes` in the processor's rows (`exporters.upstream.fixed_image.pixtral_span`); None for any other model or
    prompt."""
    vision = getattr(model.config, "vision_config", None)
    token = image_token_id(model.config)
    if getattr(vision, "model_type", None) != "pixtral" or not isinstance(sizes, torch.Tensor) or token is None \
            or not isinstance(ids, torch.Tensor) or sizes.reshape(-1, 2).shape[0] != 1:
        return None
    rows, cols = pixtral_grid(model.config, sizes.reshape(-1, 2)[0].tolist())
    found = pixtral_span(ids[0].tolist(), int(token), rows, cols)
    return None if found is None else (*found, rows, cols)


def runner_prompt(model: Any, generate_inputs: dict[str, Any]) -> Any:
    """The sample's `input_ids` as the runner places the image: a Pixtral span's [IMG_BREAK] and [IMG_END] as image
    tokens, the span one run ([`pixtral_span_of`]); other prompts as they are."""
    ids = generate_inputs.get("input_ids")
    span = pixtral_span_of(model, ids, generate_inputs.get(IMAGE_SIZES))
    if span is None:
        return ids
    token = int(image_token_id(model.config))
    return torch.where((ids == span[0]) | (ids == span[1]), torch.full_like(ids, token), ids)


def _sizes_refused(model: Any, generate_inputs: dict[str, Any]) -> str | None:
    """Why a sample's `image_sizes` do not fit the runner's one image at a fixed size: more than one image, or a
    Pixtral prompt without its processor's rows ([`PIXTRAL_ROWS`]); else None (the program bakes the one image's size in:
    `exporters.upstream.fixed_image`)."""
    sizes = generate_inputs.get(IMAGE_SIZES)
    vision = getattr(model.config, "vision_config", None)
    if sizes is not None and getattr(vision, "model_type", None) == "pixtral" \
            and pixtral_span_of(model, generate_inputs.get("input_ids"), sizes) is None:
        return PIXTRAL_ROWS
    if isinstance(sizes, torch.Tensor) and sizes.reshape(-1, 2).shape[0] != 1:
        return (f"its {IMAGE_SIZES} hold {sizes.reshape(-1, 2).shape[0]} images, where the runner's program takes "
                "one image of one fixed size")
    return None


def _mask_refused(generate_inputs: dict[str, Any]) -> str | None:
    """Why an Idefics3-style sample (`pixel_attention_mask` beside `[1, images, 3, H, W]` pixels) does not fit the
    runner's images: its mask leaves pixels out (the program's `vision_encoder` counts every pixel:
    `exporters.upstream.idefics_image`); else None. Tiles (`do_image_splitting`) fit: each is one image input of
    the runner, in its own run of image tokens."""
    mask = generate_inputs.get(PIXEL_MASK)
    if not isinstance(mask, torch.Tensor):
        return None
    if not bool(mask.all()):
        return (f"its {PIXEL_MASK} leaves pixels out (a padded image), which the runner's one image (pixels only, "
                "every pixel counted) cannot carry")
    return None


def _ring_refused(target: Any, model: Any, ids: torch.Tensor, image_token: int, max_cache_len: int) -> str | None:
    """Why a vision-language model's sliding-window layers shorter than the cache do not fit the runner's program,
    else None. The program holds them in ring buffers of twice their window (`llm_runner.ring_windows`, through
    ExecuTorch's LLM custom ops, so not where the target turns them off), one `text_decoder` call taking at most
    the window (`get_max_seq_len`); the runner prefills each image in one call, so each run of image tokens must fit
    it (the runner's text inputs are split to it: `exporters.layouts.executorch_multimodal`)."""
    windows = llm_runner.ring_windows(model, max_cache_len)
    if not windows:
        return None
    window, longest = min(windows.values()), max(end - start for start, end in _runs(ids[0].tolist(), image_token))
    if not custom_ops_of(target, model):  # the LLM runner's program says the same (`llm_runner.window_refused`)
        return WINDOW_WITHOUT_CUSTOM_OPS.format(window=window)
    if longest > window:
        return (f"its image's {longest} tokens do not fit one text_decoder call of its sliding window ({window}): "
                "the runner prefills each image in one call, and the ring buffer keeps a call's keys only up to "
                "the window")
    return None


def _window_refused(model: Any, max_cache_len: int) -> str | None:
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    if window is not None and window < max_cache_len:
        return (f"its text model has sliding-window layers (window {window}, shorter than the cache of "
                f"{max_cache_len}): the runner program's static cache would roll them on one traced code path")
    return None


def _audio_refused(model: Any, generate_inputs: dict[str, Any], max_cache_len: int) -> str | None:
    """Why a Voxtral-shaped model's sample does not fit the runner's one audio input, else None."""
    extra = sorted(set(generate_inputs) - AUDIO_INPUTS - {FEATURE_MASK})
    features, ids = generate_inputs.get("input_features"), generate_inputs.get("input_ids")
    token = getattr(model.config, "audio_token_id", None)
    mask = generate_inputs.get(FEATURE_MASK)
    if not multimodal_runner.audio_stages(model):
        return (f"{type(model).__name__} has no get_audio_features, nor an audio_tower and a multi_modal_projector "
                "(the audio_encoder method: its audio tower and projector)")
    if extra:
        return f"its audio inputs include {extra}, which the runner's one audio (features only) cannot carry"
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        return (f"its {FEATURE_MASK} leaves frames out, which the runner's one audio (features only, every frame "
                "counted) cannot carry")
    if not isinstance(features, torch.Tensor) or features.dim() != 3 or ids is None or ids.shape[0] != 1:
        return "its sample is not one prompt with one audio's features [chunks, mel bins, frames]"
    if not isinstance(token, int) or len(_runs(ids[0].tolist(), token)) != 1:
        return "its prompt does not hold one run of audio tokens (the runner puts the audio's embeddings there)"
    return _window_refused(model, max_cache_len)


def _asked(target: Any, why: str | None) -> str | None:
    """`why` as the report says it where the layout was the default; raised where the recipe asked for it."""
    if why is None:
        return None
    if getattr(target, "layout", None) is not None:
        raise TargetPlanError(f"layout {target.layout!r} cannot be exported: {why}; use layout 'methods'",
                              option="layout")
    return NOT_MULTIMODAL.format(why=why)


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """The `(start, end)` of each run of `token` in `ids`."""
    runs: list[tuple[int, int]] = []
    for i, value in enumerate(ids):
        if value == token:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    return runs


def chunked_audio(model: Any) -> bool:
    """Whether the model's audio comes in chunks its `audio_encoder` takes any number of, one after another
    (Voxtral: its processor splits audio into 30 s chunks, each `[bins, frames]`, 375 audio tokens).

    Example:
        >>> from types import SimpleNamespace
        >>> chunked_audio(SimpleNamespace(config=SimpleNamespace(model_type="voxtral")))
        True
    """
    return getattr(model.config, "model_type", None) == "voxtral"


def two_chunks(features: torch.Tensor) -> torch.Tensor:
    """Two chunks of features from one: the sample's, then the same rolled by half a chunk (a spectrogram too).

    Example:
        >>> two_chunks(torch.arange(4.).reshape(1, 1, 4)).tolist()
        [[[0.0, 1.0, 2.0, 3.0]], [[2.0, 3.0, 0.0, 1.0]]]
    """
    return torch.cat([features[:1], features[:1].roll(features.shape[-1] // 2, dims=-1)])


def two_chunk_prompt(ids: torch.Tensor, token: int) -> torch.Tensor:
    """The prompt of [`two_chunks`]: the first row's run of audio tokens twice as long where it stands.

    Example:
        >>> two_chunk_prompt(torch.tensor([[1, 9, 9, 5]]), 9).tolist()
        [[1, 9, 9, 9, 9, 5]]
    """
    row = ids[0].tolist()
    first, count = row.index(token), row.count(token)
    return torch.tensor([row[:first] + [token] * (2 * count) + row[first + count:]])


def capture(model: Any, generate_inputs: dict[str, Any], max_cache_len: int) -> dict[str, tuple[Any, dict]]:
    """The three methods and the inputs each is traced with: the prompt's text before the image (at least 2
    tokens, so the sequence axis stays dynamic), the image's pixels (or the audio's features), the prompt's
    embeddings at position 0."""
    ids = generate_inputs["input_ids"]
    if ids.shape[1] >= max_cache_len:
        raise TargetPlanError(f"the prompt ({ids.shape[1]} tokens) does not fit the static cache of {max_cache_len} "
                              "positions: raise generation.max_cache_len", option="layout")
    marked = marks_image_rows(model.config.to_dict())
    sizes = generate_inputs.get(IMAGE_SIZES) if takes_image_sizes(model) else None
    tiles = int(runner_images(generate_inputs["pixel_values"]).shape[0]) if sizes is not None else 1
    span = pixtral_span_of(model, ids, sizes)  # Pixtral's rows: emitted with their break and end tokens
    modules = multimodal_runner.multimodal_modules(
        model, max_cache_len, marked=marked, image_sizes=(sizes.tolist(), tiles, span) if sizes is not None else None)
    # at most the decoder's `max_seq_len` (a ring-buffer layer's window)
    text = ids[:, :max(2, min(ids.shape[1], 8, modules[TEXT_DECODER].max_seq_len))].clone()
    with torch.no_grad():
        embeds = modules[TOKEN_EMBEDDING](text)
    encoder = AUDIO_ENCODER if AUDIO_ENCODER in modules else VISION_ENCODER
    source, media = _media(encoder, generate_inputs)
    fed = _fed_prompt(model, modules, encoder, media, runner_prompt(model, generate_inputs))
    embeds = embeds if fed is None else fed[:, :embeds.shape[1]].clone()
    if encoder == AUDIO_ENCODER and chunked_audio(model):  # traced on two chunks: the chunk axis stays dynamic
        media = two_chunks(media)
    return {TOKEN_EMBEDDING: (modules[TOKEN_EMBEDDING], {"input_ids": text}),
            encoder: (modules[encoder], {source: media}),
            TEXT_DECODER: (modules[TEXT_DECODER], {"inputs_embeds": embeds,
                                                   "cache_position": torch.arange(text.shape[1])})}


def _media(encoder: str, generate_inputs: dict[str, Any]) -> tuple[str, Any]:
    """The encoder's input name and the one image (audio) the runner feeds it from the sample: Idefics3's tiles each
    one image input of the runner, LLaVA-NeXT's one, stacked."""
    if encoder == AUDIO_ENCODER:
        return "input_features", generate_inputs["input_features"].clone()
    return "pixel_values", runner_image_inputs(generate_inputs)[:1].clone()


def runner_prompt_embeddings(model: Any, components: dict[str, tuple[Any, dict]],
                             generate_inputs: dict[str, Any]) -> Any:
    """The sample's whole prompt as the runner feeds `text_decoder` (`[1, prompt, width]`): the eager token
    embeddings with the image's (audio's) features in place of its tokens, from the eager methods in `components`;
    None where the features do not fill those tokens one for one."""
    modules = {name: module for name, (module, _) in components.items()}
    encoder = AUDIO_ENCODER if AUDIO_ENCODER in modules else VISION_ENCODER
    return _fed_prompt(model, modules, encoder, _media(encoder, generate_inputs)[1],
                       runner_prompt(model, generate_inputs)[:1])


def _fed_prompt(model: Any, modules: dict[str, Any], encoder: str, media: Any, ids: Any) -> Any:
    """The prompt `ids` embedded as the runner feeds it: the image's (audio's) features in place of its tokens (a
    prompt that opens with its image: LLaVA's), so `text_decoder`'s probes judge logits of what the runner runs, not
    of a placeholder's embedding no prompt holds; None where one image's features do not fill the prompt's run
    (several images or chunks), or the prompt holds none."""
    token = getattr(model.config, "audio_token_id", None) if encoder == AUDIO_ENCODER else image_token_id(model.config)
    if token is None or not isinstance(ids, torch.Tensor) or not bool((ids[0] == int(token)).any()):
        return None
    with torch.no_grad():
        features = modules[encoder](media)
        full = modules[TOKEN_EMBEDDING](ids).clone()
    features = next(iter(features.values())) if isinstance(features, dict) else features
    return full if features_in_place(full, ids, features, int(token)) else None

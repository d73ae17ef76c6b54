"""Sample inputs for models that read images or audio, in the family's own layout.

- When the model folder ships a processor (`processor_config.json`, or `preprocessor_config.json` beside a
  tokenizer), a synthetic image or waveform and the recipe's prompt go through that processor, offline: the token
  layout, pixel shapes and extra tensors (`pixel_attention_mask`, `image_grid_thw`, `token_type_ids`) are exactly
  what the family expects.
- When it ships only an image processor or feature extractor, that makes the pixels or features. So does the image
  processor of a processor that cannot load (LLaVA-OneVision's, InternVL's and Qwen3-VL's processors build a video
  processor, which needs torchvision): a vision-language model then gets the folder's pixels in its own layout and
  the image tokens by the rule below, counted on those pixels ([`image_processor_pixels`]).
- Otherwise a vision-language model's inputs are synthesized by one rule from its config and its own code
  ([`synthesize_vlm`]): the config's image token, an image at the vision config's size in the first layout the
  model's `get_image_features` accepts (one image; tiles with `image_sizes`; tiles with a pixel mask), and as many
  image tokens as that call returns features. Qwen2-VL's flattened patches and PaliGemma's and Gemma 3's token types
  keep their own layouts. A model the rule cannot serve (no `get_image_features`: Mllama's cross-attention) raises
  `UnsupportedModelError` naming the missing processor files.

Nothing from the folder runs: processors load with `trust_remote_code=False` and `local_files_only=True`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image

from exporters.capture.chat_prompt import IMAGE_TEXT, image_prompt
from exporters.errors import UnsupportedModelError, describe_error
from exporters.upstream import multimodal_submodules
from exporters.upstream.fixed_image import pixtral_grid, pixtral_rows

PROCESSOR_FILE = "processor_config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
DEFAULT_PROMPT = IMAGE_TEXT


@dataclass
class Preprocessor:
    """What the folder ships to prepare inputs: a full `processor` (text + image/audio), or only an image processor
    or feature extractor (`kind` says which)."""

    kind: str  # "processor" | "image_processor" | "feature_extractor"
    obj: Any
    notes: list[str] = field(default_factory=list)
    origin: str = ""  # "": the folder's own; else how it was built (`config_image_processor`)

    @property
    def name(self) -> str:
        return type(self.obj).__name__


def load_preprocessor(folder: Path | None, audio: bool = False) -> tuple[Preprocessor | None, list[str]]:
    """The folder's processor (or image processor / feature extractor), and notes on what could not be loaded. For
    an `audio` model the feature extractor is tried before an image processor (which cannot read its
    `preprocessor_config.json`, and would leave a misleading note)."""
    if folder is None:
        return None, []
    folder = Path(folder)
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    options = {"local_files_only": True, "trust_remote_code": False}
    attempts: list[tuple[str, str]] = []
    if (folder / PROCESSOR_FILE).is_file() or ((folder / PREPROCESSOR_FILE).is_file() and has_tokenizer):
        attempts.append(("processor", "AutoProcessor"))
    if (folder / PREPROCESSOR_FILE).is_file() or (folder / PROCESSOR_FILE).is_file():  # transformers 5 nests them
        single = [("image_processor", "AutoImageProcessor"), ("feature_extractor", "AutoFeatureExtractor")]
        attempts += single[::-1] if audio else single
    notes: list[str] = []

    for kind, loader in attempts:
        try:
            obj = getattr(transformers, loader).from_pretrained(folder, **options)
        except Exception as err:  # a broken or code-needing processor: say so, try the next, else synthesize

            reason = " ".join(describe_error(err, 300).split())  # one line: an ImportError's text spans several
            notes.append(f"the folder's {kind.replace('_', ' ')} could not be loaded ({reason})")
            continue
        if kind == "processor" and not hasattr(obj, "tokenizer") and not hasattr(obj, "image_processor"):
            kind = "image_processor" if hasattr(obj, "preprocess") else "feature_extractor"
        return Preprocessor(kind, obj), notes
    return None, notes


def config_image_processor(model) -> Preprocessor | None:
    """The image processor a model's inputs need, built from its config, where the folder ships none and no rule lays
    them out otherwise: SigLIP2's NaFlex inputs (the image cut into `num_patches` flattened patches of `patch_size`,
    with a pixel mask and the grid's spatial shapes), which only its processor makes; None for every other model.

    Example:
        >>> from transformers import Siglip2Config, Siglip2Model
        >>> tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
        >>> model = Siglip2Model(Siglip2Config(text_config=tiny, vision_config={**tiny, "patch_size": 8,
        ...                                                                    "num_patches": 16}))
        >>> config_image_processor(model).obj.max_num_patches
        16
    """
    vision = getattr(model.config, "vision_config", None) or model.config
    if getattr(vision, "model_type", None) != "siglip2_vision_model":
        return None
    patch, patches = int(vision.patch_size), int(vision.num_patches)
    processor = transformers.Siglip2ImageProcessor(patch_size=patch, max_num_patches=patches)
    return Preprocessor("image_processor", processor, origin=f"a {type(processor).__name__} built from the vision "
                        f"config (patch {patch}, up to {patches} patches: the folder ships no image processor)")


def synthetic_image(size: int | tuple[int, int], seed: int) -> np.ndarray:
    """A deterministic RGB image (`H x W x 3`, uint8): smooth gradients plus noise, like a photo's statistics.

    Example:
        >>> image = synthetic_image(32, seed=0)
        >>> image.shape, image.dtype.name, bool((image == synthetic_image(32, seed=0)).all())
        ((32, 32, 3), 'uint8', True)
    """
    height, width = (size, size) if isinstance(size, int) else size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / max(width - 1, 1), y / max(height - 1, 1), (x + y) / max(height + width - 2, 1)], axis=-1)
    image = 255 * (0.7 * base + 0.3 * rng.random((height, width, 3)))
    return image.clip(0, 255).astype(np.uint8)


def synthetic_waveform(sampling_rate: int, seconds: float, seed: int) -> np.ndarray:
    """A deterministic mono waveform: two tones and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sampling_rate * seconds)) / sampling_rate
    wave = 0.5 * np.sin(2 * np.pi * 220 * t) + 0.3 * np.sin(2 * np.pi * 660 * t) + 0.05 * rng.standard_normal(t.shape)
    return wave.astype(np.float32)


def _image_size(config, image_processor, requested: int | None) -> int:
    if requested:
        return requested
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None)
    if isinstance(size, (list, tuple)):
        size = size[0]
    if size:
        return int(size)
    wanted = getattr(image_processor, "size", None) or {}
    if not isinstance(wanted, dict):
        wanted = {}
    return int(wanted.get("height") or wanted.get("shortest_edge") or wanted.get("longest_edge") or 224)


def _tensors(batch: Any) -> dict[str, Any]:
    """The processor's output as plain `{name: tensor}` (lists of ints turned into tensors)."""
    out = {}
    for name, value in dict(batch).items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        elif isinstance(value, list) and value and isinstance(value[0], list):
            value = torch.tensor(value)
        out[name] = value
    return out


# Sizes a feature extractor derives from its config (Whisper: `n_samples = chunk_length * sampling_rate`): a
# fractional `chunk_length` saves them as floats, which the extractor then uses as slice bounds.
COUNT_ATTRIBUTES = ("n_samples", "nb_max_frames", "hop_length", "n_fft")


def whole_counts(extractor: Any) -> Any:
    """`extractor` with the sample and frame counts it computed held as whole numbers (a float count from a
    fractional `chunk_length` would fail as a slice bound), as the model reads them.

    Example:
        >>> from types import SimpleNamespace
        >>> whole_counts(SimpleNamespace(n_samples=8000.0, nb_max_frames=50.0)).n_samples
        8000
    """
    for name in COUNT_ATTRIBUTES:
        value = getattr(extractor, name, None)
        if isinstance(value, float) and value.is_integer():
            setattr(extractor, name, int(value))
        elif isinstance(value, float):
            setattr(extractor, name, int(round(value)))
    return extractor


def _images(model, spec, image_processor) -> list[Image.Image]:
    """The synthetic images (one per batch row) at the size the model's vision config or processor asks for."""
    size = _image_size(model.config, image_processor, spec.image_size)
    # PIL images: every processor reads them (Idefics2's `load_image` refuses arrays), in the one RGB layout
    return [Image.fromarray(synthetic_image(size, spec.seed + i)) for i in range(spec.batch_size)]


def image_processor_pixels(model, pre: Preprocessor, spec) -> dict[str, Any]:
    """The vision inputs the folder's image processor makes of the synthetic images, as the model's forward names
    them (`pixel_values` and what goes with them: `image_sizes`, `image_grid_thw`, `pixel_attention_mask`); what its
    forward does not take (InternVL's `num_patches`) is left out."""
    image_processor = getattr(pre.obj, "image_processor", pre.obj)
    made = _tensors(image_processor(images=_images(model, spec, image_processor), return_tensors="pt"))
    takes = set(inspect.signature(model.forward).parameters)
    return {name: value for name, value in made.items() if name in takes and isinstance(value, torch.Tensor)}


def processor_inputs(model, pre: Preprocessor, spec, family: str) -> dict[str, Any]:
    """Sample inputs made by the folder's own processor from a synthetic image / waveform (and the prompt)."""
    config = model.config
    batch = spec.batch_size
    obj = pre.obj
    if family in ("audio", "speech-seq2seq"):
        extractor = whole_counts(getattr(obj, "feature_extractor", obj))
        rate = int(getattr(extractor, "sampling_rate", 16000))
        waves = [synthetic_waveform(rate, 1.0, spec.seed + i) for i in range(batch)]
        return _tensors(extractor(waves, sampling_rate=rate, return_tensors="pt"))
    image_processor = getattr(obj, "image_processor", obj)
    images = _images(model, spec, image_processor)
    if pre.kind != "processor":
        return _tensors(image_processor(images=images, return_tensors="pt"))
    image_token = getattr(obj, "image_token", None)
    if family in ("vision-language",) and image_token is None:
        raise UnsupportedModelError(
            f"the folder's processor {pre.name} has no `image_token`: cannot place the image in the prompt")
    prompt = spec.prompt or DEFAULT_PROMPT
    kwargs: dict[str, Any] = {"return_tensors": "pt"}
    if family == "vision-language":  # one user turn: the repo's chat template, as the card's snippet builds it
        prompt, specials = image_prompt(obj, prompt)
        if not specials:
            kwargs["add_special_tokens"] = False
    text = [prompt] * batch
    nested = [[image] for image in images] if family == "vision-language" else images
    if family == "dual-encoder":
        kwargs["padding"] = "max_length" if getattr(config, "model_type", "").startswith("siglip") else True
    return _tensors(obj(text=text, images=nested, **kwargs))


# ── Synthesis per vision-language family (no processor in the folder) ─────────────────────────────────────────


def _token_id(config, *names: str) -> int | None:
    for source in (config, getattr(config, "text_config", None)):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int):
                return value
    return None


def _pixels(batch: int, channels: int, size: int, generator: torch.Generator, *lead: int) -> torch.Tensor:
    return torch.randn(batch, *lead, channels, size, size, generator=generator)


# The most tiles (base image included) an any-resolution family is offered; its own `get_image_features` reads the
# ones it wants (LLaVA-NeXT: the base image and one tile at its own size) and the rest are trimmed.
MAX_TILES = 9


def _features_of(model, pixels: dict[str, Any], batch: int) -> tuple[int, int | None]:
    """(image features per image, pixel rows per image the vision tower read) by the model's own
    `get_image_features` on `pixels`; raises what the model raises when it refuses the layout."""
    encoder = multimodal_submodules(model).get("image_encoder")
    read: list[int] = []

    def watch(_module, args, kwargs):
        value = args[0] if args else kwargs.get("pixel_values")
        if isinstance(value, torch.Tensor):
            read.append(int(value.shape[0]))

    takes = set(inspect.signature(model.get_image_features).parameters)
    handle = encoder.register_forward_pre_hook(watch, with_kwargs=True) if encoder is not None else None
    try:
        with torch.no_grad():
            out = model.get_image_features(**{name: value for name, value in pixels.items() if name in takes})
    finally:
        if handle is not None:
            handle.remove()
    features = getattr(out, "pooler_output", None) if not isinstance(out, (torch.Tensor, list, tuple)) else out
    if features is None:
        features = out[0] if isinstance(out, (list, tuple)) else out.last_hidden_state
    parts = [features] if isinstance(features, torch.Tensor) else list(features)
    rows = sum(part.numel() // part.shape[-1] for part in parts)
    return rows // batch, (read[0] // batch if read else None)


def _pixel_layouts(model, batch: int, channels: int, size: int, generator: torch.Generator):
    """Candidate vision inputs in the layouts processors produce, most specific first: tiles with a pixel mask
    (Idefics), tiles with their `image_sizes` (LLaVA-NeXT), one image with its `image_sizes` (Pixtral), one image."""
    takes = set(inspect.signature(model.get_image_features).parameters)
    forward = set(inspect.signature(model.forward).parameters)
    sizes = {"image_sizes": torch.tensor([[size, size]] * batch)} if "image_sizes" in takes else {}
    if "pixel_attention_mask" in forward:
        mask = torch.ones(batch, 1, size, size, dtype=torch.bool)
        yield {"pixel_values": _pixels(batch, channels, size, generator, 1), "pixel_attention_mask": mask}
    if sizes:
        yield {"pixel_values": _pixels(batch, channels, size, generator, MAX_TILES), **sizes}
    yield {"pixel_values": _pixels(batch, channels, size, generator), **sizes}


def counted_vision_inputs(model, spec, batch: int, generator: torch.Generator,
                          given: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """The vision inputs of an image at the vision config's size, in the first layout the model's own
    `get_image_features` accepts, and the number of image tokens it makes of them (its features counted: no
    per-family formula). `given` pixels (the folder's image processor made them) are the one layout tried.
    Raises `UnsupportedModelError` when the model takes none of the layouts."""
    config = model.config
    vision = config.vision_config
    size = _image_size(config, None, spec.image_size)
    channels = int(getattr(vision, "num_channels", None) or getattr(vision, "in_channels", 3))
    if not callable(getattr(model, "get_image_features", None)):
        raise UnsupportedModelError(f"{type(model).__name__} has no get_image_features: the image tokens it expects "
                                    "cannot be counted")
    refused = []
    layouts = [given] if given is not None else _pixel_layouts(model, batch, channels, size, generator)
    for pixels in layouts:
        try:
            count, read = _features_of(model, pixels, batch)
        except Exception as err:  # the model refuses this layout: try the next, and say why if none fits
            refused.append(f"{tuple(pixels['pixel_values'].shape)}: {describe_error(err, 160)}")
            continue
        values = pixels["pixel_values"]
        if values.dim() == 5 and read and read < values.shape[1]:  # the tiles the model read, no more
            pixels["pixel_values"] = values[:, :read].contiguous()
        if count > 0:
            return pixels, count
    raise UnsupportedModelError(f"{type(model).__name__}.get_image_features takes none of the synthesized image "
                                f"layouts ({'; '.join(refused) or 'no image features'})")


def synthesize_vlm(model, spec, text_ids: torch.Tensor, generator: torch.Generator,
                   pixels: dict[str, Any] | None = None, row_tokens: tuple[int, int] | None = None) -> dict[str, Any]:
    """Image + prompt inputs for a vision-language model without a processor, in its processor's layout; with
    `pixels` (from the folder's image processor, [`image_processor_pixels`]), around those pixels.

    `text_ids` (batch x prompt) is the prompt; image tokens are laid out before it. The rule: the image token from
    the config (`image_token_id` / `image_token_index`), an image at the vision config's size in the layout the
    model's own `get_image_features` accepts, as many image tokens as it returns features
    ([`counted_vision_inputs`]), wrapped in the config's begin/end-of-image tokens. Qwen2-VL's flattened patches
    (`image_grid_thw`, counted the same way) and PaliGemma's and Gemma 3's token types keep their own layouts.
    A Pixtral tower's image tokens (Mistral 3) are laid out in its processor's rows where the tokenizer has its
    `row_tokens` (`[IMG_BREAK]`, `[IMG_END]` ids: `exporters.upstream.fixed_image.pixtral_rows`), else in one run.
    """
    config = model.config
    model_type = getattr(config, "model_type", "")
    vision = config.vision_config
    batch = text_ids.shape[0]
    image_token = _token_id(config, "image_token_id", "image_token_index")
    if image_token is None:
        raise UnsupportedModelError(f"{type(config).__name__} names no image token (image_token_id): cannot lay out "
                                    "an image in the prompt; add the model's processor to the folder")

    def tokens(*parts: list[int]) -> torch.Tensor:
        prefix = torch.tensor([sum(parts, [])] * batch)
        return torch.cat([prefix, text_ids], dim=1)

    channels = int(getattr(vision, "num_channels", None) or getattr(vision, "in_channels", 3))
    if "image_grid_thw" in inspect.signature(model.forward).parameters and hasattr(vision, "temporal_patch_size"):
        patch, temporal, merge = vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size
        side = 2 * merge  # the smallest grid the merger accepts, twice over
        grid = torch.tensor([[1, side, side]] * batch)
        patches = torch.randn(batch * side * side, channels * temporal * patch * patch, generator=generator)
        if pixels is not None:  # the folder's image processor's patches and grid
            patches, grid = pixels["pixel_values"], pixels["image_grid_thw"]
        made = "the image processor's" if pixels is not None else "the synthesized"
        try:
            count, _ = _features_of(model, {"pixel_values": patches, "image_grid_thw": grid}, batch)
        except Exception as err:  # the model refuses the patch layout: say so, with the files that would serve it
            raise UnsupportedModelError(
                f"{type(model).__name__}.get_image_features refuses {made} patches {tuple(patches.shape)} "
                f"with image_grid_thw {grid[0].tolist()} ({describe_error(err, 200)}): save the model's processor "
                "into the folder (processor.save_pretrained(folder))") from err
        ids = tokens([config.vision_start_token_id], [image_token] * count, [config.vision_end_token_id])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "mm_token_type_ids": (ids == image_token).long(), "pixel_values": patches, "image_grid_thw": grid}
    try:
        pixels, count = counted_vision_inputs(model, spec, batch, generator, pixels)
    except UnsupportedModelError as err:
        if pixels is not None:
            raise UnsupportedModelError(f"the pixels of the folder's image processor do not fit the model: {err}. "
                                        "Save a processor that loads here into the folder") from err
        raise UnsupportedModelError(
            f"no processor in the model folder ({PROCESSOR_FILE} with its tokenizer, or {PREPROCESSOR_FILE}) and no "
            f"input synthesis for model_type '{model_type}': {err}. Save the model's processor into the folder "
            "(processor.save_pretrained(folder)) so sample inputs come in the family's own layout") from err
    if model_type == "paligemma":
        ids = tokens([image_token] * count, [_token_id(config, "bos_token_id") or 2])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                **pixels}
    begin, end = _token_id(config, "boi_token_index", "boi_token_id"), _token_id(config, "eoi_token_index",
                                                                                  "eoi_token_id")
    bos = [_token_id(config, "bos_token_id") or 2] if model_type == "gemma3" else []
    image = [image_token] * count
    if row_tokens is not None and getattr(vision, "model_type", None) == "pixtral":  # the processor's rows
        rows, cols = pixtral_grid(config, list(pixels["pixel_values"].shape[-2:]))
        image = pixtral_rows(image_token, rows, cols, *row_tokens) if rows * cols == count else image
    ids = tokens(bos, [begin] if begin is not None else [], image, [end] if end is not None else [])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **pixels}
    if model_type == "gemma3":
        inputs["token_type_ids"] = (ids == image_token).long()
    return inputs

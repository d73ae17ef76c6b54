"""ONNX Runtime GenAI's layout: a merged decoder graph with `genai_config.json` beside it, `og.Model(folder)`; for a
Whisper, GenAI's encoder and decoder graphs derived from the export's, with theirs; for a Qwen2.5-VL, Qwen2-VL or
Qwen3-VL, or a Mistral 3, GenAI's vision, embedding and decoder graphs traced beside the export's components, with
theirs and its processor config.

| module             | what it holds                                                                              |
|--------------------|--------------------------------------------------------------------------------------------|
| `__init__`         | [`Genai`]: when it applies (an ONNX generation target of one merged decoder, or a Whisper's  |
|                    | encoder and merged decoder in GenAI's 30 s window), its card snippets                        |
| `config.py`        | `genai_config.json`: the fields GenAI's own model builder writes                            |
| `buffer.py`        | a `GroupQueryAttention` graph rewritten to share GenAI's past/present buffer                 |
| `unpadded.py`      | a fused batch-1 graph rewritten for GenAI's unpadded calls (`"unpadded": true`)             |
| `files.py`         | the files it writes beside the graphs (the buffer rewrite, Whisper's graphs, the config)    |
| `proof.py`         | GenAI's greedy generation from the folder alone, token for token against eager             |
| `whisper.py`       | Whisper: `genai_encoder.onnx` (with the cross-attention cache) and `genai_decoder.onnx`      |
| `whisper_proof.py` | GenAI transcribing the sample's spectrogram from the folder alone, against eager           |
| `qwen_vl.py`       | Qwen2.5-VL, Qwen2-VL, Qwen3-VL: GenAI's vision, embedding and decoder graphs beside them |
| `qwen_vl_proof.py` | GenAI generating from the sample's image and prompt from the folder alone, against eager    |
| `mistral3.py`      | Mistral 3 (Pixtral tower): GenAI's vision, embedding and decoder graphs traced beside them |
| `mistral3_proof.py`| GenAI generating from the sample's image and prompt from the folder alone, against eager   |
| `phi4mm.py`        | Phi-4-multimodal: GenAI's `phi4mm` graphs and hard-coded ids and crops; why none is written |

Example:
    >>> Genai().runtime, Genai().executes
    ('ONNX Runtime GenAI', ('genai_config.json',))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.capture.image_attention import bidirectional_prefill
from exporters.layouts.base import Layout, components_in, latent_cache, may_feed, not_fed, read_json
from exporters.layouts.genai.config import GENAI_CONFIG
from exporters.layouts.genai.phi4mm import MODEL_TYPE as PHI4_MULTIMODAL, phi4mm_declined
from exporters.layouts.card import EXAMPLE_IDS, NO_TOKENIZER, PROMPT_LINE, download, file_names, has_tokenizer

MERGED = "model"  # the one component of a merged decoder export (exporters.capture.merged.MERGED)
ENCODER = "encoder"  # an encoder-decoder export's encoder (optimum's encoder_model.onnx)
# GenAI's Whisper model takes 30-second windows only: `int num_frames_{3000}` and ValidateWhisperAudioFeaturesShape
# ("Whisper uses num_frames = 3000", src/models/whisper.h, 0.18), its encoder output allocated [batch, 1500, hidden]
GENAI_WHISPER_FRAMES = 3000
EMBED_TOKENS = "embed_tokens"  # a vision-language export's (exporters.capture.components.VLM_TEXT_STAGES)
TJS_DECODER = "decoder_model_merged"  # transformers.js's layout's (exporters.capture.image_text.DECODER)
# GenAI 0.18's vision-language and multimodal model types (src/models/model_type.h: IsVLM, IsMMM; the 0.18 library's
# own strings): each runs from its builder's vision, embedding and text graphs and its processor config
GENAI_VLM_TYPES = ("fara", "gemma3", "gemma4", "mistral3", "phi3v", "phi4mm", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe",
                   "qwen3_vl", "videochat_flash_qwen")
WHISPER_ENCODER_FILE = "genai_encoder.onnx"  # whisper.GENAI_ENCODER: what tells a Whisper folder's card apart
AUDIO_PROCESSOR_FILE = "audio_processor_config.json"  # whisper.AUDIO_PROCESSOR: GenAI's processor can run
# the vision-language model types whose GenAI graphs this product writes (qwen_vl.QWEN_VL_TYPES and
# mistral3.MODEL_TYPE, which load torch) and the files that tell such a folder's card apart (qwen_vl.VISION; a Mistral
# 3's processor config, mistral3.PROCESSOR: its prompt's image marker is `[IMG]`)
WRITTEN_VLM_TYPES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "mistral3")  # Qwen2-VL written as GenAI's `qwen2_5_vl`
VISION_FILE = "genai_vision.onnx"
PIXTRAL_PROCESSOR_FILE = "pixtral_processor_config.json"
NOT_TRACED = ("GenAI's vision-language graphs were not written beside this export's components (the export's notes say "
              "why)")
# a vision-language folder in transformers.js's layout (`exporters.capture.image_text`'s merged decoder on embeddings)
TRANSFORMERS_JS_FOLDER = ("this folder is in transformers.js's layout (`layout: \"transformers.js\"`: its vision_encoder, "
                          "embed_tokens and decoder_model_merged); GenAI's vision-language graphs are written beside "
                          "a target's own components, in a target without that layout")
NOT_DERIVED = ("GenAI's Whisper graphs could not be derived from this export's encoder and merged decoder (the "
               "export's notes say why)")

# A folder with the repo's chat template (transformers 5 saves it as chat_template.jinja; GenAI's tokenizer reads it
# there): the card's prompt is one user turn in it with the generation prompt, rendered by GenAI's own tokenizer (its
# `apply_chat_template`, which raises on a folder without one: the lines are written only where the file is)
CHAT_TEMPLATE_FILES = ("chat_template.jinja",)
CHAT_PROMPT = ("# the repo's chat template: one user turn, with the generation prompt\n"
               'turn = [{"role": "user", "content": prompt}]\n'
               "prompt = tokenizer.apply_chat_template(json.dumps(turn), add_generation_prompt=True)\n")
# The card's Whisper snippet after the download lines, where the folder has no tokenizer (or GenAI's processor cannot
# make its features): the folder's feature extractor on your audio (here one second of a 440 Hz tone, padded to the
# 30 s window), fed to GenAI as features with generate()'s decoder prompt read from generation_config.json
WHISPER_SNIPPET = """import numpy as np
import onnxruntime_genai as og
from transformers import AutoFeatureExtractor, GenerationConfig

extractor = AutoFeatureExtractor.from_pretrained(folder)
seconds = np.arange(extractor.sampling_rate) / extractor.sampling_rate
audio = 0.5 * np.sin(2 * np.pi * 440 * seconds)  # your audio, at extractor.sampling_rate
features = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="np").input_features
generation = GenerationConfig.from_pretrained(folder)
prompt = [generation.decoder_start_token_id]
if getattr(generation, "is_multilingual", False):
    prompt += [generation.lang_to_id["<|en|>"], generation.task_to_id["transcribe"]]  # your language and task
if getattr(generation, "no_timestamps_token_id", None) is not None:
    prompt.append(generation.no_timestamps_token_id)

model = og.Model(folder)
inputs = og.NamedTensors()
inputs["audio_features"] = features.astype(np.float32)
inputs["input_ids"] = np.array([prompt], dtype=np.int32)
params = og.GeneratorParams(model)
params.set_search_options(max_length=32)
generator = og.Generator(model, params)
generator.set_inputs(inputs)
while not generator.is_done():
    generator.generate_next_token()
print(generator.get_sequence(0).tolist())"""

# The end of the card's GenAI snippets whose inputs GenAI's own processor made: generate from them, decode the reply
PROCESSED_GENERATION = """params = og.GeneratorParams(model)
params.set_search_options(max_length=64)
generator = og.Generator(model, params)
generator.set_inputs(inputs)
while not generator.is_done():
    generator.generate_next_token()
print(processor.decode(generator.get_sequence(0)))"""

# The card's Whisper snippet where the folder has a tokenizer and GenAI's audio processor config: GenAI's own
# processor decodes your audio file into features and tokenizes the decoder prompt (GenAI's Whisper example)
WHISPER_PROCESSOR_SNIPPET = """import json
import os
import onnxruntime_genai as og

model = og.Model(folder)
processor = model.create_multimodal_processor()
audios = og.Audios.open("audio.wav")  # your audio
with open(os.path.join(folder, "generation_config.json")) as handle:
    multilingual = json.load(handle).get("is_multilingual", False)
prompt = "<|startoftranscript|>" + ("<|en|><|transcribe|>" if multilingual else "") + "<|notimestamps|>"  # your language and task
inputs = processor(prompt, audios=audios)
""" + PROCESSED_GENERATION


# The card's Qwen2.5-VL snippet after the download lines: GenAI's own processor on your image (resized to the traced
# size) and a prompt whose vision markers it expands to the image's tokens
QWEN_VL_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"  # a Mistral 3's prompt marks its image with `[IMG]`
VISION_SNIPPET = """import onnxruntime_genai as og

model = og.Model(folder)
processor = model.create_multimodal_processor()
images = og.Images.open("image.jpg")  # your image
prompt = "<|vision_start|><|image_pad|><|vision_end|>describe the image"  # your prompt
inputs = processor(prompt, images=images)
""" + PROCESSED_GENERATION


def encoder_decoder_declined(config: dict[str, Any]) -> str | None:
    """Why GenAI cannot take an encoder-decoder ONNX folder (its `config.json`, read as data), None for a Whisper
    GenAI runs (its two graphs are then derived: `whisper.py`).

    Example:
        >>> encoder_decoder_declined({"model_type": "t5"}).startswith("GenAI has no encoder-decoder text model")
        True
        >>> encoder_decoder_declined({"model_type": "whisper", "max_source_positions": 1500}) is None
        True
    """
    if config.get("model_type") != "whisper":
        return (f"GenAI has no encoder-decoder text model type (model type {config.get('model_type')!r}): it runs "
                "decoder-only language models, vision-language models and Whisper")
    positions = config.get("max_source_positions")
    frames = 2 * positions if isinstance(positions, int) else None
    if frames != GENAI_WHISPER_FRAMES:
        return (f"GenAI's Whisper model runs 30-second windows only ({GENAI_WHISPER_FRAMES} mel frames, "
                f"max_source_positions 1500: \"Whisper uses num_frames = {GENAI_WHISPER_FRAMES}\"); this model's "
                f"encoder takes {frames} frames (max_source_positions {positions!r})")
    return None


def vision_language_declined(config: dict[str, Any]) -> str | None:
    """Why GenAI does not run a vision- or audio-language ONNX folder of this product (its `config.json`, read as
    data), None for a model type whose GenAI graphs are written (`WRITTEN_VLM_TYPES`: `qwen_vl.py`, `mistral3.py`).

    Example:
        >>> vision_language_declined({"model_type": "llava"}).startswith("GenAI 0.18 has no vision-language model type")
        True
        >>> vision_language_declined({"model_type": "gemma3"})[:48]
        'its prefill attends bidirectionally among one im'
        >>> vision_language_declined({"model_type": "voxtral", "audio_config": {"d_model": 16}})[:43]
        'GenAI 0.18 has no audio-language model type'
        >>> vision_language_declined({"model_type": "qwen2_5_vl", "vision_config": {}}) is None
        True
    """
    model_type = config.get("model_type")
    # an audio encoder's config: `audio_config`, or Granite Speech's `encoder_config` beside its `text_config`
    hears = bool(config.get("audio_config")) or bool(config.get("encoder_config") and config.get("text_config"))
    audio = hears and not config.get("vision_config")
    kind, encoder = ("audio-language", "an audio") if audio else ("vision-language", "a vision")
    if model_type in GENAI_VLM_TYPES and (fact := bidirectional_prefill(config)):
        return (f"{fact}, where GenAI 0.18 runs its {model_type!r} text model causally over the whole prompt (its "
                "builder's attention is GroupQueryAttention or a 4D causal mask; no token_type_ids input is named "
                "anywhere in the library): its own model would generate other tokens than transformers, and a text "
                "graph that marks the image's rows (as this product's ExecuTorch program does) is not written yet")
    if model_type in GENAI_VLM_TYPES and model_type not in WRITTEN_VLM_TYPES:
        return (f"GenAI runs {model_type!r} as a {kind} model from its own builder's graphs ({encoder}, an "
                "embedding and a text model) and processor config, a layout this product does not write yet")
    if model_type in WRITTEN_VLM_TYPES:
        return None
    if model_type == PHI4_MULTIMODAL:  # GenAI's `phi4mm`: its own builder's graphs, hard-coded ids and crops
        return phi4mm_declined(config)
    return (f"GenAI 0.18 has no {kind} model type {model_type!r}: it runs {', '.join(GENAI_VLM_TYPES)} "
            "(src/models/model_type.h)")


class Genai(Layout):
    """ONNX Runtime GenAI generating from a merged decoder ONNX folder."""

    runtime = "ONNX Runtime GenAI"
    install = "pip install onnxruntime-genai (the image and `make venv` install the pinned version)"
    # the config GenAI executes from (it names libraries and session entries to load): the proof applies only where
    # this run's export wrote it (`folder_trust.may_read`), never where a model folder's copy or a planted one lies
    executes = (GENAI_CONFIG,)

    def may_apply(self, target: Any, components: list[str]) -> bool:
        # an encoder-decoder folder gets Whisper's graphs or is declined with the reason (`declines`), a
        # vision-language one is declined with the reason
        return target.export_format == "onnx" and target.mode == "generation" \
            and (list(components) == [MERGED] or ENCODER in components or EMBED_TOKENS in components)

    def may_decline(self, target: Any, components: list[str]) -> bool:
        return self.may_apply(target, components) or may_feed(target, components)

    def applies(self, target: Any, directory: Path) -> bool:
        # no genai_config.json: the export said why (a graph input GenAI does not feed)
        return (directory / GENAI_CONFIG).is_file() and self.may_apply(target, components_in(directory))

    def declines(self, target: Any, directory: Path) -> str | None:
        if EMBED_TOKENS in components_in(directory):
            why = vision_language_declined(read_json(directory / "config.json"))
            if not why and TJS_DECODER in components_in(directory):
                return TRANSFORMERS_JS_FOLDER
            return why if why or (directory / GENAI_CONFIG).is_file() else NOT_TRACED
        if ENCODER in components_in(directory):
            why = encoder_decoder_declined(read_json(directory / "config.json"))
            return why if why or (directory / GENAI_CONFIG).is_file() else NOT_DERIVED
        # one merged graph fed ids, mask, positions and past; GenAI's KV cache is one key and one value per head
        return not_fed(directory) or latent_cache(directory)

    def reference(self, model: Any, context: Any) -> Any:
        config = model.config
        if getattr(config, "model_type", None) in WRITTEN_VLM_TYPES and getattr(config, "vision_config", None) \
                and not vision_language_declined(config.to_dict()):
            proof = "mistral3_proof" if config.model_type == "mistral3" else "qwen_vl_proof"
            return self.part(proof).reference(model, context)
        if any(getattr(config, name, None) is not None for name in ("vision_config", "audio_config")) or \
                getattr(config, "encoder_config", None) is not None and getattr(config, "text_config", None) is not None:
            return None  # a vision- or audio-language export: declined (`vision_language_declined`), no proof runs
        if getattr(config, "is_encoder_decoder", False):  # Whisper's proof, else declined: no proof runs
            if encoder_decoder_declined(config.to_dict()):
                return None
            return self.part("whisper_proof").reference(model, context)
        return super().reference(model, context)

    def prove(self, directory: Path, reference: Any, context: Any) -> Any:
        if isinstance(reference, dict) and "qwen_vl" in reference:  # a Qwen-VL's (qwen_vl_proof.reference)
            return self.part("qwen_vl_proof").prove(self, directory, reference, context)
        if isinstance(reference, dict) and "mistral3" in reference:  # Mistral 3's (mistral3_proof.reference)
            return self.part("mistral3_proof").prove(self, directory, reference, context)
        if isinstance(reference, dict):  # Whisper's (whisper_proof.reference)
            return self.part("whisper_proof").prove(self, directory, reference, context)
        return super().prove(directory, reference, context)

    def write_files(self, directory: Path, target: Any, model: Any, notes: list[str]) -> None:
        components = components_in(directory)
        if ENCODER in components:  # Whisper: GenAI's two graphs derived from the export's, where GenAI runs it
            runs = not encoder_decoder_declined(read_json(directory / "config.json"))
            if runs and self.may_apply(target, components):
                self.part("files").write_whisper_files(directory, model, notes)
            return
        if EMBED_TOKENS in components:  # a vision-language model: GenAI's graphs where it runs the type
            if self.may_apply(target, components) and TJS_DECODER not in components and \
                    not vision_language_declined(config := read_json(directory / "config.json")):
                if config.get("model_type") == "mistral3":
                    self.part("mistral3").write_mistral3_files(directory, target, model, notes)
                else:
                    self.part("qwen_vl").write_qwen_vl_files(directory, target, model, notes)
            return
        if self.declines(target, directory):  # no genai_config.json: the "runs in" column says why
            return
        if getattr(target, "merged", False) and self.may_apply(target, components_in(directory)):
            self.part("files").write_files(directory, model, notes, getattr(target, "unpadded", False))

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str] | None:
        if any(name.rsplit("/", 1)[-1] == WHISPER_ENCODER_FILE for name in file_names(target)):
            processor = {"tokenizer.json", AUDIO_PROCESSOR_FILE} <= {name.rsplit("/", 1)[-1]
                                                                     for name in file_names(target)}
            return "python", download(repo_id, target, revision, "genai_config.json may name a library to load") \
                + (WHISPER_PROCESSOR_SNIPPET if processor else WHISPER_SNIPPET)
        if any(name.rsplit("/", 1)[-1] == VISION_FILE for name in file_names(target)):
            if "tokenizer.json" not in file_names(target):  # GenAI's processor tokenizes the prompt: no snippet
                return None
            pixtral = any(name.rsplit("/", 1)[-1] == PIXTRAL_PROCESSOR_FILE for name in file_names(target))
            return "python", download(repo_id, target, revision, "genai_config.json may name a library to load") \
                + (VISION_SNIPPET.replace(QWEN_VL_MARKER, "[IMG]") if pixtral else VISION_SNIPPET)
        if has_tokenizer(target):
            chat = CHAT_PROMPT if file_names(target) & set(CHAT_TEMPLATE_FILES) else ""
            prepare, prompt, shown = (f"tokenizer = og.Tokenizer(model)\n{PROMPT_LINE}\n{chat}",
                                      "tokenizer.encode(prompt)", "tokenizer.decode(generator.get_sequence(0))")
        else:  # GenAI's tokenizer reads the folder's tokenizer files: without them, token ids in and out
            prepare = f"prompt = np.array({EXAMPLE_IDS}, dtype=np.int32)  {NO_TOKENIZER}\n"
            prompt, shown = "prompt", "generator.get_sequence(0)"
        return "python", (
            download(repo_id, target, revision, "genai_config.json may name a library to load")
            + ("import json\n\n" if "json.dumps" in prepare else "")
            + "import numpy as np\nimport onnxruntime_genai as og\n\n"
            "model = og.Model(folder)\n"
            + prepare + "params = og.GeneratorParams(model)\n"
            "params.set_search_options(max_length=64)\n"
            "generator = og.Generator(model, params)\n"
            f"generator.append_tokens({prompt})\n"
            "while not generator.is_done():\n"
            "    generator.generate_next_token()\n"
            f"print({shown})")

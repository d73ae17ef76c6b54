"""ONNX Runtime GenAI's layout: a merged decoder graph with `genai_config.json` beside it, `og.Model(folder)`.

| module      | what it holds                                                                                    |
|-------------|--------------------------------------------------------------------------------------------------|
| `__init__`  | [`Genai`]: when it applies (an ONNX generation target of one merged decoder), its card snippet    |
| `config.py` | `genai_config.json`: the fields GenAI's own model builder writes                                  |
| `buffer.py` | a `GroupQueryAttention` graph rewritten to share GenAI's past/present buffer                       |
| `files.py`  | the files it writes beside the graph (the buffer rewrite, then `genai_config.json`)               |
| `proof.py`  | GenAI's greedy generation from the folder alone, token for token against eager                   |

Example:
    >>> Genai().runtime, Genai().executes
    ('ONNX Runtime GenAI', ('genai_config.json',))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.layouts.base import Layout, components_in, latent_cache, read_json
from exporters.layouts.genai.config import GENAI_CONFIG
from exporters.layouts.card import EXAMPLE_IDS, NO_TOKENIZER, PROMPT_LINE, download, has_tokenizer

MERGED = "model"  # the one component of a merged decoder export (exporters.capture.merged.MERGED)
ENCODER = "encoder"  # an encoder-decoder export's encoder (optimum's encoder_model.onnx)
# What GenAI's Whisper model (src/models/whisper.cpp, 0.18) feeds, against optimum's merged decoder
WHISPER_DECLINED = (
    "GenAI's Whisper model runs an encoder graph fed `audio_features` and a decoder fed `input_ids`, its self-attention "
    "past and either the encoder's per-layer cross-attention keys and values (outputs of GenAI's encoder graph) or "
    "`encoder_hidden_states`; this folder is optimum's (encoder_model.onnx outputs `last_hidden_state`, "
    "decoder_model_merged.onnx also takes `past_key_values.N.encoder.key/value` and `use_cache_branch`), which GenAI "
    "does not feed: GenAI's own builder writes its Whisper graphs")


def encoder_decoder_declined(config: dict[str, Any]) -> str:
    """Why GenAI cannot take an encoder-decoder ONNX folder (its `config.json`, read as data).

    Example:
        >>> encoder_decoder_declined({"model_type": "t5"}).startswith("GenAI has no encoder-decoder text model")
        True
    """
    if config.get("model_type") == "whisper":
        return WHISPER_DECLINED
    return (f"GenAI has no encoder-decoder text model type (model type {config.get('model_type')!r}): it runs "
            "decoder-only language models, vision-language models and Whisper")


class Genai(Layout):
    """ONNX Runtime GenAI generating from a merged decoder ONNX folder."""

    runtime = "ONNX Runtime GenAI"
    install = "pip install onnxruntime-genai (the image and `make venv` install the pinned version)"
    # the config GenAI executes from (it names libraries and session entries to load): the proof applies only where
    # this run's export wrote it (`folder_trust.may_read`), never where a model folder's copy or a planted one lies
    executes = (GENAI_CONFIG,)

    def may_apply(self, target: Any, components: list[str]) -> bool:
        # an encoder-decoder folder only to be declined with the reason (`declines`): nothing is written for it
        return target.export_format == "onnx" and target.mode == "generation" \
            and (list(components) == [MERGED] or ENCODER in components)

    def applies(self, target: Any, directory: Path) -> bool:
        # no genai_config.json: the export said why (a graph input GenAI does not feed)
        return (directory / GENAI_CONFIG).is_file() and self.may_apply(target, components_in(directory))

    def declines(self, target: Any, directory: Path) -> str | None:
        if ENCODER in components_in(directory):
            return encoder_decoder_declined(read_json(directory / "config.json"))
        return latent_cache(directory)  # GenAI's KV cache is one key and one value per head and layer

    def reference(self, model: Any, context: Any) -> Any:
        if getattr(model.config, "is_encoder_decoder", False):  # declined (`declines`): no proof runs
            return None
        return super().reference(model, context)

    def write_files(self, directory: Path, target: Any, model: Any, notes: list[str]) -> None:
        if self.declines(target, directory):  # no genai_config.json: the "runs in" column says why
            return
        if getattr(target, "merged", False) and self.may_apply(target, components_in(directory)):
            self.part("files").write_files(directory, model, notes)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        if has_tokenizer(target):
            prepare, prompt, shown = (f"tokenizer = og.Tokenizer(model)\n{PROMPT_LINE}\n", "tokenizer.encode(prompt)",
                                      "tokenizer.decode(generator.get_sequence(0))")
        else:  # GenAI's tokenizer reads the folder's tokenizer files: without them, token ids in and out
            prepare = f"prompt = np.array({EXAMPLE_IDS}, dtype=np.int32)  {NO_TOKENIZER}\n"
            prompt, shown = "prompt", "generator.get_sequence(0)"
        return "python", (
            download(repo_id, target, revision, "genai_config.json may name a library to load")
            + "import numpy as np\nimport onnxruntime_genai as og\n\n"
            "model = og.Model(folder)\n"
            + prepare + "params = og.GeneratorParams(model)\n"
            "params.set_search_options(max_length=64)\n"
            "generator = og.Generator(model, params)\n"
            f"generator.append_tokens({prompt})\n"
            "while not generator.is_done():\n"
            "    generator.generate_next_token()\n"
            f"print({shown})")

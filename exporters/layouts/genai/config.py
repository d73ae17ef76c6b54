"""`genai_config.json` beside a merged decoder graph: what ONNX Runtime GenAI (`og.Model(folder)`) reads to run it.

The fields are those GenAI's own model builder writes (`onnxruntime_genai/models/builders/base.py::make_genai_config`,
parsed by `src/config.h`); the graph names are `exporters.export.onnx_names`' (also GenAI's defaults). Our plain
graph takes a past as long as what it holds and returns past + new keys, so `past_present_share_buffer` is false. A
graph fused into `GroupQueryAttention` (`ort_fusions` with the batch fixed at 1) whose past length was rewritten to
come from the attention mask (`exporters.layouts.genai.buffer`) shares one buffer (`share_buffer`), as the model
builder's graph does; without that rewrite upstream's fused graph reads the length off the past's shape, which a
shared buffer makes `max_length` (GenAI then fails in the graph: `GatherND ... invalid index found`). GenAI pads a
batch on the right with `pad_token_id` and derives the attention mask and positions from it: the pad id is the
model's own (else its first eos id).

Example:
    >>> from transformers import GenerationConfig, LlamaConfig
    >>> config = LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    ...                      num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, pad_token_id=3)
    >>> genai = genai_config(config, GenerationConfig(eos_token_id=2, pad_token_id=3))
    >>> genai["model"]["type"], genai["model"]["decoder"]["head_size"], genai["search"]["past_present_share_buffer"]
    ('llama', 8, False)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporters import fsutil
from exporters.capture.token_ids import special_token_ids

GENAI_CONFIG = "genai_config.json"
# GenAI's decoder-only model types (src/models/model_type.h: IsLLM); any other decoder-only model runs as "decoder".
# Not "gpt2": GenAI runs that type as its legacy GPT model (src/models/gpt_common.h), whose past is one combined
# `past_%d` tensor per layer; the merged graph's separate keys and values are read as "decoder" (measured: "gpt2" fails
# with "Model input was not found", "decoder" generates).
GENAI_TYPES = frozenset({"chatglm", "decoder", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gptoss",
                         "granite", "internlm2", "llama", "mistral", "nemotron", "olmo", "phi", "phi3", "phi3small",
                         "phimoe", "qwen2", "qwen3", "smollm3"})


def genai_config(config: Any, generation_config: Any, filename: str = "model.onnx",
                 context_length: int | None = None, share_buffer: bool = False) -> dict[str, Any]:
    """The `genai_config.json` content for a merged decoder graph `filename` of the model `config`; `share_buffer`:
    the graph can run on one past/present buffer (see the module)."""
    text = getattr(config, "text_config", None) or config
    heads = int(text.num_attention_heads)
    head_size = getattr(text, "head_dim", None) or text.hidden_size // heads
    gen = generation_config
    special = special_token_ids(gen, config)
    context = context_length or getattr(text, "max_position_embeddings", None) or 2048
    model_type = getattr(text, "model_type", "")
    search_value = lambda name, default: default if getattr(gen, name, None) is None else getattr(gen, name)  # noqa: E731
    content = {
        "model": {
            "bos_token_id": special.bos,
            "context_length": int(context),
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": int(head_size),
                "hidden_size": int(text.hidden_size),
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": heads,
                "num_hidden_layers": int(text.num_hidden_layers),
                "num_key_value_heads": int(getattr(text, "num_key_value_heads", None) or heads),
            },
            "eos_token_id": special.eos[0] if len(special.eos) == 1 else (special.eos or None),
            "pad_token_id": special.pad,
            "type": model_type if model_type in GENAI_TYPES else "decoder",
            "vocab_size": int(text.vocab_size),
        },
        "search": {
            "diversity_penalty": float(search_value("diversity_penalty", 0.0)),
            "do_sample": bool(search_value("do_sample", False)),
            "early_stopping": bool(search_value("early_stopping", True)),
            "length_penalty": float(search_value("length_penalty", 1.0)),
            "max_length": int(context),
            "min_length": 0,
            "no_repeat_ngram_size": int(search_value("no_repeat_ngram_size", 0)),
            "num_beams": int(search_value("num_beams", 1)),
            "num_return_sequences": int(search_value("num_return_sequences", 1)),
            "past_present_share_buffer": share_buffer,  # see the module
            "repetition_penalty": float(search_value("repetition_penalty", 1.0)),
            "temperature": float(search_value("temperature", 1.0)),
            "top_k": int(search_value("top_k", 50)),
            "top_p": float(search_value("top_p", 1.0)),
        },
    }
    # GenAI parses each id as a number and refuses a null: an id the model does not have is left out (GenAI's default)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if content["model"][name] is None:
            del content["model"][name]
    return content


def write_genai_config(directory: Path, config: Any, generation_config: Any, filename: str = "model.onnx",
                       share_buffer: bool = False) -> Path:
    """Write `genai_config.json` into `directory` (see the module); returns its path."""
    path = directory / GENAI_CONFIG
    content = genai_config(config, generation_config, filename, share_buffer=share_buffer)
    fsutil.write_file(path, json.dumps(content, indent=4) + "\n")
    return path

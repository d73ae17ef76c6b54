"""Build the bundled demo model: a tiny random-weight Llama-style LLM with a real tokenizer.

Writes config.json, model.safetensors, generation_config.json and the tokenizer files next to the committed
export_config.json, so `make demo` runs the real loading code without downloading anything.

Usage: python examples/build_demo_model.py examples/demo-model
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporters.quiet import mute_import_chatter

mute_import_chatter()  # the stack's import chatter, muted as in the CLI, the Action and the bot

WORDS = (
    "the a an model export graph token layer weight onnx torch program runtime hub pull request report valid "
    "shape dynamic static cache prefill decode hello world owner recipe artifact run test fast small"
).split()


def build_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    return fast


def build(folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    print(f"demo model written to {folder}")


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "examples/demo-model"))

"""Build the bundled demo model: a tiny random-weight Llama-style LLM with a real tokenizer.

Writes config.json, model.safetensors, generation_config.json and the tokenizer files next to the committed
export_config.json (the plainest recipe: each format in generation mode, the defaults), so `make demo` runs the real
loading code without downloading anything. The tokenizer is a byte-level BPE trained here in milliseconds: the
ExecuTorch LLM runner's C++ tokenizer reads its `tokenizer.json`, so the report shows the runner's proof too.

Usage: python examples/build_demo_model.py examples/demo-model
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporters.quiet import mute_import_chatter

mute_import_chatter()  # the stack's import chatter, muted as in the CLI, the Action and the bot

CORPUS = [
    "the model exports its graph to every runtime",
    "a small program runs on phones and boards",
    "dynamic shapes let the prompt go in one call",
    "the report says what passed and what to fix",
    "hello world export the model",
] * 20
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"


def build_tokenizer(folder: Path):
    """A byte-level BPE (ASCII corpus, ids below 128, `<|begin_of_text|>` 0, `<|end_of_text|>` 1, `<|pad|>` 2) saved
    into `folder`: byte-level because the ExecuTorch runner's C++ tokenizer reads no whitespace pre-tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=128, special_tokens=[BOS, EOS, PAD],
                                                            show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(folder)
    return fast


def build(folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(folder)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, **ids,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # EOS never the argmax: every generation in the report runs its full length
        model.get_output_embeddings().weight[tokenizer.eos_token_id].zero_()
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(folder)
    print(f"demo model written to {folder}")


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "examples/demo-model"))

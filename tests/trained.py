"""A tiny LLM trained in the test session (seconds on a CPU) so that its outputs are not noise: quality budgets
(top-1 agreement, KL, greedy match) judged on it say whether a quantized variant keeps what the model learned, which
a random-weight model cannot (its top-1 margins are hundredths of a logit: any rounding flips them).

The model memorizes a few sentences (`TRAINED_TEXT`), so its greedy continuation of a sentence's start is that
sentence, with margins of several logits.

A tiny LLaVA (`tests.models.tiny_llava_with_processor`, its tokenizer trained on the same sentences) is trained the
same way on the sentences after an image's 16 tokens (`train_llava_once`): the image drawn from a pool of the
synthetic images the product's sample inputs are made of (`exporters.capture.multimodal.synthetic_image`, seeds
0-15), through the model's own processor, so its continuation of `<image>` + `TRAINED_PROMPT` is the sentence whatever
the image (margins of ~5.6 logits on the sample's images), as transformers.js's quantized dtype files need.

Example:
    >>> trained = train_once(tmp_path / "trained")  # doctest: +SKIP
    >>> folder = trained_llama(tmp_path / "model", {"exports": [...]}, trained)  # doctest: +SKIP
    >>> vlm = train_llava_once(tmp_path / "vlm", {"exports": [...]})  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from tests.models import (
    RUNNER_BOS,
    RUNNER_EOS,
    RUNNER_PAD,
    tiny_llava_with_processor,
    train_bpe_tokenizer,
    write_recipe,
)

TRAINED_TEXT = [
    "the quick brown fox jumps over the lazy dog and runs into the woods",
    "a tiny model learns to export itself to many runtimes on small boards",
    "executorch runs programs on phones and small boards with little memory",
    "static caches hold keys and values for every layer of the decoder",
    "dynamic shapes let the prompt go in one call to the runner",
]
TRAINED_PROMPT = "the quick brown fox"
STEPS, WINDOW, BATCH = 150, 24, 8
IMAGE_POOL = 16  # synthetic images (seeds 0-15) the LLaVA sees its sentences after: the sample's are seeds 0 and 1


def _steps(model: Any, optimizer: Any, stream: torch.Tensor, generator: torch.Generator,
           images: torch.Tensor | None = None) -> None:
    """`STEPS` steps on windows of `stream`; with `images` (a pool of pixel values), each window follows one of them
    drawn at random, as the image's tokens, which learn too (each predicts the next: an image token, then the text).
    Validation judged the decoder's logits at every position of the prompt, the image's rows included: trained
    without loss there, their top two logits were 0.07-0.3 apart, so q8's top-1 agreement (83% on a VNNI Xeon, 97%
    on an AVX2-only AMD: the same seed trains other bytes on other CPUs) was a draw on near ties (KL 0.004). The
    budget now judges the text rows alone (`exporters.validate.judged_rows`); the image's rows still learn, as the
    model's own loss over `labels=ids` has them do."""
    for _ in range(STEPS):
        starts = torch.randint(0, stream.numel() - WINDOW - 1, (BATCH,), generator=generator)
        batch = torch.stack([stream[s:s + WINDOW + 1] for s in starts.tolist()])
        ids, extra = batch[:, :-1], {}
        if images is not None:
            lead = model.config.image_seq_length
            ids = torch.cat([torch.full((BATCH, lead), model.config.image_token_index), ids], 1)
            extra = {"pixel_values": images[torch.randint(0, len(images), (BATCH,), generator=generator)]}
        loss = model(input_ids=ids, labels=ids, **extra).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _trained(model: Any, stream: torch.Tensor, images: torch.Tensor | None = None) -> Any:
    """`model` trained on `stream` (one thread, seeded: the same bytes every time), in eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread than on a shared machine's cores
    try:
        _steps(model, optimizer, stream, generator, images)
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _train(folder: Path) -> Path:
    """Train the model once into `folder` (model, tokenizer, generation config; no recipe)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe_tokenizer(folder, TRAINED_TEXT * 20, [RUNNER_BOS, RUNNER_EOS, RUNNER_PAD], vocab_size=200,
                                    bos=RUNNER_BOS, eos=RUNNER_EOS, pad=RUNNER_PAD, byte_level=True)
    stream = torch.tensor(tokenizer(" ".join(TRAINED_TEXT * 40), add_special_tokens=False)["input_ids"])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = _trained(LlamaForCausalLM(config), stream)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    return folder


def train_once(folder: Path) -> Path:
    """The trained model in `folder` (model, tokenizer, generation config; no recipe), trained unless already there."""
    return folder if (folder / "model.safetensors").is_file() else _train(folder)


def trained_llama(folder: Path, recipe: Any, trained: Path) -> Path:
    """A copy of the trained model in `trained` ([`train_once`], the `trained_llm_dir` fixture) in `folder`, with
    `recipe`."""
    shutil.copytree(trained, folder)
    write_recipe(folder, recipe)
    return folder


def train_llava_once(folder: Path, recipe: Any) -> Path:
    """The trained LLaVA in `folder` with `recipe` (see the module), trained unless already there."""
    if (folder / "model.safetensors").is_file():
        write_recipe(folder, recipe)
        return folder
    from exporters.capture.multimodal import synthetic_image
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    tiny_llava_with_processor(folder, recipe, corpus=TRAINED_TEXT * 20, vocab_size=200)
    processor = AutoProcessor.from_pretrained(folder)
    stream = torch.tensor(processor.tokenizer(" ".join(TRAINED_TEXT * 40), add_special_tokens=False)["input_ids"])
    images = [Image.fromarray(synthetic_image(32, seed)) for seed in range(IMAGE_POOL)]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    torch.manual_seed(0)
    _trained(LlavaForConditionalGeneration.from_pretrained(folder), stream, pixels).save_pretrained(folder)
    return folder

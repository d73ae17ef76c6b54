"""Tiny random-weight models built in code and saved with `save_pretrained`, so the real loading code runs.

Hidden sizes 16-64, 1-2 layers: each exports in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from matrix.tokenizer import train_bpe_tokenizer

DYNAMO_ONLY = {"export_format": "dynamo", "mode": "generation", "dynamic": True}


def write_recipe(folder: Path, recipe: Any) -> Path:
    path = folder / "export_config.json"
    path.write_text(json.dumps(recipe, indent=2) + "\n")
    return path


def _saved(model, folder: Path, recipe: Any | None) -> Path:
    """`model` saved (in eval mode) into `folder`, with the recipe when one is given."""
    model.eval().save_pretrained(folder)
    if recipe is not None:
        write_recipe(folder, recipe)
    return folder


def tiny_llama(folder: Path, recipe: Any | None = DYNAMO_ONLY, seed: int = 0, initializer_range: float = 0.02,
               max_position_embeddings: int = 256, tie_word_embeddings: bool = False, layers: int = 2) -> Path:
    """A 2-layer Llama (hidden 32, vocab 128; `layers` other depths) with a WordLevel tokenizer.

    The default initialization gives logits a few hundredths apart; `initializer_range=0.3` spreads them (top-2
    gaps of tenths) while greedy decoding still varies, for checks that must not hinge on near ties.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, bos_token_id=1, eos_token_id=2,
        pad_token_id=3, initializer_range=initializer_range, tie_word_embeddings=tie_word_embeddings,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, recipe)


def tiny_qwen2(folder: Path, recipe: Any | None = None, seed: int = 0, initializer_range: float = 0.02,
               layers: int = 2) -> Path:
    """A 2-layer Qwen2 (hidden 32, vocab 128; `layers` other depths): its forward takes one attention mask per layer
    type (`layer_types`), so `generate()` and a static-cache decode graph pass it a mapping of 4D masks."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        initializer_range=initializer_range, tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, recipe)


def tiny_deepseek_v2(folder: Path, recipe: Any | None = None, seed: int = 0, layers: int = 2) -> Path:
    """A 2-layer DeepSeek-V2 (multi-head latent attention: kv_lora_rank 16; the last layer MoE, 4 routed experts, 1
    shared; `layers=1`: that MoE layer alone)."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    config = DeepseekV2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, head_dim=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=layers - 1, n_shared_experts=1, max_position_embeddings=128, bos_token_id=1,
        eos_token_id=2, pad_token_id=3, initializer_range=0.2,
    )
    model = DeepseekV2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, recipe)


def tiny_gemma2(folder: Path, recipe: Any | None = None, seed: int = 0, sliding_window: int = 6) -> Path:
    """A 2-layer Gemma 2 (hidden 32, vocab 128): a sliding-window layer (window 6, shorter than an 8-token prompt)
    then a full-attention one."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    config = Gemma2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, sliding_window=sliding_window,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, initializer_range=0.3,
    )
    model = Gemma2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return _saved(model, folder, recipe)


# The tiny BERT's dynamo and ONNX run (`--jobs 1`) two modules read (the shared store exports it once, #48): the
# isolation of its export processes (tests/test_isolation.py) and the batch kept dynamic (tests/test_genai.py)
BERT_TWO_TARGETS = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
                    {"name": "onnx", "export_format": "onnx", "dynamic": True}]


def tiny_bert(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A 1-layer BERT encoder (hidden 32)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    return _saved(BertModel(config), folder, recipe)


def tiny_t5(folder: Path, recipe: Any | None = None, seed: int = 0, decoder_layers: int = 1) -> Path:
    """A 1+1-layer T5 (d_model 32; `decoder_layers` encoder and decoder layers: transformers 5.24's `generate` fails
    with an IndexError on a T5 whose encoder and decoder differ in depth, its cache has `num_layers` layers)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=decoder_layers,
                      num_decoder_layers=decoder_layers, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # T5's default init makes greedy decoding repeat one token: parity could not fail
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return _saved(model, folder, recipe)


def tiny_whisper(folder: Path, recipe: Any | None = None, seed: int = 0, decoder_layers: int = 1,
                 feature_extractor: bool = False, source_positions: int = 32) -> Path:
    """A 1+1-layer Whisper (d_model 32, 16 mel bins, `source_positions` source positions, 32 by default; 1500 is a
    real Whisper's 30 s window of 3000 frames, the one ONNX Runtime GenAI runs; `decoder_layers` decoder layers),
    with its feature extractor (`preprocessor_config.json`: twice `source_positions` frames at hop 160 from one
    second of audio, or 30 s at 16 kHz for 1500 positions) when asked."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=decoder_layers, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=source_positions, max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=99,  # a token greedy decoding of this model does not pick early: parity sees 8 steps
        bos_token_id=1, suppress_tokens=None, begin_suppress_tokens=None,
        init_std=1.0,  # the default 0.02 makes greedy decoding repeat one token: parity could not fail
    )
    if feature_extractor:
        from transformers import WhisperFeatureExtractor

        rate, seconds = (16000, 30) if source_positions == 1500 else (source_positions * 320, 1)
        WhisperFeatureExtractor(feature_size=16, sampling_rate=rate, hop_length=160, chunk_length=seconds,
                                n_fft=400).save_pretrained(folder)
    return _saved(WhisperForConditionalGeneration(config), folder, recipe)


# Whisper's ONNX targets in transformers.js's layout and optimum's, and a dynamo one, `dynamic: true`, on
# `tiny_whisper(folder, this, decoder_layers=2, feature_extractor=True)`: tests/test_seq2seq_onnx.py and
# tests/test_speech_onnx_runtimes.py read the ONNX targets, tests/test_complete_components.py the `onnx` and `dynamo`
# ones, of the same run, which the shared store (tests/export_store.py) exports once (#48)
WHISPER_ONNX_TARGET = {"export_format": "onnx", "mode": "generation", "dynamic": True}
WHISPER_ONNX_RECIPE = {"exports": [{"name": "tjs", **WHISPER_ONNX_TARGET, "layout": "transformers.js"},
                                   {"name": "onnx", **WHISPER_ONNX_TARGET},
                                   {"name": "dynamo", **WHISPER_ONNX_TARGET, "export_format": "dynamo"}],
                       "generation": {"max_new_tokens": 8}}


# T5's ONNX targets in optimum's layout (merged, and `merged: false`) and transformers.js's, and a dynamo one,
# `dynamic: true`, on `tiny_t5(folder, this, seed=T5_SEED, decoder_layers=2)`: tests/test_seq2seq_onnx.py reads the
# ONNX targets, tests/test_complete_components.py the `onnx` and `dynamo` ones, of the same run, which the shared
# store (tests/export_store.py) exports once (#48)
T5_RECIPE = {"exports": [{"name": "onnx", **WHISPER_ONNX_TARGET},
                         {"name": "tjs", **WHISPER_ONNX_TARGET, "layout": "transformers.js"},
                         {"name": "onnx-split", **WHISPER_ONNX_TARGET, "merged": False},
                         {"name": "dynamo", **WHISPER_ONNX_TARGET, "export_format": "dynamo"}]}
# The two-layer T5's seed: its greedy tokens vary (at least three distinct of eight) on every prompt its tests decode,
# test_seq2seq_onnx's TEXT_IDS and both rows of TEXT_BATCH and the pipeline's own generation prompt; seed 0 decodes
# one token eight times from the pipeline's prompt (a parity check that could hardly fail), seed 4 twice two tokens
# from TEXT_IDS (benchmarks/RESULTS.md, "Fixture cuts, round 6")
T5_SEED = 6


# openai/whisper-tiny's generation_config.json, as the repo ships it (its 90 suppressed ids cut to the first 20 and
# the last 7; two languages of its 99)
WHISPER_TINY_GENERATION = {
    "alignment_heads": [[2, 2], [3, 0], [3, 2], [3, 3], [3, 4], [3, 5]],
    "begin_suppress_tokens": [220, 50257], "bos_token_id": 50257, "decoder_start_token_id": 50258,
    "eos_token_id": 50257, "forced_decoder_ids": [[1, None], [2, 50359]], "is_multilingual": True,
    "lang_to_id": {"<|en|>": 50259, "<|fr|>": 50265}, "max_initial_timestamp_index": 50, "max_length": 448,
    "no_timestamps_token_id": 50363, "pad_token_id": 50257, "prev_sot_token_id": 50361, "return_timestamps": False,
    "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 50254, 50258,
                        50358, 50359, 50360, 50361, 50362],
    "task_to_id": {"transcribe": 50359, "translate": 50358},
}


def whisper_tiny_shaped(folder: Path, recipe: Any | None = None) -> Path:
    """openai/whisper-tiny's shape at width 64: its full depth (4 encoder + 4 decoder layers), its vocabulary
    (51865, the output projection tied to the token embedding), 80 mel bins, 1500 source and 448 target positions,
    its special ids in config.json, its `generation_config.json` ([`WHISPER_TINY_GENERATION`]), a
    `WhisperFeatureExtractor` of 30 s chunks (3000 frames) and a tokenizer of its shape ([`whisper_tokenizer`])."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.manual_seed(0)
    generation = WHISPER_TINY_GENERATION
    config = WhisperConfig(
        vocab_size=51865, d_model=64, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=50258, pad_token_id=50257,
        bos_token_id=50257, eos_token_id=50257, suppress_tokens=generation["suppress_tokens"],
        begin_suppress_tokens=generation["begin_suppress_tokens"], tie_word_embeddings=True, init_std=0.2)
    folder = _saved(WhisperForConditionalGeneration(config), folder, recipe)
    (folder / "generation_config.json").write_text(json.dumps({**generation, "transformers_version": "4.31.0"},
                                                              indent=2) + "\n")
    WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    whisper_tokenizer(folder)
    return folder


def _byte_characters() -> list[str]:
    """GPT-2's (and Whisper's) byte-level alphabet: the 256 characters its BPE vocabulary spells bytes with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in printable]
    table = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}
    return [table[b] for b in range(256)]


def whisper_tokenizer(folder: Path):
    """A `WhisperTokenizer` shaped like openai/whisper-tiny's (no download): a byte-level BPE vocabulary of 50257
    entries (the 256 byte characters, a few words, numbered fillers), then its special tokens at their ids,
    `<|endoftext|>` 50257, `<|startoftranscript|>` 50258, its 99 languages from 50259 (`<|en|>` 50259, `<|fr|>`
    50265), `<|translate|>` 50358, `<|transcribe|>` 50359, `<|notimestamps|>` 50363, and its 1501 timestamps up to
    51864: 51865 tokens, the model's vocabulary. Saved into `folder` (`tokenizer.json`, `tokenizer_config.json`
    naming `WhisperTokenizer`, `vocab.json`, `merges.txt`)."""
    from transformers import WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    vocab = {character: i for i, character in enumerate(_byte_characters())}
    for word in ("Ġt", "Ġth", "Ġthe", "Ġa", "Ġcat", "Ġhello", "Ġworld"):
        vocab[word] = len(vocab)
    while len(vocab) < 50257:
        vocab[f"Ġfiller{len(vocab)}"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\nĠ t\nĠt h\nĠth e\n")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), unk_token=end,
                                 bos_token=end, eos_token=end, pad_token=end)
    languages = [f"<|{code}|>" for code in LANGUAGES if code != "yue"]  # whisper-tiny's 99 (yue came with v3)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<|startoftranscript|>", *languages, "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
        "<|nocaptions|>", "<|notimestamps|>"]})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    assert len(tokenizer) == 51865 and tokenizer.convert_tokens_to_ids("<|notimestamps|>") == 50363
    tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_llava(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A LLaVA-style model: a 1-layer CLIP vision tower (image 16, patch 8) + a 1-layer Llama."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=16, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       bos_token_id=1, eos_token_id=2, pad_token_id=3)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=127, image_seq_length=4,
                         vision_feature_layer=-1, projector_hidden_act="gelu")
    return _saved(LlavaForConditionalGeneration(config), folder, recipe)


def tiny_marian(folder: Path, recipe: Any | None = None, seed: int = 0,
                suppress_tokens: list[int] | None = None, decoder_layers: int = 1, init_std: float = 0.02) -> Path:
    """A 1+1-layer Marian (d_model 32, vocab 96; `decoder_layers` decoder layers, weights drawn at `init_std`) with
    `MarianConfig`'s other defaults, among them `forced_eos_token_id=0`: eager `generate()` forces EOS at the last
    step. `suppress_tokens` go into its generation config (eager never picks them)."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=decoder_layers, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=95, decoder_start_token_id=95, init_std=init_std,
    )
    model = MarianMTModel(config).eval()
    if suppress_tokens is not None:
        model.generation_config.suppress_tokens = suppress_tokens
    return _saved(model, folder, recipe)


def tiny_bart(folder: Path, recipe: Any | None = None, seed: int = 0, decoder_layers: int = 1) -> Path:
    """A 1-layer-encoder BART (d_model 32, vocab 100; `decoder_layers` decoder layers) with `BartConfig`'s other
    defaults, among them `forced_eos_token_id=2` (eager `generate()` forces EOS at the last step) and learned
    positions offset by 2."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=decoder_layers, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        init_std=0.2,  # the default 0.02 makes greedy decoding repeat one token: parity could not fail
    )
    return _saved(BartForConditionalGeneration(config), folder, recipe)

def tiny_resnet(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A 2-stage ResNet image classifier (widths 8 and 16, images of 32): convolutions take any image size."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3, image_size=32)
    return _saved(ResNetForImageClassification(config), folder, recipe)


def tiny_longformer(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A 1-layer Longformer encoder: its forward branches on tensor values (`.item()`), which no format exports."""
    from transformers import LongformerConfig, LongformerModel

    torch.manual_seed(seed)
    config = LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, attention_window=4, max_position_embeddings=130)
    return _saved(LongformerModel(config), folder, recipe)


def tiny_fnet(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A 1-layer FNet encoder: Fourier transforms instead of attention (ExecuTorch has no kernel for them)."""
    from transformers import FNetConfig, FNetModel

    torch.manual_seed(seed)
    config = FNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                        max_position_embeddings=64)
    return _saved(FNetModel(config), folder, recipe)


def _word_tokenizer(specials: list[str], words: list[str]):
    """A WordLevel tokenizer (no download) whose special tokens are single ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *specials, *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def tiny_idefics3_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                 family: str = "idefics3", text_layers: int | None = None,
                                 byte_level: bool = False, split: bool = False) -> Path:
    """A tiny Idefics3 (SigLIP-style tower, image 32, patch 8, 4 image tokens) saved with its own processor: a
    PIL-backend Idefics3 image processor (one image, not split into tiles) and a WordLevel tokenizer whose `<image>`
    id is the model's. `family` "smolvlm": a SmolVLM model (Idefics3's architecture) with the same processor (SmolVLM's
    own needs torchvision for its video processor, which the stack does not install). `text_layers`: the language
    model's depth (else 2). `byte_level`: a byte-level BPE tokenizer instead (one ExecuTorch's C++ tokenizer loads),
    the text model's vocabulary its size. `split`: the processor splits the image (`do_image_splitting`, real SmolVLM
    repos' default): resized to 64, it gives 2 x 2 tiles of 32 and the whole image, each its own run of image tokens."""
    import dataclasses

    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    from matrix.families import FAMILIES, build

    specials = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
    vocabulary: dict[str, Any] = {}
    if byte_level:  # bos 1, eos 2, pad 3 (VLM_SPECIALS), every id the model generates decodes to a piece
        tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *specials], vocab_size=120, bos="<s>",
                                        eos="</s>", pad="<pad>", byte_level=True)
        vocabulary = {"text_config.vocab_size": len(tokenizer), "text_config.pad_token_id": 3}
    else:
        tokenizer = _word_tokenizer(specials, ["describe", "the", "image", "a", "cat", "on", "mat", "."])
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    spec = FAMILIES[family]
    spec = dataclasses.replace(spec, tokenizer=None, overrides={**spec.overrides, "image_token_id": image_token,
                                                "text_config.bos_token_id": 1, "text_config.eos_token_id": 2,
                                                "text_config.pad_token_id": 0, **vocabulary,
                                                **_text_depth(text_layers)})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 64 if split else 32},
                                                max_image_size={"longest_edge": 32}, do_image_splitting=split)
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4).save_pretrained(folder)
    return folder


# A vision backbone's ONNX target in transformers.js's layout: tests/test_folder_files.py and tests/test_families.py
# read the same run of `tiny_vit_with_image_processor(folder, this)`, which the shared store exports once (#48)
VIT_TJS_RECIPE = {"export_format": "onnx", "dynamic": True, "layout": "transformers.js"}


def tiny_vit_with_image_processor(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A tiny ViT (image 32, patch 8) saved with a PIL-backend ViT image processor."""
    from transformers import ViTImageProcessorPil

    from matrix.families import FAMILIES, build

    build(FAMILIES["vit"], folder, seed=seed, recipe=recipe)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def tiny_siglip2_with_image_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                      layers: int = 2) -> Path:
    """A tiny SigLIP2 (NaFlex: patch 8, up to 16 patches an image, their grid kept to the image's aspect ratio;
    `layers` in each tower) saved with its own image processor, which makes the patches, `pixel_attention_mask` and
    `spatial_shapes`."""
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model

    torch.manual_seed(seed)
    config = Siglip2Config(
        text_config={"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
                     "num_attention_heads": 4, "max_position_embeddings": 16, "projection_size": 32,
                     "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
                       "num_attention_heads": 4, "patch_size": 8, "num_patches": 16})
    _saved(Siglip2Model(config).eval(), folder, recipe)
    Siglip2ImageProcessor(patch_size=8, max_num_patches=16).save_pretrained(folder)
    return folder


def tiny_bert_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0,
                             sentence_transformers: bool = True) -> Path:
    """A 1-layer BERT encoder (hidden 32) saved with a WordPiece tokenizer over a 24-token vocabulary (no download):
    `vocab.txt`, `tokenizer.json` and a `tokenizer_config.json` naming `BertTokenizer`, as BERT repos ship them.
    With `sentence_transformers`, the files of a sentence-transformers model too: `modules.json`, CLS pooling
    (`1_Pooling/config.json`: not the mean pooling sentence-transformers guesses without it), then normalization."""
    from transformers import BertConfig, BertModel, BertTokenizer

    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "park", "hello", "world", "tiny", "model",
             "test", "sentence", "longer", "one"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s", "##ing"]
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    _saved(BertModel(config), folder, recipe)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(folder)
    if sentence_transformers:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
        (folder / "modules.json").write_text(json.dumps(modules, indent=2))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
        (folder / "2_Normalize").mkdir()
    return folder


def tiny_vit_classifier_with_image_processor(folder: Path, recipe: Any | None = None, seed: int = 0) -> Path:
    """A 1-layer ViT image classifier (image 32, patch 8, labels cat/dog/bird) saved with a PIL-backend ViT image
    processor. Initialized wide (std 0.5) so the three logits lie apart: a wrong graph cannot match them by luck."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(seed)
    labels = ["cat", "dog", "bird"]
    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, initializer_range=0.5, id2label=dict(enumerate(labels)),
                       label2id={label: i for i, label in enumerate(labels)})
    _saved(ViTForImageClassification(config), folder, recipe)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def tiny_mamba(folder: Path, recipe: Any | None = None, seed: int = 0, initializer_range: float = 0.1) -> Path:
    """A 1-layer Mamba (hidden 16, state 4): a state-space model, no key-value cache (its cache holds conv and
    recurrent states). The default initialization makes greedy decoding repeat one token; `initializer_range=1.0`
    makes it vary, for parity checks that can fail."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2, conv_kernel=4,
                         time_step_rank=2, bos_token_id=0, eos_token_id=63, pad_token_id=1,
                         initializer_range=initializer_range)
    return _saved(MambaForCausalLM(config), folder, recipe)


def tiny_falcon_h1(folder: Path, recipe: Any | None = None, seed: int = 0, initializer_range: float = 0.5,
                   chunk_size: int = 4, layers: int = 2) -> Path:
    """A 2-layer Falcon-H1 (hidden 32, vocab 64; `layers` to change the depth): a hybrid, every layer an attention
    block beside a Mamba2 mixer, so its cache holds keys and values (growing) and conv and recurrent states (fixed;
    the recurrent state is 4-D, `[batch, heads, head_dim, state]`). `chunk_size` 4 makes the 8-token prompt two
    chunks of the scan."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    torch.manual_seed(seed)
    config = FalconH1Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=chunk_size, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=63, pad_token_id=1, initializer_range=initializer_range,
    )
    return _saved(FalconH1ForCausalLM(config), folder, recipe)


def save_bpe_tokenizer(folder: Path, vocab_size: int = 100, chat_template: bool = True) -> Path:
    """A small whitespace BPE with `<pad> <s> </s> <unk>` saved into `folder`; with `chat_template`, a
    `chat_template.jinja` too. Ids stay below `vocab_size` (a tiny model's vocabulary)."""
    text = ["the cat sat on the mat", "a dog ran in the park", "hello world, the model exports", "tiny models test"]
    train_bpe_tokenizer(folder, text * 4, ["<pad>", "<s>", "</s>", "<unk>"], vocab_size=vocab_size, bos="<s>",
                        eos="</s>", pad="<pad>", unk="<unk>", chat_template=chat_template)
    return folder


BPE_SPECIALS = ["<unk>", "<s>", "</s>", "<|pad|>"]  # ids 0-3: unk, bos 1, eos 2, pad 3 (the tiny configs' ids)
BPE_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world", "a tiny model with its own tokenizer",
              "pack my box with five dozen liquor jugs", "how vexingly quick daft zebras jump"] * 4


def save_ascii_bpe_tokenizer(folder: Path, vocab_size: int = 128) -> Path:
    """A whitespace BPE with the tiny configs' special ids saved into `folder`. Its alphabet is ASCII (no byte-level
    alphabet): every token decodes to text alone."""
    train_bpe_tokenizer(folder, BPE_CORPUS, BPE_SPECIALS, vocab_size=vocab_size, bos="<s>", eos="</s>", pad="<|pad|>",
                        unk="<unk>")
    return folder


RUNNER_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a tiny model learns to export itself to many runtimes",
    "executorch runs programs on phones and small boards",
    "static caches hold keys and values for every layer",
    "dynamic shapes let the prompt go in one call",
] * 20
RUNNER_BOS, RUNNER_EOS, RUNNER_PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"


def runner_bpe_tokenizer(folder: Path):
    """A byte-level BPE trained in code, ASCII only (no byte symbols >= 0x80: the ExecuTorch LLM runner's pybinding
    cannot hand a partial UTF-8 piece to Python; its C++ tokenizer reads no whitespace pre-tokenizer), saved with its
    tokenizer_config.json."""
    return train_bpe_tokenizer(folder, RUNNER_CORPUS, [RUNNER_BOS, RUNNER_EOS, RUNNER_PAD], vocab_size=200,
                               bos=RUNNER_BOS, eos=RUNNER_EOS, pad=RUNNER_PAD, byte_level=True)


def runner_model(folder: Path, kind: str, recipe: Any, layers: int = 2, window: int = 6,
                 positions: int | None = 64) -> Path:
    """A tiny Llama (tied embeddings), Qwen2, Qwen2-MoE (4 experts, 2 a token, a shared expert), Gemma 3 text or
    Gemma 2 (a sliding-window layer of `window` positions, then a full-attention one: `layers` 2) with its own BPE
    (`runner_bpe_tokenizer`), the vocabulary the tokenizer's; EOS never the argmax, so every run is full length.
    `layers` decoder layers (2; 1 where no check reads the depth: half the program to lower). Positions end at
    `positions` (None: the config class's default, Gemma 3's 131072, as real checkpoints keep 32K-128K)."""
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig,
                              LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig,
                              Qwen2MoeForCausalLM)

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = runner_bpe_tokenizer(folder)
    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2,
                  **({} if positions is None else {"max_position_embeddings": positions}),
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    torch.manual_seed(0)
    windowed = dict(head_dim=8, sliding_window=window, layer_types=["sliding_attention", "full_attention"][:layers],
                    tie_word_embeddings=False)  # tied, the tiny Gemmas repeat one token
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **common))
    elif kind == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(**windowed, **common))
    elif kind == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(**windowed, **common))
    elif kind == "qwen2_moe":
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                                   num_experts=4, num_experts_per_tok=2, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=False, **common))
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id].zero_()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.eval().save_pretrained(folder)
    write_recipe(folder, recipe)
    return folder


def tiny_moonshine(folder: Path, recipe: Any | None = None, seed: int = 0, feature_extractor: bool = True) -> Path:
    """A 1+1-layer Moonshine (hidden 32): a speech encoder-decoder on raw waveforms (`input_values`), with its
    feature extractor (`Wav2Vec2FeatureExtractor`, 16 kHz) saved in the folder when `feature_extractor`."""
    from transformers import MoonshineConfig, MoonshineForConditionalGeneration, Wav2Vec2FeatureExtractor

    torch.manual_seed(seed)
    config = MoonshineConfig(vocab_size=64, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=1,
                             decoder_num_hidden_layers=1, encoder_num_attention_heads=2,
                             decoder_num_attention_heads=2, max_position_embeddings=128, decoder_start_token_id=1,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.3)
    folder = _saved(MoonshineForConditionalGeneration(config), folder, recipe)
    if feature_extractor:
        Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=False,
                                 return_attention_mask=True).save_pretrained(folder)
    return folder


def tiny_speecht5(folder: Path, recipe: Any | None = None, seed: int = 2) -> Path:
    """A 1+1-layer SpeechT5ForSpeechToText (hidden 32): a speech encoder-decoder on raw waveforms (`input_values`,
    through its two-layer convolutional speech prenet) whose text decoder places tokens by sinusoidal positions, with
    its feature extractor (`SpeechT5FeatureExtractor`, 16 kHz) saved in the folder. Seed 2 and weights at std 1.0:
    greedy decoding varies within 8 tokens (at 0.3, or seed 0, it repeats one token from the second on)."""
    from transformers import SpeechT5Config, SpeechT5FeatureExtractor, SpeechT5ForSpeechToText

    torch.manual_seed(seed)
    config = SpeechT5Config(vocab_size=64, hidden_size=32, encoder_layers=1, decoder_layers=1,
                            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, conv_dim=[32, 32], conv_stride=[5, 2], conv_kernel=[10, 3],
                            num_feat_extract_layers=2, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                            encoder_max_relative_position=16, max_text_positions=64, decoder_start_token_id=2,
                            bos_token_id=0, eos_token_id=2, pad_token_id=1, initializer_range=1.0)
    folder = _saved(SpeechT5ForSpeechToText(config), folder, recipe)
    SpeechT5FeatureExtractor(sampling_rate=16000, do_normalize=False, return_attention_mask=True).save_pretrained(folder)
    return folder


VLM_CORPUS = ["describe the image", "a cat on the mat", "the quick brown fox jumps over the lazy dog"] * 4
VLM_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0-3, then the family's image tokens


def _vlm_tokenizer(folder: Path, image_tokens: list[str], byte_level: bool = False):
    """A whitespace BPE trained here whose special tokens include the family's image tokens (single ids);
    `byte_level`: a byte-level BPE instead (as the released checkpoints of these families ship; one ExecuTorch's C++
    tokenizer loads), whose size the text model's vocabulary must then be (`_byte_vocabulary`)."""
    if byte_level:
        return train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *image_tokens], vocab_size=120, bos="<s>",
                                   eos="</s>", pad="<pad>", byte_level=True)
    return train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *image_tokens], vocab_size=120, bos="<s>",
                               eos="</s>", pad="<pad>", unk="<unk>")


def _byte_vocabulary(tokenizer, byte_level: bool) -> dict[str, Any]:
    """The override that sizes the text model's vocabulary to a byte-level tokenizer's (every id the model
    generates decodes to a piece); none for the whitespace one."""
    return {"text_config.vocab_size": len(tokenizer)} if byte_level else {}


def _text_depth(layers: int | None) -> dict[str, Any]:
    """The overrides that give a vision-language model's language model `layers` full-attention layers (none: the
    matrix's default depth)."""
    if layers is None:
        return {}
    return {"text_config.num_hidden_layers": layers, "text_config.layer_types": ["full_attention"] * layers}


def _windowed(layers: int, window: int | None) -> dict[str, Any]:
    """The overrides that make a Gemma-style language model's layers alternate a sliding-window layer of `window` and
    a full one (None: a window longer than any cache here, every layer as full attention)."""
    if window is None:
        return {"text_config.sliding_window": 4096}
    return {"text_config.sliding_window": window,
            "text_config.layer_types": [("sliding_attention", "full_attention")[i % 2] for i in range(layers)]}


def _vlm_spec(name: str, model_class: str, overrides: dict[str, Any]):
    import dataclasses

    from matrix.families import FAMILIES

    base = FAMILIES.get(name) or FAMILIES["llava"]
    # tokenizer=None: each builder saves its own tokenizer and processor, whose ids the overrides set (the matrix
    # family's own tokenizer would overwrite them)
    return dataclasses.replace(base, name=name, model_class=model_class, tokenizer=None, overrides={
        "text_config.bos_token_id": 1, "text_config.eos_token_id": 2, "text_config.pad_token_id": 3, **overrides})


def tiny_llava_next_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                   text_layers: int = 2, byte_level: bool = False) -> Path:
    """A tiny LLaVA-NeXT (CLIP tower, image 32, patch 8, any-resolution grid pinpoints up to 64; a language model of
    `text_layers` layers) saved with its own processor: a PIL-backend LLaVA-NeXT image processor (base image + one
    tile at 32: 5-D pixels and `image_sizes`) and a BPE tokenizer whose `<image>` id is the model's. `byte_level`: a
    byte-level BPE tokenizer (one ExecuTorch's C++ tokenizer loads), the text model's vocabulary its size."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    from matrix.families import build

    vocabulary: dict[str, Any] = {}
    if byte_level:  # every id the model generates decodes to a piece
        tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, "<image>"], vocab_size=120, bos="<s>",
                                        eos="</s>", pad="<pad>", byte_level=True)
        vocabulary = {"text_config.vocab_size": len(tokenizer)}
    else:
        tokenizer = _vlm_tokenizer(folder, ["<image>"])
    pinpoints = [[32, 32], [32, 64], [64, 32]]
    spec = _vlm_spec("llava_next", "LlavaNextForConditionalGeneration", {
        **vocabulary, "vision_config.image_size": 32, "vision_config.patch_size": 8, "image_grid_pinpoints": pinpoints,
        "text_config.num_hidden_layers": text_layers, "image_token_index": tokenizer.convert_tokens_to_ids("<image>")})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                                 image_grid_pinpoints=pinpoints)
    LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8, image_token="<image>",
                       vision_feature_select_strategy="default",
                       num_additional_image_tokens=1).save_pretrained(folder)  # CLIP's class token
    return folder


# transformers.js's vision-language layout of an ONNX generation target (tests/test_transformers_js_vlm.py)
BLOCK = 32  # ONNX Runtime's int4 block along a MatMul's input axis (the int4 variant's and transformers.js's q4)


def snap_to_int4_grid(folder: Path, auto: str = "AutoModelForCausalLM") -> None:
    """Every linear weight and the embedding table of the saved model (loaded with transformers' `auto` class)
    replaced by its symmetric block-wise 4-bit value along the input (hidden) axis (ONNX Runtime's rule: each block's
    largest-magnitude value is code -8; an axis shorter than a block, or not a multiple of it, is padded with zeros as
    the quantizer pads it). A block of zeros (the padding token's row, which the model initializes to zero) stays
    zero: divided by its zero scale it had become NaN, and every padded row of the proofs' batches with it, on both
    sides alike."""
    import transformers

    model = getattr(transformers, auto).from_pretrained(folder)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                rows, columns = module.weight.shape
                padded = torch.nn.functional.pad(module.weight, (0, -columns % BLOCK))
                blocks = padded.reshape(rows, -1, BLOCK)
                scale = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True)) / -8
                scale = torch.where(scale == 0, torch.ones_like(scale), scale)
                snapped = (torch.clamp(torch.round(blocks / scale), -8, 7) * scale).reshape(rows, -1)
                module.weight.copy_(snapped[:, :columns])
    model.save_pretrained(folder)


TJS_TARGET = {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}
TJS_FP16_TARGET = {**TJS_TARGET, "name": "tjs16", "dtype": "float16"}  # the layout's `_fp16` files
# the tiny LLaVA's ONNX run two modules read (the shared store exports it once, #48): the plainest ONNX generation
# target (tests/test_genai_vlm.py) and the transformers.js layout, fp32 and fp16 (tests/test_transformers_js_vlm.py)
# the LLaVA run's transformers.js target writes q4 and q4f16 dtype files beside its fp32 graphs; its weights are snapped
# to the 4-bit grid (`tiny_llava_onnx_model`), as tests/test_transformers_js_dtypes.py's: random weights lose int4's
# greedy budget, snapped ones keep eager's tokens up to float rounding, so a wrong packing still fails
TJS_VLM_VARIANTS = ["fp32", "int4", "q4f16"]
LLAVA_ONNX_RECIPE = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "generation"},
                                 {**TJS_TARGET, "variants": TJS_VLM_VARIANTS}, TJS_FP16_TARGET],
                     "generation": {"max_new_tokens": 8}}


def tiny_qwen2_5_vl_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 1,
                                   family: str = "qwen2_5_vl") -> Path:
    """A tiny Qwen2.5-VL (matrix's: patch 8, merge 2; a language model of `text_layers` layers), or the matrix's
    Qwen2-VL where `family` is "qwen2_vl", with a byte-level BPE tokenizer whose `<|vision_start|>`, `<|image_pad|>`,
    `<|vision_end|>` and `<|video_pad|>` ids are the model's (the markers ONNX Runtime GenAI's processor expands), the
    vocabulary the tokenizer's."""
    import dataclasses

    from transformers import AutoConfig

    from matrix.families import FAMILIES, build

    markers = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *markers], vocab_size=120, bos="<s>",
                                    eos="</s>", pad="<pad>", byte_level=True)
    ids = dict(zip(["vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id"],
                   tokenizer.convert_tokens_to_ids(markers)))
    base = FAMILIES[family]
    depth = _text_depth(text_layers)
    if not hasattr(AutoConfig.for_model(base.name).text_config, "layer_types"):
        # Qwen3-VL's text config has no `layer_types` (as its checkpoints' have none): set, it makes `generate()`'s
        # static-cache mask a per-layer-type dict its text model cannot read (docs/upstream-gaps.md)
        depth.pop("text_config.layer_types", None)
    spec = dataclasses.replace(base, tokenizer=None, overrides={**base.overrides, **ids, **depth,
                                                "text_config.vocab_size": len(tokenizer), "text_config.bos_token_id": 1,
                                                "text_config.eos_token_id": 2, "text_config.pad_token_id": 3})
    build(spec, folder, seed=seed, recipe=recipe)
    return folder


def tiny_qwen_vl_with_image_processor(folder: Path, recipe: Any | None = None, family: str = "qwen2_vl",
                                      seed: int = 0, text_layers: int = 1) -> Path:
    """`tiny_qwen2_5_vl_with_tokenizer`'s Qwen2-VL (or Qwen2.5-VL, Qwen3-VL) with its image processor saved
    (`preprocessor_config.json`: the PIL backend, its pixel bounds one 32-pixel square, patch 8, merge 2: a 4x4 grid,
    4 image tokens), so the sample's pixels are the processor's. No `processor_config.json`: transformers'
    Qwen2VLProcessor needs a video processor, which needs torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tiny_qwen2_5_vl_with_tokenizer(folder, recipe, seed=seed, text_layers=text_layers, family=family)
    Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=32 * 32, patch_size=8, merge_size=2,
                             temporal_patch_size=2).save_pretrained(folder)
    return folder


MISTRAL3_IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]"]  # the tokens GenAI's mistral3 processor reads


def tiny_mistral3_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 1) -> Path:
    """A tiny Mistral 3 (matrix's: Pixtral tower, image 32, patch 8, merge 2: 4 image features; a Mistral text model
    of `text_layers` layers) with a byte-level BPE tokenizer whose `[IMG]` id is the model's image token and which
    holds `[IMG_BREAK]`, `[IMG_END]` and `[INST]` (the tokens ONNX Runtime GenAI's processor looks up), the
    vocabulary the tokenizer's. No processor: transformers' PixtralProcessor needs torchvision."""
    import dataclasses

    from matrix.families import FAMILIES, build

    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *MISTRAL3_IMAGE_TOKENS], vocab_size=120,
                                    bos="<s>", eos="</s>", pad="<pad>", byte_level=True)
    base = FAMILIES["mistral3"]
    spec = dataclasses.replace(base, tokenizer=None, overrides={
        **base.overrides, "image_token_index": tokenizer.convert_tokens_to_ids("[IMG]"),
        "text_config.num_hidden_layers": text_layers, "text_config.vocab_size": len(tokenizer),
        "text_config.bos_token_id": 1, "text_config.eos_token_id": 2, "text_config.pad_token_id": 3})
    build(spec, folder, seed=seed, recipe=recipe)
    return folder


def tiny_mistral3_with_processor(folder: Path, recipe: Any | None = None) -> Path:
    """The matrix's tiny Mistral 3 (Pixtral tower, image 32, patch 8, merge 2: 2 x 2 image features; its byte-level
    BPE holds `[IMG]`, `[IMG_BREAK]` and `[IMG_END]`; the EOS row of its output zeroed, so 8 tokens are generated)
    saved with its processor's files as a Mistral 3 repo ships them: `preprocessor_config.json` (Pixtral's image
    processor, longest edge 32, written by its PIL backend) and `processor_config.json` (PixtralProcessor's tokens,
    patch and merge sizes, written here: transformers' PixtralProcessor needs torchvision)."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    family_model("mistral3", folder, recipe, never_eos=True)
    PixtralImageProcessorPil(size={"longest_edge": 32}, patch_size=8).save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps({
        "processor_class": "PixtralProcessor", "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]", "patch_size": 8, "spatial_merge_size": 2}, indent=2) + "\n")
    return folder


def tiny_llava_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0, tied: bool = False,
                              text_layers: int = 2, corpus: list[str] = VLM_CORPUS, vocab_size: int = 120) -> Path:
    """A tiny LLaVA (CLIP tower, image 32, patch 8: 16 image tokens; Llama text of `text_layers` layers) saved with
    its own processor: a PIL-backend CLIP image processor at 32 and a byte-level BPE tokenizer (one ExecuTorch's C++
    tokenizer loads; trained on `corpus` to `vocab_size`) whose `<image>` id is the model's. `tied`: the text model's
    output projection is its embedding table."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    from matrix.families import build

    tokenizer = train_bpe_tokenizer(folder, corpus, [*VLM_SPECIALS, "<image>"], vocab_size=vocab_size, bos="<s>",
                                    eos="</s>", pad="<pad>", byte_level=True)
    spec = _vlm_spec("llava", "LlavaForConditionalGeneration", {
        "vision_config.image_size": 32, "vision_config.patch_size": 8, "image_seq_length": 16,
        "text_config.vocab_size": len(tokenizer),  # every id the model generates decodes to a piece
        "text_config.num_hidden_layers": text_layers,
        **({"tie_word_embeddings": True, "text_config.tie_word_embeddings": True} if tied else {}),
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>")})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8, image_token="<image>",
                   vision_feature_select_strategy="default",
                   num_additional_image_tokens=1).save_pretrained(folder)  # CLIP's class token
    return folder


def tiny_llava_onnx_model(folder: Path) -> Path:
    """The tiny LLaVA of `LLAVA_ONNX_RECIPE`'s run (tests/test_genai_vlm.py and tests/test_transformers_js_vlm.py read
    it from the shared store), its linear weights snapped to the 4-bit grid."""
    tiny_llava_with_processor(folder, LLAVA_ONNX_RECIPE)
    snap_to_int4_grid(folder, "AutoModelForImageTextToText")
    return folder


GEMMA3_IMAGE_TOKENS = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]  # boi, image, eoi
GEMMA3_IMAGE_LENGTH = 4  # image tokens: the 4x4 patches pooled 2x2


def tiny_gemma3_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 2,
                               sliding_window: int | None = None, chat_template: bool = False) -> Path:
    """A tiny Gemma 3 (SigLIP tower, image 32, patch 8, pooled to 4 image tokens; a Gemma 3 text model of
    `text_layers` full-attention layers) saved with its own processor: a PIL-backend Gemma 3 image processor at 32 and
    a byte-level BPE tokenizer (one ExecuTorch's C++ tokenizer loads) whose `<start_of_image>`, `<image_soft_token>`
    and `<end_of_image>` ids are the model's. The processor returns `token_type_ids` (1 on the image's tokens), with
    which Gemma 3's prefill attends bidirectionally among one image's tokens: two layers, so that attention reaches
    the text's logits (with one layer the image positions' keys and values are their embeddings whatever the mask).
    `sliding_window`: the text model's layers alternate a sliding-window layer of that window and a full one, as
    Gemma 3's (None: every layer full attention). `chat_template`: a `chat_template.jinja` (Gemma's turns) beside,
    as a Gemma 3 repository holds one (transformers.js's `Gemma3Processor` will not load without it)."""
    from transformers import Gemma3Processor, PreTrainedTokenizerFast
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from matrix.families import build

    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *GEMMA3_IMAGE_TOKENS], vocab_size=120,
                                    bos="<s>", eos="</s>", pad="<pad>", byte_level=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, extra_special_tokens=dict(zip(
        ("boi_token", "image_token", "eoi_token"), GEMMA3_IMAGE_TOKENS)))  # the names Gemma3Processor reads
    boi, image, eoi = tokenizer.convert_tokens_to_ids(GEMMA3_IMAGE_TOKENS)
    spec = _vlm_spec("gemma3", "Gemma3ForConditionalGeneration", {
        "vision_config.image_size": 32, "vision_config.patch_size": 8, "mm_tokens_per_image": GEMMA3_IMAGE_LENGTH,
        **_text_depth(text_layers), **_windowed(text_layers, sliding_window),
        "text_config.vocab_size": len(tokenizer),
        "text_config.bos_token_id": tokenizer.bos_token_id, "text_config.eos_token_id": tokenizer.eos_token_id,
        "text_config.pad_token_id": tokenizer.pad_token_id,
        "boi_token_index": boi, "image_token_index": image, "eoi_token_index": eoi})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer,
                    image_seq_length=GEMMA3_IMAGE_LENGTH).save_pretrained(folder)
    if chat_template:
        (folder / "chat_template.jinja").write_text(GEMMA_CHAT_TEMPLATE, encoding="utf-8")
    return folder


# Gemma's turns, as a Gemma 3 repository's chat_template.jinja writes them (its image as the begin-of-image token)
GEMMA_CHAT_TEMPLATE = """{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == \
'assistant' else message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}\
{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}\
{% endfor %}{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""


def tiny_paligemma_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 2) -> Path:
    """A tiny PaliGemma (SigLIP tower, image 32, patch 8: 16 image tokens; a Gemma text model of `text_layers`
    layers) saved with its own processor: a PIL-backend SigLIP image processor at 32 (with `image_seq_length`, which
    transformers.js's PaliGemmaProcessor reads there) and a byte-level BPE tokenizer whose `<image>` id is the model's.
    Its prefill attends both ways over the image and the prompt (its prefix): two layers, so that attention reaches
    the text's logits."""
    from transformers import PaliGemmaProcessor, PreTrainedTokenizerFast, SiglipImageProcessorPil

    from matrix.families import build

    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, "<image>"], vocab_size=120, bos="<s>",
                                    eos="</s>", pad="<pad>", byte_level=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    spec = _vlm_spec("paligemma", "PaliGemmaForConditionalGeneration", {
        "vision_config.image_size": 32, "vision_config.patch_size": 8, **_text_depth(text_layers),
        "text_config.vocab_size": len(tokenizer), "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "text_config.bos_token_id": tokenizer.bos_token_id, "text_config.eos_token_id": tokenizer.eos_token_id,
        "text_config.pad_token_id": tokenizer.pad_token_id})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = SiglipImageProcessorPil(size={"height": 32, "width": 32}, image_seq_length=16)
    PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


AYA_IMAGE_TOKENS = ["<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE",
                    "TILE_GLOBAL"]


def tiny_aya_vision_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                   text_layers: int = 2, byte_level: bool = False) -> Path:
    """A tiny Aya Vision (SigLIP tower, image 32, patch 8, pixel shuffle 2: 4 image tokens; Cohere2 text of
    `text_layers` layers, each with a sliding window, as the tiny family's two are) saved with its own processor: a
    PIL-backend GOT-OCR2 image processor and a BPE tokenizer whose `<|IMG_PATCH|>` id is the model's image token
    (`byte_level`: a byte-level one, `_vlm_tokenizer`)."""
    from transformers import AyaVisionProcessor, GotOcr2ImageProcessorPil

    from matrix.families import build

    tokenizer = _vlm_tokenizer(folder, AYA_IMAGE_TOKENS, byte_level)
    spec = _vlm_spec("aya_vision", "AyaVisionForConditionalGeneration", {**_byte_vocabulary(tokenizer, byte_level),
        "vision_config.image_size": 32, "vision_config.patch_size": 8, "downsample_factor": 2,
        "text_config.sliding_window": 12, "image_token_id": tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        "text_config.num_hidden_layers": text_layers, "text_config.layer_types": ["sliding_attention"] * text_layers})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True,
                                               min_patches=1, max_patches=1)
    AyaVisionProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8, img_size=32,
                       downsample_factor=2).save_pretrained(folder)
    return folder


def tiny_mllama_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                               byte_level: bool = False) -> Path:
    """A tiny Mllama (tiled vision tower, image 32, patch 8, 4 tiles; a 2-layer language model whose second layer
    cross-attends to the image) saved with its own processor: a PIL-backend Mllama image processor (`aspect_ratio_ids`,
    `aspect_ratio_mask`, `cross_attention_mask`) and a BPE tokenizer whose `<|image|>` id is the model's
    (`byte_level`: a byte-level one, `_vlm_tokenizer`)."""
    from transformers import MllamaImageProcessorPil, MllamaProcessor

    from matrix.families import build

    tokenizer = _vlm_tokenizer(folder, ["<|image|>", "<|begin_of_text|>"], byte_level)
    spec = _vlm_spec("mllama", "MllamaForConditionalGeneration", {**_byte_vocabulary(tokenizer, byte_level),
        "vision_config.image_size": 32, "vision_config.patch_size": 8, "vision_config.max_num_tiles": 4,
        "vision_config.num_global_layers": 1, "vision_config.intermediate_layers_indices": [0],
        "vision_config.vision_output_dim": 64, "text_config.cross_attention_layers": [1],
        "image_token_index": tokenizer.convert_tokens_to_ids("<|image|>")})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = MllamaImageProcessorPil(size={"height": 32, "width": 32}, max_image_tiles=4)
    MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def tiny_idefics2_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                 byte_level: bool = False) -> Path:
    """A tiny Idefics2 (SigLIP-style tower, image 32, patch 8; a perceiver resampler of 4 latents: 4 image tokens)
    saved with its own processor: a PIL-backend Idefics2 image processor (no splitting) and a BPE tokenizer whose
    `<image>` id is the model's. `byte_level`: a byte-level BPE tokenizer (one ExecuTorch's C++ tokenizer loads),
    the text model's vocabulary its size."""
    from transformers import Idefics2ImageProcessorPil, Idefics2Processor

    from matrix.families import FAMILIES, build

    specials = ["<image>", "<fake_token_around_image>", "<end_of_utterance>"]
    vocabulary: dict[str, Any] = {}
    if byte_level:  # every id the model generates decodes to a piece
        tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, *specials], vocab_size=120, bos="<s>",
                                        eos="</s>", pad="<pad>", byte_level=True)
        vocabulary = {"text_config.vocab_size": len(tokenizer)}
    else:
        tokenizer = _vlm_tokenizer(folder, specials)
    spec = _vlm_spec("idefics2", "Idefics2ForConditionalGeneration", {
        **FAMILIES["idefics2"].overrides, **vocabulary,
        "image_token_id": tokenizer.convert_tokens_to_ids("<image>")})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = Idefics2ImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 32},
                                                do_image_splitting=False)
    Idefics2Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4).save_pretrained(folder)
    return folder


def tiny_llava_onevision_with_processor(folder: Path, recipe: Any | None = None, seed: int = 0,
                                        text_layers: int = 2, byte_level: bool = False) -> Path:
    """A tiny LLaVA-OneVision (SigLIP tower, image 32, patch 8, any-resolution grid pinpoints up to 64; a Qwen2
    language model of `text_layers` layers) saved with the files its processor writes: `processor_config.json`
    naming `LlavaOnevisionProcessor`, with its image processor (PIL backend: base image + one tile at 32, 5-D pixels
    and `image_sizes`) and its video processor nested as transformers 5 nests them, and a BPE tokenizer whose
    `<image>` id is the model's (`byte_level`: a byte-level one, `_vlm_tokenizer`). The processor class
    builds a video processor, which needs torchvision (not in the stack): it cannot be built here to save itself,
    nor loaded, which is the case this folder is for."""
    import json

    from transformers import LlavaOnevisionImageProcessorPil

    from matrix.families import FAMILIES, build

    tokenizer = _vlm_tokenizer(folder, ["<image>", "<video>"], byte_level)
    spec = _vlm_spec("llava_onevision", "LlavaOnevisionForConditionalGeneration", {
        **_byte_vocabulary(tokenizer, byte_level),
        **FAMILIES["llava_onevision"].overrides, "text_config.num_hidden_layers": text_layers,
        "text_config.layer_types": ["full_attention"] * text_layers,  # Qwen2's, one a layer
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "video_token_index": tokenizer.convert_tokens_to_ids("<video>")})
    build(spec, folder, seed=seed, recipe=recipe)
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32},
                                                      image_grid_pinpoints=spec.overrides["image_grid_pinpoints"])
    processor = {"processor_class": "LlavaOnevisionProcessor", "image_processor": image_processor.to_dict(),
                 "video_processor": {"video_processor_type": "LlavaOnevisionVideoProcessor"},
                 "image_token": "<image>", "video_token": "<video>", "num_image_tokens": 16,
                 "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9"}
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return folder


def family_model(name: str, folder: Path, recipe: Any | None = None, never_eos: bool = False, tokenizer: bool = True,
                 **overrides: Any) -> Path:
    """`matrix.families`' tiny `name` saved to `folder` (with `recipe`), `overrides` set on its config after the
    family's own (e.g. `num_hidden_layers=1` where the test's point needs no second layer: half the graph to trace
    and lower). `never_eos`: the output projection's EOS row zeroed, as `runner_model` does, so greedy decoding
    never ends early (a one-layer random model may pick EOS first, and a generation check that saw one token is
    unverified). `tokenizer=False`: without the family's tokenizer (the model drawn as before the family had one:
    a test whose point is that model's own numbers).

    Example:
        family_model("falcon", tmp_path / "model", {"export_format": "executorch"}, num_hidden_layers=1)
    """
    import dataclasses

    from matrix.families import FAMILIES, build

    spec = FAMILIES[name]
    spec = spec if tokenizer else dataclasses.replace(spec, tokenizer=None)
    folder = build(dataclasses.replace(spec, overrides={**spec.overrides, **overrides}), folder, recipe=recipe)
    if never_eos:
        import transformers

        model = getattr(transformers, spec.model_class).from_pretrained(folder)
        eos = model.generation_config.eos_token_id
        if eos is not None:  # a family without an EOS id decodes to the end anyway
            with torch.no_grad():
                model.get_output_embeddings().weight[eos if isinstance(eos, list) else [eos]] = 0.0
            model.save_pretrained(folder)
    return folder


def tiny_voxtral_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 1,
                                feature_extractor: bool = True, **audio: Any) -> Path:
    """A tiny Voxtral (matrix's, 16 mel bins, with 50 source positions: one second of 100 frames, 25 audio tokens;
    a Llama text model of `text_layers` layers) with a byte-level BPE tokenizer (one ExecuTorch's C++ tokenizer
    loads) whose `[AUDIO]` id is the model's `audio_token_id`, the vocabulary the tokenizer's; `feature_extractor`:
    the log-mel extractor its audio config implies saved beside it (preprocessor_config.json); `audio`: audio config
    values set over those (`max_source_positions=1500, intermediate_size=128`: Voxtral's 30 s chunk of 3000 frames,
    stacked by 4 into 375 audio tokens, as transformers.js's processor lays them out)."""
    import dataclasses

    from exporters.capture.audio_text import extractor_from_config
    from matrix.families import FAMILIES, build

    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, "[AUDIO]"], vocab_size=120, bos="<s>",
                                    eos="</s>", pad="<pad>", byte_level=True)
    base = FAMILIES["voxtral"]
    spec = dataclasses.replace(base, overrides={
        **base.overrides, "audio_token_id": tokenizer.convert_tokens_to_ids("[AUDIO]"),
        "audio_config.max_source_positions": 50, **{f"audio_config.{k}": v for k, v in audio.items()},
        "text_config.vocab_size": len(tokenizer), "text_config.num_hidden_layers": text_layers,
        "text_config.bos_token_id": 1, "text_config.eos_token_id": 2, "text_config.pad_token_id": 3})
    build(spec, folder, seed=seed, recipe=recipe)
    if feature_extractor:
        from transformers import AutoConfig

        audio = AutoConfig.from_pretrained(folder).audio_config
        extractor_from_config(audio, 2 * audio.max_source_positions).save_pretrained(folder)
    return folder


def tiny_qwen2_audio_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0, text_layers: int = 1) -> Path:
    """A tiny Qwen2-Audio (matrix's: 16 mel bins, 32 source positions: 64 frames, 16 audio tokens; a Qwen2 text model
    of `text_layers` full-attention layers) with the matrix's byte-level BPE tokenizer (one ExecuTorch's C++ tokenizer
    loads) whose `<|AUDIO|>` id is the model's `audio_token_index`, and the log-mel extractor its audio config
    implies."""
    import dataclasses

    from transformers import AutoConfig

    from exporters.capture.audio_text import extractor_from_config
    from matrix.families import FAMILIES, build

    base = FAMILIES["qwen2_audio"]  # the matrix's family builds its tokenizer (`matrix.tokenizer`)
    spec = dataclasses.replace(base, overrides={
        **base.overrides, "text_config.num_hidden_layers": text_layers,
        "text_config.layer_types": ["full_attention"] * text_layers})
    build(spec, folder, seed=seed, recipe=recipe)
    audio = AutoConfig.from_pretrained(folder).audio_config
    extractor_from_config(audio, 2 * audio.max_source_positions).save_pretrained(folder)
    return folder


def tiny_granite_speech_with_tokenizer(folder: Path, recipe: Any | None = None, seed: int = 0,
                                       text_layers: int = 1) -> Path:
    """A tiny Granite Speech (matrix's: a two-block Conformer reading 160-wide stacked log-mel frames, a Q-Former
    projector, a Granite text model of `text_layers` layers), its attention blocks 50 frames long (the sample's
    length: one second, 100 mel frames stacked in pairs, 4 projector windows, 12 audio tokens), with a byte-level
    BPE tokenizer (one ExecuTorch's C++ tokenizer loads) whose `<|audio|>` id is the model's `audio_token_id`. No
    feature extractor is saved: Granite's needs torchaudio, which the stack does not install (its inputs are made
    from the config, `exporters.capture.audio_text`)."""
    import dataclasses

    from matrix.families import FAMILIES, build

    tokenizer = train_bpe_tokenizer(folder, VLM_CORPUS, [*VLM_SPECIALS, "<|audio|>"], vocab_size=120, bos="<s>",
                                    eos="</s>", pad="<pad>", byte_level=True)
    base = FAMILIES["granite_speech"]
    spec = dataclasses.replace(base, overrides={
        **base.overrides, "audio_token_index": tokenizer.convert_tokens_to_ids("<|audio|>"),
        "encoder_config.context_size": 50, "projector_config.num_hidden_layers": 1,
        "text_config.vocab_size": len(tokenizer), "text_config.num_hidden_layers": text_layers,
        "text_config.bos_token_id": 1, "text_config.eos_token_id": 2, "text_config.pad_token_id": 3})
    return build(spec, folder, seed=seed, recipe=recipe)


def tiny_mistral3_model():
    """A tiny Mistral 3 in memory (a one-layer Pixtral tower of 32-pixel images, 8-pixel patches; a one-layer text
    model of 64 tokens, its image token 10), eval mode: for the tests of what a sample's layout makes a layout refuse."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config(vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 16,
                                           "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                           "head_dim": 8},
                            text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                                         "vocab_size": 64})
    config.image_token_index = 10
    return Mistral3ForConditionalGeneration(config).eval()

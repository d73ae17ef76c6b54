"""The families of the support matrix: tiny random-weight models built from transformers' own default configs,
shrunk consistently (hidden 32, 1-2 layers, vocabulary 256, or the tokenizer's where the family has one, with every
special token id moved inside it), so each family's real code path runs in seconds.

Example:
    >>> from pathlib import Path
    >>> spec = FAMILIES["llama"]
    >>> spec.kind, spec.model_class
    ('decoder-only', 'LlamaForCausalLM')
    >>> build(spec, Path("/tmp/tiny-llama"))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("decoder-only", "state-space", "hybrid", "encoder", "vision", "audio", "encoder-decoder", "vision-language",
         "audio-language", "dual-encoder")
VOCAB = 256
SIZES: dict[str, Any] = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "projection_dim": 32, "word_embed_proj_dim": 32,
    "intermediate_size": 64, "ffn_dim": 64, "d_ff": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "num_hidden_layers": 2, "num_layers": 2, "encoder_layers": 1, "decoder_layers": 1, "num_decoder_layers": 1,
    "depth": 1, "num_attention_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "d_kv": 8, "query_pre_attn_scalar": 8,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "max_window_layers": 2, "projection_size": 32, "ffn_hidden_size": 64,
}
VISION = {"image_size": 32, "patch_size": 8}
AUDIO_CONV = {"conv_dim": [32, 32], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_feat_extract_layers": 2,
              "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2}


# every vision-language family's folder holds a byte-level BPE whose image token is the model's (`FamilySpec.tokenizer`)
# Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's vision markers and image token: GenAI's processor expands the image pad
QWEN_VL_TOKENS = (("<|image_pad|>", "image_token_id"), ("<|video_pad|>", "video_token_id"),
                  ("<|vision_start|>", "vision_start_token_id"), ("<|vision_end|>", "vision_end_token_id"))


@dataclass(frozen=True)
class FamilySpec:
    """One family: its kind, model class, and the settings that keep its shrunk config consistent (dotted paths
    into the config, applied after the generic shrinking)."""

    name: str
    kind: str
    model_class: str
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    # the folder gets a byte-level BPE tokenizer (`matrix.tokenizer`), for a runtime proof that reads one: `()` a plain
    # one (every decoder-only family's, for the ExecuTorch LLM runner), `(special token, the config's id of it)` one
    # with that token (Qwen2-Audio's audio token, LLaVA's image token, for ExecuTorch's MultimodalRunner), or a tuple
    # of such pairs (Qwen2-VL's vision markers and image token, which GenAI's processor reads); None: no tokenizer
    tokenizer: tuple[Any, ...] | None = None
    # the std the layers' weights are drawn at (`tiny_model`); narrower for a model whose activations it blows up
    weight_std: float = 0.5


def _f(name: str, kind: str, model_class: str, note: str = "", tokenizer: tuple[Any, ...] | None = None,
       weight_std: float = 0.5, **overrides: Any) -> FamilySpec:
    """A family; a decoder-only one gets a plain tokenizer (its ExecuTorch program's LLM runner proof reads one: a
    check that did not run is not a pass)."""
    if tokenizer is None and kind == "decoder-only":
        tokenizer = ()
    return FamilySpec(name, kind, model_class, {k.replace("__", "."): v for k, v in overrides.items()}, note,
                      tokenizer, weight_std)


_SPECS = [
    # decoder-only
    _f("gpt2", "decoder-only", "GPT2LMHeadModel"),
    _f("llama", "decoder-only", "LlamaForCausalLM"),
    _f("mistral", "decoder-only", "MistralForCausalLM"),
    _f("mixtral", "decoder-only", "MixtralForCausalLM"),
    _f("qwen2", "decoder-only", "Qwen2ForCausalLM"),
    _f("qwen3", "decoder-only", "Qwen3ForCausalLM"),
    _f("qwen3_moe", "decoder-only", "Qwen3MoeForCausalLM"),
    _f("phi", "decoder-only", "PhiForCausalLM"),
    _f("phi3", "decoder-only", "Phi3ForCausalLM"),
    _f("gemma", "decoder-only", "GemmaForCausalLM"),
    _f("gemma2", "decoder-only", "Gemma2ForCausalLM", "sliding window 12: decoding crosses it", sliding_window=12),
    _f("gemma3_text", "decoder-only", "Gemma3ForCausalLM", "sliding window 12: decoding crosses it",
       sliding_window=12, layer_types=["sliding_attention", "full_attention"]),
    # Gemma 3n's language model alone (its checkpoints' text-only class): AltUp, LAuReL, per-layer inputs, the last
    # two of four layers reading the first two's keys and values; its first layers' activation sparsity (0.95, as
    # the checkpoints have it) computes `Normal(0, 1).icdf`
    _f("gemma3n_text", "decoder-only", "Gemma3nForCausalLM",
       "the last 2 of 4 layers share the first 2's cache; sliding window 12: decoding crosses it; ONNX and "
       "ExecuTorch fail upstream on its activation sparsity's erfinv (docs/upstream-gaps.md #45). "
       "Gemma3nForConditionalGeneration (image, audio, text) is not in the matrix: its vision tower is a timm "
       "MobileNetV5 (TimmWrapperModel); timm needs torchvision, and PyPI's torchvision for torch 2.13 (0.28.0) is "
       "a CUDA build whose native ops do not load beside the CPU torch (`import torchvision`: operator "
       "torchvision::nms does not exist), so it cannot be built here (docs/upstream-gaps.md #60)",
       num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
       sliding_window=12, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0], vocab_size_per_layer_input=VOCAB,
       hidden_size_per_layer_input=8, laurel_rank=8, intermediate_size=[64] * 4),
    _f("falcon", "decoder-only", "FalconForCausalLM"),
    _f("gpt_neox", "decoder-only", "GPTNeoXForCausalLM"),
    _f("opt", "decoder-only", "OPTForCausalLM"),
    _f("bloom", "decoder-only", "BloomForCausalLM"),
    _f("stablelm", "decoder-only", "StableLmForCausalLM"),
    _f("olmo", "decoder-only", "OlmoForCausalLM"),
    _f("granite", "decoder-only", "GraniteForCausalLM"),
    _f("smollm3", "decoder-only", "SmolLM3ForCausalLM"),
    _f("starcoder2", "decoder-only", "Starcoder2ForCausalLM"),
    _f("gptj", "decoder-only", "GPTJForCausalLM", rotary_dim=4),
    _f("cohere", "decoder-only", "CohereForCausalLM"),
    _f("cohere2", "decoder-only", "Cohere2ForCausalLM", "sliding window 12: decoding crosses it", sliding_window=12,
       layer_types=["sliding_attention", "full_attention"]),
    _f("qwen2_moe", "decoder-only", "Qwen2MoeForCausalLM", shared_expert_intermediate_size=32),
    _f("olmo2", "decoder-only", "Olmo2ForCausalLM"),
    _f("olmo3", "decoder-only", "Olmo3ForCausalLM", "sliding window 12: decoding crosses it", sliding_window=12,
       layer_types=["sliding_attention", "full_attention"]),
    _f("olmoe", "decoder-only", "OlmoeForCausalLM"),
    _f("deepseek_v3", "decoder-only", "DeepseekV3ForCausalLM", "multi-head latent attention, first layer dense",
       num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
       qk_head_dim=8, head_dim=4, n_routed_experts=4, n_group=1, topk_group=1, first_k_dense_replace=1,
       num_nextn_predict_layers=0),
    _f("deepseek_v2", "decoder-only", "DeepseekV2ForCausalLM", "multi-head latent attention, every layer MoE; ExecuTorch fails "
       "upstream: its complex-number RoPE's program does not load (docs/upstream-gaps.md #45)",
       num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
       head_dim=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2),
    _f("glm", "decoder-only", "GlmForCausalLM"),
    _f("glm4", "decoder-only", "Glm4ForCausalLM"),
    _f("glm4_moe", "decoder-only", "Glm4MoeForCausalLM", "MoE: 4 routed experts and a shared one, first layer dense",
       n_routed_experts=4, first_k_dense_replace=1, num_nextn_predict_layers=0),
    _f("helium", "decoder-only", "HeliumForCausalLM"),
    _f("granitemoe", "decoder-only", "GraniteMoeForCausalLM"),
    _f("exaone4", "decoder-only", "Exaone4ForCausalLM", "sliding window 12: decoding crosses it", sliding_window=12,
       layer_types=["sliding_attention", "full_attention"]),
    _f("ernie4_5", "decoder-only", "Ernie4_5ForCausalLM"),
    _f("ernie4_5_moe", "decoder-only", "Ernie4_5_MoeForCausalLM"),
    _f("arcee", "decoder-only", "ArceeForCausalLM"),
    _f("seed_oss", "decoder-only", "SeedOssForCausalLM"),
    _f("apertus", "decoder-only", "ApertusForCausalLM"),
    _f("gpt_neo", "decoder-only", "GPTNeoForCausalLM",
       "dynamo and ONNX fail upstream: its attention slices a fixed causal buffer by the key length, which bounds "
       "the prompt plus the cache (docs/upstream-gaps.md #35)", attention_types=[[["global", "local"], 1]],
       attention_layers=["global", "local"], window_size=12),
    _f("codegen", "decoder-only", "CodeGenForCausalLM", rotary_dim=4),
    # state-space: no attention, the recurrent state is the cache
    _f("mamba", "state-space", "MambaForCausalLM", state_size=8, time_step_rank=8, use_mambapy=False),
    _f("mamba2", "state-space", "Mamba2ForCausalLM", num_heads=4, head_dim=16, state_size=16, n_groups=1,
       time_step_rank=8, chunk_size=16),
    _f("falcon_mamba", "state-space", "FalconMambaForCausalLM", state_size=8, time_step_rank=8, use_mambapy=False),
    # recurrent: the state (RWKV's five per-layer tensors, xLSTM's matrix memory) is the cache, stepped like Mamba's
    _f("rwkv", "state-space", "RwkvForCausalLM", "RWKV-4: the state is a list of tensors (`state`)",
       attention_hidden_size=32, context_length=64, rescale_every=0),
    # xLSTM rounds its head dimensions up to multiples of 64 (its cache does, its layers do not): 64 wide
    _f("xlstm", "state-space", "xLSTMForCausalLM", "mLSTM blocks: the state is an xLSTMCache", hidden_size=64,
       embedding_dim=64, num_blocks=2, qk_dim_factor=1.0, chunk_size=16, autocast_kernel_dtype="float32",
       max_inference_chunksize=16),
    # hybrids: at least one attention layer and one state-space (or convolution) layer
    _f("falcon_h1", "hybrid", "FalconH1ForCausalLM", "attention and Mamba2 in parallel in every layer",
       mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
       projectors_bias=False),
    _f("jamba", "hybrid", "JambaForCausalLM", "layer 0 Mamba, layer 1 attention + MoE", attn_layer_period=2,
       attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
       use_mamba_kernels=False),
    _f("bamba", "hybrid", "BambaForCausalLM", "layer 0 Mamba2, layer 1 attention", attn_layer_indices=[1],
       mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16),
    _f("granitemoehybrid", "hybrid", "GraniteMoeHybridForCausalLM", "layer 0 Mamba2, layer 1 attention (Granite 4)",
       layer_types=["linear_attention", "full_attention"], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
       mamba_chunk_size=16),
    _f("zamba2", "hybrid", "Zamba2ForCausalLM", "layer 0 Mamba2, layer 1 shared attention + Mamba2",
       layers_block_type=["linear_attention", "hybrid"], hybrid_layer_ids=[1], mamba_d_state=16, n_mamba_heads=4,
       mamba_headdim=16, attention_hidden_size=64, attention_head_dim=16, kv_channels=8, num_query_groups=4,
       num_key_value_heads=4, adapter_rank=8, chunk_size=16, use_mamba_kernels=False),
    _f("lfm2", "hybrid", "Lfm2ForCausalLM", "layer 0 short convolution, layer 1 attention",
       layer_types=["conv", "full_attention"], full_attn_idxs=[1], block_multiple_of=32),
    _f("nemotron_h", "hybrid", "NemotronHForCausalLM", "layer 0 Mamba2, layer 1 attention",
       layer_types=["linear_attention", "full_attention"], ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=16,
       n_groups=1, chunk_size=16, use_mamba_kernels=False),
    _f("qwen3_next", "hybrid", "Qwen3NextForCausalLM", "layer 0 gated DeltaNet, layer 1 gated attention; MoE",
       layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8, linear_value_head_dim=8,
       linear_num_key_heads=2, linear_num_value_heads=4, shared_expert_intermediate_size=32),
    # encoders
    _f("bert", "encoder", "BertModel"),
    _f("roberta", "encoder", "RobertaModel"),
    _f("distilbert", "encoder", "DistilBertModel", dim=32, hidden_dim=64, n_layers=2, n_heads=4),
    _f("albert", "encoder", "AlbertModel", embedding_size=16),
    _f("electra", "encoder", "ElectraModel", embedding_size=16),
    _f("deberta_v2", "encoder", "DebertaV2Model"),
    _f("xlm_roberta", "encoder", "XLMRobertaModel"),
    _f("mpnet", "encoder", "MPNetModel"),
    _f("modernbert", "encoder", "ModernBertModel", global_attn_every_n_layers=2, local_attention=16),
    # vision
    _f("vit", "vision", "ViTModel", **VISION),
    _f("deit", "vision", "DeiTModel", **VISION),
    _f("beit", "vision", "BeitModel", **VISION),
    _f("dinov2", "vision", "Dinov2Model", **VISION),
    _f("convnext", "vision", "ConvNextModel", num_stages=4, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=32),
    _f("resnet", "vision", "ResNetModel", embedding_size=16, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1]),
    _f("swin", "vision", "SwinModel", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
       window_size=4),
    _f("dinov3_vit", "vision", "DINOv3ViTModel", **VISION),
    _f("mobilevit", "vision", "MobileViTModel", image_size=32, patch_size=2, hidden_sizes=[16, 24, 32],
       neck_hidden_sizes=[8, 16, 16, 24, 24, 32, 64], aspp_out_channels=32),
    _f("segformer", "vision", "SegformerModel",
       "dynamo fails upstream: torch.export's constraint solver (`DimConstraints.solve`, sympy's "
       "solve_univariate_inequality) raises NotImplementedError on the floor-division guard of the image size after "
       "the patch embedding and the sequence reduction, where it should report the specialization "
       "(docs/upstream-gaps.md #54: reproduced with one stage of plain modules)", hidden_sizes=[8, 16, 24, 32],
       depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=32),
    _f("levit", "vision", "LevitModel", image_size=64, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
       depths=[1, 1, 1], key_dim=[8, 8, 8]),
    # hidden_dim must equal the top convolution's width, round_filters(1280) = 1280 x width_coefficient
    _f("efficientnet", "vision", "EfficientNetModel", image_size=32, width_coefficient=0.1, depth_coefficient=0.25,
       hidden_dim=128),
    _f("regnet", "vision", "RegNetModel",
       "its weights drawn at std 0.3, not the matrix's 0.5: at 0.5 its BatchNorms at init (running mean 0, "
       "variance 1) pass activations of ~1900 through, and float32 cancellation left outputs near zero off in eager "
       "float32 itself (5.6e-3 from float64), beyond dynamo's and ONNX's atol (1e-5, 1e-4): the test model's "
       "conditioning, not the graph; at 0.3 its outputs reach ~10 and eager float32 is 2e-6 from float64",
       weight_std=0.3, embedding_size=16, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], groups_width=8),
    # audio / speech
    _f("wav2vec2", "audio", "Wav2Vec2Model", **AUDIO_CONV),
    _f("hubert", "audio", "HubertModel", **AUDIO_CONV),
    _f("wavlm", "audio", "WavLMModel", **AUDIO_CONV, num_buckets=32, max_bucket_distance=64),
    _f("data2vec_audio", "audio", "Data2VecAudioModel", **AUDIO_CONV),
    _f("wav2vec2_bert", "audio", "Wav2Vec2BertModel", "160-wide features: 80 mel bins, two frames stacked",
       conv_depthwise_kernel_size=3, output_hidden_size=32),
    _f("audio_spectrogram_transformer", "audio", "ASTModel", num_mel_bins=16, max_length=64, patch_size=8,
       frequency_stride=8, time_stride=8),
    _f("whisper", "audio", "WhisperForConditionalGeneration", "speech encoder-decoder", num_mel_bins=16,
       max_source_positions=32, max_target_positions=64, suppress_tokens=None, begin_suppress_tokens=None),
    _f("moonshine", "audio", "MoonshineForConditionalGeneration", "speech encoder-decoder on raw waveforms",
       encoder_num_hidden_layers=1, decoder_num_hidden_layers=1, encoder_num_attention_heads=4,
       decoder_num_attention_heads=4, encoder_num_key_value_heads=4, decoder_num_key_value_heads=4,
       max_position_embeddings=64),
    _f("speech_to_text", "audio", "Speech2TextForConditionalGeneration", "speech encoder-decoder on filter banks",
       conv_channels=32, input_feat_per_channel=16, max_source_positions=64, max_target_positions=64),
    # max_speech_positions left at its default (4000 frames): a sinusoidal table shorter than the waveform's frames
    # grows in eager forward, and torch.export freezes the grown table at the traced length (no longer samples run)
    _f("speecht5", "audio", "SpeechT5ForSpeechToText", "speech encoder-decoder on raw waveforms", **AUDIO_CONV,
       encoder_max_relative_position=16, max_text_positions=64),
    # encoder-decoder
    _f("t5", "encoder-decoder", "T5ForConditionalGeneration", decoder_start_token_id=0),
    _f("bart", "encoder-decoder", "BartForConditionalGeneration"),
    _f("mbart", "encoder-decoder", "MBartForConditionalGeneration"),
    _f("marian", "encoder-decoder", "MarianMTModel", decoder_vocab_size=VOCAB),
    _f("pegasus", "encoder-decoder", "PegasusForConditionalGeneration"),
    _f("m2m_100", "encoder-decoder", "M2M100ForConditionalGeneration"),
    _f("mt5", "encoder-decoder", "MT5ForConditionalGeneration", decoder_start_token_id=0),
    _f("t5gemma", "encoder-decoder", "T5GemmaForConditionalGeneration", "sliding window 12: decoding crosses it",
       encoder__sliding_window=12, decoder__sliding_window=12, decoder__cross_attention_hidden_size=32,
       tie_word_embeddings=False),  # tied narrow embeddings: greedy decoding repeats the start token
    # vision-language
    _f("llava", "vision-language", "LlavaForConditionalGeneration",
       tokenizer=("<image>", "image_token_index"), vision_config__image_size=32, vision_config__patch_size=8,
       image_seq_length=16),
    _f("idefics3", "vision-language", "Idefics3ForConditionalGeneration",
       tokenizer=("<image>", "image_token_id"), vision_config__image_size=32,
       vision_config__patch_size=8),
    _f("smolvlm", "vision-language", "SmolVLMForConditionalGeneration",
       tokenizer=("<image>", "image_token_id"), vision_config__image_size=32,
       vision_config__patch_size=8),
    _f("paligemma", "vision-language", "PaliGemmaForConditionalGeneration",
       tokenizer=("<image>", "image_token_index"), vision_config__image_size=32,
       vision_config__patch_size=8),
    _f("gemma3", "vision-language", "Gemma3ForConditionalGeneration",
       tokenizer=(("<image_soft_token>", "image_token_index"), ("<start_of_image>", "boi_token_index"),
                  ("<end_of_image>", "eoi_token_index")), vision_config__image_size=32,
       vision_config__patch_size=8, mm_tokens_per_image=4, text_config__sliding_window=12,
       text_config__layer_types=["sliding_attention", "full_attention"]),
    _f("qwen2_vl", "vision-language", "Qwen2VLForConditionalGeneration",
       tokenizer=QWEN_VL_TOKENS, vision_config__patch_size=8,
       text_config__rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]}),
    _f("qwen2_5_vl", "vision-language", "Qwen2_5_VLForConditionalGeneration",
       tokenizer=QWEN_VL_TOKENS, vision_config__patch_size=8,
       vision_config__out_hidden_size=32, vision_config__fullatt_block_indexes=[0], vision_config__window_size=16,
       text_config__rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]}),
    _f("llava_next", "vision-language", "LlavaNextForConditionalGeneration",
       tokenizer=("<image>", "image_token_index"), vision_config__image_size=32,
       vision_config__patch_size=8, image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]], image_seq_length=16),
    _f("llava_onevision", "vision-language", "LlavaOnevisionForConditionalGeneration",
       tokenizer=(("<image>", "image_token_index"), ("<video>", "video_token_index")), vision_config__image_size=32,
       vision_config__patch_size=8, image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]]),
    _f("mllama", "vision-language", "MllamaForConditionalGeneration",
       "layer 1 cross-attends to the image; inputs as its processor makes them, from the config",
       tokenizer=("<|image|>", "image_token_index"),
       vision_config__image_size=32, vision_config__patch_size=8, vision_config__attention_heads=4,
       vision_config__num_global_layers=1, vision_config__intermediate_layers_indices=[0],
       vision_config__vision_output_dim=64, text_config__cross_attention_layers=[1]),
    _f("internvl", "vision-language", "InternVLForConditionalGeneration",
       tokenizer=("<IMG_CONTEXT>", "image_token_id"), vision_config__image_size=[32, 32],
       vision_config__patch_size=[8, 8], image_seq_length=4),
    _f("mistral3", "vision-language", "Mistral3ForConditionalGeneration",
       "Pixtral vision tower; ONNX image_encoder: eager float32's own rounding (the random tower's states grow to ~100) "
       "fails the check, arbitrated in float64 (the graph is within tolerance of float64)",
       tokenizer=(("[IMG]", "image_token_index"), ("[IMG_BREAK]", None), ("[IMG_END]", None)),
       vision_config__image_size=32, vision_config__patch_size=8),
    _f("qwen3_vl", "vision-language", "Qwen3VLForConditionalGeneration",
       tokenizer=QWEN_VL_TOKENS, vision_config__patch_size=8,
       vision_config__out_hidden_size=32, vision_config__deepstack_visual_indexes=[0],
       text_config__rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [1, 1, 2],
                                     "mrope_interleaved": True}),
    _f("idefics2", "vision-language", "Idefics2ForConditionalGeneration",
       tokenizer=("<image>", "image_token_id"), vision_config__image_size=32,
       vision_config__patch_size=8, perceiver_config__resampler_n_heads=4, perceiver_config__resampler_head_dim=8,
       perceiver_config__resampler_n_latents=4, perceiver_config__resampler_depth=1),
    _f("aya_vision", "vision-language", "AyaVisionForConditionalGeneration",
       tokenizer=("<|IMG_PATCH|>", "image_token_index"), vision_config__image_size=32,
       vision_config__patch_size=8, text_config__sliding_window=12,
       text_config__layer_types=["sliding_attention", "full_attention"]),
    # audio-language: the audio encoder and projector exported as stages (Voxtral, Qwen2-Audio); a family whose audio
    # stages are not exported is refused, never passed on the language model alone; Granite Speech: its Conformer
    # encoder and Q-Former projector (`model.encoder`, `model.projector`)
    _f("voxtral", "audio-language", "VoxtralForConditionalGeneration",
       "audio encoder + projector + language model, from log-mel features; a byte-level BPE tokenizer, for the "
       "MultimodalRunner's proof", tokenizer=("[AUDIO]", "audio_token_id"),
       audio_config__num_mel_bins=16, audio_config__max_source_positions=32),
    _f("qwen2_audio", "audio-language", "Qwen2AudioForConditionalGeneration",
       "audio encoder + projector + language model; a feature mask; a byte-level BPE tokenizer, for the "
       "MultimodalRunner's proof", tokenizer=("<|AUDIO|>", "audio_token_index"),
       audio_config__num_mel_bins=16,
       audio_config__max_source_positions=32),
    _f("granite_speech", "audio-language", "GraniteSpeechForConditionalGeneration",
       "Conformer speech encoder + Q-Former projector + language model, from stacked log-mel features; a byte-level "
       "BPE tokenizer, for the MultimodalRunner's proof", tokenizer=("<|audio|>", "audio_token_index"),
       has_lora_adapter=False, projector_config__encoder_hidden_size=32),
    # Phi-4-multimodal hears and sees (a Conformer speech encoder and a SigLIP image tower beside a Phi-3 decoder, no
    # `text_config`): refused, naming the image and audio stages it does not export (exporters/capture/modalities.py)
    _f("phi4_multimodal", "audio-language", "Phi4MultimodalForCausalLM",
       "hears and sees (Conformer speech encoder, SigLIP image tower with 448-pixel HD crops, Phi-3 decoder): every "
       "target is refused, its image and audio stages are not exported; ONNX Runtime GenAI's phi4mm runs only its "
       "builder's graphs of Microsoft's remote-code checkpoint, with image token 200010 and 448-pixel crops "
       "hard-coded (exporters/layouts/genai/phi4mm.py)",
       audio_config__num_blocks=1, audio_config__nemo_conv_channels=32, audio_config__ext_pw_out_channel=32,
       audio_config__depthwise_separable_out_channel=32),
    # dual encoders
    _f("clip", "dual-encoder", "CLIPModel", vision_config__image_size=32, vision_config__patch_size=8),
    _f("siglip", "dual-encoder", "SiglipModel", vision_config__image_size=32, vision_config__patch_size=8),
    _f("siglip2", "dual-encoder", "Siglip2Model", "NaFlex: patches, pixel mask and spatial shapes",
       vision_config__patch_size=8, vision_config__num_patches=16),
]
FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in _SPECS}


def _token_attributes(config) -> list[str]:
    names = set(vars(config)) | {n for n in dir(type(config)) if not n.startswith("_")}
    return sorted(n for n in names if n.endswith(("_token_id", "_token_index", "_token_ids")))


def shrink(config, overrides: dict[str, Any] | None = None, vocab: int = VOCAB):
    """A copy of `config` (and its sub-configs) at tiny sizes, every special token id inside the vocabulary, then
    `overrides` (dotted paths) applied."""
    from transformers import PreTrainedConfig

    config = copy.deepcopy(config)
    free = iter(range(vocab - 1, vocab // 2, -1))
    moved: dict[int, int] = {}

    def inside(value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value >= vocab - 16:
            if value not in moved:
                moved[value] = next(free)
            return moved[value]
        if isinstance(value, list):
            return [inside(v) for v in value]
        return value

    def visit(node) -> None:
        for key, value in SIZES.items():
            if isinstance(getattr(node, key, None), int) and not isinstance(getattr(node, key), bool):
                try:
                    setattr(node, key, value)
                except AttributeError:  # a derived property (Falcon's head_dim): follows the sizes set
                    continue
        layers = getattr(node, "num_hidden_layers", None)
        for key in ("layer_types", "mlp_layer_types"):
            if isinstance(getattr(node, key, None), list) and isinstance(layers, int):
                try:
                    setattr(node, key, getattr(node, key)[:layers])
                except AttributeError:  # derived from other settings (Mamba, Jamba): follows the layers set
                    continue
        if isinstance(getattr(node, "vocab_size", None), int):
            node.vocab_size = vocab
        for key in _token_attributes(node):
            try:
                value = getattr(node, key)
                new = inside(value)
                if new != value:
                    setattr(node, key, new)
            except Exception:  # noqa: S112 - deprecated aliases that refuse to be read or set
                continue
        for name in getattr(node, "sub_configs", None) or {}:
            sub = getattr(node, name, None)
            if isinstance(sub, PreTrainedConfig):
                visit(sub)

    visit(config)
    for path, value in (overrides or {}).items():
        node = config
        *parents, last = path.split(".")
        for parent in parents:
            node = getattr(node, parent)
        setattr(node, last, copy.deepcopy(value))
    if hasattr(config, "stage_names"):  # a backbone: its stage names and outputs follow from the (new) depth
        derived = ("stage_names", "out_features", "out_indices", "_out_features", "_out_indices")
        config = type(config)(**{k: v for k, v in config.to_dict().items() if k not in derived})
    return config


def tiny_model(spec: FamilySpec, seed: int = 0):
    """The family's tiny random-weight model (eval mode), weights drawn wide enough that greedy decoding varies."""
    import torch
    import transformers

    model_class = getattr(transformers, spec.model_class)
    # a model built to its tokenizer's vocabulary (`build`) moves its special token ids inside that one (a
    # multimodal model's: its text model's vocabulary, `text_config.vocab_size`)
    vocab = spec.overrides.get("vocab_size", spec.overrides.get("text_config.vocab_size", VOCAB))
    config = shrink(model_class.config_class(), spec.overrides, vocab=vocab)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    # The default init (std 0.02) makes tiny generators repeat one token, and parity could not fail: the layers are
    # drawn wide, the token embeddings narrow (with tied embeddings, wide ones make the model echo its input).
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()} if _has_embeddings(model) else set()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1 and "norm" not in name:
                parameter.normal_(0, 0.02 if id(parameter) in embeddings else spec.weight_std)
    return model


def _has_embeddings(model) -> bool:
    try:
        return model.get_input_embeddings() is not None
    except (NotImplementedError, AttributeError):
        return False


def build(spec: FamilySpec, folder: Path, seed: int = 0, recipe: Any = None) -> Path:
    """Save the family's tiny model (and `recipe` as export_config.json) to `folder`, with its tokenizer where the
    family has one (`spec.tokenizer`: `matrix.tokenizer.with_tokenizer`)."""
    import dataclasses
    import json

    if spec.tokenizer is not None:
        import transformers

        from matrix.tokenizer import with_tokenizer  # tokenizers' trainer: only for the families that need it

        config_class = getattr(transformers, spec.model_class).config_class
        text = "text_config." if "text_config" in (getattr(config_class, "sub_configs", None) or {}) else ""
        spec = dataclasses.replace(spec, overrides=with_tokenizer(folder, spec.tokenizer, spec.overrides, text))
    model = tiny_model(spec, seed)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        text = model.config.get_text_config()
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
            value = getattr(model.config, name, None)
            if value is None:
                value = getattr(text, name, None)
            if value is not None:
                setattr(model.generation_config, name, value)
    model.save_pretrained(folder)
    if recipe is not None:
        (Path(folder) / "export_config.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return Path(folder)

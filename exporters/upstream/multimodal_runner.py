"""ExecuTorch's `MultimodalRunner` program (part of the adapter to upstream): a vision-language or audio-language
model as one `.pte` with the three methods the runner calls, the KV cache inside `text_decoder` as for the text runner
(`exporters.upstream.llm_runner`: transformers' static-cache wrapper, executorch's custom SDPA and cache ops, XNNPACK),
and the runner's constant metadata methods.

```
model ──► multimodal_modules ──► export_multimodal_program ──► one .pte
          token_embedding(tokens int64[1, seq]) -> embeddings [1, seq, hidden]          seq dynamic
          vision_encoder(pixel_values float[1, 3, H, W]) -> image embeddings [1, n, hidden]  the processor's pixels
            (Idefics3, SmolVLM: one image or tile, its position ids a constant: `exporters.upstream.idefics_image`;
            LLaVA-NeXT, LLaVA-OneVision: one image of one fixed size, its image_sizes baked in, its tiles stacked
            [1, 3, tiles x h, w]: `exporters.upstream.fixed_image`)
          or audio_encoder(input_features float[1, mel bins, frames]) -> audio embeddings [1, n, hidden]
          text_decoder(embeddings [1, seq, hidden], cache_position int64[seq]) -> logits    the cache inside
          get_max_seq_len, get_max_context_len, get_eos_ids, get_bos_id, ... (constants.h), vision_token_id
          Gemma 3 (`marked`): token_embedding and vision_encoder -> [1, n, hidden + 1], the last channel marking an
          image's rows, which text_decoder attends both ways ([`MarkedTextDecoder`])
          sliding-window layers shorter than the cache: ring buffers of 2 x window slots, as the LLM runner's
          (`llm_runner.ring_update`), text_decoder's seq at most the window (get_max_seq_len)
```

The runner (extension/llm/runner/multimodal_prefiller.cpp) embeds each text input with `token_embedding`, each image
with `vision_encoder` (its input dtype picks what it accepts: float here, the processor's normalized `CHW` pixels,
not raw `uint8` `HWC`), each audio with `audio_encoder` (`make_audio_input`: the extractor's float log-mel
features `[batch, bins, frames]`, as optimum-executorch's Voxtral program takes them), and runs `text_decoder`
on each result at the next cache positions; decoding feeds each new token through `token_embedding` and
`text_decoder`. A LLaVA-style model's own forward does the same (image features in place of the image tokens;
Voxtral's audio embeddings in place of its audio tokens), so the runner's tokens are eager `generate()`'s.

Granite Speech's audio encoder traced with its frames dynamic (transformers.js's layout) computes its Conformer and
projector in sizes a trace keeps symbolic ([`granite_speech_frames_dynamic`]).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers.exporters.metadata import ExportMetadata
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

from exporters.upstream.beyond import _external_constants, _tag_delegate_weights, xnnpack_lowering
from exporters.upstream.fixed_image import FixedSizeImageEncoder
from exporters.upstream.idefics_image import OneImageEncoder, takes_pixel_mask
from exporters.upstream.internals import cache_layers_through_buffers
from exporters.upstream.llm_runner import (
    _static_generation_config,
    custom_ops_installed,
    drop_embedding_padding_idx,
    max_seq_len,
    quantize_runner_graph,
)
from exporters.upstream.patches import patched, patched_item
from exporters.upstream.xnnpack_passes import quant_fusion_only_with_quantized_ops

# The runner's method names (extension/llm/runner/constants.h)
TOKEN_EMBEDDING, VISION_ENCODER, TEXT_DECODER = "token_embedding", "vision_encoder", "text_decoder"
AUDIO_ENCODER = "audio_encoder"
METHODS = (TOKEN_EMBEDDING, VISION_ENCODER, TEXT_DECODER)
AUDIO_METHODS = (TOKEN_EMBEDDING, AUDIO_ENCODER, TEXT_DECODER)


class TokenEmbedding(torch.nn.Module):
    """`token_embedding(input_ids [1, seq]) -> [1, seq, hidden]`: the model's own input embedding (with its scale)."""

    def __init__(self, embedding: torch.nn.Module):
        super().__init__()
        self.embedding = embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids)


class VisionEncoder(torch.nn.Module):
    """`vision_encoder(pixel_values [1, 3, H, W]) -> [1, image tokens, hidden]`: the model's `get_image_features`
    (vision tower, feature selection, projector), the features of the one image as one sequence."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.model.get_image_features(pixel_values=pixel_values)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output object
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), dim=0)
        return features.reshape(1, -1, features.shape[-1])


class AudioEncoder(torch.nn.Module):
    """`audio_encoder(input_features [batch, mel bins, frames]) -> [1, audio tokens, hidden]`: the model's
    `get_audio_features` (audio tower, frame stacking, projector), every chunk's embeddings as one sequence, as
    optimum-executorch's Voxtral `audio_encoder`; a model without it (Qwen2-Audio) its `audio_tower` then its
    `multi_modal_projector`, on features whose every frame counts (the runner's audio carries no feature mask)."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        if callable(getattr(self.model, "get_audio_features", None)):
            features = self.model.get_audio_features(input_features)
        else:
            inner = getattr(self.model, "model", self.model)
            features = inner.multi_modal_projector(inner.audio_tower(input_features).last_hidden_state)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output object
        return features.reshape(1, -1, features.shape[-1])


def audio_chunks_dim(encoder: torch.nn.Module, inputs: dict[str, torch.Tensor],
                     max_cache_len: int) -> dict[str, dict[int, Any]] | None:
    """`audio_encoder`'s dynamic shapes: where it is traced on two chunks or more (Voxtral:
    `exporters.capture.multimodal_runner.chunked_audio`), the chunk axis of its features, up to as many chunks as
    their audio tokens fit the cache (the runner's audio is `[chunks, bins, frames]`); else None (fixed)."""
    features = inputs["input_features"]
    if features.shape[0] < 2:
        return None
    per_chunk = int(encoder(**inputs).shape[1]) // int(features.shape[0])
    most = max(int(features.shape[0]), (max_cache_len - 1) // max(per_chunk, 1))
    return {"input_features": {0: torch.export.Dim("audio_chunks", min=1, max=most)}}


def audio_stages(model: Any) -> bool:
    """Whether [`AudioEncoder`] can run `model`'s audio stages: its own `get_audio_features` (Voxtral, Granite
    Speech), or an `audio_tower` and a `multi_modal_projector` (Qwen2-Audio).

    Example:
        >>> audio_stages(torch.nn.Linear(2, 2))
        False
    """
    if callable(getattr(model, "get_audio_features", None)):
        return True
    inner = getattr(model, "model", model)
    return all(isinstance(getattr(inner, name, None), torch.nn.Module)
               for name in ("audio_tower", "multi_modal_projector"))


def methods_of(model: Any) -> tuple[str, ...]:
    """The runner's methods for `model`: `audio_encoder` for an audio-language model (no `vision_config`, and an
    `audio_config` or the model's own `get_audio_features`: Granite Speech), else `vision_encoder`."""
    config = model.config
    hears = getattr(config, "audio_config", None) is not None or callable(getattr(model, "get_audio_features", None))
    audio = hears and getattr(config, "vision_config", None) is None
    return AUDIO_METHODS if audio else METHODS


class TextDecoder(torch.nn.Module):
    """`text_decoder(inputs_embeds [1, seq, hidden], cache_position [seq]) -> {"logits": [1, seq, vocab]}` around
    transformers' static-cache wrapper (its `wrapper`, as `llm_runner.RunnerProgram`'s, so the same custom ops swap
    in); the cache is the wrapper's buffers. `max_seq_len`: the most positions one call takes (a ring-buffer
    layer's window, `llm_runner.max_seq_len`; the runner's text inputs and each image no longer)."""

    def __init__(self, wrapper: torch.nn.Module, max_cache_len: int, max_seq_len: int | None = None):
        super().__init__()
        self.wrapper, self.max_cache_len = wrapper, max_cache_len
        self.max_seq_len = max_seq_len or max_cache_len - 1

    def forward(self, inputs_embeds: torch.Tensor, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        # named, as the LLM runner's program's: a quantized program's logits are judged as logits (top-1, KL)
        return {"logits": self.wrapper(inputs_embeds=inputs_embeds, cache_position=cache_position)}


def _marked(rows: torch.Tensor, mark: float) -> torch.Tensor:
    return torch.cat([rows, torch.full_like(rows[..., :1], mark)], dim=-1)


class MarkedTokenEmbedding(TokenEmbedding):
    """`token_embedding` with one channel more, 0 in every row: text (read by [`MarkedTextDecoder`])."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return _marked(super().forward(input_ids), 0.0)


class MarkedVisionEncoder(VisionEncoder):
    """`vision_encoder` with one channel more, 1 in every row: an image's (read by [`MarkedTextDecoder`])."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return _marked(super().forward(pixel_values), 1.0)


class MarkedTextDecoder(TextDecoder):
    """`text_decoder(inputs_embeds [1, seq, hidden + 1], cache_position [seq])` of a model whose prefill attends
    bidirectionally among one image's tokens (Gemma 3): the last channel marks the image's rows (1, else 0); a
    query attends to every earlier position and, on an image's row, to the image's rows of the same call. The
    runner prefills each image as one call of its own (extension/llm/runner/multimodal_prefiller.cpp), so this is
    transformers' mask (one block per image, from `token_type_ids`) wherever the runner feeds it; text and decoding
    stay causal. The mask goes to the model as its per-layer-type mapping (transformers uses a given mapping as it
    is), and to executorch's `custom_sdpa` as an explicit mask (`llm_runner.custom_ops_installed`). A sliding-window
    layer's mask keeps the keys within its window (transformers' sliding mask or the image's block: one call holds
    the whole image, no longer than the window); in a ring buffer it is gathered at the slots' positions
    (`llm_runner.ring_mask`)."""

    def forward(self, inputs_embeds: torch.Tensor, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        embeds, image = inputs_embeds[..., :-1], inputs_embeds[0, :, -1] > 0.5
        cache = self.wrapper.static_cache
        for layer in cache.layers:  # as the wrapper's own forward: the cache resumes at the call's first position
            layer.cumulative_length.copy_(cache_position[0])
        keys = torch.arange(self.max_cache_len, device=embeds.device)
        offset = keys - cache_position[0]
        inside = (offset >= 0) & (offset < embeds.shape[1])
        image_key = image[offset.clamp(0, embeds.shape[1] - 1)] & inside
        allowed = (keys[None, :] <= cache_position[:, None]) | (image[:, None] & image_key[None, :])
        text = self.wrapper.model.config.get_text_config()
        window = getattr(text, "sliding_window", None) or self.max_cache_len
        masks = {}
        for kind in set(getattr(text, "layer_types", None) or ["full_attention"]):
            seen = allowed & (cache_position[:, None] - keys[None, :] < window) if kind == "sliding_attention" \
                else allowed
            masks[kind] = torch.where(seen, 0.0, float("-inf")).to(embeds.dtype)[None, None]
        out = self.wrapper.model(inputs_embeds=embeds, attention_mask=masks, cache=cache, use_cache=True)
        return {"logits": out.logits}


def multimodal_modules(model: Any, max_cache_len: int, marked: bool = False,
                       image_sizes: tuple[list[list[int]], int, Any] | None = None) -> dict[str, torch.nn.Module]:
    """The runner's three methods as eager modules, in the order the runner calls them. `marked`: the image's rows
    marked for a bidirectional prefill ([`MarkedTextDecoder`]). `image_sizes`: the one image's `image_sizes`, its
    number of tiles and a Pixtral tower's span (or None), baked into `vision_encoder` (LLaVA-NeXT, Mistral 3:
    `exporters.upstream.fixed_image`).

    Example:
        >>> sorted(multimodal_modules(llava, 64))  # doctest: +SKIP
        ['text_decoder', 'token_embedding', 'vision_encoder']
    """
    with _static_generation_config(model, max_cache_len):
        wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache_len)
    seq = max_seq_len(model, max_cache_len)  # a ring-buffer layer's window: at most that many positions a call
    encoder: torch.nn.Module = AudioEncoder(model) if AUDIO_ENCODER in methods_of(model) else VisionEncoder(model)
    if takes_pixel_mask(model):  # Idefics3, SmolVLM: one full image, its mask of ones the model's own
        encoder = OneImageEncoder(model)
    if image_sizes is not None:  # one image of one fixed size, its tiles stacked
        encoder = FixedSizeImageEncoder(model, *image_sizes)
    embedding: torch.nn.Module = TokenEmbedding(model.get_input_embeddings())
    decoder: torch.nn.Module = TextDecoder(wrapper, max_cache_len, seq)
    if marked:  # a vision-language model (an audio one has no bidirectional prefill here)
        embedding, encoder = MarkedTokenEmbedding(model.get_input_embeddings()), MarkedVisionEncoder(model)
        decoder = MarkedTextDecoder(wrapper, max_cache_len, seq)
    return {TOKEN_EMBEDDING: embedding.eval(), methods_of(model)[1]: encoder.eval(), TEXT_DECODER: decoder.eval()}


@contextlib.contextmanager
def text_attention_as_custom_sdpa(model: Any) -> Iterator[None]:
    """`custom_ops_installed` sets the attention of the model's top config; a vision-language model's text layers
    read their own (`text_config`), set here while the decoder is traced (the vision tower keeps its own)."""
    text = model.config.get_text_config()
    with patched(text, "_attn_implementation", "custom_sdpa") if text is not model.config \
            else contextlib.nullcontext():
        yield


def export_multimodal_program(modules: dict[str, torch.nn.Module], model: Any, inputs: dict[str, dict[str, Any]], *,
                              max_cache_len: int, custom_ops: bool, metadata: dict[str, Any],
                              external_weights: str | None = None, quantizer: Any = None
                              ) -> tuple[Any, dict[str, Any], int]:
    """Export the three methods and lower them, XNNPACK, into one program with `metadata` as constant methods.
    `inputs`: each method's traced inputs; `seq` is dynamic up to `max_cache_len - 1` for `token_embedding` and
    up to the decoder's `max_seq_len` for `text_decoder` (a sliding-window layer's window where it is held in a ring
    buffer of twice its window: `llm_runner.ring_update`), the image (or audio) fixed at its traced size (Voxtral's audio: any number of chunks,
    [`audio_chunks_dim`]). `text_decoder` is traced strict (as the text runner's), with
    executorch's custom SDPA and cache ops when `custom_ops`. `external_weights`: the tag of a `.ptd` every weight
    goes to (None: inside the `.pte`). `quantizer`: upstream's `PT2EQuantizer` of `text_decoder`'s graph
    (`llm_runner.quantize_runner_graph`; None: the model as it is, float or quantized by torchao beforehand). An
    embedding table torchao quantized is fused into ExecuTorch's quantized embedding kernel
    (`llm_runner.drop_embedding_padding_idx`).

    Returns `(ExecutorchProgramManager, {method: ExportMetadata}, number of custom-op nodes)`."""
    # executorch loads only where a program is lowered (seconds, native memory)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # deferred: heavy
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower  # heavy
    from executorch.exir.passes import MemoryPlanningPass  # deferred: heavy

    seq = torch.export.Dim("seq_length_dim", max=max_cache_len - 1)
    # text_decoder: at most `max_seq_len` positions a call (a ring-buffer layer's window)
    call = torch.export.Dim("seq_length_dim", max=getattr(modules[TEXT_DECODER], "max_seq_len", max_cache_len - 1))
    shapes = {TOKEN_EMBEDDING: {"input_ids": {1: seq}}, TEXT_DECODER: {"inputs_embeds": {1: call},
                                                                       "cache_position": {0: call}}}
    programs: dict[str, torch.export.ExportedProgram] = {}
    with torch.no_grad():
        if AUDIO_ENCODER in modules:
            shapes[AUDIO_ENCODER] = audio_chunks_dim(modules[AUDIO_ENCODER], inputs[AUDIO_ENCODER], max_cache_len)
        for name in (n for n in modules if n != TEXT_DECODER):  # the token embedding and the modality's encoder
            programs[name] = torch.export.export(modules[name], (), dict(inputs[name]),
                                                 dynamic_shapes=shapes.get(name), strict=False)
        decoder, kwargs = modules[TEXT_DECODER], dict(inputs[TEXT_DECODER])
        stack = contextlib.ExitStack()
        with stack:
            if custom_ops:
                stack.enter_context(custom_ops_installed(decoder, model,
                                                         explicit_mask=isinstance(decoder, MarkedTextDecoder)))
                stack.enter_context(text_attention_as_custom_sdpa(model))
            with cache_layers_through_buffers(decoder.wrapper):  # non-strict: a third of strict's CPU
                exported = torch.export.export(decoder, (), kwargs, dynamic_shapes=shapes[TEXT_DECODER], strict=False)
            if custom_ops:
                # executorch's LLM export passes: loaded only when custom ops are asked for
                from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes

                module = RemoveRedundantTransposes()(exported.module())[0]
                exported = torch.export.export(module, (), kwargs, dynamic_shapes=shapes[TEXT_DECODER], strict=False)
        if quantizer is not None:
            exported = quantize_runner_graph(exported, quantizer, kwargs, shapes[TEXT_DECODER])
        programs[TEXT_DECODER] = exported
    records = {name: _record(model, program, inputs[name]) for name, program in programs.items()}
    custom_nodes = sum(1 for n in exported.graph.nodes if n.op == "call_function" and "llama." in str(n.target))
    backend_config = ExecutorchBackendConfig(
        extract_delegate_segments=True,
        # the cache (text_decoder's mutable buffers) in an arena of its own: ExecuTorch's Python runtime shares one
        # set of arenas among a program's host methods, where token_embedding's values would overwrite it
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=True),
        do_quant_fusion_and_const_prop=True,
    )
    if external_weights is not None:
        for program in programs.values():
            _tag_delegate_weights(program, external_weights)
        backend_config = _external_constants(backend_config, external_weights)
    with propagated_constants_named_once():
        with xnnpack_lowering():
            edge = to_edge_transform_and_lower(
                programs, partitioner=[XnnpackPartitioner()] if quantizer is None
                else [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()],
                compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
                constant_methods=metadata, transform_passes=[drop_embedding_padding_idx],
            )
        with quant_fusion_only_with_quantized_ops():
            return edge.to_executorch(config=backend_config), records, custom_nodes


@contextlib.contextmanager
def propagated_constants_named_once() -> Iterator[None]:
    """While a program of several methods is lowered, each constant ExecuTorch's constant propagation makes gets a
    name no other method's has.

    The pass names them `_prop_tensor_constant<N>` from each method's own count, so two methods can each hold a
    different tensor by one name; in the `.pte` each method's constants are its own, but the named-data file (`.ptd`)
    is keyed by name across methods, and the method whose tensor lost does not load (Granite Speech's
    `audio_encoder`: "Scalar type mismatch. Expected 6, got 4": the decoder's int64 constant under its float one's
    name; docs/upstream-gaps.md #51). Here the names issued to earlier methods count as taken.

    Example:
        >>> with propagated_constants_named_once():  # doctest: +SKIP
        ...     edge.to_executorch(config=external_constants)
    """
    module = importlib.import_module("executorch.exir.passes.constant_prop_pass")  # heavy: loaded when lowering
    original = module.replace_with_constant_node
    issued: set[str] = set()

    def replace_with_constant_node(node: Any, tensor: torch.Tensor, first_user_input: Any, fake_mode: Any,
                                   program: Any) -> tuple[Any, str]:
        with contextlib.ExitStack() as stack:
            for taken in issued - set(program.constants):  # held by another method: the pass names past these
                stack.enter_context(patched_item(program.constants, taken, tensor))
            placeholder, name = original(node, tensor, first_user_input, fake_mode, program)
        issued.add(name)
        return placeholder, name

    with patched(module, "replace_with_constant_node", replace_with_constant_node):
        yield


def _record(model: Any, program: torch.export.ExportedProgram, kwargs: dict[str, Any]) -> ExportMetadata:
    """Upstream's metadata of one method (its inputs and the call specs the loader binds them with)."""
    return ExportMetadata(
        architecture=type(model).__name__, export_dtype=str(model.dtype).removeprefix("torch."), export_device="cpu",
        kwargs={name: {"type": "tensor", "dtype": str(t.dtype), "shape": list(t.shape)} for name, t in kwargs.items()},
        in_spec=torch.utils._pytree.treespec_dumps(program.call_spec.in_spec),
        out_spec=torch.utils._pytree.treespec_dumps(program.call_spec.out_spec))


GRANITE_SPEECH = "transformers.models.granite_speech.modeling_granite_speech"


def _granite_attention_forward(self: Any, hidden_states: torch.Tensor, attention_dists: torch.Tensor) -> torch.Tensor:
    """Granite Speech's Conformer attention (blocks of `context_size` frames, Shaw's relative positions) as upstream
    computes it, in sizes a trace keeps symbolic: the last block padded by `(-frames) % context` (none where the
    frames fill it) and its padding masked both ways (nothing masked where there is none), where upstream pads and
    masks only `if remainder > 0`; blocks kept an axis of their own, so no reshape asks whether there is one."""
    hidden_states = self.pre_norm(hidden_states)
    batch, frames, _ = hidden_states.shape
    context, heads, dim = self.context_size, self.num_heads, self.dim_head
    blocks = (frames + context - 1) // context
    length = blocks * context
    hidden_states = torch.nn.functional.pad(hidden_states, (0, 0, 0, length - frames))
    keys, values = self.to_kv(hidden_states).chunk(2, dim=-1)
    # [batch, blocks, heads, context, dim]: each block attends within itself
    query, keys, values = (states.unflatten(1, (blocks, context)).unflatten(-1, (heads, dim)).transpose(2, 3)
                           for states in (self.to_q(hidden_states), keys, values))
    positions = torch.einsum("n b h c d, c r d -> n b h c r", query, self.rel_pos_emb(attention_dists)) * self.scale
    real = (torch.arange(length, device=hidden_states.device) < frames).unflatten(0, (blocks, context))
    padding = ~(real.unsqueeze(-1) & real.unsqueeze(-2))  # [blocks, context, context]
    positions = positions.masked_fill(padding.unsqueeze(1), -torch.finfo(positions.dtype).max)
    scores = torch.matmul(query, keys.transpose(-1, -2)) * self.scale + positions  # upstream's SDPA, MATH backend
    out = torch.matmul(scores.softmax(dim=-1), values).transpose(2, 3).flatten(3).flatten(1, 2)
    return self.dropout(self.to_out(out[:, :frames, :]))


def _granite_projector_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """Granite Speech's Q-Former projector (its queries over windows of `window_size` frames) as upstream computes
    it, the windows counted by integer division and its queries given one per window (not broadcast from one)."""
    batch, frames, dim = hidden_states.size()
    windows = (frames + self.window_size - 1) // self.window_size
    hidden_states = torch.nn.functional.pad(hidden_states, (0, 0, 0, windows * self.window_size - frames))
    hidden_states = hidden_states.unflatten(1, (windows, self.window_size)).flatten(0, 1)
    query = self.query.expand(hidden_states.shape[0], self.num_queries, self.query.shape[-1])
    out = self.qformer(query_embeds=query, encoder_hidden_states=hidden_states, encoder_attention_mask=None,
                       return_dict=True).last_hidden_state
    return self.linear(out.unflatten(0, (batch, windows)).flatten(1, 2))


@contextlib.contextmanager
def granite_speech_frames_dynamic() -> Iterator[None]:
    """While Granite Speech's audio encoder is traced with its frames dynamic (transformers.js's audio-language
    layout: any length of audio), its Conformer attention and Q-Former projector compute what upstream's do
    (eager-equal at every length) in symbolic sizes: upstream's `math.ceil(frames / context_size)` and `if remainder
    > 0` fix the frames at the traced count (docs/upstream-gaps.md #53).

    Example:
        >>> with granite_speech_frames_dynamic():  # doctest: +SKIP
        ...     program = torch.export.export(AudioEncoder(model), (features,), dynamic_shapes=...)
    """
    modeling = importlib.import_module(GRANITE_SPEECH)
    with patched(modeling.GraniteSpeechConformerAttention, "forward", _granite_attention_forward), \
            patched(modeling.GraniteSpeechEncoderProjector, "forward", _granite_projector_forward):
        yield

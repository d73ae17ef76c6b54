"""The ExecuTorch LLM runner's program (part of the adapter to upstream): transformers' exportable wrapper
(`transformers.integrations.executorch.TorchExportableModuleWithStaticCache`), executorch's LLM custom ops and the
lowering optimum-executorch uses, reached here only.

```
model ──► runner_module (static cache of max_cache_len as buffers) ──► export_runner_program
          forward(input_ids [1, seq], cache_position [seq]) -> {"logits"}    torch.export, custom ops swapped in,
                                                                            [PT2E quantizer, fresh cache per sample],
                                                                            XNNPACK, constant metadata methods
```

The program is what executorch's `TextLLMRunner` (extension/llm/runner) and optimum-executorch load: one `forward`
method with two inputs and one output, the KV cache held inside as mutable buffers, `seq` dynamic (the prompt in one
call), and the constant methods they read (`get_max_seq_len`, `get_eos_ids`, ...). See docs/upstream-gaps.md for
what upstream lacks (no runner layout in `ExecutorchExporter`, no metadata methods, a custom cache that does not fit
transformers 5.24).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.exporters.configs import ExportFormat
from transformers.exporters.metadata import ExportMetadata
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from exporters.upstream.beyond import _external_constants, _tag_delegate_weights, xnnpack_lowering
from exporters.upstream.internals import cache_layers_through_buffers, subclass_named_as
from exporters.upstream.patches import patched
from exporters.upstream.xnnpack_passes import quant_fusion_only_with_quantized_ops

# The runner's metadata methods (executorch extension/llm/runner/constants.h) and optimum-executorch's.
FLOAT_DTYPE_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}
CUSTOM_OPS_MODULE = "executorch.extension.llm.custom_ops.custom_ops"
QUANTIZED_KERNELS_MODULE = "executorch.kernels.quantized"


def register_custom_ops() -> None:
    """Register executorch's LLM custom ops (`llama::custom_sdpa`, `llama::update_cache`): their export-time meta
    kernels and, in the shared kernel registry of the Python runtime and `TextLLMRunner`, their kernels (a program
    that uses them does not load without it: `Missing operator: llama::update_cache.out`)."""
    # executorch loads only where a program is lowered or run (seconds, native memory)
    importlib.import_module(CUSTOM_OPS_MODULE)


def register_quantized_kernels() -> None:
    """Register executorch's quantized kernels (`quantized_decomposed::embedding_byte`, `embedding_4bit`: a quantized
    embedding table, fused by the lowering) in the shared kernel registry; a program that uses them does not load
    without it: `Missing operator: quantized_decomposed::embedding_byte.out`."""
    # executorch loads only where a program is lowered or run (seconds, native memory)
    importlib.import_module(QUANTIZED_KERNELS_MODULE)


class RunnerProgram(torch.nn.Module):
    """`forward(input_ids [1, seq], cache_position [seq]) -> {"logits": [1, seq, vocab]}` around transformers'
    static-cache wrapper; the cache is the wrapper's buffers (re-running from position 0 restarts generation)."""

    def __init__(self, wrapper: torch.nn.Module, max_cache_len: int | None = None, max_seq_len: int | None = None):
        super().__init__()
        self.wrapper = wrapper
        self.max_cache_len = max_cache_len  # positions of its static cache: a prompt takes at most one fewer
        # tokens one call takes (None: max_cache_len - 1): a ring-buffer layer's window, else a chunk would overwrite
        # keys its own first queries see
        self.max_seq_len = max_seq_len

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.wrapper(input_ids=input_ids, cache_position=cache_position)}


@contextlib.contextmanager
def _static_generation_config(model: Any, max_cache_len: int) -> Iterator[None]:
    """The generation config transformers' wrapper asserts on (use_cache, a static cache), only while it is built:
    the eager model keeps its own."""
    original = model.generation_config
    values = {k: v for k, v in original.to_dict().items() if k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    with patched(model, "generation_config", GenerationConfig(
            **values, use_cache=True, cache_implementation="static",
            cache_config={"batch_size": 1, "max_cache_len": max_cache_len})):
        yield


def runner_module(model: Any, max_cache_len: int) -> RunnerProgram:
    """The eager runner program: transformers' `TorchExportableModuleWithStaticCache` (batch 1, a static cache of
    `max_cache_len` positions) behind `RunnerProgram`'s signature."""

    with _static_generation_config(model, max_cache_len):
        wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache_len)
    return RunnerProgram(wrapper, max_cache_len, max_seq_len(model, max_cache_len)).eval()


def max_seq_len(model: Any, max_cache_len: int) -> int:
    """The most tokens one call of the runner program takes: `max_cache_len - 1`, or the shortest window of its
    ring-buffer layers ([`ring_windows`]): the runner splits a longer prompt into chunks of that size
    (`get_max_seq_len`)."""
    return min([max_cache_len - 1, *ring_windows(model, max_cache_len).values()])


@contextlib.contextmanager
def custom_ops_installed(program: torch.nn.Module, model: Any, explicit_mask: bool = False) -> Iterator[None]:
    """Swap in executorch's custom ops on a runner program, as optimum-executorch's `--use_custom_sdpa
    --use_custom_kv_cache` select: each static layer writes with `llama::update_cache` into a `[B, S, H, D]` buffer,
    attention is `llama::custom_sdpa` (which builds the causal mask from the start position). optimum-executorch's
    own cache class reads `cache_kwargs["cache_position"]`, which transformers 5.24 no longer passes
    (docs/upstream-gaps.md), so the layers' `update` is overridden here. The attention implementation is restored
    afterwards (the eager model keeps its own). `explicit_mask`: attention takes the mask the program's decoder
    passes (not causal; a ring-buffer layer gathers it at its slots' positions: [`ring_mask`]); otherwise any mask
    is ignored, as before. `program`: a [`RunnerProgram`] or the multimodal program's `text_decoder`, each with its
    transformers `wrapper` and `max_cache_len` (the sliding-window layers shorter than it: [`ring_windows`])."""
    register_custom_ops()

    def mask_passthrough(*args: Any, **kwargs: Any) -> None:
        return None

    def custom_sdpa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        start = kwargs["position_ids"][0][0].item()
        torch._check_is_size(start)
        window = rings.get(getattr(module, "layer_idx", None))
        if window is not None:  # a ring-buffer layer: the mask from the positions its slots hold
            positions = getattr(program.wrapper, f"cache_positions_{module.layer_idx}")
            mask = ring_mask(positions, window, start, q.shape[1], attention_mask[0, 0] if explicit_mask else None)
            return torch.ops.llama.custom_sdpa(q, k, v, 0, mask, 0.0, False, scaling), None
        torch._check(start < k.shape[1])
        if explicit_mask:  # the decoder's own float mask [1, 1, seq, cache] (`multimodal_runner.MarkedTextDecoder`)
            return torch.ops.llama.custom_sdpa(q, k, v, start, attention_mask[0, 0].float(), 0.0, False, scaling), None
        return torch.ops.llama.custom_sdpa(q, k, v, start, None, 0.0, True, scaling), None

    # ring buffers for the sliding-window layers shorter than the program's cache (the LLM runner's program and the
    # multimodal one's text_decoder alike)
    rings = ring_windows(model, program.max_cache_len)
    AttentionInterface.register("custom_sdpa", custom_sdpa_attention)
    AttentionMaskInterface.register("custom_sdpa", mask_passthrough)
    configs = {id(c): c for c in (model.config, getattr(getattr(model, "model", None), "config", None)) if c is not None}
    with contextlib.ExitStack() as stack:
        for config in configs.values():
            stack.enter_context(patched(config, "_attn_implementation", "custom_sdpa"))
        _cache_in_custom_ops(program.wrapper, rings)
        yield


def ring_windows(model: Any, max_cache_len: int | None) -> dict[int, int]:
    """`{layer index: window}` of the model's sliding-window layers whose window is shorter than the cache
    (`max_cache_len`; None: every sliding layer): the layers the runner program holds in a ring buffer
    ([`ring_update`]), as optimum-executorch's `ETCustomHybridCache` does.

    Example:
        >>> from transformers import Gemma3TextConfig
        >>> config = Gemma3TextConfig(num_hidden_layers=3, sliding_window=8, layer_types=[
        ...     "sliding_attention", "full_attention", "sliding_attention"])
        >>> ring_windows(type("M", (), {"config": config})(), 64), ring_windows(type("M", (), {"config": config})(), 8)
        ({0: 8, 2: 8}, {})
    """
    text = model.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if not window or (max_cache_len is not None and window >= max_cache_len):
        return {}
    return {i: int(window) for i, kind in enumerate(getattr(text, "layer_types", None) or [])
            if kind == "sliding_attention"}


def ring_mask(positions: torch.Tensor, window: int, start: Any, seq: int,
              allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The float mask `[seq, slots]` of a ring-buffer layer's attention (ExecuTorch's
    `_create_causal_mask_for_ring_buffer`): query `start + j` sees a slot that holds position `p` (`positions`,
    -1: empty) when `0 <= start + j - p < window`, transformers' sliding-window mask (`kv_idx > q_idx - window`).
    `allowed`: the program's own float mask `[seq, cache positions]` (0: seen; a bidirectional image's rows,
    `multimodal_runner.MarkedTextDecoder`) in place of `0 <= delta`, gathered at the positions the slots hold.

    Example:
        >>> positions = torch.tensor([4, 1, 2, 3])  # 4 slots: position 4 wrote over 0
        >>> ring_mask(positions, 3, 4, 1).tolist()
        [[0.0, -inf, 0.0, 0.0]]
    """
    delta = (start + torch.arange(seq, dtype=torch.long)).view(-1, 1) - positions
    if allowed is None:
        seen = (positions >= 0) & (delta >= 0) & (delta < window)
    else:
        seen = (positions >= 0) & (allowed[:, positions.clamp(min=0)] == 0) & (delta < window)
    return torch.where(seen, 0.0, float("-inf"))


def ring_update(wrapper: torch.nn.Module, i: int, layer: Any, key_states: torch.Tensor,
                value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a chunk into layer `i`'s ring buffer (`2 * window` slots, ExecuTorch's `CustomRingKVCache`): position
    `p` goes to slot `p % slots` through `llama::update_cache_with_indices`, and `cache_positions_{i}` records the
    position each slot holds (slots past the chunk's start that the chunk does not write are emptied: a run from
    position 0 restarts generation). A chunk of at most `window` tokens keeps every key its queries see."""
    kbuf, vbuf = getattr(wrapper, f"key_cache_{i}"), getattr(wrapper, f"value_cache_{i}")
    positions = getattr(wrapper, f"cache_positions_{i}")
    slots, seq = kbuf.shape[1], key_states.shape[-2]
    start = layer.cumulative_length.item()
    torch._check_is_size(start)
    written = torch.arange(seq, dtype=torch.long) + start
    indices = written % slots
    kept = torch.where(torch.arange(slots, dtype=torch.long) < start, positions, torch.full_like(positions, -1))
    positions.copy_(kept)
    positions.index_copy_(0, indices, written)
    torch.ops.llama.update_cache_with_indices(key_states.transpose(1, 2), kbuf, start, indices.unsqueeze(0))
    torch.ops.llama.update_cache_with_indices(value_states.transpose(1, 2), vbuf, start, indices.unsqueeze(0))
    layer.cumulative_length.add_(seq)
    return kbuf.transpose(1, 2), vbuf.transpose(1, 2)


def _cache_in_custom_ops(wrapper: torch.nn.Module, rings: dict[int, int] | None = None) -> None:
    """Each static layer of the wrapper's cache writes with `llama::update_cache` into a `[B, S, H, D]` buffer of
    the wrapper (the program is built for export: the change is its own, never undone); a layer of `rings` (its
    window) into a ring buffer of twice its window ([`ring_update`])."""
    rings = rings or {}
    for i, layer in enumerate(wrapper.static_cache.layers):
        b, h, length, d = layer.keys.shape
        if i in rings:
            length = 2 * rings[i]
            wrapper.register_buffer(f"cache_positions_{i}", torch.full((length,), -1, dtype=torch.long),
                                    persistent=False)
        keys = torch.zeros(b, length, h, d, dtype=layer.keys.dtype)
        values = torch.zeros(b, length, h, d, dtype=layer.values.dtype)
        wrapper.register_buffer(f"key_cache_{i}", keys, persistent=False)
        wrapper.register_buffer(f"value_cache_{i}", values, persistent=False)

        def update(_self, key_states, value_states, *args, _i=i, _layer=layer, **kwargs):
            if _i in rings:
                return ring_update(wrapper, _i, _layer, key_states, value_states)
            kbuf, vbuf = getattr(wrapper, f"key_cache_{_i}"), getattr(wrapper, f"value_cache_{_i}")
            start = _layer.cumulative_length.item()
            torch._check_is_size(start)
            torch._check(start < kbuf.shape[1])
            torch.ops.llama.update_cache(key_states.transpose(1, 2), kbuf, start)
            torch.ops.llama.update_cache(value_states.transpose(1, 2), vbuf, start)
            _layer.cumulative_length.add_(key_states.shape[-2])
            return kbuf.transpose(1, 2), vbuf.transpose(1, 2)

        # a method of the layer's class, not a function in its __dict__: a non-strict trace snapshots the module's
        # attributes through transformers' cache pytree, which cannot rebuild a function
        layer.__class__ = subclass_named_as(type(layer), {"update": update})
        layer.keys, layer.values = keys, values


def runner_metadata(model: Any, max_cache_len: int, custom_ops: bool, eos_ids: list[int],
                    seq_len: int | None = None) -> dict[str, Any]:
    """The constant methods of the program: what `TextLLMRunner` reads (`get_max_seq_len`, `get_max_context_len`,
    `get_eos_ids` (one output per id), `use_kv_cache`, `use_sdpa_with_kv_cache`, `enable_dynamic_shape`) and what
    optimum-executorch writes (`get_bos_id`, `get_eos_id`, `get_vocab_size`, `get_n_layers`, ...). None values are
    left out (the runner then uses its default). `seq_len`: the tokens one call takes, when fewer than the cache
    (a ring-buffer layer's window: [`max_seq_len`])."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    values = {
        "get_max_seq_len": seq_len or max_cache_len,  # tokens one forward call takes (the prompt is chunked by it)
        "get_max_context_len": max_cache_len,  # the cache's capacity
        "get_max_batch_size": 1,
        "get_bos_id": config.bos_token_id,
        "get_eos_id": eos_ids[0] if eos_ids else None,
        "get_eos_ids": list(eos_ids) or None,
        "get_vocab_size": config.vocab_size,
        "get_n_layers": config.num_hidden_layers,
        "get_n_kv_heads": kv_heads,
        "get_head_dim": head_dim,
        "get_dtype": FLOAT_DTYPE_CODES.get(model.dtype),
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": custom_ops,
        "enable_dynamic_shape": True,
    }
    return {name: value for name, value in values.items() if value is not None}


class FreshCacheSamples:
    """Calibration samples replayed on a prepared runner graph, each from a fresh cache: the graph's buffers (the
    static cache and its write positions) mutate on every forward, so `reset` restores them before each sample is
    handed out (a prompt at position 0 then sees the empty cache it sees in generation)."""

    def __init__(self, samples: Iterable[dict[str, Any]], reset: Callable[[], None]):
        self.samples, self.reset = list(samples), reset

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for sample in self.samples:
            self.reset()
            yield copy.deepcopy(sample)


def _restore_buffers(module: torch.nn.Module, fresh: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name in fresh and buffer.shape == fresh[name].shape:
                buffer.copy_(fresh[name])


def quantize_runner_graph(exported: torch.export.ExportedProgram, quantizer: Any, kwargs: dict[str, Any],
                          shapes: dict[str, Any]) -> torch.export.ExportedProgram:
    """The runner program quantized by upstream's FX-graph quantizer (`PT2EQuantizer`), exported again as upstream's
    exporters do (non-strict: Dynamo does not trace an exported graph). Calibration replays its samples (the
    quantizer's, else the traced prompt at position 0) from a fresh cache each ([`FreshCacheSamples`]), and the
    buffers are restored once more after conversion, so the program starts with the empty cache it was traced with;
    a buffer that still differs raises."""
    module = exported.module()
    fresh = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
    samples = FreshCacheSamples(quantizer.calibration_dataset or [kwargs], lambda: _restore_buffers(module, fresh))
    quantized = quantizer.with_calibration(samples).quantize(module, copy.deepcopy(kwargs), ExportFormat.EXECUTORCH)
    _restore_buffers(quantized, fresh)
    changed = [name for name, buffer in quantized.named_buffers()
               if name in fresh and buffer.shape == fresh[name].shape and not torch.equal(buffer, fresh[name])]
    if changed:
        raise RuntimeError(f"the quantized runner program's buffers {changed[:4]} kept calibration state")
    with torch.no_grad():
        return torch.export.export(quantized, (), copy.deepcopy(kwargs), dynamic_shapes=shapes, strict=False)


def drop_embedding_padding_idx(graph_module: torch.fx.GraphModule):
    """An edge `aten.embedding` without its `padding_idx` (which only masks a gradient), as optimum-executorch's
    `RemovePaddingIdxEmbeddingPass` does: ExecuTorch's quantization fusion matches `embedding(table, ids)` only, so
    a quantized table of a model with a pad token is fused into `quantized_decomposed::embedding_byte` /
    `embedding_4bit` (else: "Missing out variants: {'torchao::dequantize_affine'}")."""
    from executorch.exir.dialects._ops import ops as exir_ops  # deferred: executorch loads only where one lowers
    from executorch.exir.pass_base import PassResult  # deferred: heavy

    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target == exir_ops.edge.aten.embedding.default and len(node.args) == 3:
            node.args = node.args[:2]
    graph_module.recompile()
    return PassResult(graph_module, True)


def export_runner_program(program: RunnerProgram, model: Any, inputs: dict[str, Any], *, max_cache_len: int,
                          custom_ops: bool, metadata: dict[str, Any], external_weights: str | None = None,
                          quantizer: Any = None):
    """Export and lower the runner program: non-strict `torch.export` with the cache layers reading through the
    wrapper's buffers ([`cache_layers_through_buffers`]: docs/upstream-gaps.md), `seq` dynamic up to
    `max_cache_len - 1`, custom ops when asked (then
    executorch's `RemoveRedundantTransposes` and a second export), `quantizer` (upstream's `PT2EQuantizer`, None:
    float) on that graph ([`quantize_runner_graph`]), XNNPACK (a quantized program with the dynamically quantized
    linears delegated first: docs/upstream-gaps.md #18), `metadata` as constant methods. `external_weights`: the
    tag of a `.ptd` the weights go to (None: inside the `.pte`).

    Returns `(ExecutorchProgramManager, ExportMetadata, number of custom-op nodes)`."""
    # executorch loads only where a program is lowered (seconds, native memory)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # deferred: heavy
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower  # heavy
    from executorch.exir.passes import MemoryPlanningPass  # deferred: heavy

    seq = torch.export.Dim("seq_length_dim", max=program.max_seq_len or max_cache_len - 1)
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    kwargs = {"input_ids": inputs["input_ids"], "cache_position": inputs["cache_position"]}
    stack = contextlib.ExitStack()
    with stack, torch.no_grad():
        if custom_ops:
            stack.enter_context(custom_ops_installed(program, model))
        with cache_layers_through_buffers(program.wrapper):  # non-strict: a third of strict's CPU
            exported = torch.export.export(program, (), kwargs, dynamic_shapes=shapes, strict=False)
        if custom_ops:
            # executorch's LLM export passes: loaded only when custom ops are asked for
            from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes

            module = RemoveRedundantTransposes()(exported.module())[0]
            # non-strict: the graph module's buffers are its own (what strict export needed the model for), and
            # Dynamo retracing a traced graph costs seconds for nothing
            exported = torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=False)
    if quantizer is not None:
        exported = quantize_runner_graph(exported, quantizer, kwargs, shapes)
    custom_nodes = sum(1 for n in exported.graph.nodes if n.op == "call_function" and "llama." in str(n.target))
    record = ExportMetadata(
        architecture=type(model).__name__,
        export_dtype=str(model.dtype).removeprefix("torch."),
        export_device="cpu",
        kwargs={name: {"type": "tensor", "dtype": str(t.dtype), "shape": list(t.shape)} for name, t in kwargs.items()},
        in_spec=torch.utils._pytree.treespec_dumps(exported.call_spec.in_spec),
        out_spec=torch.utils._pytree.treespec_dumps(exported.call_spec.out_spec),
    )
    backend_config = ExecutorchBackendConfig(
        extract_delegate_segments=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        do_quant_fusion_and_const_prop=True,
    )
    if external_weights is not None:  # every constant (delegated or not) to `<external_weights>.ptd`
        _tag_delegate_weights(exported, external_weights)
        backend_config = _external_constants(backend_config, external_weights)
    with xnnpack_lowering():  # the same lowering as every other program (the tanh GELU kept off XNNPACK)
        edge = to_edge_transform_and_lower(
            {"forward": exported},
            partitioner=[XnnpackPartitioner()] if quantizer is None
            else [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()],
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
            constant_methods=metadata,
            transform_passes=[drop_embedding_padding_idx],
        )
    with quant_fusion_only_with_quantized_ops():  # a float program has no quantized op to fuse
        manager = edge.to_executorch(config=backend_config)
    return manager, record, custom_nodes

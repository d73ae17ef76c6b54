"""Every patch this project lays on upstream or the stack, in one table, and the one helper that lays them.

A patch replaces an attribute (a method, a module's function, an entry of a table) for the duration of a `with` block
and puts back what was there on the way out, also when the block raises: [`patched`] for an attribute,
[`patched_item`] for a mapping's entry. Each context manager of `exporters.upstream` that changes the stack lays its
patches with them, and has a row in `PATCHES`: what it changes, why, and the upstream change that would make it
unnecessary (docs/upstream-gaps.md has each gap's story). tests/test_upstream_patches.py enters every row and checks
that what it changes is restored; tests/test_structure.py refuses a hand-written "patch, yield, restore".

Example:
    >>> import types
    >>> box = types.SimpleNamespace(size=1)
    >>> with patched(box, "size", 2):
    ...     box.size
    2
    >>> box.size
    1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block; afterwards it is what it was: the object `owner` held itself (a
    class's own method as defined, `classmethod` included), or, where `owner` only inherited the attribute or lacked
    it, nothing of its own again. A property (or an object without `__dict__`) gets its earlier value set back.

    Example:
        >>> class Greeter:
        ...     def hello(self):
        ...         return "hello"
        >>> with patched(Greeter, "hello", lambda self: "hi"):
        ...     Greeter().hello()
        'hi'
        >>> Greeter().hello()
        'hello'
    """
    own = getattr(owner, "__dict__", None)
    if own is not None and name in own:
        saved = own[name]

        def restore() -> None:
            setattr(owner, name, saved)
    elif own is None or hasattr(getattr(type(owner), name, None), "__set__"):
        saved = getattr(owner, name)

        def restore() -> None:
            setattr(owner, name, saved)
    else:
        def restore() -> None:
            if name in vars(owner):
                delattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        restore()


@contextlib.contextmanager
def patched_item(mapping: MutableMapping, key: Any, value: Any) -> Iterator[None]:
    """`mapping[key]` is `value` inside the block; afterwards it is what it was (or absent, as it was).

    Example:
        >>> table = {"xnnpack": "upstream's"}
        >>> with patched_item(table, "xnnpack", "ours"):
        ...     table["xnnpack"]
        'ours'
        >>> table
        {'xnnpack': "upstream's"}
    """
    saved = mapping.get(key, _MISSING)
    mapping[key] = value
    try:
        yield
    finally:
        if saved is _MISSING:
            mapping.pop(key, None)
        else:
            mapping[key] = saved


@dataclass(frozen=True)
class Patch:
    """One row of the table: the context manager of `exporters.upstream` that lays the patch, what it changes
    (`module:Owner.attribute`, `module:table[key]`, or an argument's attribute such as `model.generation_config`),
    why, and the upstream change that makes it unnecessary."""

    manager: str
    changes: tuple[str, ...]
    why: str
    until: str


XNNPACK = "executorch.backends.xnnpack"
EXIR = "executorch.exir"
UTILS = "transformers.exporters.utils"

PATCHES: tuple[Patch, ...] = (
    # ── capture and trace (every format) ──
    Patch("patches_of_loaded_models", (f"{UTILS}:import_dotted_path",),
          "upstream's trace-time patches of model code resolve only modules already imported (0.9 s per export)",
          "upstream resolving its patches lazily (benchmarks/RESULTS.md)"),
    Patch("contiguity_known_once", (f"{UTILS}:is_contiguous_or_false",),
          "the reshape patch's contiguity test is symbolic work repeated by every layer",
          "docs/upstream-gaps.md #31: upstream caching the answer per shape environment"),
    Patch("symbolic_arithmetic_once", ("torch.fx.experimental.sym_node:SymNode._add",),
          "symbolic size arithmetic (every binary SymNode operation but mod) is redone for every layer",
          "docs/upstream-gaps.md #42: torch caching the whole SymNode operation"),
    Patch("named_dims_share_symbols", ("torch._export.non_strict_utils:fakify", "shape_env.create_symbol",
                                       "shape_env.val_to_var[size]"),
          "a named Dim gives every input size its own symbol, so no layer reuses the previous one's work",
          "docs/upstream-gaps.md #41: torch.export giving equal named sizes one symbol"),
    Patch("static_sliding_layers_kept_whole",
          ("transformers.cache_utils:STATIC_LAYER_TYPE_MAPPING[sliding_attention]",),
          "a static sliding-window layer picks its update path at trace time, so a decode cannot pass the window",
          "docs/upstream-gaps.md #9: a traceable static sliding-window layer in transformers"),
    Patch("recording_logits_processors", ("model._get_logits_processor",),
          "generate() has no public way to say which logits processors it applies",
          "docs/upstream-gaps.md #7: a public accessor in transformers"),
    Patch("experts_without_custom_ops", ("model.get_experts_implementation()",),
          "ExecuTorch has no kernel for transformers' grouped-matmul experts op",
          "docs/upstream-gaps.md #36: an out variant of transformers::grouped_mm_fallback"),
    Patch("patch_convolutions_as_matmul", ("torch.nn:Conv3d.forward",),
          "ExecuTorch's portable kernels and XNNPACK take no whole-input Conv3d (video patch embeddings)",
          "docs/upstream-gaps.md #23: a 5-D convolution kernel in ExecuTorch"),
    Patch("negative_padding_as_slices", ("torch.nn.modules.padding:_ConstantPadNd.forward",),
          "ExecuTorch's constant_pad_nd kernel refuses negative pads (RWKV's token shift)",
          "docs/upstream-gaps.md #44: negative pads in ExecuTorch's portable kernel"),
    Patch("image_sizes_as_constants", ("torch._subclasses.fake_tensor:CONSTANT_NUMEL_LIMIT",),
          "Mistral 3's get_image_features splits its features by sizes it computes from a tensor of image_sizes, "
          "traced as a data-dependent int whose asserts ExecuTorch's constant propagation cannot fold",
          "upstream: transformers computing Mistral 3's split sizes in Python from image_sizes"),
    Patch("checkpoint_read_not_mapped", ("transformers.modeling_utils:safe_open",),
          "from_pretrained maps the shards and keeps every page it read resident beside the converted weights",
          "docs/upstream-gaps.md #46: a `from_pretrained` option to read shards without mapping them"),
    Patch("new_empty_as_zeros", ("torch:Tensor.new_empty",),
          "ExecuTorch's _empty_dim_order takes int[] sizes: a new_empty over the prompt fixes its length (DeepSeek-V3)",
          "docs/upstream-gaps.md #47: _empty_dim_order(SymInt[] size) in ExecuTorch"),
    Patch("cache_layers_through_buffers", ("transformers.cache_utils:StaticLayer (each layer's class)",),
          "the static cache's layers hold their tensors themselves: a non-strict torch.export of the wrapper reads the "
          "real tensors behind the module's buffers (the cache traced as constants)",
          "docs/upstream-gaps.md, the LLM runner wrapper: TorchExportableModuleWithStaticCache reading its cache "
          "through its buffers"),
    Patch("shared_tables_kept_once", ("onnxscript.optimizer._constant_folding:FoldConstantsPass.__init__",),
          "onnxscript folds a tied table's transpose into a second initializer (small tables stored twice)",
          "upstream onnxscript keeping a transpose of an initializer other nodes also read"),
    Patch("granite_speech_frames_dynamic",
          tuple(f"transformers.models.granite_speech.modeling_granite_speech:{owner}.forward"
                for owner in ("GraniteSpeechConformerAttention", "GraniteSpeechEncoderProjector")),
          "Granite Speech's Conformer and projector count blocks with math.ceil and pad only `if remainder > 0`",
          "docs/upstream-gaps.md #53: the two forwards written in sizes a trace keeps symbolic"),
    Patch("windows_counted_in_tokens",
          ("transformers.masking_utils:_preprocess_mask_arguments",
           "transformers.masking_utils:sliding_window_causal_mask_function"),
          "a sliding window counted in cache slots covers the pads GenAI leaves inside a right-padded row",
          "transformers' sliding-window mask counting the window in the padding mask's tokens"),
    Patch("argsort_of_permutations", ("torch:argsort",),
          "ExecuTorch has no sort kernel; Qwen2.5-VL's vision tower argsorts a permutation",
          "docs/upstream-gaps.md #23: aten::sort in ExecuTorch's portable kernels"),
    # ── the ExecuTorch LLM runner's program ──
    Patch("_static_generation_config", ("model.generation_config",),
          "transformers' exportable wrapper asserts on a static-cache generation config",
          "transformers' TorchExportableModuleWithStaticCache taking its cache settings as arguments"),
    Patch("custom_ops_installed", ("model.config._attn_implementation",),
          "optimum-executorch's custom-cache class reads a kwarg transformers 5.24 no longer passes",
          "docs/upstream-gaps.md #25: an LLM runner program in ExecutorchExporter"),
    Patch("text_attention_as_custom_sdpa", ("model.config.text_config._attn_implementation",),
          "custom_ops_installed sets the top config's attention; a VLM's text layers read their text_config's",
          "docs/upstream-gaps.md #25: an LLM runner program (and MultimodalRunner's) in ExecutorchExporter"),
    # ── ExecuTorch lowering ──
    Patch("tanh_gelu_kept_off_xnnpack",
          (f"{XNNPACK}.partition.config.generic_node_configs:GeluConfig.check_constraints",),
          "XNNPACK's GELU ignores approximate='tanh' (4.7e-4 per activation)",
          "docs/upstream-gaps.md #24: XNNPACK's GELU honouring `approximate`"),
    Patch("upsample_fusion_only_with_upsample",
          (f"{XNNPACK}._passes.convert_to_upsample_bilinear2d:ConvertToUpsampleBilinear2d.call",),
          "the pass exports four modules per process to build patterns a graph without upsample cannot hold",
          "docs/upstream-gaps.md #37: XNNPACK's passes building their patterns once, or only when needed"),
    Patch("sdpa_fusion_only_with_softmax", (f"{XNNPACK}._passes.convert_to_sdpa:ConvertToSDPAPass.call",),
          "the pass exports an attention per process for patterns a partition without their ops cannot hold",
          "docs/upstream-gaps.md #37: XNNPACK's passes building their patterns once, or only when needed"),
    Patch("xnnpack_passes_only_where_they_apply",
          tuple(f"{XNNPACK}._passes.{m}:{c}.call" for m, c in (
              ("fuse_batch_norm", "FuseBatchNormPass"), ("decompose_batch_norm", "DecomposeBatchNorm"),
              ("fuse_activation_pass", "FuseActivationPass"), ("conv1d_unsqueeze_pass", "Conv1dUnsqueezePass"),
              ("prelu_reshape_pass", "PReLUReshapePass"), ("propagate_custom_meta_pass", "PropagateCustomMetaPass"),
              ("remove_redundant_copy_pass", "RemoveRedundantCopyPass"), ("convert_to_linear", "ConvertToLinearPass"),
              ("insert_pad_qdq", "InsertPadQDQPass"), ("decompose_cat", "DecomposeConcatenate")))
          + ("executorch.backends.transforms.remove_getitem_op:RemoveGetItemPass.call",
             f"{XNNPACK}._passes:XNNPACKPassManager.transform"),
          "each pass retraces every partition even where it rewrites nothing (most of a split program's lowering)",
          "docs/upstream-gaps.md #37: XNNPACK's passes building their patterns once, or only when needed"),
    Patch("second_decomposition_only_where_it_decomposes",
          (f"{EXIR}.program._program:_replace_aten_ops_with_transformed_ops",
           "torch.export:ExportedProgram.run_decompositions"),
          "the EDGE_DO_NOT_DECOMP path retraces a second time where every kept node passed the partitioner's checks",
          "docs/upstream-gaps.md #37: to_edge skipping a decomposition whose table matches no node of the graph"),
    Patch("edge_passes_only_where_they_apply",
          (f"{EXIR}.passes.normalize_transpose_pass:NormalizeTransposePass.call",
           f"{EXIR}.passes.replace_broken_ops_with_function_ops_pass:ReplaceBrokenOpsWithFunctionalOpsPass.call"),
          "to_edge's transpose and view passes retrace every program even where no node is one they rewrite",
          "docs/upstream-gaps.md #37: to_edge's passes returning a graph they do not change without a retrace"),
    Patch("provenance_shared_while_lowering", ("torch.fx.traceback:NodeSource.__init__",),
          "every retrace deep-copies each node's chain of ancestors (one level deeper after each pass)",
          "docs/upstream-gaps.md #37: torch.fx sharing a node's provenance history (its records are never changed)"),
    Patch("cia_ops_materialized_once",
          tuple(f"{module}:_collect_all_valid_cia_ops"
                for module in ("torch._export.utils", "torch.export.exported_program", "torch.export.decomp_utils")),
          "torch looks every CompositeImplicit op up in torch.ops once per op namespace it walks (40 of them), per call",
          "docs/upstream-gaps.md #37: torch materializing the CompositeImplicit ops once per collection"),
    Patch("quant_fusion_only_with_quantized_ops", (f"{EXIR}.passes.quant_fusion_pass:QuantFusionPass.call",),
          "to_executorch's quantization fusion traces its 23 patterns and tries them on a program with no quantized op",
          "docs/upstream-gaps.md #37: the fusion skipping a graph without quantize/dequantize nodes"),
    Patch("constants_shared_by_lowering_copies",
          (f"{EXIR}.backend.backend_details:BackendDetails.copy_exported_program_for_preprocess",
           f"{EXIR}.backend.canonical_partitioners.duplicate_constant_node_pass:copy"),
          "lowering deep-copies every partition's weights before preprocessing (3.7x the weights at the peak)",
          "docs/upstream-gaps.md #20: ExecuTorch sharing constants with the copy it preprocesses"),
    Patch("named_data_on_disk", (f"{EXIR}._serialize._named_data_store:NamedDataStore.add_named_data",),
          "XNNPACK's serialized weights pile up in memory until the program is written",
          "docs/upstream-gaps.md #20: a named-data store that spills to disk"),
    Patch("list_results_validated_whole",
          (f"{EXIR}.verification.arg_validator:EdgeOpArgValidator.call_function",),
          "ExecuTorch's dtype validator asks len() of an op's first listed tensor, which fixes a MoE's token count",
          "docs/upstream-gaps.md #47: the validator taking an op's one Tensor[] result as one result"),
    Patch("lowering_captured", ("transformers.exporters.exporter_executorch:to_edge_transform_and_lower",),
          "upstream lowers each component to a program of its own: one program, a method per component, needs them all",
          "docs/upstream-gaps.md #11: ExecutorchExporter exporting one program with a method per component"),
    Patch("xnnpack_dynamic_quant_partitioners",
          ("transformers.exporters.exporter_executorch:_BACKEND_PREPARE[xnnpack]",),
          "one XnnpackPartitioner fails on a PT2E-quantized decoder with a cache (dependency cycles)",
          "docs/upstream-gaps.md #18: a partitioner option in upstream's ExecutorchConfig"),
    Patch("propagated_constants_named_once",
          (f"{EXIR}.passes.constant_prop_pass:replace_with_constant_node",),
          "constant propagation names constants per method; a .ptd keyed by name mixes two methods' tensors",
          "docs/upstream-gaps.md #51: ExecuTorch naming propagated constants uniquely across a program's methods"),
    # ── ONNX export and optimization ──
    Patch("decompose_only_what_onnx_lacks", ("torch.onnx._internal.exporter._fx_passes:decompose_with_registry",),
          "torch.onnx decomposes (traces again) a program ONNX can already translate as traced",
          "docs/upstream-gaps.md #21: torch.onnx skipping decompositions that change nothing"),
    Patch("type_promotion_on_traced_values",
          ("torch.onnx._internal.fx.passes.type_promotion:_TypePromotionInterpreter.run_node",),
          "type promotion runs every node again under fake tensors to learn dtypes the trace recorded",
          "docs/upstream-gaps.md #40: torch.onnx reading the recorded values"),
    Patch("torchlib_registry_built_once",
          tuple(f"torch.onnx._internal.exporter._registration:ONNXRegistry.{name}"
                for name in ("from_torchlib", "_cleanup_registry_based_on_opset_version"))
          + ("logging:getLogger(torch.onnx._internal.exporter._registration).level",),
          "every export builds torch.onnx's registry of torchlib's functions again (0.5 s: a signature per function)",
          "docs/upstream-gaps.md #49: torch.onnx building its default registry once per process"),
    Patch("exact_no_op_rewrites", ("onnxscript.rewriter.rules.common._no_op:rules",),
          "the no-op rules match within 1e-8, so an RMS norm's 1e-8 epsilon is removed",
          "docs/upstream-gaps.md #38: onnxscript matching an exact 0 or 1"),
    Patch("multi_output_patterns_anchored", ("onnxscript.rewriter._matcher:SimplePatternMatcher.match",),
          "a pattern of several output nodes is tried at every node of the graph (quadratic)",
          "docs/upstream-gaps.md #39: onnxscript anchoring such patterns"),
    Patch("rules_tried_where_their_root_can_match", ("onnxscript.rewriter._rewrite_rule:RewriteRule.try_rewrite",),
          "the rewriter tries every rule at every node (69,704 attempts at 4 layers of TinyLlama's width)",
          "docs/upstream-gaps.md #50: onnxscript indexing its rules by their root's op type"),
    Patch("transposed_weights_written_in_blocks", ("onnx_ir:Tensor.tofile",),
          "numpy writes a transposed weight (every linear's MatMul input) element by element (0.09-0.27 GB/s)",
          "docs/upstream-gaps.md #48: onnx_ir writing a non-contiguous array a block at a time"),
    Patch("group_query_attention_at_any_batch",
          ("transformers.exporters.onnxruntime_fusions:_STEPS",
           "transformers.exporters.onnxruntime_fusions:_static_dim"),
          "ort_fusions fuses no GroupQueryAttention into a merged decoder with a dynamic batch; after the guards, "
          "one guard condition for every layer and the masked rows zeroed without reshapes (a decode step's kernels)",
          "docs/upstream-gaps.md #33: upstream's fusion guarding a dynamic batch itself"),
    # ── loading ──
    Patch("quiet_torch_serde", ("logging:getLogger(torch._export.serde.serialize).level",),
          "torch 2.13's .pt2 loader logs a warning whose format string breaks the logging call",
          "docs/upstream-gaps.md #3: the warning fixed in torch"),
    Patch("pt2_read_once", ("torch._export.serde.serialize:typing",
                             "torch._export.serde.serialize:GraphModuleDeserializer._parse_sym_expr"),
          "torch's .pt2 loader resolves a schema class's type hints per object and parses every size with sympy",
          "docs/upstream-gaps.md #59: torch's deserializer caching type hints per class and parsed expressions"),
)


def patch_row(manager: str) -> Patch:
    """The row of `manager` (a context manager's name).

    Example:
        >>> patch_row("tanh_gelu_kept_off_xnnpack").changes[0].rpartition(":")[2]
        'GeluConfig.check_constraints'
    """
    for row in PATCHES:
        if row.manager == manager:
            return row
    raise KeyError(f"no patch named {manager!r}: the table has {sorted(row.manager for row in PATCHES)}")

"""The one adapter to upstream `transformers.exporters`: everything this project takes from it goes through here.

Upstream is experimental and changes between releases (5.24 renamed cache kwargs and made `.pt2` loading need
`trust_remote_code`); pinning it (constraints.txt) and importing it in this module only means the next release is
adapted in one place. A test fails if another module imports `transformers.exporters`.

What is here: the registry (`exporter_class`, `config_class`), decomposition (`decompose_for_generation`,
`decompose_multimodal`), pytree helpers (`leaf_tensors`, `cast_leaf_tensors`, `pytree_flatten`,
`register_cache_pytrees`), the saved-export format (`ExportedModel`, `read_manifest`, `write_manifest`) and a loader
that never runs code from an artifact folder unless the operator allowed it ([`load_exported`]), and what upstream's
save and load do not cover: one ExecuTorch program with a method per component (`export_executorch_methods`,
`executorch_method_runner`), validation's ONNX Runtime sessions (`lean_session_options`), graphs whose inputs were
renamed for transformers.js (`RenamedRunner`), split programs that hold their equal weights once when loaded
(`share_identical_weights`), and workarounds scoped to one step: static caches whose sliding layers are captured whole
(`static_sliding_layers_kept_whole`), ExecuTorch lowering that leaves the tanh GELU off XNNPACK and runs the upsample
and SDPA fusions, XNNPACK's other passes and `to_edge`'s transpose and view passes only where a graph can hold their
patterns (`xnnpack_lowering`, `xnnpack_passes_only_where_they_apply`, `edge_passes_only_where_they_apply`), looks
torch's CompositeImplicit ops up once per collection (`cia_ops_materialized_once`), tries `to_executorch`'s quantization
fusion only on a graph with a quantized op (`quant_fusion_only_with_quantized_ops`), and does not copy the weights per
partition (`constants_shared_by_lowering_copies`, `named_data_on_disk`).

The modules: `core.py` (the registry, decomposition, the saved-export format and the safe loader), `pytree.py`
(upstream's pytree rules for transformers' objects), `beyond.py` (what upstream's save and load do not cover),
`quantizers.py` (upstream's quantizers), `pte_weights.py` (a `.pte`'s quantized weights, read from its delegates), `internals.py` (the stack's private interfaces this project relies on),
`llm_runner.py` (the ExecuTorch LLM runner's program), `asr_runner.py` (the ASR runner's `encoder` + `text_decoder`),
`multimodal_runner.py` (ExecuTorch MultimodalRunner's program: token_embedding, vision_encoder, text_decoder; Granite
Speech's audio encoder traced at any length), `idefics_image.py` (that program's `vision_encoder` of Idefics3 and
SmolVLM: one full image, its position ids a constant), `fixed_image.py` (its `vision_encoder` of LLaVA-NeXT
and LLaVA-OneVision at one image size, their `image_sizes` baked in),
`onnx_decompositions.py` (torch.onnx's second trace skipped
where it changes nothing), `ort_attention.py` (ONNX Runtime's `GroupQueryAttention` with a dynamic batch),
`runtime_ops.py` (models traced in the ops their target's runtime has), `xnnpack_passes.py` (XNNPACK's passes run
only where they can change a partition), `patches.py` (every patch on upstream or the
stack in one table, what it changes, why and until when, and the one helper that lays and undoes them).

Example:
    >>> exporter_class("onnx").program_suffix
    '.onnx'
    >>> sorted(formats_from_files(["decode.pte", "prefill.pte"]))
    ['executorch']
"""

from __future__ import annotations

from exporters.upstream.beyond import (
    RenamedRunner,
    constants_shared_by_lowering_copies,
    executorch_method_runner,
    export_executorch_methods,
    lean_session_options,
    metadata_dict,
    named_data_on_disk,
    share_identical_weights,
    static_sliding_layers_kept_whole,
    tanh_gelu_kept_off_xnnpack,
    xnnpack_lowering,
)
from exporters.upstream.core import (
    EXPORT_BACKENDS,
    MANIFEST_FILE,
    OUTPUT_FLAGS,
    STEP_COUNTERS,
    SUFFIX_FORMATS,
    TORCH_SERDE_LOGGER,
    ExportedComponent,
    ExportedModel,
    UpstreamAutoExportConfig,
    UpstreamAutoHfExporter,
    config_class,
    counter_in_spec_components,
    decompose_for_generation,
    decompose_multimodal,
    exporter_class,
    exporter_ready,
    import_loaders,
    fit_traced_spec,
    formats_from_files,
    load_exported,
    multimodal_submodules,
    prepare_traced_inputs,
    quiet_torch_serde,
    read_manifest,
    run_component,
    runner_class,
    runner_for_file,
    write_manifest,
)
from exporters.upstream.internals import (
    checkpoint_read_not_mapped,
    contiguity_known_once,
    named_dims_share_symbols,
    patches_of_loaded_models,
    pt2_read_once,
    pte_float_dtypes,
    pte_weight_bytes,
    recording_logits_processors,
    cache_layers_through_buffers,
    symbolic_arithmetic_once,
)
from exporters.upstream.onnx_decompositions import (
    decompose_only_what_onnx_lacks,
    torchlib_registry_built_once,
    torchlib_registry_ready,
    type_promotion_on_traced_values,
)
from exporters.upstream.multimodal_runner import granite_speech_frames_dynamic
from exporters.upstream.ort_attention import GQA_GUARD_NAME, group_query_attention_at_any_batch
from exporters.upstream.runtime_ops import (
    argsort_of_permutations,
    exact_no_op_rewrites,
    experts_without_custom_ops,
    list_results_validated_whole,
    multi_output_patterns_anchored,
    negative_padding_as_slices,
    new_empty_as_zeros,
    patch_convolutions_as_matmul,
    rules_tried_where_their_root_can_match,
    shared_tables_kept_once,
    transposed_weights_written_in_blocks,
    windows_counted_in_tokens,
)
from exporters.upstream.xnnpack_passes import (
    cia_ops_materialized_once,
    edge_passes_only_where_they_apply,
    provenance_shared_while_lowering,
    quant_fusion_only_with_quantized_ops,
    sdpa_fusion_only_with_softmax,
    second_decomposition_only_where_it_decomposes,
    upsample_fusion_only_with_upsample,
    xnnpack_passes_only_where_they_apply,
)
from exporters.upstream.pytree import (
    cast_leaf_tensors,
    leaf_tensors,
    move_to,
    pytree_flatten,
    register_cache_pytrees,
)
from exporters.upstream.pte_weights import pte_quantized_weights
from exporters.upstream.quantizers import (
    capture_calibration_inputs,
    onnxruntime_int4_quantizer,
    onnxruntime_quantizer,
    pt2e_quantizer,
    quantize_matmul_nbits,
    xnnpack_dynamic_quant_partitioners,
)

__all__ = [
    "checkpoint_read_not_mapped",
    "granite_speech_frames_dynamic",
    "contiguity_known_once",
    "patches_of_loaded_models", "pt2_read_once",
    "pte_float_dtypes", "pte_weight_bytes", "pte_quantized_weights",
    "recording_logits_processors",
    "cache_layers_through_buffers",
    "TORCH_SERDE_LOGGER",
    "cast_leaf_tensors",
    "onnxruntime_int4_quantizer",
    "quantize_matmul_nbits",
    "EXPORT_BACKENDS",
    "ExportedComponent",
    "ExportedModel",
    "MANIFEST_FILE",
    "OUTPUT_FLAGS",
    "RenamedRunner",
    "STEP_COUNTERS",
    "SUFFIX_FORMATS",
    "UpstreamAutoExportConfig",
    "UpstreamAutoHfExporter",
    "capture_calibration_inputs",
    "config_class",
    "constants_shared_by_lowering_copies",
    "counter_in_spec_components",
    "decompose_for_generation",
    "decompose_multimodal",
    "argsort_of_permutations",
    "decompose_only_what_onnx_lacks",
    "exact_no_op_rewrites",
    "shared_tables_kept_once",
    "transposed_weights_written_in_blocks",
    "windows_counted_in_tokens",
    "multi_output_patterns_anchored",
    "rules_tried_where_their_root_can_match",
    "executorch_method_runner",
    "experts_without_custom_ops",
    "export_executorch_methods",
    "exporter_class",
    "exporter_ready",
    "import_loaders",
    "fit_traced_spec",
    "formats_from_files",
    "leaf_tensors",
    "list_results_validated_whole",
    "lean_session_options",
    "load_exported",
    "metadata_dict",
    "move_to",
    "multimodal_submodules",
    "named_data_on_disk",
    "named_dims_share_symbols",
    "negative_padding_as_slices",
    "new_empty_as_zeros",
    "patch_convolutions_as_matmul",
    "onnxruntime_quantizer",
    "prepare_traced_inputs",
    "pt2e_quantizer",
    "pytree_flatten",
    "quiet_torch_serde",
    "read_manifest",
    "register_cache_pytrees",
    "run_component",
    "runner_class",
    "runner_for_file",
    "provenance_shared_while_lowering",
    "cia_ops_materialized_once",
    "quant_fusion_only_with_quantized_ops",
    "sdpa_fusion_only_with_softmax",
    "second_decomposition_only_where_it_decomposes",
    "edge_passes_only_where_they_apply",
    "share_identical_weights",
    "static_sliding_layers_kept_whole",
    "symbolic_arithmetic_once",
    "tanh_gelu_kept_off_xnnpack",
    "type_promotion_on_traced_values",
    "torchlib_registry_built_once",
    "torchlib_registry_ready",
    "group_query_attention_at_any_batch",
    "GQA_GUARD_NAME",
    "upsample_fusion_only_with_upsample",
    "xnnpack_lowering",
    "xnnpack_passes_only_where_they_apply",
    "write_manifest",
    "xnnpack_dynamic_quant_partitioners",
]

"""Models traced in the ops their target's runtime has, where upstream's trace holds one it has not: transformers'
grouped-matmul experts op for ExecuTorch ([`experts_without_custom_ops`], docs/upstream-gaps.md #36), a whole-input
`Conv3d` for ExecuTorch ([`patch_convolutions_as_matmul`], #23), the argsort of a permutation for ExecuTorch
([`argsort_of_permutations`], #23), a negative pad for ExecuTorch ([`negative_padding_as_slices`], #44), an
operator's list result checked whole by ExecuTorch's validator ([`list_results_validated_whole`], #47) and
`new_empty` as `new_zeros` for its dim-order pass ([`new_empty_as_zeros`], #47), and an ONNX
graph whose optimizer keeps a norm's 1e-8 epsilon ([`exact_no_op_rewrites`], #38) and tries a pattern of several
output nodes only where its first one can match ([`multi_output_patterns_anchored`], #39) and any rule only where
its root's op type is the node's ([`rules_tried_where_their_root_can_match`], #50), and whose transposed
weights are written a block at a time ([`transposed_weights_written_in_blocks`], #48); an ONNX generation graph
on a full-length cache whose sliding windows count tokens, not slots ([`windows_counted_in_tokens`]: GenAI's
right-padded batches).
Part of the one adapter (`exporters.upstream`).

Example:
    >>> with experts_without_custom_ops(model), patch_convolutions_as_matmul():  # doctest: +SKIP
    ...     program = torch.export.export(model, args)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import torch
from transformers import masking_utils

from exporters.upstream.patches import patched, patched_item


@contextlib.contextmanager
def experts_without_custom_ops(model: Any):
    """While an ExecuTorch program is exported, a mixture-of-experts model whose experts run through transformers'
    grouped matmul (`experts_implementation="grouped_mm"`, the default: under torch.export it is transformers' own op
    `transformers::grouped_mm_fallback`, which ExecuTorch has no kernel or out variant for) runs them through
    `"batched_mm"` instead: each token's selected experts as a batched matmul of standard ops, the same function
    (docs/upstream-gaps.md #36). The model's own setting is restored after; a model without experts is untouched.

    Example:
        >>> with experts_without_custom_ops(model):  # doctest: +SKIP
        ...     program = torch.export.export(model, args)
    """
    get = getattr(model, "get_experts_implementation", None)
    saved = get() if callable(get) else {}
    if "grouped_mm" not in saved.values():
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.callback(model.set_experts_implementation, saved)
        model.set_experts_implementation({key: "batched_mm" if value == "grouped_mm" else value
                                          for key, value in saved.items()})
        yield


@contextlib.contextmanager
def patch_convolutions_as_matmul():
    """While an ExecuTorch program is traced, a `Conv3d` whose kernel covers its whole input with a stride of its
    kernel (one output position per sample, no padding, no dilation, one group: a video patch embedding such as
    Qwen2-VL's and Qwen3-VL's) is traced as the matmul it is: the sample flattened times the kernel flattened, plus
    the bias. ExecuTorch's portable `convolution` takes 3-D and 4-D inputs only and XNNPACK takes no 3-D convolution
    (docs/upstream-gaps.md #23); a linear lowers to XNNPACK. Any other `Conv3d` is traced as it is.

    Example:
        >>> with patch_convolutions_as_matmul():  # doctest: +SKIP
        ...     program = torch.export.export(vision_tower, (pixel_values, grid_thw))
    """
    real = torch.nn.Conv3d.forward

    def forward(self: torch.nn.Conv3d, input: torch.Tensor) -> torch.Tensor:
        if not _whole_input_kernel(self, input):
            return real(self, input)
        samples = input.shape[0]
        flat = torch.nn.functional.linear(input.reshape(samples, -1), self.weight.reshape(self.out_channels, -1),
                                          self.bias)
        return flat.reshape(samples, self.out_channels, 1, 1, 1)

    with patched(torch.nn.Conv3d, "forward", forward):
        yield


# Modeling modules whose only `torch.argsort` inverts a permutation (`argsort(window_index)`: Qwen2.5-VL's vision
# window order, copied into the vision towers of these families in transformers 5.24)
PERMUTATION_ARGSORTS = tuple(f"transformers.models.{name}." for name in (
    "qwen2_5_vl", "qwen2_5_omni", "exaone4_5", "muse_glimmer", "muse_spark"))


@contextlib.contextmanager
def argsort_of_permutations(model: Any):
    """While an ExecuTorch program of a model whose code argsorts only a permutation (`PERMUTATION_ARGSORTS`:
    Qwen2.5-VL's vision tower restores its window order with `torch.argsort(window_index)`) is traced, that argsort is
    traced as the inverse permutation it is, a `scatter` of `arange` (ExecuTorch has no `sort` kernel:
    docs/upstream-gaps.md #23). Any other model, and a call on anything but a 1-D integer tensor ascending, traces
    `torch.argsort` as it is; validation compares the program with eager either way.

    Example:
        >>> with argsort_of_permutations(model):  # doctest: +SKIP
        ...     program = torch.export.export(model.model.visual, (pixel_values, grid_thw))
    """
    modules = {type(module).__module__ for module in model.modules()} if isinstance(model, torch.nn.Module) else set()
    if not any(name.startswith(PERMUTATION_ARGSORTS) for name in modules):
        yield
        return
    real = torch.argsort

    def argsort(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        dim = kwargs.get("dim", args[0] if args else -1)
        descending = kwargs.get("descending", args[1] if len(args) > 1 else False)
        if input.dim() != 1 or dim not in (0, -1) or descending or input.is_floating_point() or input.is_complex():
            return real(input, *args, **kwargs)
        positions = torch.arange(input.shape[0], device=input.device)
        return torch.zeros_like(positions).scatter(0, input.long(), positions)

    with patched(torch, "argsort", argsort):
        yield


@contextlib.contextmanager
def negative_padding_as_slices():
    """While an ExecuTorch program is traced, a constant-padding module with a negative pad (RWKV's token shift,
    `nn.ZeroPad2d((0, 0, 1, -1))`: one zero row in front, the last row dropped) is traced as the slice and the
    non-negative pad it is: ExecuTorch's `constant_pad_nd` kernel refuses negative pads at run time ("Padding values
    must be non-negative", docs/upstream-gaps.md #44). Any other padding is traced as it is.

    Example:
        >>> with negative_padding_as_slices():
        ...     torch.nn.ZeroPad2d((0, 0, 1, -1))(torch.ones(1, 3, 2))[0, :, 0].tolist()
        [0.0, 1.0, 1.0]
    """
    cls = torch.nn.modules.padding._ConstantPadNd
    real = cls.forward

    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        padding = list(self.padding)
        if min(padding) >= 0:
            return real(self, input)
        for index in range(0, len(padding), 2):  # pairs from the last dimension backwards
            dim = input.dim() - 1 - index // 2
            before, after = padding[index], padding[index + 1]
            start, stop = max(0, -before), input.shape[dim] - max(0, -after)
            input = input.narrow(dim, start, stop - start)
        kept = [max(0, p) for p in padding]
        return torch.nn.functional.pad(input, kept, "constant", self.value) if any(kept) else input

    with patched(cls, "forward", forward):
        yield


@contextlib.contextmanager
def new_empty_as_zeros():
    """While an ExecuTorch program is traced, `Tensor.new_empty` is traced as `new_zeros` (the same shape, dtype and
    device; an empty tensor's values are unspecified, and a model writes them before it reads them). ExecuTorch's
    dim-order pass turns `empty` into `_empty_dim_order`, whose size is `int[]`, not `SymInt[]`: a symbolic size
    becomes a guard that fixes it (DeepSeek-V3's latent attention builds its keys with `new_empty` over the prompt's
    tokens, so its prefill took only the traced length: docs/upstream-gaps.md #47); `new_zeros` lowers to `full`,
    which takes symbolic sizes.

    Example:
        >>> with new_empty_as_zeros():
        ...     torch.ones(2).new_empty(3).tolist()
        [0.0, 0.0, 0.0]
    """

    def new_empty(self: torch.Tensor, *size: Any, **kwargs: Any) -> torch.Tensor:
        return self.new_zeros(*size, **kwargs)

    with patched(torch.Tensor, "new_empty", new_empty):
        yield


@contextlib.contextmanager
def list_results_validated_whole():
    """While ExecuTorch checks an edge program's operator dtypes, an operator whose one result is a list of tensors
    (`split_with_sizes`, what `chunk` lowers to) has that list checked as its result. ExecuTorch's validator
    (`EdgeOpArgValidator`, executorch 1.5.1) walks the node's value as the sequence of results, so it takes the
    list's first tensor for the list and asks its `len`: a guard on that tensor's first size, which fixes it at its
    traced value. A mixture-of-experts layer splits its experts' gate and up projections over the `(tokens x top_k)`
    rows (transformers' `batched_mm` experts), so its program took only prompts of the traced length
    (docs/upstream-gaps.md #47). Every other operator is checked as before; the dtypes checked are the same.

    Example:
        >>> with list_results_validated_whole():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # executorch loads only where a program is lowered (seconds, native memory)
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator

    real = EdgeOpArgValidator.call_function
    tensors = torch.ListType.ofTensors()

    def call_function(self: Any, target: Any, args: Any, kwargs: Any) -> Any:
        returns = getattr(getattr(target, "_schema", None), "returns", ())
        value = self.node.meta.get("val")
        if len(returns) == 1 and returns[0].type == tensors and isinstance(value, list):
            with patched_item(self.node.meta, "val", (value,)):  # the one result: the list
                return real(self, target, args, kwargs)
        return real(self, target, args, kwargs)

    with patched(EdgeOpArgValidator, "call_function", call_function):
        yield


def _whole_input_kernel(conv: torch.nn.Conv3d, input: torch.Tensor) -> bool:
    spatial = tuple(input.shape[2:])
    return (input.dim() == 5 and all(isinstance(size, int) for size in spatial)
            and spatial == tuple(conv.kernel_size) and tuple(conv.stride) == tuple(conv.kernel_size)
            and conv.padding in ((0, 0, 0), "valid") and tuple(conv.dilation) == (1, 1, 1) and conv.groups == 1)


@contextlib.contextmanager
def exact_no_op_rewrites():
    """While an ONNX graph is optimized, onnxscript's no-op rules (`x + 0`, `x - 0`, `x * 1`, `x / 1` → `x`) match
    only an exact 0 or 1. Their pattern constants match within `abs_tol=1e-8` / `rel_tol=1e-5` by default, so an
    RMS norm's `variance + 1e-8` lost its epsilon: a 1.5e-5 relative error in every norm of a model whose
    `rms_norm_eps` is 1e-8 (Helium), and a NaN where a row is all zeros (docs/upstream-gaps.md #38).

    Example:
        >>> with exact_no_op_rewrites():  # doctest: +SKIP
        ...     torch.onnx.export(model, args, dynamo=True, optimize=True)
    """
    # onnxscript loads only where an ONNX graph is exported
    from onnxscript.rewriter import _pattern_ir
    from onnxscript.rewriter.rules.common import _no_op  # deferred: ONNX exports only

    constants = [value for rule in _no_op.rules.rules for node in rule._target_pattern for value in node.inputs
                 if isinstance(value, _pattern_ir.Constant)]
    with contextlib.ExitStack() as stack:
        for constant in constants:
            stack.enter_context(patched(constant, "_rel_tol", 0.0))
            stack.enter_context(patched(constant, "_abs_tol", 0.0))
        yield


@contextlib.contextmanager
def multi_output_patterns_anchored():
    """While an ONNX graph is optimized, onnxscript's matcher tries a rewrite pattern of several output nodes (the
    default rules' `SlicesSplit`: two `Slice` nodes) only at a node its first output node can match (the same op type
    and domain). Upstream indexes the whole graph by op type before it looks at the node, for every node of the
    graph: quadratic in the graph's size (docs/upstream-gaps.md #39). The matcher's first step at that node is the
    same local test, so every match and every rewrite is the same; only the nodes that cannot match are skipped.
    A matcher asked to trace its attempts (`tracer`, a debugging aid) runs unchanged.

    Example:
        >>> with multi_output_patterns_anchored():  # doctest: +SKIP
        ...     torch.onnx.export(model, args, dynamo=True, optimize=True)
    """
    # onnxscript loads only where an ONNX graph is exported
    from onnxscript.rewriter import _basics, _matcher

    real = _matcher.SimplePatternMatcher.match

    def match(self, model, graph_or_function, node, **kwargs):
        if kwargs.get("tracer") is None and not self.pattern.has_single_output_node:
            first = self.pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail(f"{node.op_type} cannot be the pattern's first output node.")
        return real(self, model, graph_or_function, node, **kwargs)

    with patched(_matcher.SimplePatternMatcher, "match", match):
        yield


@contextlib.contextmanager
def rules_tried_where_their_root_can_match():
    """While an ONNX graph is optimized (and fused for ONNX Runtime), onnxscript's rewriter tries a rule at a node
    only where the rule's root (its pattern's output node, the first of several) has the node's op type and domain.
    Upstream tries every rule at every node: at TinyLlama-1.1B's width and 4 layers 69,704 attempts, most of the
    optimizer's time (docs/upstream-gaps.md #50), and the matcher's first step at that node is this same local test,
    so every match, rewrite and graph is the same; only the attempts that fail at once are skipped. A rule with
    another matcher than the simple one, a verbose rewrite and a traced one (`tracer`, a debugging aid, which records
    every failure) run unchanged.

    Example:
        >>> with rules_tried_where_their_root_can_match():  # doctest: +SKIP
        ...     torch.onnx.export(model, args, dynamo=True, optimize=True)
    """
    # onnxscript loads only where an ONNX graph is exported
    from onnxscript.rewriter import _matcher, _rewrite_rule

    real = _rewrite_rule.RewriteRule.try_rewrite
    simple = _matcher.SimplePatternMatcher

    def try_rewrite(self, model, graph_or_function, node, *, verbose=None, tracer=None):
        matcher = self._matcher
        if tracer is None and not verbose and not self._verbose and type(matcher) is simple:
            root = matcher.pattern.output_nodes[0]
            if not (root.op.matches(node.op_type) and root.domain.matches(node.domain)):
                return None
        return real(self, model, graph_or_function, node, verbose=verbose, tracer=tracer)

    with patched(_rewrite_rule.RewriteRule, "try_rewrite", try_rewrite):
        yield


@contextlib.contextmanager
def shared_tables_kept_once():
    """While an ONNX graph is optimized, onnxscript's constant folding leaves a `Transpose` of a weight that other
    nodes also read (a tied embedding table: the lookup reads it, the output projection its transpose) to the runtime.
    Upstream folds such a transpose into a second initializer when the table is small (8,192 elements or fewer; a
    larger one it keeps only when the transpose is its one reader), so a tiny tied model stored its table twice
    (1.18x its parameters). ONNX Runtime folds the transpose in memory when the session starts; the file holds one
    copy.

    Example:
        >>> with shared_tables_kept_once():  # doctest: +SKIP
        ...     torch.onnx.export(model, args, dynamo=True, optimize=True)
    """
    # onnxscript loads only where an ONNX graph is exported
    from onnxscript.optimizer import _constant_folding

    real = _constant_folding.FoldConstantsPass.__init__

    def init(self, *args, should_fold=lambda node: None, **kwargs):
        def keep_shared(node):
            table = node.inputs[0] if node.op_type == "Transpose" and node.domain == "" and node.inputs else None
            if table is not None and table.const_value is not None and len(table.uses()) > 1:
                return False
            return should_fold(node)

        real(self, *args, should_fold=keep_shared, **kwargs)

    with patched(_constant_folding.FoldConstantsPass, "__init__", init):
        yield


# How much of a transposed weight is copied into C order at a time when it is written (a bound on the temporary).
TRANSPOSE_BLOCK_BYTES = 32 << 20


def _write_transposed(matrix: torch.Tensor, file: Any, scratch: dict[Any, list[torch.Tensor]] | None = None) -> None:
    """Write `matrix.t()` in C order to `file`, `matrix` a C-contiguous 2-D tensor: a block of the result's rows at
    a time, each block copied in two steps torch does fast (a slice of columns into rows, then the transpose of that
    contiguous block, torch's blocked transpose copy), both into `scratch`'s two buffers of the matrix's dtype
    (`TRANSPOSE_BLOCK_BYTES` each, kept by the caller for every weight of a save): a fresh 32 MiB temporary per
    block is a fresh mapping whose pages fault in every time, which cost as much CPU as the copies themselves."""
    columns, rows = matrix.shape  # the result is rows x columns
    step = max(1, TRANSPOSE_BLOCK_BYTES // max(1, columns * matrix.element_size()))
    scratch = {} if scratch is None else scratch
    elements = min(step, rows) * columns
    buffers = scratch.get(matrix.dtype)
    if buffers is None or buffers[0].numel() < elements:
        buffers = scratch[matrix.dtype] = [torch.empty(max(elements, TRANSPOSE_BLOCK_BYTES // matrix.element_size()),
                                                       dtype=matrix.dtype) for _ in range(2)]
    for start in range(0, rows, step):
        count = min(step, rows - start)
        block = buffers[0][:columns * count].view(columns, count)
        block.copy_(matrix[:, start:start + count])  # columns x count, C order
        result = buffers[1][:count * columns].view(count, columns)
        result.copy_(block.t())
        file.write(result.numpy().data)


@contextlib.contextmanager
def transposed_weights_written_in_blocks():
    """While an ONNX graph is saved, a weight onnxscript's constant folding turned into its transpose (every
    linear's `MatMul` takes `W.T`: a transposed numpy view of the parameter) is written through torch's transpose
    copy a block at a time ([`TRANSPOSE_BLOCK_BYTES`]), instead of numpy's `tofile` of the view, which walks it
    element by element: 0.09-0.27 GB/s against about 1 GB/s (5.4 s against 3.0 s of CPU, the writes included, for
    the 922 MiB of linears of TinyLlama-1.1B's width at 4 layers; docs/upstream-gaps.md #48). The same bytes in the
    same order; every other tensor (C-contiguous, not 2-D, or a dtype torch does not hold, such as ml_dtypes'
    bfloat16) is written by upstream's own `tofile`.

    Example:
        >>> with transposed_weights_written_in_blocks():  # doctest: +SKIP
        ...     onnx_ir.save(model, "model.onnx", external_data="model.onnx.data")
    """
    # onnx_ir loads only where an ONNX graph is exported
    import onnx_ir

    real = onnx_ir.Tensor.tofile
    scratch = threading.local()  # each writing thread's two block buffers (onnx_ir may write from several)

    def tofile(self, file) -> None:
        array = self.raw
        if isinstance(array, np.ndarray) and array.ndim == 2 and not array.flags.c_contiguous \
                and array.T.flags.c_contiguous and self.dtype.itemsize == array.itemsize and hasattr(file, "write"):
            try:
                matrix = torch.from_numpy(array.T)  # the parameter itself: no copy
            except TypeError:  # a dtype torch cannot view (ml_dtypes' bfloat16, float8)
                return real(self, file)
            return _write_transposed(matrix, file, scratch.__dict__)
        return real(self, file)

    with patched(onnx_ir.Tensor, "tofile", tofile):
        yield


@contextlib.contextmanager
def windows_counted_in_tokens():
    """While an ONNX generation graph is traced on a full-length cache (`exporters.capture.cache_settings.
    full_length_windows`), a sliding-window layer's mask counts its window in the attention mask's tokens, not in
    cache slots: a key is seen by a query when fewer than `window` unpadded tokens lie after it up to the query.
    ONNX Runtime GenAI pads a batch on the right (a shorter row's pads stay between its prompt and its new tokens),
    so a window of slots would cover those pads; optimum, transformers.js and eager `generate()` pad on the left,
    where the two counts are the same. transformers' window (`sliding_window_causal_mask_function`, a distance in
    slots) is replaced by the count, taken from the padding mask `_preprocess_mask_arguments` returns for the same
    mask; without a padding mask (or past a cache that keeps only a window: the mask's slots are not from 0) the
    window stays transformers'.

    Example:
        >>> with windows_counted_in_tokens():  # doctest: +SKIP
        ...     onnx_program = exporter.export(gemma3, config)
    """
    preprocess, window_function = masking_utils._preprocess_mask_arguments, \
        masking_utils.sliding_window_causal_mask_function
    padding: list[Any] = []

    def preprocessed(*args: Any, **kwargs: Any) -> Any:
        result = preprocess(*args, **kwargs)
        mask, kv_offset = result[1], result[-1]
        padding[:] = [mask] if isinstance(mask, torch.Tensor) and mask.dim() == 2 and kv_offset == 0 else []
        return result

    def counted_window(sliding_window: int) -> Any:
        if not padding:
            return window_function(sliding_window)
        counted = padding.pop().to(torch.int64).cumsum(-1)

        def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
            return counted[batch_idx, q_idx] - counted[batch_idx, kv_idx] < sliding_window

        return masking_utils.and_masks(inner, masking_utils.causal_mask_function)

    with patched(masking_utils, "_preprocess_mask_arguments", preprocessed), \
            patched(masking_utils, "sliding_window_causal_mask_function", counted_window):
        yield

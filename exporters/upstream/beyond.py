"""What upstream's save and load do not cover (docs/upstream-gaps.md #11, #13, #15, #16, #20): one ExecuTorch program
with a method per component (its weights in one `.ptd` when the model ties them), a lowering that does not copy the
weights per partition, ONNX Runtime sessions that read the weights in place, graphs whose inputs were renamed for
transformers.js. Part of the one adapter (`exporters.upstream`): only this package imports `transformers.exporters`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from transformers import cache_utils
from transformers.exporters.metadata import load_treespec
from transformers.exporters.runners.base import ModelRunner
from transformers.exporters.utils import apply_patches

from exporters.upstream.patches import patched, patched_item
from exporters.upstream.pytree import leaf_tensors
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


def lean_session_options(prepack: bool = True):
    """ONNX Runtime options for validation sessions: no memory arena kept at its high-water mark, and its intra-op
    threads torch's count (what `exporters.run.resources.threads_left` leaves free next to running exports), not
    every core. MatMul weights of a float32 graph are prepacked (ONNX Runtime's default, as GenAI and optimum run the
    graph): each packed weight replaces its external-data mapping, so the session holds the weights once either way
    (at TinyLlama-1.1B: peak RSS 4.36 GB packed against 4.12 GB read in place, benchmarks/RESULTS.md round 8), and a
    probe of several tokens runs about twice as fast as from unpacked weights, which MLAS packs again on every call.
    `prepack` False ([`prepacks_alike`] said no: a quantized or half-precision graph, whose kernels compute otherwise
    once packed) keeps the weights read in place (`session.disable_prepacking`), as validation always read them."""
    # ONNX Runtime loads only where a session or a quantizer runs
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    return options


# ONNX Runtime's quantized kernels compute otherwise once their weights are prepacked: MatMulNBits at accuracy level 4
# quantizes its activations to int8 only then (a snapped int4 checkpoint's top-1 agreement with eager: 1.0 unpacked,
# 0.97 packed, tests/test_int4_onnx.py). The ops of `exporters.export.quantize`'s quantized-graph check and ONNX
# Runtime's other quantized MatMuls (a QDQ graph's pairs are fused into quantized kernels when the session optimizes it)
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul",
                           "QLinearConv", "QGemm", "QAttention", "QLinearAdd", "QLinearMul", "MatMulNBits",
                           "GatherBlockQuantized", "MatMulBnb4", "MatMulFpQ4", "DynamicQuantizeLSTM"})


def prepacks_alike(programs: Any) -> bool:
    """Whether validation prepacks these ONNX programs' weights (`onnx_ir` models, their weights unread): float32
    graphs without a quantized kernel (no half-precision weight, no op of `QUANTIZED_OPS`), whose outputs prepacking
    keeps bit for bit from two rows on (a one-row MatMul takes MLAS's vector path: the last bits differ, 2.6e-6 on a
    tiny Llama's logits), as the runtimes run them."""
    # onnx_ir loads only where an ONNX folder is read
    import onnx_ir

    half = {onnx_ir.DataType.FLOAT16, onnx_ir.DataType.BFLOAT16}
    for program in programs:
        for graph in program.graphs():
            if any(value.dtype in half for value in graph.initializers.values()):
                return False
            if any(node.op_type in QUANTIZED_OPS for node in graph):
                return False
    return True


_ORT_DTYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16,
               "tensor(double)": torch.float64, "tensor(int64)": torch.int64, "tensor(int32)": torch.int32,
               "tensor(bool)": torch.bool}


class RenamedRunner:
    """Upstream's ONNX runner for a graph whose inputs were renamed (the transformers.js layout): kwargs flattened to
    upstream's leaf names, fed under the graph's names. Outputs keep their order, so upstream unflattens them.

    `branch` (a merged encoder-decoder graph, `decoder_model_merged.onnx`) is the `use_cache_branch` this component
    runs; a graph input the component does not have (the no-past step's past) is fed empty as the runtimes feed it:
    its symbolic dims 0, `batch_size` the batch of the inputs fed. A floating input is fed in the type the graph
    declares (a float16 encoder's float32 pixels or features: `exporters.layouts.transformers_js.files`)."""

    def __init__(self, runner: Any, inputs: dict[str, str], branch: bool | None = None):
        self._runner = runner
        self._inputs = inputs  # graph input name -> upstream leaf path
        self._branch = branch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs: Any) -> Any:
        leaves = leaf_tensors(kwargs)
        feed = {graph: leaves[path] for graph, path in self._inputs.items() if path in leaves}
        declared = {spec.name: _ORT_DTYPES.get(spec.type) for spec in self._runner.session.get_inputs()}
        feed = {name: value.to(declared[name]) if value.is_floating_point() and declared.get(name) is not None
                and declared[name].is_floating_point and value.dtype != declared[name] else value
                for name, value in feed.items()}
        if self._branch is not None:
            batch = next(iter(feed.values())).shape[0]
            feed["use_cache_branch"] = torch.tensor([self._branch])
            for spec in self._runner.session.get_inputs():
                if spec.name not in feed:
                    shape = [d if isinstance(d, int) else batch if d == "batch_size" else 0 for d in spec.shape]
                    feed[spec.name] = torch.zeros(shape, dtype=_ORT_DTYPES[spec.type])
        return self._runner(share_inputs=share_inputs, share_outputs=share_outputs, **feed)


class _CapturedLowering:
    """What upstream's ExecuTorch exporter would have lowered: its prepared program and the lowering arguments."""

    def __init__(self, program: Any, kwargs: dict[str, Any]):
        self.program, self.kwargs, self.backend_config = program, kwargs, None

    def to_executorch(self, config: Any = None) -> _CapturedLowering:
        self.backend_config = config
        return self


@contextlib.contextmanager
def lowering_captured():
    """While components are exported, upstream's ExecuTorch exporter hands back each prepared program with its
    lowering's arguments (`_CapturedLowering`) instead of lowering it, so that [`export_executorch_methods`] lowers
    them all together as one program with a method per component (docs/upstream-gaps.md #11)."""
    # upstream's ExecuTorch exporter loads ExecuTorch and its XNNPACK backend (tens of seconds): only where one lowers
    import transformers.exporters.exporter_executorch

    with patched(transformers.exporters.exporter_executorch, "to_edge_transform_and_lower",
                 lambda program, **kwargs: _CapturedLowering(program, kwargs)):
        yield


def export_executorch_methods(exporter: Any, components: dict[str, tuple[Any, dict]], configs: dict[str, Any],
                              methods: dict[str, str] | None = None,
                              weights_file: str | None = None,
                              constant_methods: dict[str, Any] | None = None,
                              fusing: list[Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """`(ExecutorchProgramManager, {component: ExportMetadata})`: every component traced and prepared by upstream's
    `ExecutorchExporter.export_program` (backend preparation, patches, FX fixes) with its lowering captured, then all
    lowered together by one `to_edge_transform_and_lower({method: program})` under the same patches: one program, one
    method per component (`methods` maps components to method names; the component's name by default), XNNPACK's
    content-keyed weights stored once.

    With `weights_file` (a name without suffix), every constant goes to `<weights_file>.ptd` beside the program,
    the program's own constants and the delegates' weights alike, where ExecuTorch's named-data store keeps identical
    tensors once: a tied embedding table (looked up on the portable kernels, multiplied by XNNPACK as the output
    projection) is then stored once instead of twice (docs/upstream-gaps.md #13). Save with
    `write_tensor_data_to_file`; load with `Runtime.load_program(pte, data_path=ptd)`. `constant_methods`: methods
    that return a constant (a runner's metadata: `exporters.upstream.asr_runner.asr_metadata`). `fusing`: the
    edge passes a program torchao quantized needs (`llm_runner.drop_embedding_padding_idx`), run after upstream's;
    its quantized ops are then fused into ExecuTorch's kernels (`do_quant_fusion_and_const_prop`, as the runners')."""

    # upstream's ExecuTorch exporter loads ExecuTorch and its XNNPACK backend (tens of seconds): only where one lowers
    import transformers.exporters.exporter_executorch

    captured: dict[str, _CapturedLowering] = {}
    metadata: dict[str, Any] = {}
    with lowering_captured():
        for name, (module, inputs) in components.items():
            try:
                program, meta = exporter.export_program(module, copy.deepcopy(inputs), configs[name])
            except Exception as err:
                raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}") from err
            meta.export_config = json.loads(configs[name].to_json_string())
            captured[name], metadata[name] = program, meta
    first = next(iter(captured.values()))
    backend = next(iter(configs.values())).backend
    methods = methods or {name: name for name in captured}
    backend_config = first.backend_config
    if weights_file is not None:
        for lowering in captured.values():
            _tag_delegate_weights(lowering.program, weights_file)
        backend_config = _external_constants(backend_config, weights_file)
    with apply_patches("executorch"), apply_patches(f"executorch.{backend}"):
        edge = transformers.exporters.exporter_executorch.to_edge_transform_and_lower(
            {methods[name]: c.program for name, c in captured.items()},
            partitioner={methods[name]: c.kwargs["partitioner"] for name, c in captured.items()},
            compile_config=first.kwargs["compile_config"],
            transform_passes=[*(first.kwargs["transform_passes"] or []), *(fusing or [])] or None,
            constant_methods=constant_methods or None)
        del captured
        if not fusing:
            return edge.to_executorch(config=backend_config), metadata
        from executorch.exir import ExecutorchBackendConfig  # deferred: loaded by upstream's exporter above

        with quant_fusion_only_with_quantized_ops():
            return edge.to_executorch(config=dataclasses.replace(backend_config or ExecutorchBackendConfig(),
                                                                 do_quant_fusion_and_const_prop=True)), metadata


def _tag_delegate_weights(program: Any, tag: str) -> None:
    """Mark the program's constants (parameters, constant buffers, lifted constants; not the mutable cache) so a
    delegate that serializes them (XNNPACK) puts them in the named-data file `tag` instead of its own blob."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    constants = {*signature.inputs_to_parameters, *signature.inputs_to_lifted_tensor_constants,
                 *(node for node, buffer in signature.inputs_to_buffers.items() if buffer not in mutated)}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in constants:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag


def _external_constants(config: Any, tag: str) -> Any:
    """Upstream's `ExecutorchBackendConfig` (None for defaults) with every non-delegated constant in file `tag`."""

    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir.capture._config import ExecutorchBackendConfig

    def to_file(_node: Any) -> str:
        return tag

    if config is None:
        return ExecutorchBackendConfig(external_constants=to_file)
    return dataclasses.replace(config, external_constants=to_file)


@contextlib.contextmanager
def constants_shared_by_lowering_copies():
    """While ExecuTorch lowers, the copy of each partition that a backend preprocesses shares the partition's
    constants (parameters, constant buffers, lifted constants) with it instead of copying them.

    ExecuTorch deep-copies every partition of every method before preprocessing the first one
    (`lower_all_submodules_to_backend`, through `BackendDetails.copy_exported_program_for_preprocess`, the hook a
    backend may override): on a 0.5B model that held a second copy of all the weights (and touched the first)
    while XNNPACK's serialized weights accumulated beside them, 3.7x the weights at the peak
    (benchmarks/profile_executorch_memory.py). The graph is still copied, so preprocessing can rewrite it; a
    backend pass that wrote into a constant in place would change the numbers, which validation checks. Likewise a
    constant used by two partitions gets a node per partition naming the same tensor, not a copy of it."""
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir.backend.backend_details import BackendDetails

    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir.backend.canonical_partitioners import duplicate_constant_node_pass

    def sharing_copy(cls: Any, edge_program: Any, compile_specs: Any) -> Any:
        memo = {id(tensor): tensor for tensor in _program_constants(edge_program)}
        return copy.deepcopy(edge_program, memo)

    class _TensorSharingCopy:
        """`copy` as the pass that gives each partition its own node for a shared constant sees it: the new node
        names the same tensor (a tied embedding table used by the lookup and the projection) instead of a copy."""

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

        @staticmethod
        def deepcopy(value: Any, memo: dict | None = None) -> Any:
            return value if isinstance(value, torch.Tensor) else copy.deepcopy(value, memo)

    with patched(BackendDetails, "copy_exported_program_for_preprocess", classmethod(sharing_copy)), \
            patched(duplicate_constant_node_pass, "copy", _TensorSharingCopy()):
        yield


SPILL_BYTES = 4096  # named data at least this large (every weight matrix) waits on disk for the program's writing


@contextlib.contextmanager
def named_data_on_disk(directory: Any):
    """While ExecuTorch lowers and saves, every large blob a backend adds to its named-data store (XNNPACK's
    serialized copy of each weight) is written to a file under `directory` at once and kept as ExecuTorch's
    `FileBackedData`, which the store deduplicates by hash and the program's writer copies in chunks; the blobs no
    longer pile up in memory until the `.pte` / `.ptd` is written (docs/upstream-gaps.md #20). The files are removed
    when the context exits."""

    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir._serialize._cord import FileBackedData

    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.exir._serialize._named_data_store import NamedDataStore

    spill = Path(tempfile.mkdtemp(prefix=".named-data-", dir=directory))
    real = NamedDataStore.add_named_data

    def add_named_data(self: Any, key: str, data: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(data, (bytes, bytearray)) and len(data) >= SPILL_BYTES:
            digest = hashlib.sha256(data).digest()
            with tempfile.NamedTemporaryFile(dir=spill, suffix=".bin", delete=False) as handle:
                handle.write(data)
            data = FileBackedData(handle.name, cleanup=True, sha256=digest)
        return real(self, key, data, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, spill, ignore_errors=True)
        stack.enter_context(patched(NamedDataStore, "add_named_data", add_named_data))
        yield


def _program_constants(value: Any) -> list[Any]:
    """The constant tensors of an `ExportedProgram`, or of the programs an ExecuTorch program manager holds."""

    if isinstance(value, ExportedProgram):
        programs = [value]
    elif isinstance(getattr(value, "exported_program", None), ExportedProgram):
        programs = [value.exported_program]
    else:
        programs = [p for p in (getattr(value, "_edge_programs", None) or {}).values() if isinstance(p, ExportedProgram)]
    tensors = []
    for program in programs:
        tensors += list(_unmutated_state(program).values())
        tensors += list(program.constants.values())
    return tensors


@contextlib.contextmanager
def tanh_gelu_kept_off_xnnpack():
    """While ExecuTorch lowers, XNNPACK's partitioner leaves `gelu(approximate="tanh")` to the portable kernels:
    XNNPACK's GELU node ignores `approximate` and computes the exact (erf) GELU, up to 4.7e-4 away per activation
    (SigLIP, Gemma, GPT-2-style MLPs; docs/upstream-gaps.md #24). The exact GELU stays delegated.

    Example:
        >>> with tanh_gelu_kept_off_xnnpack():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig

    real = GeluConfig.check_constraints

    def check_constraints(self: Any, node: Any, ep: Any) -> bool:
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return approximate != "tanh" and real(self, node, ep)

    with patched(GeluConfig, "check_constraints", check_constraints):
        yield


@contextlib.contextmanager
def xnnpack_lowering():
    """How every ExecuTorch program of this project is lowered to XNNPACK beyond upstream's defaults: the tanh GELU
    kept off XNNPACK ([`tanh_gelu_kept_off_xnnpack`]), the upsample fusion only where a graph has an upsample
    ([`upsample_fusion_only_with_upsample`]), the SDPA fusion only where a partition has a softmax
    ([`sdpa_fusion_only_with_softmax`]), XNNPACK's other passes only where a partition calls an op they rewrite
    ([`xnnpack_passes_only_where_they_apply`]) and the `EDGE_DO_NOT_DECOMP` path's second decomposition only where
    a node is left to decompose ([`second_decomposition_only_where_it_decomposes`]), and `to_edge`'s transpose and
    view passes only where a node is one they rewrite ([`edge_passes_only_where_they_apply`]), each node's history
    shared, not deep-copied ([`provenance_shared_while_lowering`]), and torch's CompositeImplicit ops looked up once
    per collection, not once per op namespace ([`cia_ops_materialized_once`]); all in
    `exporters.upstream.xnnpack_passes` but the first.

    Example:
        >>> with xnnpack_lowering():  # doctest: +SKIP
        ...     to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    """
    with tanh_gelu_kept_off_xnnpack(), upsample_fusion_only_with_upsample(), sdpa_fusion_only_with_softmax(), \
            xnnpack_passes_only_where_they_apply(), second_decomposition_only_where_it_decomposes(), \
            edge_passes_only_where_they_apply(), provenance_shared_while_lowering(), cia_ops_materialized_once():
        yield


@contextlib.contextmanager
def static_sliding_layers_kept_whole():
    """While components are captured, a static cache's sliding-window layers are plain static layers: every position
    has its slot, and the model's sliding-window mask applies the window (upstream already traces a dynamic cache's
    sliding layers whole). A `StaticSlidingWindowLayer` chooses its update's code path from a Python counter at
    trace time (write in place while the window has room, roll once it is full), so a decode traced before the window
    filled cannot run past it (docs/upstream-gaps.md #9). The cost: those layers hold `max_cache_len` positions.

    Example:
        >>> with static_sliding_layers_kept_whole():  # doctest: +SKIP
        ...     components = decompose_for_generation(gemma2, inputs, generation_config=static)
    """

    mapping = cache_utils.STATIC_LAYER_TYPE_MAPPING
    if mapping.get("sliding_attention") is not cache_utils.StaticSlidingWindowLayer:
        yield  # transformers changed the mapping: nothing of ours to undo
        return
    with patched_item(mapping, "sliding_attention", cache_utils.StaticLayer):
        yield


def share_identical_weights(program: Any, pool: dict[str, Any]) -> int:
    """Give a loaded `ExportedProgram` the tensors of `pool` (state-dict name -> tensor, from the programs of the same
    export loaded before it) where its own are equal bit for bit, and add the others to the pool; call it before the
    program's runner is built. Returns the bytes no longer held twice.

    torch.export's `.pt2` holds one program with its weights, so a split dynamo target's `prefill.pt2` and
    `decode.pt2` each load a copy of the model: validation then holds both. Sharing is exact (same name, dtype, shape,
    strides and `torch.equal`) and leaves out the buffers a program mutates (a cache). Other programs are left alone.

    Example:
        >>> pool = {}
        >>> share_identical_weights(prefill_program, pool), share_identical_weights(decode_program, pool)  # doctest: +SKIP
        (0, 232000000)
    """

    if not isinstance(program, ExportedProgram):
        return 0
    freed = 0
    for name, tensor in _unmutated_state(program).items():
        earlier = pool.get(name)
        if earlier is None:
            pool[name] = tensor
        elif earlier is not tensor and earlier.dtype == tensor.dtype and earlier.shape == tensor.shape \
                and earlier.stride() == tensor.stride() and torch.equal(earlier, tensor):
            program.state_dict[name] = earlier
            freed += tensor.nbytes
    return freed


def _unmutated_state(program: Any) -> dict[str, Any]:
    """An `ExportedProgram`'s parameters and constant buffers by state-dict name; not the buffers it mutates (a
    cache)."""
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    return {name: tensor for name, tensor in program.state_dict.items() if name not in mutated}


def executorch_method_runner(program: Any, metadata: Any, method: str) -> Any:
    """Upstream's ExecuTorch runner on one method of a loaded program (upstream's own runs `forward` only)."""
    # upstream's ExecuTorch runner loads ExecuTorch
    from transformers.exporters.runners.runner_executorch import ExecutorchModelRunner

    runner = ExecutorchModelRunner.__new__(ExecutorchModelRunner)
    ModelRunner.__init__(runner, metadata)
    runner.method = program.load_method(method)
    runner.in_spec = load_treespec(metadata.in_spec)
    return runner


def metadata_dict(metadata: Any) -> dict[str, Any]:
    """An `ExportMetadata` as upstream's manifest stores it."""

    return dataclasses.asdict(metadata)

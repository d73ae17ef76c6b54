"""transformers.js's dtype files: every variant of a transformers.js-layout target in the one folder transformers.js
loads, `onnx/model{suffix}.onnx` beside `onnx/model.onnx`, picked at load time with `dtype`.

```
variants ["fp32", "fp16", "int8-dynamic", "int4", "q4f16"]      (exporters.recipe.variants.TRANSFORMERS_JS_DTYPES)
onnx/model.onnx (fp32, the exported graph) ──► model_fp16.onnx       float16 (ONNX Runtime's converter, keep_io_types)
                                          ├─► model_quantized.onnx  q8: int8 MatMul weights (quantize_dynamic)
                                          ├─► model_q4.onnx         q4: 4-bit block-wise MatMulNBits
                                          └─► model_q4f16.onnx      q4f16: the q4 graph converted to float16
config.json transformers.js_config {dtype: the first variant's, use_external_data_format: {file: 1 per file}}
export.json "dtype_files" {dtype: {file, files, variant, kind, quantize}}
```

A folder of several graphs (a vision-language model's `vision_encoder`, `embed_tokens`, `decoder_model_merged`, an
audio-language model's `audio_encoder` ..., Whisper's `encoder_model` and `decoder_model_merged`) gets each graph's
file of every dtype (`onnx/vision_encoder_q4.onnx`, ...): transformers.js picks each session's file by the one `dtype`
(or a `{graph: dtype}` object); `files` maps each fp32 graph to its dtype file, `file` names the decoder's. A merged
encoder-decoder decoder (its `If` branches reading outer weights) is refused q8 and fp16/q4f16 with the reason
(`_derive`): ONNX Runtime's converters would leave it float under a q8 name, or fail.

Each file is derived from the fp32 graph as transformers.js's own conversion (its `scripts/quantize.py`) derives
them: the same converters, the same defaults (q4: block 32, symmetric, accuracy level 0; fp16 and q4f16: float32
inputs and outputs, `keep_io_types`, so the caller's cache and logits stay float32; q8: int8 per-channel weights (where
transformers.js's script keeps per-tensor: per-channel keeps more of a small model's argmaxes), dynamic uint8
activations, of MatMuls). The fp32 graph is always written, listed or not: it is what the others are derived from and what
transformers.js loads without a `dtype`. Validation judges each file against eager with its variant's budget
(`exporters.validate.dtype_files`) and the proof loads each with its `dtype` (`proof.py`).

Example:
    >>> dtype_file("int4"), dtype_file("int8-dynamic")
    ('model_q4.onnx', 'model_quantized.onnx')
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from exporters import fsutil
from exporters.errors import TargetPlanError
from exporters.recipe.budgets import resolve_budget
from exporters.recipe.variants import TRANSFORMERS_JS_DTYPES, OnnxRuntimeInt4Quantize
from exporters.upstream import quantize_matmul_nbits, read_manifest, write_manifest

SUBFOLDER = "onnx"
DTYPE_FILES = "dtype_files"  # export.json's key: {dtype: {file, files, variant, kind, quantize}}


def dtype_file(variant: str) -> str:
    """The file transformers.js loads for `variant` (`model{suffix}.onnx`)."""
    return f"model{TRANSFORMERS_JS_DTYPES[variant][1]}.onnx"


def dtype_files_in(directory: Path) -> dict[str, dict[str, Any]]:
    """The dtype files export.json lists (`{}` where there are none, or it is unreadable).

    Example:
        >>> dtype_files_in(Path("/nonexistent"))
        {}
    """
    try:
        files = json.loads((Path(directory) / "export.json").read_text(encoding="utf-8")).get(DTYPE_FILES) or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def write_dtype_files(directory: Path, target: Any) -> None:
    """Derive each of the target's variants from each fp32 graph under `onnx/` in `directory` (see the module)."""
    variants = list(target.variants or [])
    manifest = read_manifest(directory)
    graphs = sorted({entry["file"] for entry in manifest["components"].values()})
    plain = [file for file in graphs if file.startswith(f"{SUBFOLDER}/") and file.endswith(".onnx")
             and not any(file.endswith(f"{suffix}.onnx") for _, suffix, _, _ in TRANSFORMERS_JS_DTYPES.values() if suffix)]
    if plain != graphs or getattr(target, "dtype", None) not in (None, "float32"):
        raise TargetPlanError("`variants` of a transformers.js target are written as dtype files of its float32 "
                              f"graphs under onnx/; this export has {graphs} (dtype {getattr(target, 'dtype', None)}): "
                              "list one variant per target instead", option="variants")
    listed: dict[str, dict[str, Any]] = {}
    external = {Path(file).name: 1 for file in graphs if (directory / f"{file}_data").is_file()}
    for variant in variants:
        dtype, suffix, kind, quantize = TRANSFORMERS_JS_DTYPES[variant]
        if variant == "fp32":
            continue
        files = {}
        for file in graphs:  # each graph of the folder (a VLM's encoder, embed_tokens and decoder): one file a dtype
            name = Path(file).name.removesuffix(".onnx") + f"{suffix}.onnx"
            _derive(directory / file, directory / SUBFOLDER / name, variant)
            if (directory / SUBFOLDER / f"{name}_data").is_file():
                external[name] = 1
            files[file] = f"{SUBFOLDER}/{name}"
        listed[dtype] = {"file": files[_main(graphs)], "files": files, "variant": variant, "kind": kind,
                         "quantize": quantize}
    manifest[DTYPE_FILES] = listed
    write_manifest(directory, manifest)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["transformers.js_config"] = {"dtype": TRANSFORMERS_JS_DTYPES[variants[0]][0],
                                        "use_external_data_format": external or False}
    fsutil.write_file(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def _main(graphs: list[str]) -> str:
    """The graph a dtype file's row is named by: the decoder's (`decoder_model_merged`, a text model's `model`)."""
    return next((file for file in graphs if file.endswith(("/decoder_model_merged.onnx", "/model.onnx"))), graphs[-1])


def _derive(source: Path, destination: Path, variant: str) -> None:
    """`destination` (with `{name}_data`) written from the fp32 graph at `source` as `variant` asks."""
    # ONNX and ONNX Runtime load only where an ONNX model is converted
    import onnx

    if variant == "int8-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic  # (the same)

        with tempfile.TemporaryDirectory() as tmp:
            quantized = Path(tmp) / "model.onnx"
            # MatMuls only: the graph's Gathers index shape tensors too, which ONNX Runtime's quantizer cannot scale.
            # 7-bit weights (reduce_range): on an x86 CPU without VNNI (AVX2 alone: AMD Zen 2/3, older Xeons) ONNX
            # Runtime's u8 x s8 kernels add pairs of products in int16, which 8-bit weights overflow (a trained
            # LLaVA's q8 next-token KL 0.07 there, its budget 0.05); the file runs on the user's CPU, not ours.
            quantize_dynamic(str(source), str(quantized), weight_type=QuantType.QInt8, use_external_data_format=True,
                             per_channel=True, reduce_range=True, op_types_to_quantize=["MatMul"],
                             extra_options={"MatMulConstBOnly": True})
            model = onnx.load(str(quantized))
        if _weight_matmuls(onnx.load(str(source), load_external_data=False).graph) and \
                not _weight_matmuls(model.graph) & {"MatMulInteger", "DynamicQuantizeMatMul"}:
            # a merged decoder whose If branches read their weights from the outer graph: the quantizer skips them
            raise TargetPlanError(f"variant 'int8-dynamic': ONNX Runtime's quantizer quantized no MatMul of "
                                  f"{source.name} (an If branch's weights held by the outer graph); a q8 file of "
                                  "float weights would be mislabelled: list int4 instead", option="variants")
        _save(model, destination)
        return
    model = _matmul_nbits(source) if variant in ("int4", "q4f16") else onnx.load(str(source))  # with its weights
    if variant in ("fp16", "q4f16"):
        from onnxruntime.transformers.float16 import convert_float_to_float16  # (the same)

        from onnxruntime.transformers.onnx_model import OnnxModel  # (the same)

        if shared_initializer_names(model.graph):
            raise TargetPlanError(f"variant '{variant}': {source.name}'s If branches share initializer names "
                                  f"({shared_initializer_names(model.graph)[:3]}), which ONNX Runtime's float16 "
                                  "converter cannot convert; an encoder-decoder's merged decoder gets no fp16 or q4f16 "
                                  "file yet: list int4", option="variants")
        model = convert_float_to_float16(model, keep_io_types=True)
        half = OnnxModel(model)
        half.topological_sort()  # the converter appends the input casts last (transformers.js's script slims it)
        model = half.model
    _save(model, destination)


def shared_initializer_names(graph: Any, seen: set[str] | None = None) -> list[str]:
    """Float initializer names `graph`'s subgraphs hold more than once (an encoder-decoder's merged decoder: each `If`
    branch its own `zeros`), which ONNX Runtime's float16 converter refuses (and, renamed, it returns the branches'
    outer `logits` directly, which ONNX Runtime cannot load): such a graph gets no fp16 or q4f16 file yet.

    Example:
        >>> from onnx import helper, TensorProto
        >>> zeros = helper.make_tensor("zeros", TensorProto.FLOAT, [1], [0.0])
        >>> branch = helper.make_graph([helper.make_node("Identity", ["zeros"], ["y"])], "b", [], [], [zeros])
        >>> shared_initializer_names(helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=branch,
        ...                                           else_branch=branch)], "g", [], [], []))
        ['zeros']
    """
    # onnx loads only where an ONNX model is converted
    import onnx

    seen = set() if seen is None else seen
    shared = []
    for tensor in graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT and tensor.name in seen:
            shared.append(tensor.name)
        seen.add(tensor.name)
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else []) + list(attribute.graphs):
                shared += shared_initializer_names(sub, seen)
    return shared


def _weight_matmuls(graph: Any) -> set[str]:
    """The op types of `graph`'s nodes (its subgraphs' too) that multiply by a weight: a `MatMul` whose second input
    is an initializer of any scope, and the int8 ops ONNX Runtime's quantizer writes in their place."""
    # onnx loads only where an ONNX model is converted
    import onnx

    def walk(graph: Any, weights: set[str], ops: set[str]) -> None:
        weights = weights | {tensor.name for tensor in graph.initializer}
        for node in graph.node:
            if node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") or (
                    node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in weights):
                ops.add(node.op_type)
            for attribute in node.attribute:
                subgraphs = ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else []) + list(attribute.graphs)
                for sub in subgraphs:
                    walk(sub, weights, ops)

    found: set[str] = set()
    walk(graph, set(), found)
    return found


def _matmul_nbits(source: Path) -> Any:
    """The fp32 graph at `source` with every constant-weight MatMul as a 4-bit `MatMulNBits` (transformers.js's
    conversion defaults: block 32, symmetric, accuracy level 0), through the `int4` variant's own quantizer: a table
    tied to the LM head stored once in 4 bits (`GatherBlockQuantized` over the head's blocks, as GenAI's builder
    stores it), the graph sorted after quantizing (a fused graph's `If` branches read outer values)."""
    # ONNX loads only where an ONNX model is converted
    import onnx_ir

    spec = OnnxRuntimeInt4Quantize(method="onnxruntime-int4", accuracy_level=0)
    model = onnx_ir.load(str(source))
    onnx_ir.external_data.load_to_model(model)
    return onnx_ir.to_proto(quantize_matmul_nbits(model, **spec.options()))


def _save(model: Any, path: Path) -> None:
    """`path` with its weights in `{name}_data` (the name transformers.js reads)."""
    # onnx loads only where an ONNX file is written
    import onnx

    data = path.with_name(f"{path.name}_data")
    data.unlink(missing_ok=True)  # onnx appends external data to an existing file
    # small tensors (shapes, axes) stay in the graph: ONNX Runtime's shape inference reads them there
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    data.chmod(0o644)  # as the folder's other files (onnx writes it private)


def proof_runs(directory: Path, validation: Any, steps: int) -> list[tuple[str | None, int]]:
    """What a multimodal proof loads (`image_text_proof`, `audio_text_proof`, `speech_proof`), as (dtype, greedy
    tokens asked): the folder's own graphs with all `steps` tokens (None: the dtype `config.json` names; `"fp32"`
    where the folder has dtype files, the first of which may be another), then each dtype file with the tokens its
    variant's budget asks (`min_greedy_match`, as `proof.py` asks of a text decoder's).

    Example:
        >>> proof_runs(Path("/nonexistent"), None, 8)
        [(None, 8)]
    """
    files = {dtype: entry for dtype, entry in dtype_files_in(directory).items()
             if dtype in {row[0] for row in TRANSFORMERS_JS_DTYPES.values()}}
    runs: list[tuple[str | None, int]] = [("fp32" if files else None, steps)]
    for dtype, entry in files.items():
        budget = resolve_budget(str(entry.get("kind")), validation)
        runs.append((dtype, min(steps, int(budget.get("min_greedy_match", steps)))))
    return runs


def equal_new(want: list[int], got: Any, prompt: int) -> int:
    """How many generated tokens of `got` equal eager's `want` before the first difference (`prompt` tokens lead
    both).

    Example:
        >>> equal_new([1, 2, 3, 4], [1, 2, 3, 9], 2), equal_new([1, 2, 3], None, 2)
        (1, 0)
    """
    got = got if isinstance(got, list) else []
    equal = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return max(0, equal - prompt) if len(got) >= prompt else 0


def judged(want: list[int], got: Any, prompt: int, steps: int, asked: int,
           where: str = "") -> tuple[int, str | None]:
    """How many of the `steps` generated tokens of `got` equal eager's `want` (`equal_new`), and why they fall short
    of the `asked` count (None when they do not); `where` follows "eager greedy" in that reason (" with dtype q4").

    Example:
        >>> judged([1, 2, 3, 4], [1, 2, 3, 4], 2, 2, 2), judged([1, 2, 3, 4], [1, 2, 9, 9], 2, 2, 2, " with dtype q4")
        ((2, None), (0, '0/2 tokens equal eager greedy with dtype q4: transformers.js [1, 2, 9, 9], eager [1, 2, 3, 4]'))
    """
    equal = steps if got == want else equal_new(want, got, prompt)
    if equal >= asked:
        return equal, None
    return equal, (f"{equal}/{steps} tokens equal eager greedy{where}" + ("" if asked == steps else f", {asked} asked")
                   + f": transformers.js {got}, eager {want}")


def said_runs(runs: list[tuple[str | None, int, int]], steps: int) -> str:
    """The proof's words for the dtype files after the folder's own: `; dtype q4 8/8 tokens (≥2 asked), ...`.

    Example:
        >>> said_runs([(None, 8, 8), ("q4", 8, 2), ("q4f16", 8, 8)], 8)
        '; dtype q4 8/8 tokens (≥2 asked), q4f16 8/8 tokens'
    """
    rest = [f"{dtype} {equal}/{steps} tokens" + ("" if asked == steps else f" (≥{asked} asked)")
            for dtype, equal, asked in runs[1:]]
    return f"; dtype {', '.join(rest)}" if rest else ""

"""Quantized targets: the recipe's `quantize` turned into upstream's quantizer, calibration data from the recipe, and
what was quantized and how, written into the target's `export.json`.

```
recipe quantize {method, options} ──► upstream quantizer per component ──► export ──► export.json "quantization"
inputs.calibration ──► samples at the traced shape ──► per-component forward inputs (generation: upstream's capture)
```

The methods map to upstream's quantizers (`transformers.exporters.quantizers`, through `exporters.upstream`):
`onnxruntime-dynamic` / `onnxruntime-static` → `OnnxRuntimeQuantizer` with `OnnxRuntimeDynamicConfig` /
`OnnxRuntimeStaticConfig`; `pt2e-xnnpack` → `PT2EQuantizer(XNNPACKQuantizer)`; `pt2e-x86` →
`PT2EQuantizer(X86InductorQuantizer)`. Enum-valued options are chosen by documented names (`"int8"`, `"qdq"`,
`"minmax"`), never by an import path from the recipe.

Example:
    >>> from exporters.recipe.variants import OnnxRuntimeStaticQuantize
    >>> onnxruntime_options(OnnxRuntimeStaticQuantize(method="onnxruntime-static", per_channel=True))
    {'per_channel': True}
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

from exporters import upstream
from exporters.capture.components import generation_config_for
from exporters.capture.inputs import SampleInputs, make_sample_inputs, prompt_ids
from exporters.capture.families import a_model_of
from exporters.capture.multimodal_runner import MULTIMODAL_RUNNER
from exporters.errors import RecipeError
from exporters.export.footprint import tied_embeddings
from exporters.recipe.jsonpos import format_path, nearest_line
from exporters.recipe.model import Recipe, Target
from exporters.recipe.variants import VARIANTS
from exporters.upstream import capture_calibration_inputs
from exporters.version import installed_version

TEXT_FAMILIES = ("text", "seq2seq", "vision-language", "audio-language")
# ONNX ops that hold quantized values or compute on them (ONNX Runtime's dynamic and QDQ graphs, PT2E's QDQ, int4
# weight-only MatMulNBits and its 4-bit table, GatherBlockQuantized).
_ONNX_QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                   "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul", "QLinearConv", "QGemm",
                   "QAttention", "QLinearAdd", "QLinearMul", "MatMulNBits", "GatherBlockQuantized")


# ── Calibration data ──────────────────────────────────────────────────────────


def _fit(ids: torch.Tensor, length: int) -> torch.Tensor:
    """Token ids cut or repeated to `length`: every calibration sample has the traced shape."""
    if ids.numel() >= length:
        return ids[:length]
    return ids.repeat(math.ceil(length / max(ids.numel(), 1)))[:length]


def _prompts_error(recipe: Recipe, message: str) -> RecipeError:
    source = getattr(recipe, "_source", None)
    path = (*(source.prefix if source else ()), "inputs", "calibration", "prompts")
    return RecipeError(message, path=format_path(path), line=nearest_line(source.lines, path) if source else None,
                       file=source.file if source else None)


def calibration_samples(model, recipe: Recipe, tokenizer, family: str) -> list[SampleInputs]:
    """The recipe's calibration samples (`inputs.calibration`), shaped like the sample inputs.

    Raises `RecipeError` when prompts cannot be used: the model takes no text, or the repo has no tokenizer.
    """
    spec = recipe.inputs
    calibration = spec.calibration
    if calibration is None:
        return []
    length = int(prompt_ids(model, tokenizer, spec, torch.Generator().manual_seed(spec.seed)).shape[1]) \
        if family in TEXT_FAMILIES else spec.sequence_length
    if calibration.samples is not None:
        return [
            make_sample_inputs(model, spec.model_copy(update={"seed": spec.seed + 1 + k, "prompt": None,
                                                              "sequence_length": length}))
            for k in range(calibration.samples)
        ]
    if family not in TEXT_FAMILIES:
        raise _prompts_error(recipe, f"calibration prompts need a model that takes text; this is {a_model_of(family)}: "
                                     'use "samples": N instead')
    if tokenizer is None:
        raise _prompts_error(recipe, "calibration prompts need the repo's tokenizer, and the repo has none: add one, "
                                     'or use "samples": N (synthesized token ids)')
    vocab = int(getattr(getattr(model.config, "text_config", None) or model.config, "vocab_size"))
    samples = []
    for prompt in calibration.prompts or []:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"][0].clamp(max=vocab - 1)
        batch = _fit(ids, length).unsqueeze(0).repeat(spec.batch_size, 1)
        samples.append(make_sample_inputs(model, spec, tokenizer, text_ids=batch))
    return samples


# ── Upstream quantizers ───────────────────────────────────────────────────────


def onnxruntime_options(spec: Any) -> dict[str, Any]:
    """The recipe's ONNX Runtime options as `quantize_dynamic` / `quantize_static` keyword arguments."""
    options = spec.options()
    needs_enums = {"weight_type", "activation_type", "quant_format", "calibrate_method"} & set(options)
    if needs_enums:
        # ONNX Runtime loads only where a session or a quantizer runs
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

        names = {
            "weight_type": {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8},
            "activation_type": {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8},
            "quant_format": {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator},
            "calibrate_method": {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                                 "percentile": CalibrationMethod.Percentile},
        }
        for key in needs_enums:
            options[key] = names[key][options[key]]
    return options


def xnnpack_quantizer(scheme: str):
    """ExecuTorch's `XNNPACKQuantizer` for `8da8w` / `8da4w`: per-channel symmetric weights (int8, or int4 in
    [-8, 7], which XNNPACK packs two to a byte) and per-token dynamic int8 activations, on linear layers."""
    # ExecuTorch loads only where a program is lowered or run (seconds, native memory)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    class LinearXNNPACKQuantizer(XNNPACKQuantizer):
        """`XNNPACKQuantizer.transform_for_annotation` turns every scalar of an `add`/`mul` into a float32 tensor,
        integer arithmetic included (a decoder's position and mask math), and the graph then fails with "Tensor
        dtype mismatch! Expected: Long, Got: float" (docs/upstream-gaps.md). Dynamic configs only annotate linear
        layers, which take no scalar, so the transform is not needed."""

        def transform_for_annotation(self, model):
            return model

    bits = {"weight_qmin": -8, "weight_qmax": 7} if scheme == "8da4w" else {}
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True, **bits)
    return LinearXNNPACKQuantizer().set_global(config)


def x86_quantizer(dynamic: bool):
    """torchao's `X86InductorQuantizer` with its default int8 config (dynamic or static activations)."""
    # torchao loads only for its quantizer
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_dynamic=dynamic))


def torchao_quantize(model: Any, spec: Any, notes: list[str], text_only: bool = False) -> dict[str, int]:
    """Quantize `model` in place with torchao's `quantize_`, as optimum-executorch's `quantize_model_` does: the
    embedding tables first (`IntxWeightOnlyConfig`, which gives a tied output projection its own tensor), then the
    linear layers (`Int8DynamicActivationIntxWeightConfig`; a layer whose inputs do not split into groups gets
    per-channel int8 weights), then the tensor subclasses unwrapped for `torch.export`. Returns the modules quantized
    per scheme. `text_only` (a vision-, audio-language or speech model's runner program): only its text side, the
    token embedding and the linears of `get_decoder()` and `get_output_embeddings()`, as optimum-executorch's
    multimodal and ASR tasks do without `--qlinear_encoder`; the encoder, the projector and a table its module
    indexes itself (Whisper's positions) stay float ([`text_side`]).

    Example:
        >>> torchao_quantize(model, TorchaoXnnpackQuantize(method="torchao-xnnpack"), [])  # doctest: +SKIP
        {'embedding 8w': 1, 'linear 8da4w': 15}
    """
    from torchao.quantization.granularity import PerAxis, PerGroup  # torchao loads only for its quantizer
    from torchao.quantization.quant_api import (  # torchao loads only for its quantizer
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )
    from torchao.utils import unwrap_tensor_subclass  # torchao loads only for its quantizer

    options, algorithm = spec.options(), "hqq_scale_only"  # optimum-executorch's choice of scales
    tied = tied_embeddings(model)

    def groups(size: int):
        return PerAxis(0) if size == 0 else PerGroup(size)

    def fits(module: Any, size: int) -> bool:
        return size == 0 or module.weight.shape[1] % size == 0

    counts: dict[str, int] = {}
    embedding, group = options["embedding"], options["group_size"]
    table_ids, linear_ids = text_side(model) if text_only else (None, None)

    def table(m: Any, fqn: str = "") -> bool:
        return isinstance(m, torch.nn.Embedding) and (table_ids is None or id(m) in table_ids)

    def linear(m: Any, fqn: str = "") -> bool:
        return isinstance(m, torch.nn.Linear) and (linear_ids is None or id(m) in linear_ids)

    if embedding != "none":
        tables = [m for m in model.modules() if table(m)]
        size = options["embedding_group_size"]
        if any(not fits(table, size) for table in tables):
            raise ValueError(f"embedding_group_size {size} does not divide the embedding width "
                             f"{[t.weight.shape[1] for t in tables]}: use a divisor, or 0 (per row)")
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8 if embedding == "8w" else torch.int4,
                                      granularity=groups(size), intx_choose_qparams_algorithm=algorithm)
        quantize_(model, config, table)
        counts[f"embedding {embedding}"] = len(tables)
    linears = [m for m in model.modules() if linear(m)]
    grouped = [m for m in linears if fits(m, group)]
    bits = torch.int4 if options["linear"] == "8da4w" else torch.int8
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=bits, weight_granularity=groups(group),
                                                           intx_choose_qparams_algorithm=algorithm),
              lambda m, fqn: linear(m) and fits(m, group))
    counts[f"linear {options['linear']}"] = len(grouped)
    if len(grouped) < len(linears):
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0),
                                                               intx_choose_qparams_algorithm=algorithm),
                  lambda m, fqn: linear(m) and not fits(m, group))
        counts["linear 8da8w (inputs not a multiple of group_size)"] = len(linears) - len(grouped)
        notes.append(f"{len(linears) - len(grouped)} linear layers take inputs that do not split into groups of "
                     f"{group}: their weights are per-channel int8 (8da8w)")
    unwrap_tensor_subclass(model)
    if text_only:
        left = sum(1 for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))) \
            - len(linears) - (len(tables) if embedding != "none" else 0)
        counts["float (encoder, projector, position tables)"] = left
        notes.append(f"torchao quantized the text side only (the token embedding, the decoder's and the output "
                     f"projection's linears), as optimum-executorch without --qlinear_encoder: {left} linear and "
                     "embedding layers outside it (the encoder, a projector, position tables) stay float")
    if tied:
        notes.append("the model ties its embedding table to its output projection: quantized each its own way (the "
                     f"table {embedding}, the projection {options['linear']}), they are two tensors, as "
                     "optimum-executorch stores them")
    return counts


def text_side(model: Any) -> tuple[set[int], set[int]]:
    """The ids of the token embedding, and of the linears of `get_decoder()` and `get_output_embeddings()`: what a
    runner program of a vision-, audio-language or speech model quantizes ([`torchao_quantize`]'s `text_only`)."""
    output = model.get_output_embeddings()
    roots = [model.get_decoder()] + ([output] if output is not None else [])
    linears = {id(m) for root in roots for m in root.modules() if isinstance(m, torch.nn.Linear)}
    return {id(model.get_input_embeddings())}, linears


def upstream_quantizer(spec: Any, samples: list[dict] | None):
    """The upstream quantizer for a recipe `quantize` spec, calibrating on `samples` (forward kwargs)."""

    if spec.method == "onnxruntime-dynamic":
        return upstream.onnxruntime_quantizer(False, onnxruntime_options(spec), None)
    if spec.method == "onnxruntime-static":
        return upstream.onnxruntime_quantizer(True, onnxruntime_options(spec), samples)
    if spec.method == "onnxruntime-int4":
        return upstream.onnxruntime_int4_quantizer(spec.options())
    if spec.method == "pt2e-xnnpack":
        return upstream.pt2e_quantizer(xnnpack_quantizer(spec.scheme), samples)
    if spec.method == "pt2e-x86":
        return upstream.pt2e_quantizer(x86_quantizer(spec.dynamic), samples)
    raise ValueError(f"unknown quantize method {spec.method!r}")


# the variants whose ExecuTorch setting is torchao's quantize_ (exporters.recipe.variants.TORCHAO_8DA4W)
TORCHAO_VARIANTS = ("8da4w", "int4")
# the layouts whose program torchao quantizes: the LLM runner's (and the ASR runner's, also "runner"), MultimodalRunner's
RUNNER_LAYOUTS = ("runner", MULTIMODAL_RUNNER)


def layout_refusal(target: Target, family: str, why: str | None = None) -> str | None:
    """Why a target quantized by torchao (`torchao-xnnpack`, the `8da4w` and ExecuTorch `int4` variants) cannot be
    exported in the layout it was planned in: torchao quantizes a runner's program (the LLM runner's, the ASR
    runner's: layout 'runner'; MultimodalRunner's: 'multimodal_runner') only, and a text model that cannot be a
    runner program (`why`: its reason), or a target whose settings or model give the methods layout, is planned in
    another. Said before any export, naming the variant, the layout and what quantizes that layout instead; None
    where it fits.

    Example:
        >>> from exporters.recipe.variants import TorchaoXnnpackQuantize
        >>> from types import SimpleNamespace
        >>> spec = TorchaoXnnpackQuantize(method="torchao-xnnpack")
        >>> layout_refusal(SimpleNamespace(name="et-8da4w", quantize=spec, layout=None), "vision-language")[:57]
        "variant '8da4w' (quantize 'torchao-xnnpack') cannot take "
        >>> layout_refusal(SimpleNamespace(name="et-8da4w", quantize=spec, layout="multimodal_runner"), "vision-language")
        >>> layout_refusal(SimpleNamespace(name="et-8da4w", quantize=spec, layout="runner"), "text") is None
        True
    """
    spec = target.quantize
    if spec is None or spec.method != "torchao-xnnpack" or getattr(target, "layout", None) in RUNNER_LAYOUTS:
        return None
    variant = next((v for v in TORCHAO_VARIANTS if target.name.endswith(VARIANTS[v][0])), None)
    what = f"variant '{variant}' (quantize 'torchao-xnnpack')" if variant else "quantize 'torchao-xnnpack'"
    layout = getattr(target, "layout", None) or "methods"
    return (f"{what} cannot take layout '{layout}', the layout {a_model_of(family)}'s torchao-quantized ExecuTorch "
            f"target is planned in{f' ({why})' if why else ''}: torchao quantizes a runner's program (layout "
            f"'runner' or 'multimodal_runner') only; use variant '8da8w', or \"quantize\": {{\"method\": "
            f"\"pt2e-xnnpack\", \"scheme\": \"8da4w\"}} (per-channel int4 weights, int8 dynamic activations), for it")


class Quantizing:
    """A target's quantization in its export's child process: the upstream quantizer of each component
    ([`quantizer_for`]), then what was quantized and how, written into `export.json` ([`record_into`]).
    A target without `quantize` gives no quantizer and records nothing."""

    def __init__(self, model: Any, target: Target, recipe: Recipe, calibration: list[SampleInputs], notes: list[str]):
        self.model, self.target, self.recipe, self.calibration, self.notes = model, target, recipe, calibration, notes
        self.calibrated_on: dict[str, int] = {}
        self.quantized_modules: dict[str, int] = {}

    def quantizer_for(self) -> Callable[[str, dict[str, Any]], Any] | None:
        """`(component, inputs) -> upstream quantizer` for a quantized target, None otherwise. Calibration of a
        generation target captures each component's inputs from the samples (upstream's capture runs `generate`)."""
        spec = self.target.quantize
        if spec is None:
            return None
        if spec.method == "torchao-xnnpack":  # the model itself, in place: this process is the export's own child
            layout = getattr(self.target, "layout", None)
            if layout not in RUNNER_LAYOUTS:
                raise ValueError("'torchao-xnnpack' quantizes a runner's program, and this target is exported "
                                 "with a method per component (layout 'methods'): use {'method': 'pt2e-xnnpack', "
                                 "'scheme': '8da4w'} for it")
            # a runner program with an encoder (MultimodalRunner's, the ASR runner's): its text side only
            text_only = layout == MULTIMODAL_RUNNER or bool(getattr(self.model.config, "is_encoder_decoder", False))
            self.quantized_modules = torchao_quantize(self.model, spec, self.notes, text_only)
            return None
        per_component: dict[str, list[dict]] = {}
        if spec.needs_calibration and self.target.mode == "generation":
            per_component = capture_calibration_inputs(
                self.model, [s.generate for s in self.calibration], generation_config_for(self.model, self.recipe),
                self.target.multi_token_decode)
        elif spec.needs_calibration:
            per_component = {"model": [s.forward for s in self.calibration]}

        def build(name: str, inputs: dict[str, Any]):
            samples: list[dict] | None = None
            if spec.needs_calibration:
                samples = per_component.get(name)
                if not samples:
                    self.notes.append(f"{name}: no calibration sample was captured for this component; its "
                                      "activation ranges come from its sample input only")
                    samples = [copy.deepcopy(inputs)]
            elif spec.method.startswith("pt2e-"):
                samples = [copy.deepcopy(inputs)]  # weight observers only: the sample input runs them once
            self.calibrated_on[name] = len(samples or [])
            return upstream_quantizer(spec, samples)

        return build

    def record_into(self, directory: Path) -> dict[str, Any] | None:
        """For a quantized target: describe what was quantized and how, write it into `export.json`, return it."""
        if self.target.quantize is None:
            return None
        description = describe(self.target, self.calibration, self.recipe, self.calibrated_on)
        if self.quantized_modules:
            description["modules"] = dict(self.quantized_modules)
        write_record(directory, description)
        return description


# ── What export.json records ──────────────────────────────────────────────────

_HOW = {
    "onnxruntime-dynamic": ("int8 weights (ONNX Runtime quantize_dynamic)", "quantized at run time (dynamic)"),
    "onnxruntime-static": ("int8 weights (ONNX Runtime quantize_static)", "int8, ranges calibrated ahead of time"),
    "pt2e-x86": ("int8 per-channel weights (X86InductorQuantizer)", "int8"),
    "onnxruntime-int4": ("int4 block-wise weights of every MatMul (ONNX Runtime MatMulNBitsQuantizer, MatMulNBits)",
                         "float; MatMulNBits' accuracy level sets the compute type"),
}


def describe(target, calibration: list[SampleInputs], recipe: Recipe,
             calibrated_on: dict[str, int]) -> dict[str, Any]:
    """What was quantized and how, for `export.json`'s `quantization` entry."""
    spec = target.quantize
    weights, activations = _HOW.get(spec.method, ("", ""))
    if spec.method == "pt2e-xnnpack":
        bits = 4 if spec.scheme == "8da4w" else 8
        weights = f"int{bits} per-channel symmetric weights of linear layers (XNNPACKQuantizer)"
        activations = "int8 per-token, quantized at run time (dynamic)"
    elif spec.method == "torchao-xnnpack":
        options = spec.options()
        linear = "int4 group-wise (group {group_size}) symmetric" if options["linear"] == "8da4w" else \
            "int8 per-channel symmetric"
        table = "float" if options["embedding"] == "none" else \
            f"int{options['embedding'][0]} " + ("per-row" if not options["embedding_group_size"]
                                                else "group-wise (group {embedding_group_size})")
        weights = (f"{linear} weights of linear layers, {table} embedding table (torchao quantize_)").format(**options)
        activations = "int8 per-token, quantized at run time (dynamic)"
    elif spec.method == "pt2e-x86":
        activations = "int8, quantized at run time (dynamic)" if spec.dynamic else "int8, calibrated ahead of time"
    if spec.needs_calibration:
        source = recipe.inputs.calibration
        data = {"source": "prompts" if source and source.prompts is not None else "samples",
                "samples": len(calibration)}
    else:
        data = {"source": "none (weight-only)" if spec.method == "onnxruntime-int4" else "none (dynamic activations)"}
    quantizer = {
        "onnxruntime-int4": "onnxruntime.quantization.MatMulNBitsQuantizer",
        "torchao-xnnpack": "torchao.quantization.quantize_(Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig)",
        "onnxruntime-dynamic": "transformers.exporters.OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig)",
        "onnxruntime-static": "transformers.exporters.OnnxRuntimeQuantizer(OnnxRuntimeStaticConfig)",
        "pt2e-xnnpack": "transformers.exporters.PT2EQuantizer(XNNPACKQuantizer)",
        "pt2e-x86": "transformers.exporters.PT2EQuantizer(X86InductorQuantizer)",
    }[spec.method]
    packages = {package: version for package in ("onnxruntime", "torchao", "executorch")
                if (version := installed_version(package)) is not None}
    return {"method": spec.method, "options": spec.options(), "kind": spec.kind,
            "quantizer": quantizer, "weights": weights, "activations": activations,
            "calibration": {**data, **({"per_component": dict(calibrated_on)} if spec.needs_calibration else {})},
            "packages": packages}


def onnx_quantized_ops(path: Path) -> dict[str, int]:
    """Count of the quantization ops in a saved ONNX graph, its subgraphs included (a merged encoder-decoder
    decoder's two branches: exporters.export.seq2seq_merged); weights not read."""
    # onnx loads only where an ONNX file is read
    import onnx

    counts: dict[str, int] = {}
    graphs = [onnx.load(str(path), load_external_data=False).graph]
    while graphs:
        for node in graphs.pop().node:
            if node.op_type in _ONNX_QUANT_OPS:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attribute in node.attribute:
                graphs.extend([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)
    return dict(sorted(counts.items()))


def write_record(directory: Path, description: dict[str, Any]) -> None:
    """Add `quantization` to the saved `export.json` (upstream drops the quantizer from its config record; a key it
    does not know is ignored by `ExportedModel.from_pretrained`)."""
    manifest_path = directory / "export.json"
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("export_format") == "onnx":
        description["quantized_ops"] = {name: onnx_quantized_ops(directory / entry["file"])
                                        for name, entry in manifest["components"].items()}
    manifest["quantization"] = description
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

"""`hf-export init` classifies a failed target before reacting (#47 §1): the classifier on real error texts (the
messages of torch.export, torch.onnx, ONNX Runtime, ExecuTorch's runtime, transformers and this project), and the
decision each class makes: only a shape failure shrinks dimensions, a dtype failure on CPU is retried once in
float32, configuration, missing files and an operator no runtime lowers are left out at once with what to change."""

from __future__ import annotations

from typing import Any

import pytest

from exporters.init.axes import Dimension
from exporters.init.classify import classify
from exporters.init.decide import FormatResult, decide
from exporters.status import LEFT_OUT, NAMED, PENDING


def failed(message: str, type_: str = "RuntimeError", fmt: str = "onnx", dtype: str | None = None,
           cause: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"type": type_, "message": message}
    if cause:
        error["root_cause"] = cause
    return {"name": fmt, "export_format": fmt, "status": "failed", "dtype": dtype, "error": error,
            "components": [], **extra}


GENERATION_CONFIG = ("GenerationConfig is invalid: \n- `temperature`: `do_sample` is set to `False`. However, "
                     "`temperature` is set to `0.6` -- this flag is only used in sample-based generation modes. You "
                     "should set `do_sample=True` or unset `temperature`.\nIf you're using a pretrained model, note "
                     "that some of these attributes may be set through the model's `generation_config.json` file.")
CASES = [
    # torch.export: a range the program cannot keep (exporters/export/convert.py reads the same signature)
    (failed("exporting component 'model' failed: Constraints violated (sequence_length)! For more information, run "
            "with TORCH_LOGS=\"+dynamic\".\n  - Not all values of sequence_length = L['input_ids'].size()[1] in the "
            "specified range sequence_length <= 64 satisfy the generated guard 2 <= L['input_ids'].size()[1]",
            "UserError", "dynamo"), "shape", "dynamic dimensions"),
    (failed("exporting component 'model' failed: dimension inputs['input_ids'].shape[0] 0/1 specialized; Dim.AUTO "
            "was specified along with a sample input with hint = 1.", "UserError", "dynamo"), "shape", "narrower"),
    (failed("Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1))",
            "GuardOnDataDependentSymNode"), "shape", "dynamic"),
    # ExecuTorch: a declared max the runtime caps (docs/upstream-gaps.md §8)
    (failed("RuntimeError: method->set_inputs() for method 'forward' failed with error 0x10", fmt="executorch"),
     "shape", "dynamic"),
    # ONNX Runtime without bfloat16 kernels on CPU
    (failed("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Mul(14) node with name "
            "'/model/layers.0/Mul'", "Fail", dtype="bfloat16"), "dtype", '"dtype": "float32" on the onnx target'),
    (failed("Got unsupported ScalarType BFloat16", "TypeError", "dynamo"), "dtype", "float32"),
    (failed('"addmm_impl_cpu_" not implemented for \'Half\'', "RuntimeError", "dynamo"), "dtype", "float32"),
    # upstream's operator gaps
    (failed("exporting component 'model' failed: No ONNX function found for <OpOverload(op='aten.erfinv', "
            "overload='default')>. Failure message: No decompositions registered for the real-valued input",
            "ConversionError"), "upstream-operator", "erfinv"),
    (failed("the saved artifact does not load: RuntimeError: Failed to load method forward, error: 0x:14 (runtime "
            "log: kernel 'aten::_fft_c2c.out' not found.; Missing operator: [5] aten::_fft_c2c.out)",
            fmt="executorch"), "upstream-operator", "_fft_c2c.out has no lowering or kernel for executorch"),
    (failed("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Erfinv(1) node with "
            "name 'n0'", "Fail", dtype="float32"), "upstream-operator", "Erfinv"),
    # transformers refusing the checkpoint's generation settings
    (failed("capture failed", cause={"type": "ValueError", "message": GENERATION_CONFIG}, fmt="dynamo"),
     "configuration", "generation_config.json"),
    (failed(GENERATION_CONFIG, "ValueError", "onnx"), "configuration", "generation_config.json"),
    (failed("targets[0].dynamic_shapes: unknown input 'pixel_values'", "RecipeError"), "configuration", "recipe"),
    # missing files
    (failed("Can't load tokenizer for '/models/m'. If you were trying to load it from 'https://huggingface.co/models',"
            " make sure you don't have a local directory with the same name.", "OSError", "executorch"),
     "missing-files", "tokenizer"),
    (failed("no processor in the folder: the family 'vision-language' needs preprocessor_config.json",
            "UnsupportedModelError"), "missing-files", "preprocessor_config.json"),
]


@pytest.mark.parametrize("target, kind, change", CASES, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(CASES)])
def test_real_error_texts_are_classified_and_say_what_to_change(target: dict, kind: str, change: str) -> None:
    failure = classify(target)
    assert failure.kind == kind, (failure, target["error"])
    assert change in failure.change, failure
    assert "\n" not in failure.line and failure.line, failure


def _check(probe: str, diff: float | None, passed: bool = False, error: str | None = None) -> dict:
    return {"probe": probe, "passed": passed, "verdict": "passed" if passed else "failed", "error": error,
            "outputs": [{"name": "logits", "max_abs_diff": diff, "passed": passed}]}


def test_numbers_off_and_parity_are_tolerance_failures() -> None:
    off = {"export_format": "onnx", "status": "failed", "error": None,
           "components": [{"name": "model", "checks": [_check("traced", 1e-3)]}]}
    assert classify(off).kind == "tolerance"
    parity = {"export_format": "dynamo", "status": "failed", "error": None,
              "components": [{"name": "model", "checks": [_check("traced", 1e-7, passed=True)]}],
              "generation": {"status": "failed", "first_divergence": "step 3: 17 vs 42"}}
    failure = classify(parity)
    assert failure.kind == "tolerance" and "generation parity failed: step 3" in failure.line


def test_a_probe_failing_at_a_size_is_a_shape_failure() -> None:
    target = {"export_format": "dynamo", "status": "failed", "error": None,
              "components": [{"name": "model", "checks": [_check("sequence=64", None, error="index out of range")]}]}
    assert classify(target).kind == "shape"


def _result(fmt: str = "onnx") -> FormatResult:
    dim = Dimension("sequence_length", 8, 1, 64, "limit", {"model": [("input_ids", 1)]}, {"model": NAMED})
    return FormatResult(fmt, dims=[dim], rounds=1)


@pytest.mark.parametrize("index", [i for i, (_, kind, _) in enumerate(CASES)
                                   if kind in ("configuration", "missing-files", "upstream-operator")])
def test_configuration_missing_files_and_operators_are_left_out_at_once(index: int) -> None:
    result = _result(CASES[index][0]["export_format"])
    decide(result, CASES[index][0], max_rounds=6)
    assert result.status == LEFT_OUT and result.failure.kind == CASES[index][1]
    assert result.dims[0].state == {"model": NAMED} and not result.dims[0].reasons, "no axis was shrunk"


def test_a_dtype_failure_on_cpu_is_retried_once_in_float32() -> None:
    target = CASES[4][0]
    result = _result()
    decide(result, target, max_rounds=6)
    assert result.status == PENDING and result.dtype == "float32"
    assert result.dims[0].state == {"model": NAMED}, "the shapes are not what failed"
    result.rounds += 1
    decide(result, dict(target, dtype="float32", error={"type": "Fail", "message": "Got unsupported ScalarType "
                                                                                    "BFloat16"}), max_rounds=6)
    assert result.status == LEFT_OUT, "one retry only"


def test_a_shape_failure_still_runs_the_axis_search() -> None:
    result = _result("dynamo")
    decide(result, CASES[0][0], max_rounds=6)
    assert result.status == PENDING and result.failure.kind == "shape"
    assert result.dims[0].state == {"model": "auto"}, result.dims[0].reasons


def test_the_round_progress_names_what_is_exported() -> None:
    from exporters.init.summary import exported_words

    assert exported_words({"export_format": "onnx", "mode": "generation", "expected_components": ["model"],
                           "components": {"model": {}}}) == "onnx (model)"
    assert exported_words({"export_format": "dynamo", "mode": "generation", "dtype": "float32",
                           "expected_components": ["prefill", "decode"]}) == "dynamo (prefill, decode, float32)"
    assert "runner" in exported_words({"export_format": "executorch", "mode": "generation"})
    assert exported_words({"export_format": "onnx", "mode": "generation", "dynamic": True}) == (
        "onnx (the plainest dynamic target)")


def test_a_plainest_dynamic_target_that_fails_is_followed_by_the_components() -> None:
    """A speech model's ONNX proposal starts from `dynamic: true` (no dims of its own to search); where it fails the
    next round proposes the components with the plan's dims, and the note names what did not validate."""
    from types import SimpleNamespace

    from exporters.init.decide import COMPONENT_GRAPHS, DYNAMIC_GRAPH
    from exporters.init.propose import _fall_back, build_target

    past = Dimension("past", 4, 1, 447, "max_target_positions", {"decode": [("cache", 2)]}, {"decode": NAMED})
    plan = SimpleNamespace(mode="generation", family="speech-seq2seq", components=["encoder", "prefill", "decode"],
                           expected=["encoder", "prefill", "decode"], dimensions=[past])
    assert build_target("onnx", plan, [], 20, DYNAMIC_GRAPH) == {
        "name": "onnx", "export_format": "onnx", "mode": "generation", "opset_version": 20, "dynamic": True}
    result = FormatResult("onnx", graph=DYNAMIC_GRAPH)
    decide(result, failed("ONNX Runtime GenAI cannot run it: ONNX Runtime GenAI failed: RuntimeError: Got invalid "
                          "dimensions for output: logits"), max_rounds=6)
    assert result.status == LEFT_OUT
    note = _fall_back(result, plan)
    assert (result.status, result.graph, [d.name for d in result.dims]) == (PENDING, COMPONENT_GRAPHS, ["past"])
    assert note.startswith("the plainest dynamic target (`dynamic: true`) (the default, weights stored once) did not "
                           "validate (ONNX Runtime GenAI cannot run it"), note
    assert note.endswith("proposed encoder, prefill, decode as separate graphs"), note

"""What kind of failure a target of `hf-export init`'s round had, read from its report record, before init reacts.

```
report.json target ─► error (type, message, root cause) + failed checks + generation parity
                   ─► one class: shape │ dtype │ tolerance │ configuration │ missing-files │ upstream-operator │ other
                   ─► what to change, in one line (the file, the operator, the recipe field)
```

Only a shape failure is what init's axis search cures (`decide`: named → auto → static, narrower ranges); a dtype
failure on a CPU runtime is retried once in float32; configuration, missing files and an operator no runtime lowers
are not retried: the owner has to change the named file or leave the format out. `other` (nothing recognised) keeps
the search init always ran. The patterns are upstream's own messages (torch.export, torch.onnx, ONNX Runtime,
ExecuTorch's runtime, transformers) and this project's (`exporters/errors.py` hints).

Example:
    >>> failure = classify({"export_format": "onnx", "dtype": "bfloat16", "status": "failed", "error": {
    ...     "type": "Fail", "message": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation "
    ...     "for Mul(14) node with name '/model/Mul'"}})
    >>> failure.kind, failure.change
    ('dtype', 'export in float32: set "dtype": "float32" on the onnx target (its runtime has no Mul kernel for bfloat16)')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from exporters.errors import error_line, first_line

FailureKind = Literal["shape", "dtype", "tolerance", "configuration", "missing-files", "upstream-operator", "other"]
SHAPE, DTYPE, TOLERANCE, CONFIGURATION, MISSING_FILES, UPSTREAM_OPERATOR, OTHER = (
    "shape", "dtype", "tolerance", "configuration", "missing-files", "upstream-operator", "other")
LABELS: dict[str, str] = {
    SHAPE: "shape/specialization", DTYPE: "dtype/kernel", TOLERANCE: "tolerance", CONFIGURATION: "configuration",
    MISSING_FILES: "missing files", UPSTREAM_OPERATOR: "upstream operator", OTHER: "unclassified",
}
NOT_RETRIED = (CONFIGURATION, MISSING_FILES, UPSTREAM_OPERATOR)  # no recipe change init can make cures these
HALF = ("bfloat16", "float16")

_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\)")
_HALF_TEXT = re.compile(r"bfloat16|float16|BFloat16|\bHalf\b|tensor\((b?float16)\)")
_DTYPE = re.compile(r"unsupported ScalarType (BFloat16|Half)|not implemented for '(BFloat16|Half)'|"
                    r"Unsupported (data ?type|dtype)[^\n]*(bfloat16|float16|BFloat16|Half)", re.I)
_MISSING = re.compile(r"(tokenizer|processor|preprocessor_config|feature_extractor|chat_template|vocab)[^\n]{0,80}"
                      r"(missing|not found|no such file|does not exist|can't load|cannot load|could not load)|"
                      r"(has no|no|missing|without an?|can't load|cannot load)\s+(tokenizer|processor|"
                      r"preprocessor_config|image processor|feature extractor)", re.I)
_FILE = re.compile(r"\b(tokenizer(_config)?\.json|tokenizer\.model|(pre)?processor_config\.json|vocab\.\w+|"
                   r"merges\.txt|chat_template\.jinja)\b")
_CONFIG_FILE = re.compile(r"GenerationConfig|generation_config|generation config", re.I)
_CONFIG = re.compile(r"\bconfig\.json\b|export_config|recipe|PretrainedConfig|is not a valid|invalid value", re.I)
_OPERATOR = re.compile(
    r"No ONNX function found for|Unsupported FX nodes|Missing operator|kernel '[^']+' not found|"
    r"(has|have) no (lowering|decomposition)|no (lowering|decomposition) for|Could not run '(aten|prims)::|"
    r"Operator [^\n]{0,80} is not supported|is not supported by (the )?(ONNX|ExecuTorch|XNNPACK)|erfinv", re.I)
_OPERATOR_NAME = re.compile(r"(?:aten|prims|torch\.ops\.aten)(?:::|\.)([A-Za-z_][\w.]*)|"
                            r"Could not find an implementation for (\w+\(\d+\))|Operator '?([\w.:]+)'? is not supported")
_SHAPE = re.compile(
    r"Constraints violated|ConstraintViolation|specializ|guard|data[- ]dependent|dynamic_shapes|Dim\.|\bDim\b|"
    r"symbolic|SymInt|set_inputs\(\) for method|resize a static tensor|shape mismatch|size mismatch|"
    r"Expected shape|expected size|must match the size|out of (bounds|range)", re.I)


@dataclass(frozen=True)
class Failure:
    """A failed target's class (`kind`, one of `FailureKind`), its error in one whole line, and what to change."""

    kind: str
    line: str
    change: str

    @property
    def label(self) -> str:
        """The class in words: `dtype/kernel`."""
        return LABELS[self.kind]


def _texts(target: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The target's error (type, message, root cause) and the errors of its failed checks, as text."""
    error = target.get("error") or {}
    cause = error.get("root_cause") if isinstance(error.get("root_cause"), Mapping) else {}
    text = "\n".join(str(part) for part in (error.get("type"), error.get("message"), (cause or {}).get("type"),
                                            (cause or {}).get("message")) if part)
    checks = [str(check.get("error")) for component in target.get("components") or []
              for check in component.get("checks") or [] if check.get("error")]
    return text, checks


def _numbers_off(target: Mapping[str, Any]) -> bool:
    """Some check failed on numbers alone (every output has a difference, no output is missing or broken)."""
    for component in target.get("components") or []:
        for check in component.get("checks") or []:
            outputs = check.get("outputs") or []
            if check.get("passed") or check.get("error") or check.get("skipped") or not outputs:
                continue
            if all(o.get("max_abs_diff") is not None and not o.get("note") for o in outputs):
                return True
    return False


def _operator(text: str) -> str:
    found = _OPERATOR_NAME.search(text)
    if found is None:
        return "an operator"
    return next(group for group in found.groups() if group)


def classify(target: Mapping[str, Any]) -> Failure:
    """The class of a failed target (a report.json target record: `export_format`, `dtype`, `status`, `error`,
    `components` with their checks, `generation`), its one line and what to change.

    Example:
        >>> classify({"export_format": "dynamo", "status": "failed", "error": {"type": "ValueError", "message":
        ...     "GenerationConfig is invalid: \\n- `temperature`: set `do_sample=True`."}}).kind
        'configuration'
    """
    fmt = str(target.get("export_format") or target.get("name") or "this")
    error = target.get("error") or {}
    text, checks = _texts(target)
    everything = "\n".join([text, *checks])
    line = error_line(error) if error else first_line(checks[0]) if checks else f"the target {target.get('status')}"
    kernel = _KERNEL.search(everything)
    half = str(target.get("dtype") or "") in HALF or bool(_HALF_TEXT.search(everything))
    if (kernel and half) or _DTYPE.search(everything):
        op = kernel.group(1) if kernel else _operator(everything)
        dtype = str(target.get("dtype")) if target.get("dtype") in HALF else "this dtype"
        return Failure(DTYPE, line, f'export in float32: set "dtype": "float32" on the {fmt} target (its runtime '
                                    f"has no {op} kernel for {dtype})")
    if _MISSING.search(everything) or error.get("type") == "FileNotFoundError":
        found = _FILE.search(everything) or re.search(r"tokenizer|processor|feature extractor", everything, re.I)
        what = found.group(0) if found else "the files the line names"
        return Failure(MISSING_FILES, line, f"add {what} to the model folder (the model's own, saved with "
                                            "`save_pretrained` beside the weights), then run init again")
    if _CONFIG_FILE.search(text):
        return Failure(CONFIGURATION, line, "fix generation_config.json (the setting the line names), then run init "
                                            "again; the exported graph is not the problem")
    if error.get("type") in ("RecipeError", "RecipeValidationError", "PathValueError") or (
            _CONFIG.search(text) and not _SHAPE.search(text) and not _OPERATOR.search(text)):
        return Failure(CONFIGURATION, line, "fix the configuration the line names (config.json, or the recipe's "
                                            "field), then run init again")
    if _OPERATOR.search(everything) or kernel:
        op = kernel.group(1) if kernel else _operator(everything)
        return Failure(UPSTREAM_OPERATOR, line, f"{op} has no lowering or kernel for {fmt}: leave {fmt} out, or "
                                                "replace that operator in the model (an upstream gap)")
    if _SHAPE.search(everything) or (checks and not _numbers_off(target)):
        return Failure(SHAPE, line, "the dynamic dimensions: narrower ranges, or static axes (init's axis search)")
    generation = target.get("generation") or {}
    if _numbers_off(target) or generation.get("status") == "failed":
        why = generation.get("reason") or generation.get("first_divergence")
        parity = f"generation parity failed: {first_line(str(why), 200)}" if generation.get("status") == "failed" \
            else ""
        return Failure(TOLERANCE, parity or line,
                       f"the outputs differ from the eager model's: a looser validation.formats.{fmt}.atol where the "
                       "difference is precision, else the model's numerics in this format")
    return Failure(OTHER, line, "see the target's log; init tried narrower dynamic dimensions")

"""`hf-export init` proposes the variant LLMs are deployed in: beside a decoder-only LLM's fp32 target (kept for
reference), int4 weights where they run (`variants: ["fp32", "int4"]` for the merged ONNX graph, what ONNX Runtime
GenAI's builder writes for the CPU; `["fp32", "8da4w"]` for the ExecuTorch LLM runner's program).

```
formats passed (fp32) ──► the quantized variant of each decoder-only LLM target (quantized_variant)
                      ──► one more run of the pipeline, the variant targets only (onnx-int4, executorch-8da4w)
                      ──► passed its quality budget: proposed (`variants`) │ otherwise: left out, the note says why
```

A variant is proposed only where it ran and kept its budget on this model: the recipe init writes is one that passed.

Example:
    >>> from exporters.init.decide import FormatResult, MERGED_GRAPH
    >>> quantized_variant(FormatResult("onnx", graph=MERGED_GRAPH), "text")
    'int4'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from exporters import fsutil
from exporters.init.decide import MERGED_GRAPH, RUNNER_GRAPH, FormatResult
from exporters.recipe.variants import VARIANTS
from exporters.run.pipeline import RunOptions, run_pipeline
from exporters.status import PASSED

# format -> the 4-bit variant its runtime runs an LLM in, for the graph init proposes for a decoder-only LLM
LLM_VARIANTS = {("onnx", MERGED_GRAPH): "int4", ("executorch", RUNNER_GRAPH): "8da4w"}
MIN_SECONDS = 5.0  # as a round of the search (exporters.init.propose.MIN_ROUND_SECONDS)


def quantized_variant(result: FormatResult, family: str) -> str | None:
    """The variant init tries beside fp32 for a passed format: a decoder-only LLM's (its merged graph or runner
    program) 4-bit one, else None.

    Example:
        >>> quantized_variant(FormatResult("dynamo", graph=MERGED_GRAPH), "text") is None
        True
    """
    return LLM_VARIANTS.get((result.export_format, result.graph)) if family == "text" else None


def try_variants(folder: str, family: str, passed: list[FormatResult], recipe_for: Callable[[list[dict]], dict],
                 work: Path, run: RunOptions, say: Callable[[str], None]) -> None:
    """Run each passed format's quantized variant once (`recipe_for(targets)` builds the round's recipe); a variant
    that passed is added to its target's `variants`, and each format's notes say what happened."""
    tried = {result.export_format: (result, variant) for result in passed
             if result.target is not None and (variant := quantized_variant(result, family))}
    if not tried:
        return
    if run.timeout is not None and run.timeout < MIN_SECONDS:  # the search spent the budget: said, not overrun
        for result, variant in tried.values():
            result.notes.append(f"the {variant} variant was not tried: the time budget (--max-seconds) is spent")
        return
    targets = [{**result.target, "variants": ["fp32", variant]} for result, variant in tried.values()]
    names = {fmt: f"{result.target['name']}{VARIANTS[variant][0]}" for fmt, (result, variant) in tried.items()}
    path, out = work / "variants" / "recipe.json", work / "variants" / "out"
    fsutil.real_dir(path.parent)
    fsutil.write_file(path, json.dumps(recipe_for(targets), indent=2) + "\n")
    say("variants: exporting and validating " + ", ".join(names.values()))
    options = RunOptions(out_dir=out, config_path=path, targets=list(names.values()),
                         trust_remote_code=run.trust_remote_code,
                         progress=run.progress, use_cache=False, bench=False, hand_over=run.hand_over,
                         timeout=run.timeout / len(tried) if run.timeout is not None else None)
    report = run_pipeline(folder, options)
    by_name = {target["name"]: target for target in report["targets"]}
    for fmt, (result, variant) in tried.items():
        target = by_name.get(names[fmt], {})
        if target.get("status") == PASSED:
            result.target["variants"] = ["fp32", variant]
            result.notes.append(f"the {variant} variant ({names[fmt]}) is proposed beside fp32: {_quality(target)}")
        else:
            result.notes.append(f"the {variant} variant ({names[fmt]}) was tried and left out: {_why(target)}")
        say(f"  {names[fmt]}: " + ("passed" if target.get("status") == PASSED else "left out"))


def _quality(target: dict[str, Any]) -> str:
    quality = target.get("quality") or {}
    return str(quality.get("decided_by") or "within its quality budget")


def _why(target: dict[str, Any]) -> str:
    error = target.get("error") or {}
    quality = target.get("quality") or {}
    if quality.get("passed") is False:
        return f"outside its quality budget on this model ({quality.get('decided_by')})"
    return str(error.get("message") or target.get("status") or "it did not run")[:300]

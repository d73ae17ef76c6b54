"""What a run makes of its targets' outcomes: a fresh result per target (with the command that reproduces it), the
weights stripped after validation where the recipe asks, and report.json + report.md in recipe order.

Example:
    >>> from types import SimpleNamespace
    >>> context = SimpleNamespace(model_arg="acme/tiny", source=SimpleNamespace(revision=None))
    >>> reproduce_command(context, SimpleNamespace(config_path=None), "onnx")
    'hf-export run acme/tiny --target onnx'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.export.onnx_files import strip_weights
from exporters.recipe.model import Target
from exporters.report.build import build_report, write_report
from exporters.report.results import TargetResult
from exporters.run.context import RunContext, RunOptions
from exporters.status import FAILED, PASSED

__all__ = ["new_result", "reproduce_command", "strip_after_validation", "write_results"]


def write_results(results: list[TargetResult], context: RunContext) -> dict[str, Any]:
    """The report of `results` (sorted into recipe order), written to the run's folder; returns it."""
    order = {t.name: i for i, t in enumerate(context.targets)}
    results.sort(key=lambda r: order[r.name])
    report = build_report(results, context)
    write_report(report, context.out_dir)
    return report


def new_result(target: Target, context: RunContext, options: RunOptions) -> TargetResult:
    """A target's result before anything ran: failed until its checks say otherwise."""
    asked = target.quantize
    return TargetResult(name=target.name, export_format=target.export_format, mode=target.mode, status=FAILED,
                        dtype=target.dtype, versions=context.versions, log=f"logs/{target.name}.log",
                        reproduce=reproduce_command(context, options, target.name),
                        quantize_asked={"method": asked.method, "options": asked.options()} if asked else None)


def strip_after_validation(result: TargetResult, target: Target, final: Path) -> None:
    """`export_params: false`: the weights are stripped once the artifact was validated with them."""
    if result.status == PASSED and target.export_format == "onnx" and not target.export_params:
        stripped = strip_weights(final, target.output_path)
        copy = f" and from {target.output_path}" if target.output_path else ""
        result.findings.append(f"export_params: false — validated with weights, then {len(stripped)} weights were "
                               f"stripped from every graph{copy}: the published graphs take them as inputs")


def reproduce_command(context: RunContext, options: RunOptions, target: str) -> str:
    """The `hf-export run` command line that runs `target` again."""
    parts = ["hf-export", "run", context.model_arg, "--target", target]
    if context.source.revision:
        parts += ["--revision", context.source.revision]
    if options.config_path:
        parts += ["--config", str(options.config_path)]
    return " ".join(parts)

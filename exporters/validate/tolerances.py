"""The atol/rtol a float32 (or half-precision) artifact is held to: the format's default, then the recipe's overrides
(recipe-wide, per format, per target, per component; the most specific wins).

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> recipe = parse_recipe('{"export_format": "onnx"}')
    >>> target = recipe.exports[0]
    >>> tolerance_for(recipe, target, "model", None), tolerance_for(recipe, target, "model", "bfloat16")
    ((0.0001, 0.001), (0.01, 0.01))
"""

from __future__ import annotations

from exporters.recipe.model import Recipe, Tolerance

__all__ = ["DEFAULT_TOLERANCES", "LOW_PRECISION_TOLERANCE", "dtype_tolerance", "tolerance_for"]

# Defaults per format at float32: torch programs run the same kernels as eager; ONNX Runtime and XNNPACK fuse and
# reorder reductions, so they get more room. Lower precisions get more room again.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "dynamo": (1e-5, 1e-4),
    "onnx": (1e-4, 1e-3),
    "executorch": (1e-3, 1e-3),
}
LOW_PRECISION_TOLERANCE = (1e-2, 1e-2)


def dtype_tolerance(export_format: str, dtype: str | None) -> tuple[float, float]:
    """The format's atol/rtol at `dtype`, before any recipe override: what a correct artifact of that dtype may
    differ by. It bounds a half-precision target's top-1 ties (`exporters.validate.quality.top1_ties`), which a
    recipe's `atol` therefore cannot widen.

    Example:
        >>> dtype_tolerance("dynamo", "bfloat16"), dtype_tolerance("dynamo", None)
        ((0.01, 0.01), (1e-05, 0.0001))
    """
    atol, rtol = DEFAULT_TOLERANCES.get(export_format, (1e-4, 1e-3))
    if dtype in ("float16", "bfloat16"):
        atol, rtol = max(atol, LOW_PRECISION_TOLERANCE[0]), max(rtol, LOW_PRECISION_TOLERANCE[1])
    return atol, rtol


def tolerance_for(recipe: Recipe, target, component: str, dtype: str | None) -> tuple[float, float]:
    """Format default, then recipe-wide, then per format, per target and per component overrides (most specific
    wins)."""
    atol, rtol = dtype_tolerance(target.export_format, dtype)
    layers: list[Tolerance | None] = [
        Tolerance(atol=recipe.validation.atol, rtol=recipe.validation.rtol),
        recipe.validation.formats.get(target.export_format),
        target.validation,
        target.components[component].validation if component in target.components else None,
    ]
    for layer in layers:
        if layer is None:
            continue
        atol = layer.atol if layer.atol is not None else atol
        rtol = layer.rtol if layer.rtol is not None else rtol
    return atol, rtol

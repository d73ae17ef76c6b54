"""export-action: run a model repo's export recipe, validate every artifact, publish it as a Hub PR.

Example:
    >>> from exporters import AutoHfExporter
    >>> exporter = AutoHfExporter.from_pretrained("examples/demo-model")  # doctest: +SKIP
    >>> exported = exporter.export(model, inputs)  # doctest: +SKIP
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    DeviceError,
    ExportActionError,
    ModelSourceError,
    RecipeError,
    RemoteCodeError,
    TargetPlanError,
)
from .recipe import Recipe, load_recipe_file, parse_recipe  # noqa: E402

__all__ = [
    "AutoExportConfig",
    "AutoHfExporter",
    "DeviceError",
    "ExportActionError",
    "ModelSourceError",
    "Recipe",
    "RecipeError",
    "RemoteCodeError",
    "RunOptions",
    "TargetPlanError",
    "load_recipe_file",
    "parse_recipe",
    "run_pipeline",
]


def __getattr__(name: str):
    # The heavy stack (torch, transformers) loads only when these are used.
    if name in ("AutoHfExporter", "AutoExportConfig", "RecipeExporter"):
        from . import auto

        return getattr(auto, name)
    if name in ("run_pipeline", "RunOptions"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)

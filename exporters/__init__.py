"""export-action: run a model repo's export recipe, validate every artifact, publish it as a Hub PR.

The front doors: this module (the public face), `cli` (`hf-export`), `auto` (`AutoHfExporter.from_pretrained`,
`supports_export_format`). The foundation every stage may use: `errors` (one hierarchy by cause), `status` (the
typed verdicts), `redact` (secrets scrubbed), `fsutil` (files written and read without following links), `hashing`
(content hashes), `files` (the recipe's file names), `version` (ours and the stack's), `quiet` (the stack's import
chatter muted, a front door's process ended without the interpreter's teardown). The stages, in the order a run's
data flows: `recipe`, `upstream`, `capture`, `export`, `validate`, `report`, `run`, `init`, `publish`; beside them
`layouts` (one package per deployment runtime: when it applies, its files, its proof, its card snippet). README's
*Layout* has the map; tests/test_structure.py the rules.

Example:
    >>> from exporters import parse_recipe
    >>> [t.name for t in parse_recipe('[{"export_format": "onnx"}, {"export_format": "dynamo"}]').exports]
    ['onnx', 'dynamo']
    >>> from exporters import AutoHfExporter  # the heavy stack loads here, on first use
    >>> AutoHfExporter.supports_export_format({"export_format": "executorch"})
    True
"""

from __future__ import annotations

from exporters.errors import (
    AggregateError,
    ArtifactError,
    DecodeStepError,
    DeviceError,
    EagerStageError,
    ExportActionError,
    InitError,
    JsonPositionError,
    MemoryPlanError,
    ModelSourceError,
    PublishError,
    RecipeError,
    RecipeProblem,
    RemoteCodeError,
    ShapeSpecError,
    TargetPlanError,
    UnsupportedModelError,
)
from exporters.recipe.load import load_recipe_file, parse_recipe  # noqa: E402
from exporters.recipe.model import Recipe  # noqa: E402
from exporters.version import __version__

__all__ = [
    "__version__",
    "AggregateError",
    "ArtifactError",
    "AutoExportConfig",
    "AutoHfExporter",
    "DecodeStepError",
    "DeviceError",
    "EagerStageError",
    "ExportActionError",
    "InitError",
    "JsonPositionError",
    "MemoryPlanError",
    "ModelSourceError",
    "PublishError",
    "Recipe",
    "RecipeError",
    "RecipeProblem",
    "RemoteCodeError",
    "RunOptions",
    "ShapeSpecError",
    "UnsupportedModelError",
    "TargetPlanError",
    "load_recipe_file",
    "parse_recipe",
    "run_pipeline",
    "validate_existing",
]


def __getattr__(name: str):
    # The heavy stack (torch, transformers) loads only when these are used.
    if name in ("AutoHfExporter", "AutoExportConfig", "RecipeExporter"):
        from exporters import auto  # loads torch

        return getattr(auto, name)
    if name in ("run_pipeline", "RunOptions"):
        from exporters.run import pipeline  # loads torch

        return getattr(pipeline, name)
    if name == "validate_existing":
        from exporters.run import revalidate  # loads torch

        return revalidate.validate_existing
    raise AttributeError(name)

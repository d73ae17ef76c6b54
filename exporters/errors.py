"""Errors the export pipeline raises, each saying what to fix."""

from __future__ import annotations


class ExportActionError(Exception):
    """Base class for the errors of this package."""


class RecipeError(ExportActionError):
    """An export recipe is invalid.

    Carries where the problem is: `file`, the JSON `path` (like `$.exports[0].opset_version`) and the 1-based `line`
    in that file, so the message points straight at the line to fix.

    Example:
        >>> err = RecipeError("unknown key 'opset'; did you mean 'opset_version'?", path="$.exports[0].opset", line=7)
        >>> str(err)
        "$.exports[0].opset (line 7): unknown key 'opset'; did you mean 'opset_version'?"
    """

    def __init__(self, message: str, *, path: str = "$", line: int | None = None, file: str | None = None):
        self.message = message
        self.path = path
        self.line = line
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.path
        if self.line is not None:
            where += f" (line {self.line})"
        if self.file:
            where = f"{self.file}: {where}"
        return f"{where}: {self.message}"

    def __str__(self) -> str:
        return self._render()


class RemoteCodeError(ExportActionError):
    """The model needs code from its repo (`auto_map`), and the operator did not allow that repo."""


class ModelSourceError(ExportActionError):
    """The model could not be found or read (missing folder, repo, revision or config)."""


class DeviceError(ExportActionError):
    """The requested device is not available here (a `cuda` target on a machine without a GPU)."""


class TargetPlanError(ExportActionError):
    """A target's settings do not fit this model (a merged graph for a model without a key-value cache, ...)."""

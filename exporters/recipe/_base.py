"""What the recipe's modules share and nobody else needs: the strict pydantic base, the error that carries its JSON
path to the loader, and the words for a value's kind in messages."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from exporters.recipe.jsonpos import JsonPath


class Strict(BaseModel):
    """A recipe object: unknown keys are errors, defaults are validated like given values."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True)


class PathValueError(ValueError):
    """A validation error whose location is known better than pydantic's (the loader places it at `path`)."""

    def __init__(self, path: JsonPath, message: str):
        self.path = path
        super().__init__(message)


def problem(path: JsonPath, message: str) -> PathValueError:
    """The error for a rule broken at `path` (relative to the object being validated)."""
    return PathValueError(path, message)


KIND_WORDS = {"object": "an object", "list": "a list", "keyword": "a string ('static' or 'auto')"}


def file_path(internal: JsonPath, exports_at: JsonPath | None) -> JsonPath:
    """Map a path in the normalised recipe back to the path in the file."""
    if internal[:1] != ("exports",):
        return internal
    if exports_at is None:  # seed dict: exports[0] is the whole document
        return tuple(internal[2:])
    return (*exports_at, *internal[1:])

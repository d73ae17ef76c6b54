"""The dynamic-shape part of the recipe: named dimensions, per-input axis specs, and the checks that need no model
(one name is one range; axis keys fit the inputs whose rank is known). Re-exported by `exporters.recipe`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, StrictInt, Tag, model_validator

from exporters.recipe._base import PathValueError, Strict

# Inputs whose rank is the same in every model that takes them (batch, sequence): an axis key outside it is an error
# at `check` time. Other inputs (pixel values, audio features, position ids of multimodal models, cache leaves) vary
# by family and are checked against the real inputs when exporting.
KNOWN_RANKS = {"input_ids": 2, "attention_mask": 2, "token_type_ids": 2, "decoder_input_ids": 2,
               "decoder_attention_mask": 2, "input_values": 2, "cache_position": 1}
DIM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"




class DimSpec(Strict):
    """A named dynamic dimension. One name used on several inputs is one shared dimension."""

    name: str = Field(pattern=DIM_NAME_PATTERN, description="Dimension name; the same name on two axes ties them.")
    min: StrictInt | None = Field(default=None, ge=0, description="Smallest size the export must accept.")
    max: StrictInt | None = Field(default=None, ge=1, description="Largest size the export must accept.")

    @model_validator(mode="after")
    def _bounds(self) -> DimSpec:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        return self


def _kind_of(value: Any) -> str:
    """Pick the union branch from the JSON type, so errors name the field, not every branch."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "keyword"
    return "other"


AxisSpec = Annotated[
    Union[Annotated[Literal["static", "auto"], Tag("keyword")], Annotated[DimSpec, Tag("object")]],
    Discriminator(_kind_of),
]
ShapeSpec = Annotated[
    Union[
        Annotated[list[AxisSpec], Tag("list")],
        Annotated[dict[Annotated[str, Field(pattern=r"^-?[0-9]+$")], AxisSpec], Tag("object")],
        Annotated[Literal["auto"], Tag("keyword")],
    ],
    Discriminator(_kind_of),
]
DynamicShapesSpec = dict[str, ShapeSpec]


def _axes(spec: Any) -> list[tuple[str, Any]]:
    """`(axis key as written, axis spec)` of one input's entry."""
    if isinstance(spec, list):
        return [(str(i), value) for i, value in enumerate(spec)]
    if isinstance(spec, dict):
        return list(spec.items())
    return []


def check_shape_spec(spec: dict[str, Any] | None, at: tuple) -> None:
    """One name is one dimension (one range), and axis keys fit the inputs whose rank is known.

    Example:
        >>> seq = DimSpec(name="seq", max=64)
        >>> check_shape_spec({"input_ids": {"1": seq}, "attention_mask": {"1": DimSpec(name="seq", max=32)}}, ())
        Traceback (most recent call last):
        ...
        exporters.recipe._base.PathValueError: dimension 'seq' is declared again with min/max None/32, but input_ids axis 1 gave it None/64: one name is one dimension, so give it one range (or repeat just its name)
    """
    seen: dict[str, tuple[int | None, int | None, str]] = {}
    for key, entry in (spec or {}).items():
        rank = KNOWN_RANKS.get(key)
        if rank is not None and isinstance(entry, list) and len(entry) != rank:
            raise PathValueError((*at, key), f"'{key}' has {rank} axes, but {len(entry)} are listed")
        for axis, value in _axes(entry):
            if rank is not None and isinstance(entry, dict) and not -rank <= int(axis) < rank:
                raise PathValueError((*at, key, axis), f"'{key}' has {rank} axes (0 to {rank - 1}, or -{rank} to "
                                                        f"-1 from the end): axis {axis} does not exist")
            if not isinstance(value, DimSpec):
                continue
            where = f"{key} axis {axis}"
            if value.name not in seen:
                seen[value.name] = (value.min, value.max, where)
                continue
            low, high, first = seen[value.name]
            if (value.min, value.max) not in ((low, high), (None, None)):
                path = (*at, key, int(axis) if isinstance(entry, list) else axis)
                raise PathValueError(path, f"dimension '{value.name}' is declared again with min/max "
                                            f"{value.min}/{value.max}, but {first} gave it {low}/{high}: one name is "
                                            "one dimension, so give it one range (or repeat just its name)")

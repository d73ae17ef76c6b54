"""Turn a recipe's JSON dynamic-shape contract into `torch.export` dynamic shapes.

Notation (documented in docs/recipe.md):

- keys are input names (`"input_ids"`) or dotted paths to tensor leaves inside a structured input, with `*`
  wildcards: `"cache.layers.*.keys"` addresses every layer's key cache (the same paths ONNX uses as input names);
- values give each axis as `"static"`, `"auto"` (`Dim.AUTO`) or `{"name": "seq", "min": 1, "max": 4096}`, either as
  a list (one entry per axis) or an object keyed by axis index (`{"1": {...}}`; unlisted axes are static);
- the same `name` on several axes is one shared dimension.

Example:
    >>> import torch
    >>> spec = {"input_ids": {"1": DimSpec(name="seq", min=2, max=64)}}
    >>> shapes, used = build_dynamic_shapes(spec, {"input_ids": torch.zeros(1, 8, dtype=torch.long)})
    >>> shapes["input_ids"][1].__name__, sorted(used)
    ('seq', ['input_ids'])
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable

import torch
from torch.export import Dim

from exporters import upstream
from exporters.errors import ShapeSpecError
from exporters.recipe.dims import DimSpec

# Inputs that upstream pops before tracing (`prepare_for_export`): they take no dynamic-shape entry.
OUTPUT_FLAGS = upstream.OUTPUT_FLAGS
# Where a spec key is in the recipe file: `(JSON path, line)`.
Locator = Callable[[str], tuple[str, "int | None"]]


def _unlocated(key: str) -> tuple[str, int | None]:
    return f"$.dynamic_shapes.{key}", None


def leaf_paths(inputs: dict[str, Any]) -> dict[int, str]:
    """`id(tensor) -> dotted path` for every tensor leaf of `inputs` (upstream's leaf naming)."""
    return {id(tensor): path for path, tensor in upstream.leaf_tensors(inputs).items()}


def spec_key(spec: dict[str, Any], path: str) -> str | None:
    """The key of `spec` that addresses the tensor at `path`: the exact path, else the most specific pattern."""
    if path in spec:
        return path
    matches = [key for key in spec if "*" in key and fnmatch.fnmatchcase(path, key)]
    return max(matches, key=len) if matches else None


def axis_specs(spec: Any, rank: int, key: str, locate: Locator = _unlocated) -> dict[int, Any]:
    """`{axis: 'static' | 'auto' | DimSpec}` of one spec entry for an input of `rank` axes (negative axis keys count
    from the end, as in Python); `ShapeSpecError` at the entry's JSON path when the entry does not fit the rank."""
    if spec == "auto":
        return dict.fromkeys(range(rank), "auto")
    if isinstance(spec, list):
        if len(spec) != rank:
            path, line = locate(key)
            raise ShapeSpecError(f"'{key}' lists {len(spec)} axes, but the input has {rank}", path=path, line=line)
        return dict(enumerate(spec))
    axes = {}
    for axis_text, axis_spec in spec.items():
        axis = int(axis_text)
        if not -rank <= axis < rank:
            path, line = locate(key)
            raise ShapeSpecError(f"'{key}' names axis {axis}, but the input has {rank} axes (0 to {rank - 1})",
                                 path=f"{path}.{axis_text}", line=line)
        axes[axis % rank] = axis_spec
    return axes


class DimTable:
    """Named dims, one `Dim` per name, bounds checked for consistency."""

    def __init__(self) -> None:
        self.dims: dict[str, tuple[Any, int | None, int | None]] = {}

    def get(self, spec: DimSpec, where: tuple[str, int | None] = ("$", None)) -> Any:
        if spec.name in self.dims:
            dim, low, high = self.dims[spec.name]
            if (spec.min, spec.max) != (low, high) and (spec.min, spec.max) != (None, None):
                raise ShapeSpecError(
                    f"dimension '{spec.name}' is declared with min/max {spec.min}/{spec.max} and {low}/{high}; "
                    "one name is one dimension, so give it one range", path=where[0], line=where[1]
                )
            return dim
        kwargs = {k: v for k, v in (("min", spec.min), ("max", spec.max)) if v is not None}
        dim = Dim(spec.name, **kwargs)
        self.dims[spec.name] = (dim, spec.min, spec.max)
        return dim


def build_dynamic_shapes(
    spec: dict[str, Any] | None, inputs: dict[str, Any], specialized: list[str] | None = None,
    locate: Locator = _unlocated,
) -> tuple[dict[str, Any] | None, set[str]]:
    """The `dynamic_shapes` argument for `torch.export` from the recipe `spec`, for these forward `inputs`.

    Returns `(dynamic_shapes, used_keys)`: `used_keys` are the spec keys that matched a tensor, so a key matching
    nothing in any component can be reported. A named axis whose sample size is 0 or 1 cannot be traced as dynamic
    (torch.export specializes it); it is left static and described in `specialized`.
    """
    if not spec:
        return None, set()
    paths = leaf_paths(inputs)
    table = DimTable()
    used: set[str] = set()

    def spec_for(path: str) -> tuple[str, Any] | None:
        key = spec_key(spec, path)
        return None if key is None else (key, spec[key])

    def tensor_shape(tensor: torch.Tensor) -> dict[int, Any] | None:
        path = paths.get(id(tensor))
        found = spec_for(path) if path is not None else None
        if found is None:
            return None
        key, axis_spec = found
        used.add(key)
        result = {}
        for axis, value in axis_specs(axis_spec, tensor.dim(), key, locate).items():
            if value == "static":
                continue
            if value == "auto":
                result[axis] = Dim.AUTO
            else:
                if value.min is not None and tensor.shape[axis] < value.min or (
                    value.max is not None and tensor.shape[axis] > value.max
                ):
                    where, line = locate(key)
                    raise ShapeSpecError(
                        f"'{path}' axis {axis} has size {tensor.shape[axis]} in the sample inputs, outside the "
                        f"declared range of '{value.name}' [{value.min}, {value.max}]; widen the range or change "
                        "the sample inputs (recipe 'inputs')", path=where, line=line
                    )
                if tensor.shape[axis] <= 1:
                    if specialized is not None:
                        specialized.append(
                            f"{path} axis {axis} ('{value.name}') has size {tensor.shape[axis]} in the traced inputs, "
                            "so torch.export specializes it: exported static"
                        )
                    continue
                result[axis] = table.get(value, locate(key))
        return result or None

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return tensor_shape(value)
        if value is None or isinstance(value, (int, float, bool, str)):
            return None
        if type(value) in (list, tuple):
            return type(value)(walk(v) for v in value)
        if type(value) is dict:
            return {k: walk(v) for k, v in value.items()}
        node = torch.utils._pytree.SUPPORTED_NODES.get(type(value))
        if node is not None:
            children, _ = node.flatten_fn(value)
            return [walk(child) for child in children]
        if hasattr(value, "__dict__"):
            leaves, _ = upstream.pytree_flatten(value)
            return [walk(leaf) for leaf in leaves]
        return None

    upstream.register_cache_pytrees()  # caches must be pytree nodes before we walk them
    shapes = {name: walk(value) for name, value in inputs.items() if name not in OUTPUT_FLAGS}
    return shapes, used

"""The axes `hf-export init` tries to keep dynamic: which input axes vary in use, tied how, and over what range.

```
sample (S, batch, image) ─► decompose ─┐
sample (S+3, batch+1, 2×image) ─► decompose ─┴─► axes whose size moved ─► one named dimension per quantity
                                                  + the decode cache's sequence axis (`past`)
                                              ─► range: the config's position limit, the probe budget, and the
                                                 sizes the eager model runs at (bisection on the eager model)
```

Nothing here is guessed from input names except the cache layout, which is upstream's leaf naming
(`cache.layers.N.keys`, `cache.self_attention_cache.…`, `cache.cross_attention_cache.…`): the pipeline's own input
maker and decomposition run twice, and the axes that changed are the ones that vary in use. Changing a quantity
the model does not allow (an image size a vision transformer's position embeddings fix) raises, and that quantity
is left static with the error as the reason.

Example:
    >>> plan = find_dimensions(model, InputsSpec(), recipe)  # doctest: +SKIP
    >>> [(d.name, d.low, d.high) for d in plan.dimensions]  # doctest: +SKIP
    [('prompt', 1, 256), ('past', 1, 255)]
"""

from __future__ import annotations

import copy
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from exporters.capture.cache_settings import CacheSetting
from exporters.capture.components import decompose, minimum_components
from exporters.capture.inputs import default_mode, detect_family, in_model_dtype, make_sample_inputs
from exporters.capture.merged import (
    BATCH_DIM,
    MERGED,
    PAST_DIM,
    QUERY_DIM,
    QUERY_INPUTS,
    state_leaves,
    takes_cache,
    windows_keep_apart,
)
from exporters.capture.attention_size import CACHE_LEAF, MAX_PROBE_ATTENTION, attention_elements
from exporters.capture.probes import DimBinding, make_probes
from exporters.errors import first_line
from exporters.recipe.model import FORMATS, InputsSpec, Recipe
from exporters.status import AUTO, NAMED, STATIC, DimState
from exporters.validate.checks import shapes_of

Axes = list[tuple[str, int]]  # (leaf path, axis)

CAP_SEQUENCE = 4096  # when config.json declares no position limit
CAP_BATCH = 64
CAP_IMAGE_FACTOR = 8  # image sides up to 8× the traced size
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions")


@dataclass
class Dimension:
    """One quantity that varies in use (`prompt`, `past`, `sequence`, `source`, `batch`, `image`), the axes it binds
    in each component, its traced size and the range to try."""

    name: str
    traced: int
    low: int
    high: int
    limit: str  # where `high` comes from, in words
    axes: dict[str, Axes] = field(default_factory=dict)  # component -> axes
    state: dict[str, DimState] = field(default_factory=dict)  # component -> how it is declared
    reasons: list[str] = field(default_factory=list)  # why the range or the declaration changed

    @property
    def declared(self) -> DimState:
        """The most dynamic state among the components (what the summary shows)."""
        states = set(self.state.values())
        return NAMED if NAMED in states else AUTO if AUTO in states else STATIC


@dataclass
class AxisPlan:
    """What init found before exporting anything: the sample it traces with, the components, the dimensions."""

    family: str
    mode: str
    inputs: InputsSpec
    components: list[str]
    expected: list[str]
    dimensions: list[Dimension]
    leaves: dict[str, dict[str, list[int]]]  # component -> leaf path -> traced shape
    notes: list[str] = field(default_factory=list)
    # the merged graph's dimensions (`model`: one graph, weights once), where the tool's merged default applies
    merged: list[Dimension] | None = None
    # the formats whose default graph that is (`windows_keep_apart`: ONNX alone for a mix of window and full layers)
    merged_formats: tuple[str, ...] = ()


def _leaf_shapes(components) -> dict[str, dict[str, list[int]]]:
    return {name: shapes_of(inputs) for name, (_, inputs) in components.items()}


def _decompose(model, spec: InputsSpec, mode: str, tokenizer, full_windows: bool = False):
    """The components captured from a sample made with `spec`, with a growing cache: the one whose length axis
    init declares dynamic (`full_windows`: full length in every layer, as an ONNX generation capture keeps it)."""

    sample = in_model_dtype(make_sample_inputs(model, spec, tokenizer), model)  # as the pipeline holds them
    setting = CacheSetting("dynamic", full_windows=full_windows)
    components = decompose(model, mode, sample.forward, sample.generate, setting=setting,
                                  multi_token_decode=False, family=sample.family)
    return sample, components


def _moved(base: dict[str, dict[str, list[int]]], other: dict[str, dict[str, list[int]]]) -> dict[str, Axes]:
    """Per component, the (leaf, axis) pairs whose size differs between two captures of the same structure."""
    moved: dict[str, Axes] = {}
    for component, leaves in base.items():
        for path, shape in leaves.items():
            other_shape = other.get(component, {}).get(path)
            if other_shape is None or len(other_shape) != len(shape):
                continue
            moved.setdefault(component, []).extend(
                (path, axis) for axis, (a, b) in enumerate(zip(shape, other_shape)) if a != b
            )
    return {c: axes for c, axes in moved.items() if axes}


def _sequence_name(family: str, mode: str) -> str:
    if mode == "model":
        return "sequence"
    return "source" if family in ("seq2seq", "speech-seq2seq") else "prompt"


def _position_limit(config) -> tuple[int | None, str]:
    text = getattr(config, "text_config", None) or config
    for attribute in POSITION_LIMITS:
        value = getattr(text, attribute, None)
        if isinstance(value, int) and value > 0:
            return value, f"{attribute} = {value}"
    return None, f"config.json declares no position limit: searched up to {CAP_SEQUENCE}"


def _variants(family: str, mode: str, spec: InputsSpec, config) -> list[tuple[str, InputsSpec]]:
    """Samples that change one quantity each: `(quantity, inputs)`."""
    variants = []
    if family in ("text", "seq2seq", "vision-language", "audio-language"):
        variants.append(("sequence", spec.model_copy(update={"sequence_length": spec.sequence_length + 3})))
    if mode == "model":
        variants.append(("batch", spec.model_copy(update={"batch_size": spec.batch_size + 1})))
    if family in ("vision", "vision-language"):
        vision = getattr(config, "vision_config", None) or config
        size = spec.image_size or int(getattr(vision, "image_size", 32))
        variants.append(("image", spec.model_copy(update={"image_size": 2 * size})))
    return variants


def find_dimensions(model, recipe: Recipe, *, tokenizer=None, max_probe_elements: int = 1_000_000,
                    batch_size: int = 2) -> AxisPlan:
    """The dimensions to try for `model`: traced with `recipe.inputs` (batch `batch_size` for single-graph models,
    so that the batch axis can stay dynamic), each with the range the model allows. A model mixing window and full
    layers gets its merged dims (ONNX's alone: `AxisPlan.merged_formats`) from a second plan captured as ONNX
    captures it, on a full-length cache in every layer (`CacheSetting.full_windows`): its own cache's window layers
    would bound `past` by the window."""

    family, mode = detect_family(model), default_mode(model)
    spec = recipe.inputs.model_copy(update={"batch_size": batch_size if mode == "model" else 1})
    recipe = recipe.model_copy(update={"inputs": spec})
    plan, components = _plan(model, recipe, tokenizer, max_probe_elements, full_windows=False)
    formats = tuple(f for f in FORMATS if not windows_keep_apart(f, model.config))
    merged_from = plan
    if formats != FORMATS and mode == "generation" and family == "text":
        merged_from, components = _plan(model, recipe, tokenizer, max_probe_elements, full_windows=True)
    plan.merged = merged_dimensions(merged_from, components, max_probe_elements, model.config)
    if plan.merged is not None:
        # the merged graph is the decode with a multi-token query
        plan.leaves[MERGED], plan.merged_formats = merged_from.leaves["decode"], formats
    return plan


def _plan(model, recipe: Recipe, tokenizer, max_probe_elements: int, full_windows: bool):
    """The axis plan of one capture (`full_windows`: every layer's cache full length) and its components."""
    family, mode, spec = detect_family(model), default_mode(model), recipe.inputs
    _, components = _decompose(model, spec, mode, tokenizer, full_windows)
    base = _leaf_shapes(components)
    notes: list[str] = []
    roles: dict[str, dict[str, Axes]] = {}
    for quantity, variant in _variants(family, mode, spec, model.config):
        try:
            _, other = _decompose(model, variant, mode, tokenizer, full_windows)
        except Exception as err:  # the model does not allow this quantity to change
            notes.append(f"{quantity}: static — the model does not run with another {quantity} size "
                         f"({_first_line(err)})")
            continue
        roles[quantity] = _moved(base, _leaf_shapes(other))
    dimensions = _name_dimensions(roles, base, family, mode, model.config, max_probe_elements)
    _eager_ranges(model, components, dimensions, recipe)
    for dimension in dimensions:
        if dimension.low == dimension.high == dimension.traced:
            dimension.state = dict.fromkeys(dimension.axes, STATIC)
            dimension.reasons.append(f"{dimension.name}: static — the eager model runs only at the traced size "
                                     f"{dimension.traced}")
    plan = AxisPlan(family, mode, spec, list(components), minimum_components(family, mode, list(components)),
                    dimensions, base, notes)
    return plan, components


def merged_dimensions(plan: AxisPlan, components, max_probe_elements: int, config=None) -> list[Dimension] | None:
    """The dimensions of the merged graph (`model`: upstream's multi-token decode, the default generation graph of a
    decoder-only model with a key-value cache, `exporters.capture.merged`), from the prefill's and the decode's: the
    query axis of the token inputs is the prompt (1 up to its bound), the cache's sequence axis is `past` from 0 (the
    prompt runs on an empty cache), and the batch is dynamic (what runtimes batch), bounded by the probe budget. None
    where the merged default applies to no format (another family, no key-value cache, state-space layers: the
    merged default's own tests, `exporters.capture.merged`; a cache with conv or recurrent states too, which this
    contract does not batch). A mix of window and full layers keeps it for ONNX alone (`AxisPlan.merged_formats`):
    its capture keeps every position in every layer, so `past` is one length; the sliding layers' leaves are among
    its axes as the full layers' are. The names are the merged default's (optimum's and GenAI's dims). The query
    attends over itself and the traced cache here (the prefill's did not): its range is bounded again for that."""
    if plan.mode != "generation" or plan.family != "text":
        return None
    if not takes_cache(components) or state_leaves(components["decode"][1]):
        return None
    by_name = {d.name: d for d in plan.dimensions}
    prompt, past = by_name.get("prompt"), by_name.get("past")
    if prompt is None or past is None or not past.axes.get("decode"):
        return None
    decode = plan.leaves["decode"]
    queries = [(path, 1) for path in QUERY_INPUTS if len(decode.get(path, [])) >= 2]
    cache = list(past.axes["decode"])
    batch_axes = [(path, 0) for path, _ in queries] + [(path, 0) for path, _ in cache]
    batch_high = _probe_budget({MERGED: batch_axes}, {MERGED: decode}, 1, max_probe_elements, CAP_BATCH)
    batch_limit = f"batch searched up to {CAP_BATCH}" if batch_high == CAP_BATCH else (
        f"probe budget: larger inputs exceed validation.max_probe_elements ({max_probe_elements:,})")
    named = {MERGED: NAMED}
    # validation probes the query and the cache at the batch the export traces (`fit_to_contract`: the first size
    # from 2 no other axis has): their ranges end where those probes fit
    taken = {n for path, shape in decode.items() for axis, n in enumerate(shape) if (path, axis) not in batch_axes}
    traced_batch = next(n for n in range(2, CAP_BATCH + 2) if n not in taken) if batch_high >= 2 else 1
    fitted = {MERGED: _shapes_at(decode, batch_axes, traced_batch)}
    query_high, query_limit = _attention_bound(QUERY_DIM, {MERGED: queries}, fitted, config, prompt.high, prompt.limit)
    past_high = _probe_budget({MERGED: cache}, fitted, past.traced, max_probe_elements, past.high)
    past_limit = past.limit if past_high == past.high else (
        f"probe budget: larger inputs exceed validation.max_probe_elements ({max_probe_elements:,})")
    return [
        Dimension(BATCH_DIM, 1, 1, batch_high, batch_limit, {MERGED: batch_axes}, dict(named)),
        Dimension(QUERY_DIM, prompt.traced, 1, max(query_high, prompt.traced), query_limit, {MERGED: queries},
                  dict(named), list(prompt.reasons)),
        Dimension(PAST_DIM, past.traced, 0, max(past_high, past.traced), past_limit, {MERGED: cache}, dict(named),
                  list(past.reasons)),
    ]


def _name_dimensions(roles: dict[str, dict[str, Axes]], base, family: str, mode: str, config,
                     max_probe_elements: int) -> list[Dimension]:
    """One dimension per quantity, named for what it is in use; a decode cache's sequence axis is `past`."""
    by_name: dict[str, dict[str, Axes]] = {}
    for quantity, moved in roles.items():
        for component, axes in moved.items():
            for path, axis in axes:
                name = {"sequence": _sequence_name(family, mode)}.get(quantity, quantity)
                by_name.setdefault(name, {}).setdefault(component, []).append((path, axis))
    for component, leaves in base.items():  # the self-attention cache grows with every generated token
        for path, shape in leaves.items():
            if CACHE_LEAF.search(path) and "cross_attention" not in path and len(shape) >= 3:
                axis = len(shape) - 2
                for axes in by_name.values():
                    if (path, axis) in axes.get(component, []):
                        axes[component].remove((path, axis))
                by_name.setdefault("past", {}).setdefault(component, []).append((path, axis))
    positions, position_words = _position_limit(config)
    dimensions = []
    for name in ("batch", "sequence", "prompt", "source", "past", "image"):
        axes = {c: sorted(set(a)) for c, a in by_name.get(name, {}).items() if a}
        if not axes:
            continue
        component, first = next(iter(axes.items()))
        traced = base[component][first[0][0]][first[0][1]]
        high, limit = _cap(name, traced, positions, position_words)
        budget = _probe_budget(axes, base, traced, max_probe_elements, high)
        if budget < high:
            high, limit = budget, (f"probe budget: larger inputs exceed validation.max_probe_elements "
                                   f"({max_probe_elements:,})")
        high, limit = _attention_bound(name, axes, base, config, high, limit)
        dimensions.append(Dimension(name, traced, 1, max(high, traced), limit, axes, dict.fromkeys(axes, NAMED)))
    return dimensions


def _cap(name: str, traced: int, positions: int | None, position_words: str) -> tuple[int, str]:
    if name == "batch":
        high, limit = CAP_BATCH, f"batch searched up to {CAP_BATCH}"
    elif name == "image":
        high, limit = CAP_IMAGE_FACTOR * traced, f"image sides searched up to {CAP_IMAGE_FACTOR}× the traced size"
    elif name == "past":  # the next token's position must still have an embedding
        return (positions - 1, f"{position_words}, less one for the next token") if positions else (
            CAP_SEQUENCE - 1, position_words)
    else:
        return (positions, position_words) if positions else (CAP_SEQUENCE, position_words)
    if positions is not None and positions < high:  # the validator never probes a dimension past it
        return positions, position_words
    return high, limit


def _probe_budget(axes: dict[str, Axes], base, traced: int, limit: int, high: int) -> int:
    """The largest size whose probe inputs stay within `limit` elements in every component (the validator skips
    larger probes, so a bound past it could not be checked)."""

    def elements(component: str, size: int) -> float:
        per_leaf: dict[str, int] = {}
        for path, _ in axes[component]:
            per_leaf[path] = per_leaf.get(path, 0) + 1
        total = 0.0
        for path, count in per_leaf.items():
            numel = 1
            for extent in base[component][path]:
                numel *= extent
            total += numel * (size / traced) ** count
        return total

    low_ok, high_try = traced, high
    if all(elements(c, high_try) <= limit for c in axes):
        return high
    while high_try - low_ok > 1:
        middle = (low_ok + high_try) // 2
        if all(elements(c, middle) <= limit for c in axes):
            low_ok = middle
        else:
            high_try = middle
    return low_ok


def _shapes_at(leaves: dict[str, list[int]], axes: Axes, size: int) -> dict[str, list[int]]:
    shapes = {path: list(shape) for path, shape in leaves.items()}
    for path, axis in axes:
        shapes[path][axis] = size
    return shapes


def _attention_bound(name: str, axes: dict[str, Axes], base, config, high: int, limit: str) -> tuple[int, str]:
    """`(high, limit)`, or the largest size below `high` whose attention (`attention_elements`: it grows with the
    square of a sequence, where the inputs `_probe_budget` counts grow linearly) stays within what validation
    computes in every component, and why: the eager runs below and validation's probes at the range's ends stay that
    small (a 131072-token prompt's took 23 GB)."""

    def attention(size: int) -> int:
        return max(attention_elements(_shapes_at(base[c], axes[c], size), config) for c in axes)

    if attention(high) <= MAX_PROBE_ATTENTION:
        return high, limit
    good = last_good(1, high, lambda size: attention(size) <= MAX_PROBE_ATTENTION) if attention(1) <= \
        MAX_PROBE_ATTENTION else 1
    return good, (f"probe budget: attention at {name} {good + 1:,} ({attention(good + 1):,} elements, batch x heads x "
                  f"query x key) exceeds the {MAX_PROBE_ATTENTION:,} that validation computes")


# ── What the eager model runs at ──────────────────────────────────────────────


def _eager_runs(model, module, inputs, dimension: Dimension, component: str, size: int, seed: int) -> str | None:
    """None when the eager `module` runs with the dimension at `size`, else the error."""

    binding = DimBinding(dimension.name, size, size, dimension.axes[component], dimension.traced)
    probes = make_probes(inputs, [binding], model.config, limit=10**18, max_positions=None, seed=seed)
    _, probe, _ = probes[-1]
    try:
        with torch.no_grad():
            module(**copy.deepcopy(probe))
    except Exception as err:
        return _first_line(err)
    return None


def _eager_ranges(model, components, dimensions: list[Dimension], recipe: Recipe) -> None:
    """Narrow each range to the sizes the eager model runs at (bisection between the traced size and each end)."""
    seed = recipe.inputs.seed
    for dimension in dimensions:
        for component in dimension.axes:
            module, inputs = components[component]

            def error_at(size: int, component=component, module=module, inputs=inputs) -> str | None:
                return _eager_runs(model, module, inputs, dimension, component, size, seed)

            def runs(size: int) -> bool:
                return error_at(size) is None

            high_error = error_at(dimension.high)
            if high_error is not None:
                good = last_good(dimension.traced, dimension.high, runs)
                dimension.reasons.append(f"{dimension.name}: the eager model fails above {good} in {component} "
                                         f"({high_error})")
                dimension.high, dimension.limit = good, f"the eager model runs up to {good}"
            low_error = error_at(dimension.low) if dimension.low < dimension.traced else None
            if low_error is not None:
                good = last_good(dimension.traced, dimension.low, runs)
                dimension.reasons.append(f"{dimension.name}: the eager model fails below {good} in {component} "
                                         f"({low_error})")
                dimension.low = good


def _first_line(err: BaseException) -> str:
    """The first line of the innermost cause (wrappers like upstream's `decompose_prefill_decode failed` hide it)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {first_line(str(err), 240)}"


def spec_entries(axes: Axes, leaves: dict[str, list[int]], value: Any) -> dict[str, dict[str, Any]]:
    """`dynamic_shapes` entries giving each (leaf, axis) `value`; per-layer leaves of a cache are folded into one
    `*` key when the pattern matches exactly those leaves on the same axis.

    Example:
        >>> spec_entries([("cache.layers.0.keys", 2), ("cache.layers.1.keys", 2)],
        ...              {"cache.layers.0.keys": [1, 2, 8, 8], "cache.layers.1.keys": [1, 2, 8, 8]}, "auto")
        {'cache.layers.*.keys': {'2': 'auto'}}
    """

    by_leaf: dict[str, list[int]] = {}
    for path, axis in axes:
        by_leaf.setdefault(path, []).append(axis)
    entries: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    for path, leaf_axes in by_leaf.items():
        if path in done:
            continue
        pattern = re.sub(r"\.\d+\.", ".*.", path)
        matching = [p for p in leaves if fnmatch.fnmatchcase(p, pattern)]
        if pattern != path and all(by_leaf.get(p) == leaf_axes for p in matching):
            key, done = pattern, done | set(matching)
        else:
            key, done = path, done | {path}
        entries[key] = {str(axis): copy.deepcopy(value) for axis in sorted(leaf_axes)}
    return entries


def last_good(good: int, bad: int, runs: Callable[[int], bool]) -> int:
    """The size nearest `bad` that still runs, bisecting between `good` (runs) and `bad` (fails), either way up.

    Example:
        >>> last_good(8, 64, lambda size: size <= 40), last_good(8, 1, lambda size: size >= 3)
        (40, 3)
    """
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if runs(middle) else (good, middle)
    return good

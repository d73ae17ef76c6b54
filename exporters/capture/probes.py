"""Probe inputs: the shapes a dynamic-shape contract promises, and inputs resized to them.

A contract is the recipe's named dims (`{"name": "seq", "min": 2, "max": 64}`), or for `dynamic: true` the sequence
axis of text inputs. From it come

- the **traced** sizes: [`fit_to_contract`] moves every declared dim whose sample size torch.export cannot keep
  dynamic (0 or 1, or outside the declared range) to a size inside the range, for every input that shares the name;
- the **probes**: the traced inputs, then every dim at its lower bound, a middle value and its upper bound, the
  dims together (the i-th probe sets each dim at its i-th size: [`make_probes`]), which validation runs through the
  artifact and the eager model.

Example:
    >>> import torch
    >>> from exporters.recipe.dims import DimSpec
    >>> spec = {"pixel_values": {"0": DimSpec(name="batch", min=1, max=8)}}
    >>> inputs = {"pixel_values": torch.zeros(1, 3, 4, 4)}
    >>> bindings = dim_bindings(spec, inputs, dynamic=False, family="vision")
    >>> [(b.name, b.traced, probe_sizes(b, None)) for b in bindings]
    [('batch', 1, [1, 4, 8])]
    >>> fitted, notes = fit_to_contract(inputs, bindings, config=None)
    >>> fitted["pixel_values"].shape[0]
    2
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from exporters.capture.attention_size import MAX_PROBE_ATTENTION, attention_elements
from exporters.capture.inputs import random_token_ids
from exporters.capture.shapes import axis_specs, spec_key
from exporters.recipe.dims import DimSpec
from exporters.upstream import leaf_tensors

# Logits a probe may produce (tokens x vocabulary); each is held by the eager reference and the artifact's output.
MAX_PROBE_LOGITS = 1 << 26


def _leaves(inputs: Any) -> dict[str, torch.Tensor]:
    return leaf_tensors(inputs)


def _is_arange(tensor: torch.Tensor, axis: int) -> bool:
    if tensor.is_floating_point() or tensor.shape[axis] < 2:
        return False
    moved = tensor.movedim(axis, -1).reshape(-1, tensor.shape[axis])
    start = moved[:, :1]
    return bool(torch.equal(moved, start + torch.arange(moved.shape[-1])))


def resize_along(tensor: torch.Tensor, axis: int, size: int, generator: torch.Generator, config) -> torch.Tensor:
    """`tensor` cut or grown along `axis` to `size`, grown with values of the same kind (a constant stays that
    constant — masks, token types —, positions keep counting, token ids stay in the vocabulary, floats stay at their
    scale)."""
    current = tensor.shape[axis]
    if size == 0:  # freshly allocated: a zero-length slice keeps strides that ExecuTorch aborts on
        shape = list(tensor.shape)
        shape[axis] = 0
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if size <= current:
        return tensor.narrow(axis, 0, size).clone()
    extra_shape = list(tensor.shape)
    extra_shape[axis] = size - current
    if tensor.dtype == torch.bool or (not tensor.is_floating_point() and tensor.numel() > 0
                                      and bool((tensor == tensor.flatten()[0]).all())):
        # masks stay masks, token types stay the one type: a constant integer input grows with its value
        extra = torch.full(extra_shape, tensor.flatten()[0].item() if tensor.numel() else 1, dtype=tensor.dtype)
    elif tensor.is_floating_point() and current > 0 and torch.unique(tensor).numel() <= 2:
        # a float mask (0 / the dtype's minimum, 0 / 1: Mllama's cross-attention masks) grows by its last slice
        extra = tensor.narrow(axis, current - 1, 1).expand(extra_shape).clone()
    elif _is_arange(tensor, axis):
        last = tensor.narrow(axis, current - 1, 1)
        steps = torch.arange(1, size - current + 1).reshape([-1 if d == axis else 1 for d in range(tensor.dim())])
        extra = (last + steps).to(tensor.dtype)
    elif not tensor.is_floating_point():
        # ids like the sample's: below its largest (a tokenizer's ids stay clear of a padded vocabulary's rows)
        limit = int(tensor.max()) + 1 if tensor.numel() else None
        extra = random_token_ids(config, tuple(extra_shape), generator, limit).to(tensor.dtype)
    else:
        scale = float(tensor.float().std()) if tensor.numel() > 1 else 1.0
        extra = (torch.randn(extra_shape, generator=generator) * (scale or 1.0)).to(tensor.dtype)
    return torch.cat([tensor, extra.to(tensor.device)], dim=axis)


def _set_leaf(inputs: dict[str, Any], path: str, value: torch.Tensor) -> None:
    """Replace the tensor at dotted `path` (upstream leaf naming) inside `inputs`."""
    parts = path.split(".")
    node: Any = inputs
    for part in parts[:-1]:
        if isinstance(node, dict):
            node = node[_dict_key(node, part)]
        elif isinstance(node, (list, tuple)):
            node = node[int(part)]
        else:
            node = getattr(node, part)
    last = parts[-1]
    if isinstance(node, dict):
        node[_dict_key(node, last)] = value
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        setattr(node, last, value)


def _dict_key(node: dict, part: str) -> Any:
    """The key of `node` that leaf path component `part` names: a state-space layer keys its states by int
    (`conv_states[0]`), which the dotted path spells `"0"`."""
    return int(part) if part not in node and part.isdigit() and int(part) in node else part


@dataclass
class DimBinding:
    """A dynamic dimension and the (leaf path, axis) pairs it binds in one component's inputs."""

    name: str
    low: int | None
    high: int | None
    axes: list[tuple[str, int]]
    traced: int
    declared: bool = True  # a named dim of the recipe (False: the sequence axis of `dynamic: true`)
    positional: bool = True  # bounded by the model's positions (not a waveform's samples)


def dim_bindings(spec: dict[str, Any] | None, inputs: dict[str, Any], dynamic: bool, family: str) -> list[DimBinding]:
    """The dynamic dims of a component: named dims from the recipe, or for `dynamic: true` the sequence axis of
    text inputs, or the sample axis of a raw waveform (from half the traced length: a waveform shorter than the
    model's conv stack is no input) — the axes users vary; batch is specialized at size 1 by `Dim.AUTO`."""

    leaves = _leaves(inputs)
    bindings: dict[str, DimBinding] = {}
    if spec:
        for path, tensor in leaves.items():
            key = spec_key(spec, path)
            if key is None:
                continue
            for axis, value in axis_specs(spec[key], tensor.dim(), key).items():
                if isinstance(value, DimSpec):
                    binding = bindings.setdefault(
                        value.name, DimBinding(value.name, value.min, value.max, [], int(tensor.shape[axis]))
                    )
                    binding.axes.append((path, axis))
        return list(bindings.values())
    if dynamic and family in ("text", "seq2seq", "vision-language", "audio-language", "dual-encoder"):
        ids = leaves.get("input_ids")
        if ids is not None and ids.dim() == 2 and ids.shape[1] > 1:
            seq = int(ids.shape[1])
            axes = [(p, 1) for p, t in leaves.items() if t.dim() == 2 and t.shape[1] == seq and p != "position_ids"]
            axes += [(p, 1) for p, t in leaves.items() if p == "position_ids" and t.dim() == 2 and t.shape[1] == seq]
            # masks a text row attends to images with (Mllama's `batch x 1 x sequence x image tokens`)
            axes += [(p, 2) for p, t in leaves.items() if family == "vision-language" and p.endswith("mask")
                     and t.dim() == 4 and t.shape[2] == seq and t.shape[3] != seq]
            return [DimBinding("sequence (dynamic: true)", None, None, axes, seq, declared=False)]
    waveform = leaves.get("input_values")
    if dynamic and family in ("audio", "speech-seq2seq") and waveform is not None and waveform.dim() == 2:
        samples = int(waveform.shape[1])  # a raw waveform's length: what users vary (one clip, then another)
        axes = [(p, 1) for p, t in leaves.items() if t.dim() == 2 and t.shape[1] == samples]
        return [DimBinding("samples (dynamic: true)", samples // 2, None, axes, samples, declared=False,
                           positional=False)]
    return []


def probe_sizes(binding: DimBinding, max_positions: int | None) -> list[int]:
    """Lower bound, a value in between and the upper bound of a dim (sizes it was not traced with)."""
    low = binding.low if binding.low is not None else 2
    high = binding.high if binding.high is not None else binding.traced * 2 + 3
    if max_positions is not None and binding.positional:
        high = min(high, max_positions)
    sizes = [low, (low + high) // 2, high]
    floor = 0 if binding.low == 0 else 1  # a declared minimum of 0 (an empty cache) is probed too
    return sorted({s for s in sizes if s >= floor})


def make_probes(
    inputs: dict[str, Any], bindings: list[DimBinding], config, limit: int, max_positions: int | None, seed: int = 0,
    logits_per_token: int = 0, model_sized: bool = False,
) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """`(probe id, inputs or None, skip reason)`: the traced inputs, then every dim at each of its probe sizes.

    Several dims are probed together: the i-th probe sets every dim at its i-th size (its lower bound, its middle
    value, its upper bound; `batch_size=1, sequence_length=1, past_sequence_length=0`), so a merged decoder's three
    dims take 3 probes instead of 9. Each size of each dim is still run, and a graph that fixed or mishandles any one
    dim fails the probes at that dim's other sizes. A joint probe that would not run (over the limits below, or its
    positional sizes adding up past `max_positions`) is split back into one probe per dim, as a lone dim is probed.

    The traced probe is never skipped: the capture already holds its inputs (a static cache of the model's context
    is millions of elements, and generation parity runs the same graph at that size). Size limits bound what
    validation adds, the unseen shapes: a probe is skipped when its inputs exceed both `limit` elements and the traced
    inputs (`model_sized`, the recipe leaving `validation.max_probe_elements` at its default: twice the traced
    inputs, and a dim declared with no maximum (`dynamic: true`) is probed at the sizes that fit, so a decode whose
    states alone pass the default, Falcon-H1's, is verified; a skip names the setting and the value that admits
    it), and so is a probe of a language model (`logits_per_token`: its vocabulary size) whose logits would exceed
    `MAX_PROBE_LOGITS`: a 32k-token prompt is a small input but 20 GB of logits on a 150k vocabulary, held twice
    (eager and artifact).

    Example:
        >>> spec = {"input_ids": {"0": DimSpec(name="batch", min=1, max=4), "1": DimSpec(name="seq", min=2, max=8)}}
        >>> inputs = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
        >>> bindings = dim_bindings(spec, inputs, dynamic=False, family="text")
        >>> [(probe_id, tuple(p["input_ids"].shape)) for probe_id, p, _ in make_probes(inputs, bindings, None, 100, None)]
        [('traced', (2, 3)), ('batch=1, seq=2', (1, 2)), ('batch=2, seq=5', (2, 5)), ('batch=4, seq=8', (4, 8))]
    """
    traced_total = sum(t.numel() for t in _leaves(inputs).values())
    probes: list[tuple[str, dict[str, Any] | None, str | None]] = [("traced", inputs, None)]
    setting = limit
    limit = max(limit, 2 * traced_total if model_sized else traced_total)
    generator = torch.Generator().manual_seed(seed)
    original = _leaves(inputs)

    def elements(sizes: list[tuple[DimBinding, int]]) -> int:
        # sizes from the shapes alone, before any tensor is built: a declared bound (batch max 60000) costs nothing
        # when the probe is skipped
        return sum(math.prod(shape) for shape in _joint_shapes(original, sizes).values())

    def skip_reason(sizes: list[tuple[DimBinding, int]]) -> str | None:
        total = elements(sizes)
        if total > limit:
            return (f"inputs of {total} elements exceed max_probe_elements ({limit}): set "
                    f"`validation.max_probe_elements` to {total} or more (now {setting}) to probe it")
        shapes = _joint_shapes(original, sizes)
        attention = attention_elements({**{p: tuple(t.shape) for p, t in original.items()}, **shapes}, config)
        if attention > MAX_PROBE_ATTENTION:
            return (f"its attention ({attention} elements: batch x heads x query x key) exceeds what validation "
                    f"computes ({MAX_PROBE_ATTENTION}, {MAX_PROBE_ATTENTION * 4 >> 20} MiB in float32)")
        ids = shapes.get("input_ids", tuple(original["input_ids"].shape) if "input_ids" in original else None)
        logits = math.prod(ids) * logits_per_token if ids is not None else 0
        if logits > MAX_PROBE_LOGITS:
            return (f"its logits ({logits} elements) exceed what validation computes "
                    f"({MAX_PROBE_LOGITS}, {MAX_PROBE_LOGITS * 4 >> 20} MiB in float32)")
        return None

    per_dim = []
    for binding in bindings:
        sizes = probe_sizes(binding, max_positions)
        if model_sized and (not binding.declared or binding.high is None):  # no declared top to honour: the sizes
            # the budget holds
            fitting = [size for size in sizes if elements([(binding, size)]) <= limit]
            sizes = fitting if any(size != binding.traced for size in fitting) else sizes
        per_dim.append([(binding, size) for size in sizes])
    for group in _probe_groups(per_dim, max_positions, lambda sizes: skip_reason(sizes) is None):
        probe_id = ", ".join(f"{binding.name}={size}" for binding, size in group)
        skip = skip_reason(group)
        if skip is not None:
            probes.append((probe_id, None, skip))
            continue
        probe = copy.deepcopy(inputs)
        leaves = _leaves(probe)
        resized: dict[str, torch.Tensor] = {}
        for binding, size in group:
            for path, axis in binding.axes:  # a leaf may carry the dim on several axes (height and width)
                resized[path] = resize_along(resized.get(path, leaves[path]), axis, size, generator, config)
                _set_leaf(probe, path, resized[path])
        sync_cache_lengths(probe)
        probes.append((probe_id, probe, None))
    return probes


def _probe_groups(per_dim: list[list[tuple[DimBinding, int]]], max_positions: int | None,
                  runs) -> list[list[tuple[DimBinding, int]]]:
    """The dims' sizes grouped into probes: the i-th size of every dim together, or one probe per dim where the joint
    probe would not run (`runs` says no) or its positional sizes add up past `max_positions` (a prompt and a cache
    that together outgrow the model's positions: the sum is a conservative bound). One dim: one probe per size.

    Example:
        >>> a, b = DimBinding("a", 1, 9, [], 3), DimBinding("b", 0, 9, [], 2)
        >>> groups = _probe_groups([[(a, 1), (a, 5)], [(b, 0), (b, 4), (b, 9)]], None, lambda sizes: True)
        >>> [[(binding.name, size) for binding, size in group] for group in groups]
        [[('a', 1), ('b', 0)], [('a', 5), ('b', 4)], [('b', 9)]]
        >>> groups = _probe_groups([[(a, 1), (a, 5)], [(b, 0), (b, 4), (b, 9)]], 8, lambda sizes: True)
        >>> [[(binding.name, size) for binding, size in group] for group in groups]
        [[('a', 1), ('b', 0)], [('a', 5)], [('b', 4)], [('b', 9)]]
    """
    groups: list[list[tuple[DimBinding, int]]] = []
    for i in range(max((len(sizes) for sizes in per_dim), default=0)):
        group = [sizes[i] for sizes in per_dim if i < len(sizes)]
        positions = sum(size for binding, size in group if binding.positional)
        fits = max_positions is None or len(group) < 2 or positions <= max_positions
        if len(group) > 1 and not (fits and runs(group)):
            groups.extend([member] for member in group)
        else:
            groups.append(group)
    return groups


def _joint_shapes(leaves: dict[str, torch.Tensor], sizes: list[tuple[DimBinding, int]]) -> dict[str, tuple]:
    """The shape each leaf bound by the dims in `sizes` would have with them at their sizes (nothing allocated)."""
    shapes: dict[str, list[int]] = {}
    for binding, size in sizes:
        for path, axis in binding.axes:
            shapes.setdefault(path, list(leaves[path].shape))[axis] = size
    return {path: tuple(shape) for path, shape in shapes.items()}


def resized_shapes(leaves: dict[str, torch.Tensor], axes: list[tuple[str, int]], size: int) -> dict[str, tuple]:
    """The shape each leaf bound by `axes` would have with those axes at `size` (nothing is allocated).

    Example:
        >>> resized_shapes({"pixel_values": torch.zeros(1, 3, 4, 4)}, [("pixel_values", 2), ("pixel_values", 3)], 9)
        {'pixel_values': (1, 3, 9, 9)}
    """
    shapes: dict[str, list[int]] = {}
    for path, axis in axes:
        shape = shapes.setdefault(path, list(leaves[path].shape))
        shape[axis] = size
    return {path: tuple(shape) for path, shape in shapes.items()}


def _fitted_size(binding: DimBinding, taken: set[int]) -> int:
    """A size torch.export keeps dynamic (2 or more) inside the binding's range, preferring one no other axis of the
    inputs has (equal sizes can be taken for the same symbol)."""
    low = max(2, binding.low or 0)
    high = binding.high if binding.high is not None else low + 16
    candidates = range(low, high + 1)
    return next((size for size in candidates if size not in taken), low)


def fit_to_contract(inputs: dict[str, Any], bindings: list[DimBinding], config: Any,
                    seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """`inputs` with every declared dim at a size torch.export keeps dynamic, and a note per change.

    A named dim whose sample size is 0 or 1 (torch.export specializes those) or outside its declared `[min, max]` is
    resized, on every input that shares the name, to a size inside the range of at least 2. A dim whose `max` is
    below 2 cannot be dynamic: it is left as it is (the export then fixes it, and validation says so).
    """
    generator = torch.Generator().manual_seed(seed)
    fitted, notes = inputs, []
    for binding in bindings:
        if not binding.declared:
            continue  # `dynamic: true`: no range was declared, nothing to honour
        if binding.high is not None and binding.high < 2:
            notes.append(f"'{binding.name}' is declared with max {binding.high}: torch.export cannot keep a dim of "
                         "at most 1 dynamic")
            continue
        size = binding.traced
        inside = (binding.low is None or size >= binding.low) and (binding.high is None or size <= binding.high)
        if size >= 2 and inside:
            continue
        if fitted is inputs:
            fitted = copy.deepcopy(inputs)
        leaves = _leaves(fitted)
        bound = set(binding.axes)
        taken = {int(t.shape[a]) for p, t in leaves.items() for a in range(t.dim()) if (p, a) not in bound}
        new = _fitted_size(binding, taken)
        for path, axis in binding.axes:
            _set_leaf(fitted, path, resize_along(leaves[path], axis, new, generator, config))
        binding.traced = new
        why = "which torch.export would specialize" if size < 2 else f"outside [{binding.low}, {binding.high}]"
        notes.append(f"'{binding.name}' is traced at size {new}: the sample inputs had {size}, {why}")
    return fitted, notes


TRACED_BATCH = 2


def fit_batch(inputs: dict[str, Any], config: Any, seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """`inputs` of a single graph (`mode: model`) traced with `dynamic: true` at a batch of 2 when the sample has 1:
    torch.export specializes a size-1 axis, so a batch of 1 would be fixed in the artifact (sentence-transformers
    encoding three texts at once would fail). Every tensor whose first axis is the batch grows, with values of the
    same kind (`resize_along`).

    Example:
        >>> fitted, notes = fit_batch({"input_ids": torch.tensor([[5, 6, 7]]),
        ...                            "attention_mask": torch.ones(1, 3, dtype=torch.long)}, None)
        >>> fitted["input_ids"].shape, fitted["attention_mask"].tolist(), notes
        (torch.Size([2, 3]), [[1, 1, 1], [1, 1, 1]], ['the batch is traced at size 2: the sample inputs had 1, which torch.export would specialize'])
    """
    leaves = _leaves(inputs)
    if not leaves or any(t.dim() == 0 or t.shape[0] != 1 for t in leaves.values()):
        return inputs, []  # a batch of more than 1 already, or an input whose first axis is not the batch
    generator = torch.Generator().manual_seed(seed)
    fitted = copy.deepcopy(inputs)
    for path, tensor in leaves.items():
        _set_leaf(fitted, path, resize_along(tensor, 0, TRACED_BATCH, generator, config))
    return fitted, [f"the batch is traced at size {TRACED_BATCH}: the sample inputs had 1, which torch.export "
                    "would specialize"]


DECODER_PROMPT = 3


def fit_encoder_decoder(name: str, inputs: dict[str, Any], config: Any,
                        seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """A component of an encoder-decoder generation export (`encoder`, `prefill`, `decode`) traced with `dynamic:
    true`: at a batch of 2 ([`fit_batch`]: a batch of 1 would be fixed), and the prefill's decoder prompt at
    `DECODER_PROMPT` tokens (generate's first step feeds one, which torch.export would fix at 1: Whisper's forced
    prefix of language and task tokens, a `decoder_input_ids` prompt, run through the no-past decoder at once). The
    decode keeps its one new token.

    Example:
        >>> fitted, notes = fit_encoder_decoder("prefill", {"decoder_input_ids": torch.tensor([[0]]),
        ...                                                 "attention_mask": torch.ones(1, 5, dtype=torch.long)}, None)
        >>> fitted["decoder_input_ids"].tolist(), fitted["attention_mask"].shape
        ([[0, 0, 0], [0, 0, 0]], torch.Size([2, 5]))
    """
    fitted, notes = fit_batch(inputs, config, seed)
    ids = fitted.get("decoder_input_ids")
    if name == "prefill" and isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] == 1:
        fitted = dict(fitted) if fitted is not inputs else copy.deepcopy(inputs)
        generator = torch.Generator().manual_seed(seed)
        fitted["decoder_input_ids"] = resize_along(ids, 1, DECODER_PROMPT, generator, config)
        notes.append(f"the decoder prompt is traced at {DECODER_PROMPT} tokens: generate's first step feeds 1, "
                     "which torch.export would specialize")
    return fitted, notes


def sync_cache_lengths(inputs: dict[str, Any]) -> None:
    """Cache layers that count their tokens (a sliding-window layer's `cumulative_length`) told the length their
    resized key/value tensors now hold, as a cache grown to that length would be; left alone past the window, where
    a real layer keeps only its last tokens.

    Example:
        >>> from types import SimpleNamespace
        >>> layer = SimpleNamespace(keys=torch.zeros(1, 2, 3, 4), cumulative_length=8, sliding_window=16)
        >>> sync_cache_lengths({"cache": SimpleNamespace(layers=[layer])}); layer.cumulative_length
        3
    """
    for value in inputs.values():
        for layer in getattr(value, "layers", None) or []:
            keys, counted = getattr(layer, "keys", None), getattr(layer, "cumulative_length", None)
            if isinstance(keys, torch.Tensor) and isinstance(counted, int) and not isinstance(counted, bool):
                if keys.shape[-2] < (getattr(layer, "sliding_window", None) or float("inf")):
                    layer.cumulative_length = int(keys.shape[-2])

"""Every patch this project lays on upstream or the stack is a row of one table (`exporters/upstream/patches.py`),
laid by one helper, and undone when its block ends, also when the block raises: each row's manager is entered with
the smallest stand-in that makes it patch, the block raises, and what the row says it changes is as before."""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import types
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from transformers import GenerationConfig

from exporters.upstream import beyond, core, internals, llm_runner, onnx_decompositions, ort_attention, quantizers
from exporters.upstream import fixed_image, multimodal_runner, runtime_ops, xnnpack_passes
from exporters.upstream.patches import PATCHES, Patch, patch_row, patched, patched_item
from tests.conftest import ROOT

MODULES = (beyond, core, fixed_image, internals, llm_runner, multimodal_runner, onnx_decompositions, ort_attention,
           quantizers, runtime_ops, xnnpack_passes)
# Functions that lay a patch for a row's manager (called inside its block), not managers of their own
HELPERS = {"_pass_only_where": ("upsample_fusion_only_with_upsample", "sdpa_fusion_only_with_softmax",
                                 "xnnpack_passes_only_where_they_apply"),
           "_fused_as_for_one_sequence": ("group_query_attention_at_any_batch",),
           "torchlib_registry_ready": ("torchlib_registry_built_once",),
           "exporter_ready": ("torchlib_registry_built_once",)}  # through torchlib_registry_ready


class Boom(Exception):
    pass


def _manager(name: str) -> Callable[..., Any]:
    found = [getattr(module, name) for module in MODULES if inspect.isfunction(getattr(module, name, None))]
    assert found, f"the table names {name}, which no module of exporters.upstream defines"
    return found[0]


def _raw(owner: Any, name: str) -> Any:
    own = getattr(owner, "__dict__", None)
    return own[name] if own is not None and name in own else getattr(owner, name, None)


def _global(target: str) -> Any:
    """What a `module:Owner.attribute` or `module:table[key]` target holds now (the raw attribute: a classmethod as
    defined, not bound)."""
    module, path = target.split(":")
    key = None
    if path.endswith("]"):
        path, key = path[:-1].split("[")
    owner: Any = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    value = _raw(owner, name)
    return value.get(key) if key is not None else value


class _Recorder(torch.nn.Module):
    def _get_logits_processor(self, *args: Any, **kwargs: Any) -> list:
        return []


class _Experts:
    def __init__(self) -> None:
        self.setting = {"experts": "grouped_mm"}

    def get_experts_implementation(self) -> dict[str, str]:
        return dict(self.setting)

    def set_experts_implementation(self, setting: dict[str, str]) -> None:
        self.setting = dict(setting)


def _no_op_tolerances() -> list[tuple[float, float]]:
    from onnxscript.rewriter import _pattern_ir
    from onnxscript.rewriter.rules.common import _no_op

    return [(value._rel_tol, value._abs_tol) for rule in _no_op.rules.rules for node in rule._target_pattern
            for value in node.inputs if isinstance(value, _pattern_ir.Constant)]


def _stand_ins(row: Patch, tmp_path: Path, monkeypatch) -> tuple[tuple, Callable[[], list]]:
    """The arguments that make `row`'s manager patch, and what to look at before, inside and after its block."""
    name = row.manager
    if name == "recording_logits_processors":
        model = _Recorder()
        return (model, []), lambda: [vars(model).get("_get_logits_processor")]
    if name == "experts_without_custom_ops":
        model = _Experts()
        return (model,), lambda: [model.get_experts_implementation()]
    if name == "argsort_of_permutations":
        tower = type("Tower", (torch.nn.Module,), {"__module__": "transformers.models.qwen2_5_vl.modeling"})()
        return (tower,), lambda: [torch.argsort]
    if name == "_static_generation_config":
        model = _Recorder()
        model.generation_config = GenerationConfig(eos_token_id=1)
        return (model, 8), lambda: [model.generation_config]
    if name == "custom_ops_installed":
        config = types.SimpleNamespace(_attn_implementation="sdpa")
        config.get_text_config = lambda: config  # no sliding window: no ring buffer
        model = types.SimpleNamespace(config=config)
        program = types.SimpleNamespace(wrapper=types.SimpleNamespace(static_cache=types.SimpleNamespace(layers=[])),
                                        max_cache_len=8)
        return (program, model), lambda: [model.config._attn_implementation]
    if name == "cache_layers_through_buffers":  # each layer's class, for the block only
        layer = type("StaticLayer", (), {"keys": None, "values": None, "cumulative_length": None})()
        wrapper = types.SimpleNamespace(static_cache=types.SimpleNamespace(layers=[layer]))
        return (wrapper,), lambda: [type(layer)]
    if name == "text_attention_as_custom_sdpa":
        text = types.SimpleNamespace(_attn_implementation="sdpa")
        model = types.SimpleNamespace(config=types.SimpleNamespace(get_text_config=lambda: text))
        return (model,), lambda: [text._attn_implementation]
    if name == "exact_no_op_rewrites":
        return (), _no_op_tolerances
    if name == "quiet_torch_serde":
        logger = logging.getLogger(core.TORCH_SERDE_LOGGER)
        monkeypatch.setattr(logger, "level", logging.NOTSET)  # as torch leaves it (a front door may have muted it)
        return (), lambda: [logger.level]
    if name == "torchlib_registry_built_once":  # the logger is muted (and the clean-up skipped) for the one build
        logger = logging.getLogger(onnx_decompositions.REGISTRY_LOGGER)
        return (), lambda: [logger.level, *(_global(target) for target in row.changes[:2])]
    args = (tmp_path,) if name == "named_data_on_disk" else ()
    targets = [target for target in row.changes if ":" in target]
    assert targets, f"{name}: no stand-in and no module attribute to look at"
    return args, lambda: [_global(target) for target in targets]


@pytest.mark.parametrize("row", PATCHES, ids=[row.manager for row in PATCHES])
def test_every_patch_is_undone_also_when_the_block_raises(row: Patch, tmp_path: Path, monkeypatch):
    args, look = _stand_ins(row, tmp_path, monkeypatch)
    before = look()
    with pytest.raises(Boom):
        with _manager(row.manager)(*args):
            inside = look()
            raise Boom
    after = look()
    assert all(a is b or a == b for a, b in zip(after, before)), f"{row.manager} left {after}, was {before}"
    assert any(i is not b and i != b for i, b in zip(inside, before)), f"{row.manager} changed nothing it names"


def test_every_row_says_what_why_and_until_when():
    assert len({row.manager for row in PATCHES}) == len(PATCHES)
    for row in PATCHES:
        assert row.changes and row.why and row.until, row
        assert "docs/upstream-gaps.md #" in row.until or "upstream" in row.until or "transformers" in row.until, row
    assert patch_row("named_data_on_disk").changes[0].endswith("NamedDataStore.add_named_data")
    with pytest.raises(KeyError, match="no patch named 'nothing'"):
        patch_row("nothing")


def test_every_function_that_patches_is_a_row():
    """A function of exporters.upstream that lays a patch (calls `patched` / `patched_item`, or undoes a change with
    an ExitStack callback) is a row's manager, or a helper that lays one for a row."""
    managers = {row.manager for row in PATCHES}
    patching = set()
    for path in sorted((ROOT / "exporters" / "upstream").glob("*.py")):
        if path.name == "patches.py":
            continue
        for function in ast.parse(path.read_text()).body:
            if not isinstance(function, ast.FunctionDef):
                continue
            calls = {ast.unparse(node.func) for node in ast.walk(function) if isinstance(node, ast.Call)}
            if calls & {"patched", "patched_item", "stack.callback", *HELPERS}:
                patching.add(function.name)
    assert patching, "the scan finds the managers"
    assert patching - set(HELPERS) == managers, (sorted(patching - set(HELPERS) - managers),
                                                 sorted(managers - patching))
    for helper, rows in HELPERS.items():
        assert helper in patching and set(rows) <= managers, helper


class _Base:
    def greet(self) -> str:
        return "base"


class _Slotted:
    __slots__ = ("size",)

    def __init__(self) -> None:
        self.size = 1


class _WithProperty:
    def __init__(self) -> None:
        self._value = "real"

    @property
    def value(self) -> str:
        return self._value

    @value.setter
    def value(self, new: str) -> None:
        self._value = new


def test_patched_puts_back_what_was_there():
    """An own attribute (a classmethod as defined), an inherited one (nothing of its own again), an instance's, a
    property's value, a slotted object's; a mapping's entry, present or absent; each also when the block raises."""

    class Child(_Base):
        @classmethod
        def make(cls) -> str:
            return "made"

    raw = vars(Child)["make"]
    with pytest.raises(Boom), patched(Child, "make", classmethod(lambda cls: "patched")):
        assert Child.make() == "patched"
        raise Boom
    assert vars(Child)["make"] is raw and Child.make() == "made"

    with pytest.raises(Boom), patched(Child, "greet", lambda self: "child"):
        assert Child().greet() == "child"
        raise Boom
    assert "greet" not in vars(Child) and Child().greet() == "base"

    instance = Child()
    with patched(instance, "greet", lambda: "instance"):
        assert instance.greet() == "instance"
    assert "greet" not in vars(instance) and instance.greet() == "base"

    holder = _WithProperty()
    with pytest.raises(Boom), patched(holder, "value", "patched"):
        assert holder.value == "patched"
        raise Boom
    assert holder.value == "real"

    slotted = _Slotted()
    with pytest.raises(Boom), patched(slotted, "size", 2):
        assert slotted.size == 2
        raise Boom
    assert slotted.size == 1

    table = {"kept": 1}
    with pytest.raises(Boom), patched_item(table, "kept", 2), patched_item(table, "added", 3):
        assert table == {"kept": 2, "added": 3}
        raise Boom
    assert table == {"kept": 1}


def _transposed_model(arrays: dict[str, Any]):
    import onnx_ir as ir

    graph = ir.Graph([], [], nodes=[], name="g")
    for name, array in arrays.items():
        graph.register_initializer(ir.Value(name=name, const_value=ir.Tensor(array, name=name)))
    return ir.Model(graph, ir_version=10)


def test_transposed_weights_are_written_byte_for_byte_a_block_at_a_time(tmp_path: Path, monkeypatch):
    """A folded transpose (a linear's `W.T`: a transposed numpy view of the parameter) is written by torch's transpose
    copy, in blocks (here several, the last one short), and `onnx_ir.save` writes the same bytes as upstream's own
    numpy writer; a C-contiguous tensor, a 1-D one and a dtype torch cannot view (ml_dtypes' bfloat16) go through
    upstream's writer unchanged."""
    import ml_dtypes
    import numpy as np
    import onnx_ir as ir

    rng = np.random.default_rng(0)
    arrays = {"linear": rng.standard_normal((37, 21), dtype=np.float32).T,  # the view the optimizer folds to
              "half": rng.standard_normal((9, 40)).astype(np.float16).T,
              "ints": rng.integers(-100, 100, (40, 30), dtype=np.int8).T,
              "plain": rng.standard_normal((5, 7), dtype=np.float32), "vector": np.arange(11, dtype=np.int64),
              "bf16": rng.standard_normal((40, 30)).astype(ml_dtypes.bfloat16).T}
    assert not arrays["linear"].flags.c_contiguous
    ir.save(_transposed_model(arrays), str(tmp_path / "upstream.onnx"), external_data="upstream.onnx.data")
    monkeypatch.setattr(runtime_ops, "TRANSPOSE_BLOCK_BYTES", 37 * 4 * 5)  # 5 of linear's 21 rows a block
    blocks: list[tuple[int, ...]] = []
    real = runtime_ops._write_transposed
    monkeypatch.setattr(runtime_ops, "_write_transposed", lambda matrix, file, *scratch: (
        blocks.append(tuple(matrix.shape)), real(matrix, file, *scratch)))
    with runtime_ops.transposed_weights_written_in_blocks():
        ir.save(_transposed_model(arrays), str(tmp_path / "ours.onnx"), external_data="ours.onnx.data")
    assert blocks == [(37, 21), (9, 40), (40, 30)]  # the transposed views only: the parameters as torch holds them
    assert (tmp_path / "ours.onnx.data").read_bytes() == (tmp_path / "upstream.onnx.data").read_bytes()
    loaded = ir.load(str(tmp_path / "ours.onnx"))
    for name, array in arrays.items():
        assert np.array_equal(loaded.graph.initializers[name].const_value.numpy(), array), name

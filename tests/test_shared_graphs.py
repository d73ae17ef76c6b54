"""#48: ONNX targets of one run that read the same export (`exporters.run.twins`) trace, convert and optimize it once;
the later twins copy the first one's saved graphs (`exporters.export.shared_graphs`) and rewrite them as before.

The key: what the export reads (the same module objects, inputs equal in every byte and leaf, the same upstream
config, generation config, device and dtype); anything else, or anything it cannot compare, exports alone. The files:
T5's run of tests/test_seq2seq_onnx.py (`onnx`, `tjs`, `onnx-split`, `dynamo`: one ONNX export, two twins) against a
run of `onnx-split` alone (its own trace): every file of the target folder is the same, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from exporters.export import shared_graphs
from exporters.recipe.load import parse_recipe
from exporters.run.twins import Twins, export_key
from tests.export_store import MODEL, OUT, exported
from tests.models import T5_RECIPE, T5_SEED, tiny_t5


class _Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return self.linear(x) + y


def _targets(*extra: dict) -> list:
    exports = [{"name": f"t{i}", "export_format": "onnx", **fields} for i, fields in enumerate(extra)]
    recipe = parse_recipe(json.dumps({"exports": exports}))
    return recipe, recipe.exports


def _inputs(seed: int = 0, **more) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(2, 4, generator=generator), "y": torch.randn(2, 4, generator=generator), **more}


def test_targets_that_differ_only_after_the_save_share_one_key():
    module = _Pair()
    recipe, (plain, embedded) = _targets({}, {"external_data": False})
    first = export_key(plain, {"model": (module, _inputs())}, recipe, module, "cpu")
    second = export_key(embedded, {"model": (module, _inputs())}, recipe, module, "cpu")  # equal, other tensors
    assert first is not None and first == second


def test_anything_the_export_reads_that_differs_gives_another_key():
    module, other = _Pair(), _Pair()
    other.load_state_dict(module.state_dict())  # the same weights, another object: not assumed the same capture
    recipe, (plain, opset, dynamic) = _targets({}, {"opset_version": 18}, {"dynamic": True})
    key = export_key(plain, {"model": (module, _inputs())}, recipe, module, "cpu")
    assert export_key(plain, {"model": (module, _inputs(seed=1))}, recipe, module, "cpu") != key
    assert export_key(plain, {"model": (module, {**_inputs(), "y": _inputs()["y"].double()})}, recipe, module,
                      "cpu") != key
    assert export_key(plain, {"model": (other, _inputs())}, recipe, module, "cpu") != key
    assert export_key(plain, {"encoder": (module, _inputs())}, recipe, module, "cpu") != key
    assert export_key(opset, {"model": (module, _inputs())}, recipe, module, "cpu") != key
    assert export_key(dynamic, {"model": (module, _inputs())}, recipe, module, "cpu") != key
    assert export_key(plain, {"model": (module, _inputs())}, recipe, module, "cuda") != key
    assert export_key(plain, {"model": (module, _inputs(flag=True))}, recipe, module, "cpu") != key


def test_what_cannot_be_compared_or_is_not_an_onnx_export_is_no_ones_twin():
    module = _Pair()
    recipe, (plain,) = _targets({})
    assert export_key(plain, {"model": (module, _inputs(hook=lambda: 0))}, recipe, module, "cpu") is None
    dynamo = parse_recipe(json.dumps({"exports": [{"name": "d", "export_format": "dynamo"}]}))
    assert export_key(dynamo.exports[0], {"model": (module, _inputs())}, dynamo, module, "cpu") is None
    assert export_key(plain, {}, recipe, module, "cpu") is None


def _plan() -> tuple:
    """The reuse and keep folders a child would export with."""
    return shared_graphs._PLAN["reuse"], shared_graphs._PLAN["keep"]


@pytest.mark.parametrize("first_ok", [True, False])
def test_a_twin_waits_for_the_first_export_then_takes_its_graphs_or_exports_alone(tmp_path, first_ok):
    module = _Pair()
    recipe, targets = _targets({}, {"external_data": False}, {"opset_version": 18})
    items = [SimpleNamespace(target=target, components={"model": (module, _inputs())},
                             result=SimpleNamespace(device="cpu")) for target in targets]
    twins, pending = Twins(tmp_path, targets, module, recipe), list(items)  # keyed on their first look, in order
    assert twins.take_ready(pending) is items[0]
    assert twins.take_ready(pending) is items[2]  # another opset: no one's twin, does not wait
    assert twins.take_ready(pending) is None  # t1 waits for t0's export
    reuse, keep = twins.sharing("t0", _plan)()
    assert reuse is None and keep is not None and _plan() == (None, None)  # only within the child's work
    if first_ok:  # the child saved its graphs there
        keep.mkdir(parents=True)
        (keep / "export.json").write_text("{}")
    assert twins.finished("t0", first_ok) is first_ok
    assert twins.take_ready(pending) is items[1] and pending == []
    assert twins.sharing("t1", _plan)() == ((keep, None) if first_ok else (None, None))
    twins.close()
    assert not list(tmp_path.iterdir())


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_twin_targets_files_are_those_of_its_own_export(tmp_path):
    """T5's ONNX targets in one run: `onnx` traces, `tjs` and `onnx-split` take its saved graphs (their reports'
    trace time is none, their findings say whose graphs); `onnx-split` exported alone traces its own, and its folder
    is the same, byte for byte."""
    model = tiny_t5(tmp_path / "model", T5_RECIPE, seed=T5_SEED, decoder_layers=2)  # test_seq2seq_onnx's run
    together = exported(model, "run", "--no-bench", MODEL, "--out", OUT, "--quiet")
    alone = exported(model, "run", "--no-bench", MODEL, "--out", OUT, "--quiet", "--target", "onnx-split")
    assert together.returncode == 0 and alone.returncode == 0, together.stdout + alone.stdout
    timings = {name: target["timings"] for name, target in together.targets.items()}
    assert timings["onnx"]["trace_s"] > 0 and timings["tjs"]["trace_s"] == 0 == timings["onnx-split"]["trace_s"]
    assert alone.targets["onnx-split"]["timings"]["trace_s"] > 0
    said = {name: [f for f in target["findings"] if "traced once in this run" in f]
            for name, target in together.targets.items()}  # the report says whose graphs a twin took
    assert said["onnx"] == []
    assert all("target `onnx`'s export" in " ".join(said[twin]) for twin in ("tjs", "onnx-split")), said
    assert not any("traced once in this run" in f for f in alone.targets["onnx-split"]["findings"])
    assert all(target["status"] == "passed" for target in together.targets.values())
    shared, own = _folder_bytes(together.out / "onnx-split"), _folder_bytes(alone.out / "onnx-split")
    assert {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"} <= set(own)
    assert shared.keys() == own.keys()
    assert [name for name in own if shared[name] != own[name]] == []
    assert not list(together.out.glob(".shared-graphs-*"))  # the kept copy removed when the run ended

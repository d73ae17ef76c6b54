"""Recurrent models beyond Mamba (#50 item 3): RWKV's state (a list of five tensors under `state`) and xLSTM's
(`xLSTMCache.rnn_state`) are the cache. A dynamic prompt is stepped through the exported decode from the state the
model's own forward starts from (RWKV's running maximum at -1e30, the rest zero), the state an explicit input and
output of the graph; parity runs the prompt and the reply through the exported graphs. Before, the capture found
"no cache" and every target failed with `KeyError: 'the component returns no cache'`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import assert_greedy_parity, run_cli


def _run(tmp_path, family: str, exports: list[dict], **overrides):
    import dataclasses

    import torch

    from matrix.families import FAMILIES, tiny_model
    from tests.models import family_model

    spec = FAMILIES[family]
    model = tiny_model(dataclasses.replace(spec, overrides={**spec.overrides, **overrides}))  # eager first: forward
    ids = torch.randint(0, 200, (1, 8))  # and generate() run at these sizes
    assert model.generate(input_ids=ids, max_new_tokens=4, do_sample=False).shape == (1, 12)
    recipe = {"schema_version": 1, "generation": {"max_new_tokens": 8}, "exports": exports}
    model_dir = family_model(family, tmp_path / "model", recipe, **overrides)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {t["name"]: t for t in report["targets"]}, out, result


@pytest.fixture(scope="module")
def rwkv_run(tmp_path_factory):
    # the ONNX target asks for a dynamic prompt (stepped); the ExecuTorch one is the plainest recipe (prefill with
    # RWKV's negative-padding token shift, traced as a slice: the kernel refuses negative pads)
    return _run(tmp_path_factory.mktemp("rwkv"), "rwkv", [
        {"name": "onnx", "export_format": "onnx", "dynamic": True},
        {"name": "executorch", "export_format": "executorch"}])


def test_rwkv_state_is_an_explicit_input_and_output_of_the_stepped_decode(rwkv_run):
    import onnx

    targets, out, result = rwkv_run
    target = targets["onnx"]
    assert target["status"] == "passed", target["error"]
    assert target["expected_components"] == ["decode"]
    assert any("fed to the decode graph one token at a time" in f and "holds state" in f
               for f in target["findings"]), target["findings"]
    graph = onnx.load(out / "onnx" / "decode.onnx", load_external_data=False).graph
    inputs, outputs = [i.name for i in graph.input], [o.name for o in graph.output]
    assert sum("state" in name for name in inputs) == 5, inputs
    assert sum("state" in name for name in outputs) == 5, outputs
    assert_greedy_parity(target["generation"], prompt_length=8, new_tokens=8)


def test_rwkv_plainest_executorch_program_generates_like_eager(rwkv_run):
    targets, _, result = rwkv_run
    target = targets["executorch"]
    assert target["status"] == "passed", target["error"]
    assert_greedy_parity(target["generation"], prompt_length=8, new_tokens=8)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_xlstm_static_program_steps_without_the_mask_it_never_reads(tmp_path):
    """xLSTM's forward never names `attention_mask` (generate() passes one, into `**kwargs`): kept, the static
    ExecuTorch decode would refuse the next step's longer mask. One mLSTM block (the family's has two): the mask is
    the model's forward's, not a block's (#48: half the program to lower)."""
    targets, out, result = _run(tmp_path, "xlstm", [{"name": "executorch", "export_format": "executorch"}],
                                num_blocks=1)
    target = targets["executorch"]
    assert target["status"] == "passed", target["error"]
    assert_greedy_parity(target["generation"], prompt_length=8, new_tokens=8)
    shapes = [c["checks"][0]["shapes"] for c in target["components"]]
    assert all("attention_mask" not in s for s in shapes), shapes

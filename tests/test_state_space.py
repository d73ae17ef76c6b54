"""State-space models (#30): Mamba's cache holds conv and recurrent states, no key-value tensors, and its prefill
cannot keep a dynamic sequence axis (docs/upstream-gaps.md #27). Defaults fit what the capture shows: the merged ONNX
default does not apply (no error), and a `dynamic: true` generation target exports the decode alone, the prompt fed
to it one token at a time from zeroed states, said in the report; parity runs through the exported graphs in every
format. A recipe that asks for `merged: true` keeps its clear error."""

from __future__ import annotations

import json

import pytest

from tests.conftest import assert_greedy_parity, run_cli
from tests.models import tiny_mamba

FORMATS = ["dynamo", "onnx", "executorch"]
RECIPE = {"schema_version": 1, "generation": {"max_new_tokens": 8}, "exports": [
    *({"name": f, "export_format": f, "mode": "generation", "dynamic": True} for f in FORMATS),
    {"name": "onnx-merged", "export_format": "onnx", "mode": "generation", "dynamic": True, "merged": True},
]}
FILES = {"dynamo": "decode.pt2", "onnx": "decode.onnx", "executorch": "model.pte"}


@pytest.fixture(scope="module")
def mamba_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba")
    model_dir = tiny_mamba(root / "model", RECIPE, initializer_range=1.0)
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {t["name"]: t for t in report["targets"]}, out, result


@pytest.mark.parametrize("name", FORMATS)
def test_a_dynamic_prompt_is_stepped_through_the_decode_alone_and_said(mamba_run, name):
    targets, out, _ = mamba_run
    target = targets[name]
    assert target["status"] == "passed", (name, target["error"])
    assert target["expected_components"] == ["decode"]
    assert [c["name"] for c in target["components"]] == ["decode"]
    assert (out / name / FILES[name]).is_file(), sorted(p.name for p in (out / name).iterdir())
    assert not list((out / name).glob("prefill*")), "no prefill fixed to the traced prompt length"
    said = [f for f in target["findings"] if "fed to the decode graph one token at a time" in f]
    assert said, target["findings"]
    assert "conv_states" in said[0] and "recurrent_states" in said[0] and "no key-value tensors" in said[0]
    assert not [f for f in target["findings"] if "merged" in f], target["findings"]  # the ONNX default just fits
    assert "one token at a time" in (out / "report.md").read_text()


@pytest.mark.parametrize("name", FORMATS)
def test_parity_runs_the_prompt_and_the_reply_through_the_exported_decode(mamba_run, name):
    targets, _, _ = mamba_run
    assert_greedy_parity(targets[name]["generation"], prompt_length=8, new_tokens=8)


def test_an_explicit_merged_true_keeps_its_clear_error(mamba_run):
    targets, _, result = mamba_run
    target = targets["onnx-merged"]
    assert target["status"] == "failed"
    message = target["error"]["message"]
    assert "the merged graph needs a decode step that takes a key-value cache" in message, message
    assert "set `merged` to false" in message
    assert result.returncode == 1  # that target failed; the others passed


def test_a_recipe_that_names_the_prefill_gets_it_and_its_contract_checked(tmp_path):
    # The prefill is exported as asked; its sequence axis, declared dynamic, cannot hold, and the target says so.
    recipe = {"export_format": "onnx", "mode": "generation", "dynamic": True,
              "expected_components": ["prefill", "decode"]}
    model_dir = tiny_mamba(tmp_path / "model", [recipe], initializer_range=1.0)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 1, result.stderr[-2000:]
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert [c["name"] for c in target["components"]] == ["prefill", "decode"]
    assert target["status"] == "failed"
    assert target["error"]["message"].startswith("prefill: the artifact does not run at sequence"), target["error"]
    assert target["generation"]["status"] == "passed"  # the traced prompt length still runs


def test_no_model_card_snippet_is_written_for_a_stepped_target():
    # The `ExportedModel` snippet feeds a prefill or a merged graph with a key-value cache: neither fits a decode
    # alone with states, so the card gets no snippet rather than a wrong one.
    from exporters.publish.snippets import upstream_loads

    stepped = {"name": "dynamo", "export_format": "dynamo", "mode": "generation", "files": [],
               "expected_components": ["decode"]}
    assert upstream_loads(stepped) is False
    assert upstream_loads({**stepped, "expected_components": ["prefill", "decode"]}) is True

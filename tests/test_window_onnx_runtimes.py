"""Sliding-window decoders in ONNX Runtime GenAI, optimum and transformers.js (thirteenth round).

The plainest ONNX generation recipe of a decoder-only model whose sliding window is shorter than its positions
(Gemma 3 text: one sliding and one full layer; Mistral: one window for every layer) is captured on a full-length
cache in every layer (`exporters.capture.cache_settings.full_length_windows`), the cache those runtimes allocate and
feed: one merged graph whose inputs are the ids, the mask, the positions and `past_key_values.N.key/value` (no
`_sliding_window_tensor`), proven by GenAI (its `gemma3_text` / `mistral` type), optimum and transformers.js, and by
generation parity against eager's own sliding-window cache, generation crossing the window (5: the prompt is 8 tokens
and 8 more are generated). GenAI pads a batch on the right, so the window is counted in tokens
(`exporters.upstream.windows_counted_in_tokens`): its proof runs a batch of two prompts of 8 and 4 tokens. A graph of
the same weights with full attention (the window taken out of config.json) fails validation against the model.
Where GenAI's and optimum's layout cannot take an ONNX generation folder (prefill and decode with no merged graph, a
merged graph with an input they do not feed), the "runs in" column says ✗ declined with the reason, never nothing.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli, targets_by_name
from tests.export_store import stored_run
from tests.models import family_model, write_recipe

WINDOW = 5
ONNX = {"name": "onnx", "export_format": "onnx", "dynamic": True}  # the matrix's plainest ONNX recipe
TJS = {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}
SPLIT = {"name": "split", "export_format": "onnx", "mode": "generation", "dynamic": True, "merged": False}
GENAI, OPTIMUM = "ONNX Runtime GenAI", "optimum"
FED = ["input_ids", "attention_mask", "position_ids"]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A tiny Gemma 3 text (a sliding layer of 5 positions, then a full one), its plainest ONNX target and a
    transformers.js one, and `merged: false` (prefill + decode), through the real CLI and the shared store."""
    model = family_model("gemma3_text", tmp_path_factory.mktemp("gemma3_text") / "model",
                         {"exports": [ONNX, TJS, SPLIT]}, never_eos=True, num_hidden_layers=2, sliding_window=WINDOW)
    out, report, log = stored_run(model)
    return model, out, report, log


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """A tiny one-layer Mistral with a window of 5, its plainest ONNX target."""
    model = family_model("mistral", tmp_path_factory.mktemp("mistral") / "model", {"exports": [ONNX]},
                         never_eos=True, num_hidden_layers=1, sliding_window=WINDOW)
    out, report, log = stored_run(model)
    return model, out, report, log


def _graph_inputs(folder, file: str) -> list[str]:
    import onnx

    return [value.name for value in onnx.load(str(folder / file), load_external_data=False).graph.input]


def _check_target(report, out, log, name: str, layers: int, runtimes: set[str]) -> dict:
    target = targets_by_name(report)[name]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert generation["prompt_length"] > WINDOW and generation["max_new_tokens"] > 1  # decoding past the window
    folder = out / name
    manifest = json.loads((folder / "export.json").read_text())
    assert list(manifest["components"]) == ["model"]
    inputs = _graph_inputs(folder, manifest["components"]["model"]["file"])
    assert not [i for i in inputs if "_sliding_window_tensor" in i], inputs
    assert inputs == FED + [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    assert set(proofs) == runtimes, target["runtimes"]
    for runtime in runtimes:
        assert proofs[runtime]["status"] == "passed", proofs[runtime]
    assert any("every layer's cache keeps every position" in finding for finding in target["findings"]), \
        target["findings"]
    return proofs


def test_gemma3_text_is_one_merged_graph_that_genai_and_optimum_run(gemma3):
    model, out, report, log = gemma3
    proofs = _check_target(report, out, log, "onnx", 2, {"ONNX Runtime GenAI", "optimum"})
    assert proofs["ONNX Runtime GenAI"]["detail"].startswith("16/16 tokens (batch of 2, prompts of 8 and 4"), proofs
    genai = json.loads((out / "onnx" / "genai_config.json").read_text())
    assert genai["model"]["type"] == "gemma3_text"
    layer_types = json.loads((model / "config.json").read_text())["layer_types"]
    assert layer_types == ["sliding_attention", "full_attention"]


def test_gemma3_text_in_the_transformers_js_layout_runs_there(gemma3):
    _, out, report, log = gemma3
    _check_target(report, out, log, "tjs", 2, {"transformers.js", "ONNX Runtime GenAI"})


def test_mistral_with_a_window_is_one_merged_graph_that_genai_and_optimum_run(mistral):
    _, out, report, log = mistral
    _check_target(report, out, log, "onnx", 1, {"ONNX Runtime GenAI", "optimum"})
    assert json.loads((out / "onnx" / "genai_config.json").read_text())["model"]["type"] == "mistral"


def test_a_graph_without_the_window_fails_validation_against_the_model(gemma3, tmp_path):
    """The mutant: the same weights exported with a window no sequence reaches (full attention), its folder
    validated against the real model (window 5) by `hf-export validate`: the target fails."""
    model, _, _, _ = gemma3
    mutant = tmp_path / "mutant"
    shutil.copytree(model, mutant)
    config = json.loads((mutant / "config.json").read_text())
    config["sliding_window"] = 1000
    (mutant / "config.json").write_text(json.dumps(config))
    write_recipe(mutant, {"exports": [ONNX]})
    out, report, log = stored_run(mutant)
    assert targets_by_name(report)["onnx"]["status"] == "passed", log[-3000:]  # right for the model it came from
    folder = tmp_path / "out"
    shutil.copytree(out, folder)
    done = run_cli("validate", str(model), str(folder), "--target", "onnx")
    target = targets_by_name(json.loads((folder / "report.json").read_text()))["onnx"]
    assert done.returncode != 0 and target["status"] == "failed", (done.stdout[-3000:], target)
    assert target["generation"]["status"] == "failed", target["generation"]


def test_prefill_and_decode_without_a_merged_graph_are_declined_with_the_reason(gemma3):
    _, out, report, log = gemma3
    target = targets_by_name(report)["split"]
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    assert sorted(json.loads((out / "split" / "export.json").read_text())["components"]) == ["decode", "prefill"]
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    assert set(proofs) == {GENAI, OPTIMUM}, target["runtimes"]
    for proof in proofs.values():
        assert proof["status"] == "declined" and "prefill.onnx and decode.onnx with no merged decoder graph" in \
            proof["detail"], proof
    assert not (out / "split" / "genai_config.json").exists()
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| `split`"))
    assert f"{GENAI} ✗ cannot take this model: its generation export is prefill.onnx" in row, row
    assert f"{OPTIMUM} ✗ cannot take this model: its generation export is prefill.onnx" in row, row


def test_a_merged_graph_with_an_input_the_runtimes_do_not_feed_is_declined(tmp_path):
    """A merged graph left under upstream's names (one input had no runtime name: export.json records no `inputs`)
    is declined by GenAI and optimum, saying so; one under the runtimes' names is not; a decode alone is declined."""
    from exporters.layouts.genai import Genai
    from exporters.layouts.optimum import Optimum
    from exporters.recipe.load import parse_recipe
    from exporters.validate.runtimes import declined

    target = parse_recipe(json.dumps({**ONNX, "mode": "generation"})).exports[0]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    manifest = {"components": {"model": {"file": "model.onnx"}}}
    (tmp_path / "export.json").write_text(json.dumps(manifest))
    proofs = {proof.runtime: proof for proof in declined(target, tmp_path)}
    assert set(proofs) == {GENAI, OPTIMUM}, proofs
    assert all(p.status == "declined" and "takes an input the runtime does not feed" in p.detail
               for p in proofs.values()), proofs
    manifest["components"]["model"]["inputs"] = {"input_ids": "input_ids"}
    (tmp_path / "export.json").write_text(json.dumps(manifest))
    assert declined(target, tmp_path) == []
    assert Genai().declines(target, tmp_path) is None and Optimum().declines(target, tmp_path) is None
    # a state-space model's decode alone (its prompt stepped through it): declined too, naming the one file
    (tmp_path / "export.json").write_text(json.dumps({"components": {"decode": {"file": "decode.onnx"}}}))
    proofs = {proof.runtime: proof for proof in declined(target, tmp_path)}
    assert set(proofs) == {GENAI, OPTIMUM}, proofs
    assert all("its generation export is decode.onnx with no merged decoder graph" in p.detail
               for p in proofs.values()), proofs

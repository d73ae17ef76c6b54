"""The support matrix (`make coverage`): every family's shrunk config is consistent, the script runs end to end on
one family through the real CLI, and failures are classified and rendered with their reasons."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from matrix.families import FAMILIES, KINDS, VOCAB, shrink
from matrix.render import render
from matrix.run import Cell, Row, classify, estimate_s, kept_rows, plainest_recipe, untimed
from tests import cli_launcher
from tests.conftest import ROOT


def test_at_least_ninety_families_across_every_kind():
    assert len(FAMILIES) >= 90
    assert {spec.kind for spec in FAMILIES.values()} == set(KINDS)
    for needed in ("idefics3", "smolvlm", "paligemma", "gemma3", "qwen2_vl", "clip", "gemma2", "gemma3_text",
                   # state-space and hybrid (#30)
                   "mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "bamba", "granitemoehybrid", "zamba2",
                   "lfm2",
                   # speech seq2seq beyond Whisper, VLMs beyond the built-in layouts
                   "moonshine", "llava_next", "llava_onevision", "mllama", "internvl", "mistral3", "qwen3_vl",
                   "idefics2", "aya_vision",
                   # seen passing in the sweep
                   "olmoe", "mpnet", "dinov3_vit", "mt5"):
        assert needed in FAMILIES, needed


@pytest.mark.parametrize("name", sorted(n for n, s in FAMILIES.items() if s.kind == "hybrid"))
def test_hybrids_keep_an_attention_layer_and_a_recurrent_one(name):
    """A hybrid shrunk to two layers still runs both of its layer kinds (the default patterns start with several
    state-space layers, which a plain cut to two layers would keep alone)."""
    from matrix.families import tiny_model

    model = tiny_model(FAMILIES[name])
    kinds = {type(module).__name__ for module in model.modules()}
    assert any(k.endswith("Attention") for k in kinds), f"{name}: no attention layer in {sorted(kinds)}"
    recurrent = ("Mixer", "MambaLayer", "ShortConv", "GatedDeltaNet")
    assert any(k.endswith(recurrent) for k in kinds), f"{name}: no state-space or convolution layer in {sorted(kinds)}"


def _token_ids(config):
    for name in dir(config):
        if name.endswith(("_token_id", "_token_index")):
            try:
                value = getattr(config, name)
            except Exception:  # noqa: S112 - deprecated aliases
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                yield name, value


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_shrunk_configs_are_consistent(name):
    import transformers

    spec = FAMILIES[name]
    config = shrink(getattr(transformers, spec.model_class).config_class(), spec.overrides)
    nodes = [config] + [getattr(config, key) for key in (getattr(config, "sub_configs", None) or {})
                        if getattr(config, key, None) is not None]
    for node in nodes:
        vocab = getattr(node, "vocab_size", None)
        if isinstance(vocab, int):
            assert vocab == VOCAB
        for attribute, value in _token_ids(node):
            assert value < VOCAB, f"{name}: {type(node).__name__}.{attribute} = {value} is outside the vocabulary"
        layers, types = getattr(node, "num_hidden_layers", None), getattr(node, "layer_types", None)
        if isinstance(types, list) and isinstance(layers, int):
            assert len(types) == layers, f"{name}: {len(types)} layer_types for {layers} layers"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_saves_and_loads_back(name, tmp_path):
    from exporters.capture.loading import load_model
    from exporters.capture.source import ModelSource
    from matrix.families import build

    folder = build(FAMILIES[name], tmp_path / name)
    model = load_model(ModelSource(name, folder))
    assert type(model).__name__ == FAMILIES[name].model_class


def test_qwen2_audio_is_built_with_the_tokenizer_its_multimodal_runner_proof_reads(tmp_path):
    """#50: the matrix's Qwen2-Audio had no tokenizer, so its ExecuTorch MultimodalRunner proof never ran ('the model
    folder has no tokenizer.json'). Its folder now holds a byte-level BPE whose `<|AUDIO|>` is the model's audio
    token and whose vocabulary, BOS, EOS and padding are the text model's; the other families have none."""
    from tokenizers import Tokenizer
    from transformers import AutoConfig

    from matrix.families import build

    folder = build(FAMILIES["qwen2_audio"], tmp_path / "qwen2_audio")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = AutoConfig.from_pretrained(folder)
    assert tokenizer.token_to_id("<|AUDIO|>") == config.audio_token_index
    text = config.get_text_config()
    assert tokenizer.get_vocab_size() == text.vocab_size
    assert [tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>")] == [text.bos_token_id, text.eos_token_id,
                                                                             text.pad_token_id]
    assert not (build(FAMILIES["bert"], tmp_path / "bert") / "tokenizer.json").exists()  # no proof reads one


@pytest.mark.parametrize("name", ["llava", "gemma3", "qwen2_vl", "smolvlm"])
def test_a_vision_language_family_is_built_with_the_tokenizer_its_runtime_proofs_read(name, tmp_path):
    """#52 item 5: the VLM rows' ExecuTorch MultimodalRunner (and, for the types GenAI runs, GenAI) proofs did not
    apply: their folders had no tokenizer.json. Each vision-language family now gets a byte-level BPE holding its
    image token (Gemma 3 its image's begin and end too, Qwen2-VL its vision markers, which GenAI's processor reads)
    at the config's ids, and every special token id of the model inside the text model's vocabulary (a multimodal
    model's shrinking follows `text_config.vocab_size`: Gemma 3's begin-of-image id was left at 255 of 84 before)."""
    from tokenizers import Tokenizer
    from transformers import AutoConfig

    from matrix.families import build
    from matrix.tokenizer import special_pairs

    assert all(spec.tokenizer for spec in FAMILIES.values() if spec.kind == "vision-language")
    folder = build(FAMILIES[name], tmp_path / name)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = AutoConfig.from_pretrained(folder)
    pairs = special_pairs(FAMILIES[name].tokenizer)
    assert pairs and all(tokenizer.token_to_id(token) == getattr(config, setting) for token, setting in pairs)
    text = config.get_text_config()
    assert tokenizer.get_vocab_size() == text.vocab_size < VOCAB
    for source in (config, text):
        for attribute, value in _token_ids(source):
            assert value < text.vocab_size, f"{name}: {attribute} = {value} is outside the tokenizer's vocabulary"


def test_a_methods_layout_vlm_program_says_why_the_multimodal_runner_declined_it():
    """#52 item 5: a VLM ExecuTorch program that keeps the methods layout (the model does not fit the runner's one
    image) ran no MultimodalRunner proof and the row said nothing; the report's reason (its findings, the product's
    own sentence) is now the row's "declined" entry. A proof the runner ran is kept as it is."""
    from exporters.capture.multimodal_runner import NOT_MULTIMODAL
    from matrix.run import NOT_MULTIMODAL_PREFIX

    assert NOT_MULTIMODAL.format(why="W") == NOT_MULTIMODAL_PREFIX + "W"
    why = "its pixels are not one image [1, 3, H, W] (shape [1, 2, 3, 32, 32])"
    cell = classify({"status": "passed", "findings": ["other", NOT_MULTIMODAL.format(why=why)], "runtimes": []})
    assert cell.runtimes == [{"runtime": "ExecuTorch MultimodalRunner", "status": "declined",
                              "detail": f"cannot take this model: {why}"}]
    ran = {"runtime": "ExecuTorch MultimodalRunner", "status": "passed", "detail": "8/8 tokens"}
    assert classify({"status": "passed", "findings": [NOT_MULTIMODAL.format(why=why)], "runtimes": [ran]}
                    ).runtimes == [ran]
    assert classify({"status": "passed", "findings": ["other"]}).runtimes == []
    # the report itself declines a methods-layout program in general (the runs-in cell never empty): the row's
    # entry is the finding's reason in its place; without a finding, the report's general one stays
    from exporters.layouts.executorch_multimodal import METHODS_KEPT
    from matrix.run import METHODS_KEPT as MATRIX_METHODS_KEPT

    assert METHODS_KEPT.endswith(MATRIX_METHODS_KEPT)
    general = {"runtime": "ExecuTorch MultimodalRunner", "status": "declined",
               "detail": f"cannot take this model: {METHODS_KEPT}"}
    assert classify({"status": "passed", "findings": [NOT_MULTIMODAL.format(why=why)], "runtimes": [general]}
                    ).runtimes == [{**general, "detail": f"cannot take this model: {why}"}]
    assert classify({"status": "passed", "findings": ["other"], "runtimes": [general]}).runtimes == [general]


@pytest.mark.parametrize("name", ["gpt2", "deepseek_v3"])  # GPT-2's default ids are 50256; DeepSeek-V3's 0 and 1
def test_a_decoder_family_is_built_with_the_tokenizer_its_llm_runner_proof_reads(name, tmp_path):
    """#50: 34 decoder-only rows of the matrix showed their ExecuTorch LLM runner proof "❔ not run: the model folder
    has no tokenizer.json". Every decoder-only family now gets a byte-level BPE (`FamilySpec.tokenizer` `()`), the
    model built to its vocabulary: BOS/EOS/padding the tokenizer's, every special token id inside it."""
    from tokenizers import Tokenizer
    from transformers import AutoConfig

    from matrix.families import build

    assert all(spec.tokenizer is not None for spec in FAMILIES.values() if spec.kind == "decoder-only")
    folder = build(FAMILIES[name], tmp_path / name)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = AutoConfig.from_pretrained(folder)
    assert tokenizer.get_vocab_size() == config.vocab_size < VOCAB
    assert [tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>")] == [config.bos_token_id, config.eos_token_id,
                                                                             config.pad_token_id]
    for attribute, value in _token_ids(config):
        assert value < config.vocab_size, f"{name}: {attribute} = {value} is outside the tokenizer's vocabulary"


def test_no_decoder_row_of_the_matrix_leaves_its_runtime_proof_unrun_for_want_of_a_tokenizer():
    """#50: a check that did not run is not a pass. The measured table (docs/coverage.json) holds no decoder-only
    row, and no row of a family built with a tokenizer, whose runtime proof did not run for want of tokenizer.json."""
    data = json.loads((ROOT / "docs" / "coverage.json").read_text())
    checked = 0
    for row in data["rows"]:
        spec = FAMILIES.get(row["family"])
        if spec is None or (spec.kind != "decoder-only" and spec.tokenizer is None):
            continue
        for name, cell in row["cells"].items():
            for proof in cell.get("runtimes") or []:
                checked += 1
                assert "tokenizer.json" not in proof["detail"] or proof["status"] in ("passed", "declined"), \
                    f"{row['family']} {name}: {proof['runtime']} {proof['status']}: {proof['detail']}"
    assert checked >= 30


def test_every_vision_language_row_says_what_its_runtimes_showed():
    """#52 item 5: the plainest recipe of a LLaVA-style model passes with MultimodalRunner in its runs-in column, and
    no VLM row leaves a runtime silent: each passed ExecuTorch cell has MultimodalRunner's proof or its decline with
    the reason, each passed ONNX cell GenAI's (Qwen2-VL and Qwen2.5-VL: proven, their processor checked too)."""
    rows = {row["family"]: row for row in json.loads((ROOT / "docs" / "coverage.json").read_text())["rows"]}
    vlms = [name for name, spec in FAMILIES.items() if spec.kind == "vision-language"]
    for name in vlms:
        for cell_name, runtime in (("executorch", "ExecuTorch MultimodalRunner"), ("onnx", "ONNX Runtime GenAI")):
            cell = rows[name]["cells"][cell_name]
            if cell["status"] != "passed":
                continue
            proofs = [p for p in cell["runtimes"] or [] if p["runtime"] == runtime]
            assert len(proofs) == 1 and proofs[0]["status"] in ("passed", "declined") and proofs[0]["detail"], \
                (name, cell_name, cell["runtimes"])
    runner = rows["llava"]["cells"]["executorch"]["runtimes"]
    assert runner[0]["status"] == "passed" and runner[0]["detail"].startswith("8/8 tokens from an image"), runner
    for name in ("qwen2_vl", "qwen2_5_vl"):
        genai = rows[name]["cells"]["onnx"]["runtimes"][0]
        assert genai["status"] == "passed" and "its processor's pixels and image tokens" in genai["detail"], genai


def test_the_families_of_issue_50_are_measured_and_every_failure_is_said_upstream():
    """#50: SigLIP2 (NaFlex, no processor in its folder: an image processor built from its config) passes every
    format; DeepSeek-V2's graphs stand where ONNX Runtime GenAI and optimum decline its latent cache; a failed cell of
    DeepSeek-V2 or Gemma 3n's language model is upstream's (complex-number RoPE, erfinv), never ours."""
    rows = {row["family"]: row for row in json.loads((ROOT / "docs" / "coverage.json").read_text())["rows"]}
    assert {cell["status"] for cell in rows["siglip2"]["cells"].values()} == {"passed"}
    onnx = rows["deepseek_v2"]["cells"]["onnx"]
    assert onnx["status"] == "passed" and onnx["generation"] == "passed", onnx
    assert {p["runtime"]: p["status"] for p in onnx["runtimes"]} == {"ONNX Runtime GenAI": "declined",
                                                                      "optimum": "declined"}
    for family in ("deepseek_v2", "gemma3n_text"):
        assert rows[family]["cells"]["dynamo"]["status"] == "passed"
        for name, cell in rows[family]["cells"].items():
            assert cell["status"] == "passed" or (cell["cause"] == "upstream" and "[upstream: " in cell["reason"]), \
                (family, name, cell)


def test_plainest_recipe():
    recipe = plainest_recipe(["dynamo", "onnx", "executorch"])
    assert [t["export_format"] for t in recipe["exports"]] == ["dynamo", "onnx", "executorch"]
    assert recipe["exports"][0] == {"name": "dynamo", "export_format": "dynamo", "dynamic": True}
    assert "dynamic" not in recipe["exports"][2] and "mode" not in recipe["exports"][2]


def test_failures_are_classified_with_their_root_cause():
    capture = {"status": "failed", "error": {"type": "RuntimeError", "message": "decompose_prefill_decode failed",
                                             "root_cause": {"type": "ValueError", "message": "no bos"}}}
    cell = classify(capture)
    assert cell.cause == "upstream" and "root cause: ValueError: no bos" in cell.reason
    assert classify({"status": "failed", "error": {"type": "UnsupportedModelError",
                                                   "message": "sample inputs could not be made: x"}}).cause == "ours"
    assert classify({"status": "failed", "error": {"message": "generation parity failed: first divergence {}"}}
                    ).cause == "mismatch"
    assert classify({"status": "timed_out", "error": {"message": "ran past"}}).cause == "timeout"
    unverified = classify({"status": "unverified", "unverified": ["generation: EOS after 1 token"]})
    assert unverified.cause == "unverified" and "EOS after 1 token" in unverified.reason
    assert classify({"status": "passed", "generation": {"status": "passed"}}) == Cell("passed", generation="passed",
                                                                                      runtimes=[])
    runtime = classify({"status": "failed", "error": {"type": "ValidationError", "message": ""}, "runtimes": [
        {"runtime": "ONNX Runtime GenAI", "status": "failed", "detail": "bos_token_id - Expected a number"},
        {"runtime": "optimum", "status": "passed", "detail": "ok"}]})
    assert runtime.cause == "upstream" and runtime.reason == "ONNX Runtime GenAI: bos_token_id - Expected a number"
    # an upstream cause is said first, once: a long message (torch.onnx's advice) would lose it to the cut at its end
    said = "upstream: `aten::erfinv` has no ONNX operator and no ExecuTorch kernel (docs/upstream-gaps.md #45)"
    long = classify({"status": "failed", "error": {"type": "RuntimeError", "upstream": said,
                                                   "message": "exporting component 'prefill' failed: " + "advice " * 99
                                                   + f"prims.erf_inv [{said}]"}})
    assert long.cause == "upstream" and long.reason.startswith(f"[{said}] exporting") and long.reason.count(said) == 1


def test_render_lists_every_failure_reason():
    rows = [Row("llama", "decoder-only", "LlamaForCausalLM", "generation", 1.0,
                {"dynamo": Cell("passed", generation="passed"), "onnx": Cell("failed", "upstream", "boom | <x>")})]
    meta = {"date": "d", "machine": "m", "jobs": 2, "elapsed_s": 60, "versions": {"torch": "2"},
            "formats": ["dynamo", "onnx"], "recipe": plainest_recipe(["dynamo", "onnx"])}
    text = render(rows, meta)
    assert "| llama | decoder-only | `LlamaForCausalLM` | generation | ✅ passed (gen ✓) | ❌ failed upstream [1] |" in text
    assert "1. boom \\| &lt;x&gt;" in text
    assert "Passed: dynamo 1/1, onnx 0/1." in text


def test_a_pass_whose_runtime_proof_did_not_run_says_so():
    runner = {"runtime": "ExecuTorch LLM runner", "status": "unverified",
              "detail": "the model folder has no tokenizer.json, which the runner reads"}
    cell = classify({"status": "passed", "generation": {"status": "passed"}, "runtimes": [runner]})
    assert cell.status == "passed" and cell.runtimes == [runner]
    genai = classify({"status": "passed", "runtimes": [{"runtime": "ONNX Runtime GenAI", "status": "passed",
                                                        "detail": "8/8 tokens"}]})
    rows = [Row("llama", "decoder-only", "LlamaForCausalLM", "generation", 1.0,
                {"onnx": genai, "executorch": cell}),
            Row("gpt2", "decoder-only", "GPT2LMHeadModel", "generation", 1.0,
                {"onnx": Cell("passed"), "executorch": Cell("passed", runtimes=[])})]
    meta = {"date": "d", "machine": "m", "jobs": 1, "elapsed_s": 60, "versions": {"torch": "2"},
            "formats": ["onnx", "executorch"], "recipe": plainest_recipe(["onnx", "executorch"])}
    text = render(rows, meta)
    assert ("| llama | decoder-only | `LlamaForCausalLM` | generation | ✅ passed; ONNX Runtime GenAI ✓ | "
            "✅ passed (gen ✓); ExecuTorch LLM runner ❔ not run [1] |") in text
    assert "1. ExecuTorch LLM runner did not run it: the model folder has no tokenizer.json" in text
    assert "| gpt2 | decoder-only | `GPT2LMHeadModel` | generation | ✅ passed | ✅ passed |" in text
    assert "Passed: onnx 2/2, executorch 2/2. 1 of the passes were not run by the runtime" in text
    assert "1 passes were measured before the matrix kept runtime proofs" in text  # gpt2's onnx: not recorded
    assert "are declined by a runtime" not in text
    declined = {"runtime": "ONNX Runtime GenAI", "status": "declined", "detail": "cannot take a latent cache"}
    rows[1].cells["onnx"] = Cell("passed", runtimes=[declined])  # a runtime's refusal: said apart, not "not run"
    text = render(rows, meta)
    assert "| gpt2 | decoder-only | `GPT2LMHeadModel` | generation | ✅ passed; ONNX Runtime GenAI ✗ declined [2] |" \
        in text, text
    assert ("1 of the passes were not run by the runtime the artifact is for (❔ not run: the numbers and generation "
            "matched eager, that runtime's own proof did not run). 1 of the passes are declined by a runtime that "
            "cannot take the model") in text, text


def test_the_estimate_spreads_cpu_seconds_over_the_cores():
    passed = {"onnx": Cell("passed")}
    rows = [Row("a", "encoder", "A", seconds=300.0, cpu_s=100.0, cells=passed),
            Row("b", "encoder", "B", seconds=50.0, cpu_s=40.0, cells=passed),
            Row("f", "encoder", "F", seconds=9.0, cpu_s=5.0, cells={"onnx": Cell("failed", "ours", "no inputs")}),
            Row("c", "encoder", "C", seconds=900.0), Row("d", "audio", "D", seconds=5.0)]
    # c and d predate CPU timing: c counts the median of its kind's rows that exported something (70: f failed before
    # exporting and says nothing of the cost of one that passes), d (no timed audio row) that of all of them
    assert estimate_s(rows, cores=2) == (100.0 + 40.0 + 5.0 + 70.0 + 70.0) / 2
    assert untimed(rows) == ["c", "d"]
    assert estimate_s([Row("e", "encoder", "E", seconds=30.0)], cores=1) == 30.0  # nothing timed: wall is all
    meta = {"date": "d", "machine": "m", "jobs": 1, "elapsed_s": 60, "versions": {"torch": "2"}, "formats": ["onnx"],
            "recipe": plainest_recipe(["onnx"]), "estimate_s": 4200, "estimate_cores": 2, "untimed": ["b"]}
    rows = [Row("a", "encoder", "A", "model", 1.0, {"onnx": Cell("passed")}, cpu_s=1.0),
            Row("b", "encoder", "B", "model", 1.0, {"onnx": Cell("passed")})]
    text = render(rows, meta)
    assert "A full run of these 2 families on an idle machine of 2 cores at 2 at a time (`--jobs 2`) takes about " \
           "70 min" in text, text
    assert "1 of the 2 rows were measured before CPU time was recorded and count the median CPU seconds of their " \
           "kind's timed rows that passed a format: b." in text, text


def _matrix(*args: str) -> subprocess.CompletedProcess:
    """`python -m matrix *args` as `make coverage` runs it, forked from the worker's CLI launcher (#48: the script's
    own imports paid once per worker; each family's `hf-export run` is still the cold process the script starts)."""
    return cli_launcher.launch(list(args), {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 900, module="matrix").done


def test_make_coverage_script_runs_one_family_end_to_end(tmp_path):
    out = tmp_path / "coverage.md"
    done = _matrix("--families", "bert", "--formats", "onnx", "--jobs", "1", "--work", str(tmp_path / "work"),
                   "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = out.read_text()
    assert "| bert | encoder | `BertModel` | model | ✅ passed |" in text, text
    measured = json.loads((tmp_path / "coverage.json").read_text())
    assert measured["rows"][0]["cpu_s"] > 0 and measured["meta"]["estimate_s"] > 0
    # a rerun of other families with --update keeps bert's row, in the families' order, and says nothing is partial;
    # one of them is a state-space model, whose generation runs through its exported decode with the recurrent states
    done = _matrix("--families", "vit,mamba", "--formats", "onnx", "--jobs", "1", "--work", str(tmp_path / "work"),
                   "--out", str(out), "--update")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    updated = out.read_text()
    rows = [line for line in updated.splitlines() if line.startswith(("| bert ", "| vit ", "| mamba "))]
    # its ONNX folder is the decode alone: GenAI and optimum decline it, saying why (never an empty runs-in cell)
    assert rows == ["| mamba | state-space | `MambaForCausalLM` | generation | ✅ passed (gen ✓); "
                    "ONNX Runtime GenAI ✗ declined [1]; optimum ✗ declined [2] |",
                    "| bert | encoder | `BertModel` | model | ✅ passed |",
                    "| vit | vision | `ViTModel` | model | ✅ passed |"], updated
    assert "Passed: onnx 3/3." in updated and "Partial" not in updated
    assert "1. ONNX Runtime GenAI cannot take this model: its generation export is decode.onnx with no merged" in updated


def test_the_matrix_runs_a_decoders_executorch_program_in_the_llm_runner(tmp_path):
    """#50: a decoder-only family's plainest ExecuTorch target is proven in ExecuTorch's LLM runner from its folder
    (the tokenizer the matrix trains for it), not left "❔ not run"."""
    out = tmp_path / "coverage.md"
    done = _matrix("--families", "gpt2", "--formats", "executorch", "--jobs", "1", "--work", str(tmp_path / "work"),
                   "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = out.read_text()
    assert ("| gpt2 | decoder-only | `GPT2LMHeadModel` | generation | ✅ passed (gen ✓); ExecuTorch LLM runner ✓ |"
            in text), text
    assert "❔ not run [" not in text, text


def test_kept_rows_say_the_span_they_were_measured_in(tmp_path):
    """A table built by several --update runs keeps rows from all of them: the kept span starts at the oldest."""
    row = {"family": "bert", "kind": "encoder", "model_class": "BertModel", "cells": {"onnx": {"status": "passed"}}}
    meta = {"formats": ["onnx"], "date": "2026-12-02 10:00 UTC", "kept_since": "2026-12-01 05:33 UTC"}
    (tmp_path / "coverage.json").write_text(json.dumps({"meta": meta, "rows": [row]}))
    rows, span = kept_rows(tmp_path / "coverage.md", ["vit"], ["onnx"])
    assert list(rows) == ["bert"] and rows["bert"].cells["onnx"].status == "passed"
    assert span == "2026-12-01 05:33 UTC to 2026-12-02 10:00 UTC"
    (tmp_path / "coverage.json").write_text(json.dumps({"meta": {**meta, "kept_since": None}, "rows": [row]}))
    assert kept_rows(tmp_path / "coverage.md", ["vit"], ["onnx"])[1] == "2026-12-02 10:00 UTC"
    assert kept_rows(tmp_path / "coverage.md", ["vit"], ["dynamo"]) == ({}, None)  # other formats: nothing kept
    # a kept row's note is its family's as it reads now (#50: why regnet's float32 mismatch is the model's conditioning)
    regnet = {"family": "regnet", "kind": "vision", "model_class": "RegNetModel", "note": "",
              "cells": {"onnx": {"status": "failed", "cause": "mismatch"}}}
    (tmp_path / "coverage.json").write_text(json.dumps({"meta": meta, "rows": [row, regnet]}))
    rows, _ = kept_rows(tmp_path / "coverage.md", ["vit"], ["onnx"])
    assert rows["regnet"].note == FAMILIES["regnet"].note and "conditioning" in rows["regnet"].note


def test_a_stopped_update_says_which_families_it_did_not_measure():
    meta = {"date": "d", "machine": "m", "jobs": 1, "elapsed_s": 60, "versions": {"torch": "2"}, "formats": ["onnx"],
            "recipe": plainest_recipe(["onnx"]), "complete": False, "kept": 1, "kept_from": "a to b",
            "unfinished": ["vit"]}
    rows = [Row("vit", "vision", "ViTModel", "model", 1.0, {"onnx": Cell("passed")}, cpu_s=1.0)]
    text = render(rows, meta)
    assert "**Partial**: the run stopped before measuring vit: their rows (if any) are the earlier ones." in text
    assert "The rows of 1 families are kept from earlier runs (a to b)." in text
    assert "families planned" in render(rows, {**meta, "kept": 0})  # no earlier table: the rest is missing

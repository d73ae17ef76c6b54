"""Each deployment layout is one package, proven by its own runtime in the product: a transformers.js-layout run
of the real CLI proves the folder in transformers.js on Node.js (the pinned version `make test-deps` installs in
.cache/transformers-js, or HF_EXPORT_TRANSFORMERS_JS), and without it the report says `not run here` with how to
install it, never a pass. The card's snippet is the script the proof ran.

A runtime that cannot take a model declines it (#50 §6): the "runs in" column shows ✗ with the reason and the
artifact's own verdict stands. optimum is proven in its side environment.

One run of the real CLI (module-scoped) on a tiny Llama (a WordLevel tokenizer) with a transformers.js target, a merged
ONNX decoder and the plainest ExecuTorch recipe, then `hf-export validate` of the transformers.js folder where
transformers.js is not installed; one run on a tiny DeepSeek-V2 (latent attention cache), one on a tiny GLM-4-MoE
(a grouped-query cache optimum sizes otherwise).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, targets_by_name
from tests.models import _word_tokenizer, tiny_deepseek_v2, tiny_llama

RECIPE = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"},
                      {"name": "onnx", "export_format": "onnx", "mode": "generation", "merged": True},
                      # the plainest ExecuTorch recipe: the runner's program, whose C++ tokenizer cannot read this
                      # model's WordLevel tokenizer with a Whitespace pre-tokenizer
                      {"name": "et", "export_format": "executorch", "mode": "generation"}],
          "inputs": {"sequence_length": 6}, "generation": {"max_new_tokens": 5}}
TJS = "transformers.js"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    modules = ROOT / ".cache" / "transformers-js" / "node_modules" / "@huggingface" / "transformers"
    if shutil.which("node") is None or not modules.is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps` (Node.js and the pinned "
                    "@huggingface/transformers in .cache/transformers-js)")
    root = tmp_path_factory.mktemp("layouts")
    # one layer: the proofs, the declines and the card read the cache's names and the tokenizer, not the depth (#48)
    model_dir = tiny_llama(root / "model", RECIPE, initializer_range=0.3, layers=1)
    # a WordLevel vocabulary with a Whitespace pre-tokenizer (the runner's C++ tokenizer cannot load it)
    _word_tokenizer([], [f"w{i}" for i in range(100)]).save_pretrained(model_dir)
    out = root / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return model_dir, out, report, done.stdout + done.stderr


def test_a_transformers_js_run_is_proven_in_transformers_js(run):
    _, out, report, log = run
    target = targets_by_name(report)["tjs"]
    assert target["status"] == "passed", log[-4000:]
    [proof] = [p for p in target["runtimes"] if p["runtime"] == TJS]
    assert proof["status"] == "passed", proof
    assert proof["detail"].startswith("5/5 tokens (transformers.js 4.3.2, Node.js)"), proof
    markdown = (out / "report.md").read_text()
    assert "transformers.js ✓ 5/5 tokens" in markdown, markdown


def test_the_card_snippet_is_the_script_the_proof_ran(run):
    from exporters.layouts import TransformersJs
    from exporters.layouts.transformers_js import proof_script
    from exporters.layouts.transformers_js.proof import COLLECT

    _, _, report, _ = run
    target = targets_by_name(report)["tjs"]
    language, code = TransformersJs().snippet("org/model", target, "a" * 40)
    assert language == "js"
    assert "from_pretrained(\"tjs\", { device: 'cpu', dtype: \"fp32\" })" in code  # the folder's own dtype
    # the same template: the proof's script differs only in its values, the block its dtype runs in and the line
    # that hands back the ids
    ran = proof_script('"/x"', '"tjs"', [1, 2, 3], 32, ["fp32"], COLLECT)
    body = code.split("\n", 1)[1]
    card = [line.replace('"model/exports"', '"/x"').replace("  // your prompt's token ids", "")
            for line in body.splitlines() if line != "console.log(Array.from(output.data, Number));"]
    proof = [line for line in ran.splitlines() if line not in ("{", "}", 'const dtype = "fp32";', "const results = {};",
                                                                COLLECT)]
    assert card == proof
    assert 'hf download "org/model" --revision "' + "a" * 40 + '" --include "exports/tjs/*"' in code


def test_without_transformers_js_the_report_says_not_run_here(run, tmp_path):
    model_dir, out, _, _ = run
    copy = tmp_path / "out"
    shutil.copytree(out / "tjs", copy / "tjs")
    empty = tmp_path / "no-transformers-js"
    empty.mkdir()
    done = run_cli("validate", str(model_dir), str(copy), "--target", "tjs",
                   env={"HF_EXPORT_TRANSFORMERS_JS": str(empty)})
    report = json.loads((copy / "report.json").read_text())
    [target] = report["targets"]
    [proof] = [p for p in target["runtimes"] if p["runtime"] == TJS]
    assert proof["status"] == "unverified", (proof, done.stderr[-2000:])
    assert proof["detail"].startswith("not run here: install Node.js and @huggingface/transformers"), proof
    assert "transformers.js – not run here" in (copy / "report.md").read_text()


def test_a_merged_decoder_is_proven_in_optimum_in_its_side_environment(run):
    """optimum runs in the side environment `make test-deps` creates (.cache/optimum-venv), in the product's run."""
    _, out, report, log = run
    target = targets_by_name(report)["onnx"]
    assert target["status"] == "passed", log[-4000:]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["optimum"]["status"] == "passed", proofs
    assert proofs["optimum"]["detail"].endswith("(batch of 2, prompts of 6 and 3 tokens, ORTModelForCausalLM)"), proofs
    assert proofs["ONNX Runtime GenAI"]["status"] == "passed", proofs
    assert "optimum ✓" in (out / "report.md").read_text()


def test_a_tokenizer_the_runner_cannot_read_is_declined_and_the_program_stands(run):
    """#50 §6: the runner's C++ tokenizer cannot load a WordLevel tokenizer with a Whitespace pre-tokenizer: the
    runner's proof is declined (✗ with the reason), the program's own verdict (graph vs eager, generation parity)
    stands."""
    _, out, report, log = run
    target = targets_by_name(report)["et"]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", log[-4000:]
    [proof] = [p for p in target["runtimes"] if p["runtime"] == "ExecuTorch LLM runner"]
    assert proof == {"runtime": "ExecuTorch LLM runner", "status": "declined",
                     "detail": "cannot take this model: the runner's C++ tokenizer cannot load a tokenizer.json with "
                               "Whitespace and WordLevel"}, proof
    assert "ExecuTorch LLM runner ✗ cannot take this model" in (out / "report.md").read_text()


def test_a_latent_attention_cache_is_declined_by_genai_and_optimum_and_the_graph_stands(tmp_path):
    """#50 §6: a DeepSeek-V2-shaped model's ONNX graph is correct, but ONNX Runtime GenAI (and optimum) hold a
    key/value cache per head, not its latent one: no genai_config.json is written, both are declined with the
    reason, and the target passes on its own checks."""
    # one layer, its MoE one: the declines read the latent cache, which every layer has (#48)
    model_dir = tiny_deepseek_v2(tmp_path / "model", {"exports": [
        {"name": "onnx", "export_format": "onnx", "mode": "generation", "merged": True}],
        "inputs": {"sequence_length": 6}, "generation": {"max_new_tokens": 4}}, layers=1)
    out = tmp_path / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    target = targets_by_name(report)["onnx"]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", done.stderr[-4000:]
    assert not (out / "onnx" / "genai_config.json").exists()
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert set(proofs) == {"ONNX Runtime GenAI", "optimum"}, proofs
    for proof in proofs.values():
        assert proof["status"] == "declined", proof
        assert "latent (compressed) cache (kv_lora_rank 16, model type 'deepseek_v2')" in proof["detail"], proof
    assert "ONNX Runtime GenAI ✗ cannot take this model" in (out / "report.md").read_text()


def test_optimum_generates_for_a_model_without_eos():
    """A model with no eos id (a tiny GLM-4-MoE's config) gets `eos_token_id=None` in the script optimum runs, not
    JSON's `null` (its proof failed with `NameError: name 'null' is not defined`)."""
    import ast

    from exporters.layouts.optimum import generate_script
    from exporters.layouts.optimum.proof import eos_literal

    for eos, expected in (([], None), ([2, 7], [2, 7])):
        script = generate_script("spec['folder']", [[1, 2, 3]], 0, 4, eos_literal(eos), "pass")
        calls = [node for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Call)
                 and any(k.arg == "eos_token_id" for k in node.keywords)]
        value = next(k.value for k in calls[0].keywords if k.arg == "eos_token_id")
        assert ast.literal_eval(value) == expected, ast.unparse(value)


def test_a_cache_optimum_sizes_otherwise_is_declined_by_optimum_and_genai_still_proves_it(tmp_path):
    """#50 §6: GLM-4-MoE's merged graph (grouped-query: 2 key/value heads of 4) is correct and runs in ONNX Runtime
    GenAI, but optimum's ORTModelForCausalLM sizes the first call's empty past from `num_attention_heads` for a model
    type it does not list (it failed: "invalid dimensions for input: past_key_values.1.key"): optimum is declined
    with its sizes and the graph's, the GenAI proof that could apply still runs and passes, and the target passes."""
    import dataclasses

    from matrix.families import FAMILIES, build

    recipe = {"exports": [{"name": "onnx", "export_format": "onnx", "mode": "generation", "merged": True}],
              "inputs": {"sequence_length": 6}, "generation": {"max_new_tokens": 4}}
    # one layer, a MoE one (the family's first is dense): the declines read the cache's heads, which every layer has
    spec = dataclasses.replace(FAMILIES["glm4_moe"], overrides={**FAMILIES["glm4_moe"].overrides,
                                                                "num_hidden_layers": 1, "first_k_dense_replace": 0})
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    target = targets_by_name(report)["onnx"]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", done.stderr[-4000:]
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["ONNX Runtime GenAI"]["status"] == "passed", proofs
    assert proofs["optimum"] == {
        "runtime": "optimum", "status": "declined",
        "detail": "cannot take this model: optimum's ORTModelForCausalLM feeds the first call an empty past of 4 heads "
                  "x 8 (sized from the config by its own rules for model type 'glm4_moe'), where the graph's "
                  "past_key_values.0.key holds 2 heads x 8 (the model's key/value heads)"}, proofs
    assert "optimum ✗ cannot take this model" in (out / "report.md").read_text()

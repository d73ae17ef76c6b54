"""Each deployment layout is one package, proven by its own runtime in the product: a transformers.js-layout run
of the real CLI proves the folder in transformers.js on Node.js (the pinned version `make test-deps` installs in
.cache/transformers-js, or HF_EXPORT_TRANSFORMERS_JS), and without it the report says `not run here` with how to
install it, never a pass. The card's snippet is the script the proof ran.

One run of the real CLI (module-scoped) on a tiny Llama with a transformers.js target, then `hf-export validate` of
that folder where transformers.js is not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.models import tiny_llama

RECIPE = {"exports": [{"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"}],
          "inputs": {"sequence_length": 6}, "generation": {"max_new_tokens": 5}}
TJS = "transformers.js"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    modules = ROOT / ".cache" / "transformers-js" / "node_modules" / "@huggingface" / "transformers"
    if shutil.which("node") is None or not modules.is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps` (Node.js and the pinned "
                    "@huggingface/transformers in .cache/transformers-js)")
    root = tmp_path_factory.mktemp("layouts")
    model_dir = tiny_llama(root / "model", RECIPE, initializer_range=0.3)
    out = root / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return model_dir, out, report, done.stdout + done.stderr


def test_a_transformers_js_run_is_proven_in_transformers_js(run):
    _, out, report, log = run
    [target] = report["targets"]
    assert target["status"] == "passed", log[-4000:]
    [proof] = [p for p in target["runtimes"] if p["runtime"] == TJS]
    assert proof["status"] == "passed", proof
    assert proof["detail"].startswith("5/5 tokens (transformers.js 4.3.2, Node.js)"), proof
    markdown = (out / "report.md").read_text()
    assert "transformers.js ✓ 5/5 tokens" in markdown, markdown


def test_the_card_snippet_is_the_script_the_proof_ran(run):
    from exporters.layouts import TransformersJs
    from exporters.layouts.transformers_js import generate_script
    from exporters.layouts.transformers_js.proof import EMIT

    _, _, report, _ = run
    [target] = report["targets"]
    language, code = TransformersJs().snippet("org/model", target, "a" * 40)
    assert language == "js"
    # the same template: the proof's script differs only in its values and the line that hands back the ids
    ran = generate_script('"/x"', '"tjs"', [1, 2, 3], 32, EMIT, "  // your prompt's token ids")
    body = code.split("\n", 1)[1]
    assert body.replace("console.log(Array.from(output.data, Number));", EMIT).replace(
        '"model/exports"', '"/x"') == ran
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

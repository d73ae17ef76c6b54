"""Every target folder loads alone (issue #26 §3): the model's configs, tokenizer and processor files are copied as data
into each target folder, whatever its format and layout; a `tokenizer_config.json` naming transformers 5's
`TokenizersBackend` is rewritten to what released clients read, with a finding; a linked file is refused.

One export run per model (a tiny Llama with a BPE tokenizer, two targets; a tiny ViT in the transformers.js layout),
shared by every check on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.export_store import MODEL, OUT, exported
from tests.models import VIT_TJS_RECIPE, save_bpe_tokenizer, tiny_llama, tiny_vit_with_image_processor

RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "dynamo", "export_format": "dynamo", "mode": "generation", "dynamic": True, "merged": False},
        {"name": "dynamo-merged", "export_format": "dynamo", "mode": "generation", "merged": True},
        {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"},
    ],
    "inputs": {"sequence_length": 6},
    "generation": {"max_new_tokens": 4},
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder-files")
    model_dir = save_bpe_tokenizer(tiny_llama(root / "model", RECIPE, layers=1))  # one layer: no check reads depth
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert (out / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return model_dir, out, result, report, {t["name"]: t for t in report["targets"]}


def _all_findings(report, target) -> list[str]:
    return [*report.get("findings", []), *target.get("findings", [])]


def test_every_target_passes(llm):
    _, _, result, _, targets = llm
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(targets) == ["dynamo", "dynamo-merged", "tjs"]
    assert all(t["status"] == "passed" for t in targets.values()), {n: t["error"] for n, t in targets.items()}


@pytest.mark.parametrize("name", ["dynamo", "dynamo-merged", "tjs"])
def test_target_folder_holds_the_configs_and_tokenizer_files_none_a_link(llm, name):
    _, out, _, _, _ = llm
    folder = out / name
    for file in ["config.json", "generation_config.json", *TOKENIZER_FILES]:
        assert (folder / file).is_file(), f"{name} lacks {file}: {sorted(os.listdir(folder))}"
    assert not [p for p in folder.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize("name", ["dynamo", "dynamo-merged", "tjs"])
def test_tokenizer_loads_from_the_target_folder_alone(llm, name, tmp_path):
    """Copied elsewhere, away from the model folder, the target's tokenizer encodes as the model's own does."""
    import shutil

    from transformers import AutoTokenizer

    model_dir, out, _, _, _ = llm
    alone = tmp_path / name
    shutil.copytree(out / name, alone)
    tokenizer = AutoTokenizer.from_pretrained(alone)
    want = AutoTokenizer.from_pretrained(model_dir)
    assert type(tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert tokenizer("the cat sat on the mat").input_ids == want("the cat sat on the mat").input_ids
    assert tokenizer.eos_token == "</s>" and tokenizer.chat_template == want.chat_template


def test_tokenizers_backend_is_rewritten_with_a_finding(llm):
    model_dir, out, _, report, targets = llm
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    for name, target in targets.items():
        config = json.loads((out / name / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert any("TokenizersBackend" in f and "PreTrainedTokenizerFast" in f for f in _all_findings(report, target))


def test_the_export_keeps_its_own_generation_config(llm):
    """The generation target's `generation_config.json` is the one the export wrote, not overwritten by the copy."""
    _, out, _, _, targets = llm
    for name in targets:
        saved = json.loads((out / name / "generation_config.json").read_text())
        assert saved["eos_token_id"] == 2


def test_transformers_js_layout_keeps_its_config_and_graph_folder(llm):
    _, out, _, _, _ = llm
    config = json.loads((out / "tjs" / "config.json").read_text())
    assert "transformers.js_config" in config
    assert (out / "tjs" / "onnx" / "model.onnx").is_file()


@pytest.mark.parametrize("name", ["dynamo", "dynamo-merged"])
def test_exported_model_snippet_runs_against_the_target_folder(llm, name):
    """The model card's `ExportedModel.from_pretrained` snippet, run as written (the repo id and subfolder replaced
    by the local target folder), gives the eager logits: with `DynamicCache(config=...)`, as the snippet says."""
    import torch
    from transformers import AutoModelForCausalLM

    from exporters.publish.snippets import exported_model_snippet

    model_dir, out, _, _, targets = llm
    snippet = exported_model_snippet("org/model", targets[name])
    assert "DynamicCache(config=" in snippet and "DynamicCache()" in snippet  # the comment names what fails
    where = f'"org/model", subfolder="exports/{name}"'
    assert snippet.count(where) == 2, snippet
    namespace: dict = {}
    exec(snippet.replace(where, repr(str(out / name))), namespace)  # noqa: S102 - our snippet, our export
    eager = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = namespace["input_ids"]
    with torch.no_grad():
        want = eager(input_ids=ids).logits
    torch.testing.assert_close(namespace["outputs"].logits, want, atol=1e-4, rtol=1e-3)
    if "step" in namespace:  # prefill then one decode step on its cache
        following = torch.cat([ids, namespace["next_token"]], dim=1)
        with torch.no_grad():
            want = eager(input_ids=following).logits[:, -1:]
        torch.testing.assert_close(namespace["step"].logits, want, atol=1e-4, rtol=1e-3)


def test_a_plain_dynamic_cache_fails_the_traced_spec(llm):
    """What the snippet warns about (docs/upstream-gaps.md): upstream's runner refuses `DynamicCache()`."""
    import torch
    from transformers import DynamicCache
    from transformers.exporters import ExportedModel

    _, out, _, _, _ = llm
    model = ExportedModel.from_pretrained(str(out / "dynamo"), trust_remote_code=True)
    with pytest.raises(ValueError, match="exported input tree spec"):
        model.runners["prefill"](input_ids=torch.tensor([[5, 9]]), position_ids=torch.arange(2)[None],
                                 cache=DynamicCache())


def test_model_card_shows_a_snippet_per_proven_runtime(llm):
    """Keyed by runtime name: a passed proof gets its runtime's snippet, a failed one none; upstream's loader's
    snippet for the formats it reads."""
    from exporters.publish.snippets import target_snippets

    _, _, _, _, targets = llm
    target = {**targets["tjs"], "runtimes": [
        {"runtime": "transformers.js", "status": "passed", "detail": "4/4 tokens"},
        {"runtime": "optimum", "status": "passed", "detail": "batch 2"},
        {"runtime": "ONNX Runtime GenAI", "status": "failed", "detail": "no genai_config.json"}]}
    snippets = {runtime: code for runtime, _, code in target_snippets("org/model", target)}
    assert list(snippets) == ["transformers.js", "optimum"]  # the transformers.js layout: not upstream's loader
    # each the script its proof runs (exporters.layouts: one template feeds both)
    assert 'AutoModelForCausalLM.from_pretrained("tjs", ' in snippets["transformers.js"]
    assert 'env.localModelPath = "model/exports";' in snippets["transformers.js"]
    assert 'ORTModelForCausalLM.from_pretrained("org/model", subfolder="exports/tjs", use_cache=True' in snippets["optimum"]
    runner = {**targets["dynamo"], "export_format": "executorch", "expected_components": ["model"],
              "files": [{"path": "et/model.pte"}], "name": "et",
              "runtimes": [{"runtime": "ExecuTorch LLM runner", "status": "passed", "detail": "8/8 tokens"},
                           {"runtime": "ONNX Runtime GenAI", "status": "passed"}]}
    snippets = {runtime: code for runtime, _, code in target_snippets("org/model", runner)}
    assert 'TextLLMRunner(f"{folder}/model.pte", f"{folder}/tokenizer.json")' in snippets["ExecuTorch LLM runner"]
    assert "og.Model(folder)" in snippets["ONNX Runtime GenAI"]
    assert "transformers.exporters" not in snippets  # the runner's program: not called the way upstream's loader is
    split = {**runner, "expected_components": ["prefill", "decode"], "runtimes": [],
             "files": [{"path": "et/prefill.pte"}, {"path": "et/decode.pte"}]}
    [(runtime, _, code)] = target_snippets("org/model", split)
    assert runtime == "transformers.exporters" and 'model.runners["prefill"]' in code


def test_a_linked_tokenizer_file_is_refused(tmp_path):
    """A model folder (a pull request's checkout) whose tokenizer file is a link: the run refuses it, and nothing it
    points to reaches an artifact."""
    model_dir = save_bpe_tokenizer(tiny_llama(tmp_path / "model", RECIPE["exports"][0]))
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy me")
    (model_dir / "chat_template.jinja").unlink()
    (model_dir / "chat_template.jinja").symlink_to(secret)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode != 0
    assert "chat_template.jinja" in result.stdout + result.stderr and "link" in result.stdout + result.stderr
    leaked = [p for p in out.rglob("*") if p.is_file() and "do not copy me" in p.read_text(errors="ignore")] \
        if out.exists() else []
    assert not leaked


# ── a vision model in the transformers.js layout ──────────────────────────────


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder-files-vit")
    # the run tests/test_families.py reads too: the shared store exports it once (the tests here only read)
    done = exported(tiny_vit_with_image_processor(root / "model", VIT_TJS_RECIPE), "run", "--no-bench", MODEL, "--out",
                    OUT, "--quiet")
    assert (done.out / "report.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return done.model_dir, done.out, done.result, done.report


def test_vit_transformers_js_folder_carries_its_preprocessor_config(vit):
    model_dir, out, result, report = vit
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [target] = report["targets"]
    folder = out / target["name"]
    assert (folder / "preprocessor_config.json").is_file(), sorted(os.listdir(folder))
    assert (folder / "preprocessor_config.json").read_bytes() == (model_dir / "preprocessor_config.json").read_bytes()
    from transformers import AutoImageProcessor

    assert AutoImageProcessor.from_pretrained(folder).size == {"height": 32, "width": 32}


TJS_IMAGE_SCRIPT = Path(__file__).with_name("transformers_js") / "image.mjs"


def test_vit_runs_in_a_transformers_js_pipeline_from_its_folder(vit):
    """transformers.js itself, on Node.js: `pipeline('image-feature-extraction')` loads the folder alone (its
    preprocessor_config.json prepares the image) and gives the eager model's features. Installed by `make
    test-deps` (see tests/test_weights_once.py); never skipped."""
    import random
    import shutil
    import subprocess

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    root = Path(__file__).resolve().parents[1]
    from exporters.layouts.transformers_js import home  # HF_EXPORT_TRANSFORMERS_JS, else .cache

    modules = str(home())
    if shutil.which("node") is None or not (Path(modules) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps`, or set HF_EXPORT_TRANSFORMERS_JS to a "
                    "folder with node_modules/@huggingface/transformers")
    model_dir, out, _, report = vit
    [target] = report["targets"]
    rng = random.Random(0)
    pixels = [rng.randrange(256) for _ in range(32 * 32 * 3)]
    script = Path(modules) / "image.mjs"
    shutil.copyfile(TJS_IMAGE_SCRIPT, script)
    result = subprocess.run(["node", str(script), str(out), target["name"], "image-feature-extraction", "32", "32",
                             json.dumps(pixels)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    image = Image.fromarray(np.array(pixels, dtype=np.uint8).reshape(32, 32, 3))
    inputs = AutoImageProcessor.from_pretrained(model_dir)(image, return_tensors="pt")
    with torch.no_grad():
        want = AutoModel.from_pretrained(model_dir).eval()(**inputs).last_hidden_state
    assert got["dims"] == list(want.shape)
    np.testing.assert_allclose(np.array(got["data"]).reshape(want.shape), want.numpy(), atol=1e-3, rtol=1e-3)

"""Encoders proven in the runtimes users deploy them with, each loading a target folder alone (issue #26 §2-§4).

- A tiny BERT (WordPiece tokenizer, sentence-transformers modules) exported `{"export_format": "onnx", "dynamic":
  true}`: optimum's `ORTModelForFeatureExtraction` encodes a padded batch of three texts (a batch the sample inputs
  did not have: `dynamic: true` keeps the batch dynamic), and `SentenceTransformer(folder, backend="onnx")` gives the
  eager model's sentence embeddings (its CLS pooling and normalization copied into the folder); in the
  transformers.js layout too, where transformers.js' `pipeline('feature-extraction')` tokenizes with the folder's
  WordPiece tokenizer itself and gives eager's hidden states.
- A tiny ViT classifier (its `preprocessor_config.json`), ONNX `dynamic: true` in the default and the transformers.js
  layouts: optimum's `ORTModelForImageClassification` classifies a batch of two images of other sizes, and
  transformers.js' `pipeline('image-classification')` gives the eager model's label scores.
- The model card's `ExportedModel.from_pretrained` snippet runs against both folders as written.
- `hf-export run` itself proves the BERT folder in sentence-transformers (`exporters/layouts/sentence_transformers`,
  in the side environment): its report's "runs in" column, the card's snippet (the proof's template) run as written,
  `not run here` without the side environment, and a module that is not sentence-transformers' own declined.

One export run per model, shared by every check on it. optimum needs transformers 4.x: `make test-deps` creates the
pinned venv .cache/optimum-venv (tests/optimum/constraints.txt), never the product's environment;
HF_EXPORT_OPTIMUM_PYTHON names another interpreter with optimum-onnx and sentence-transformers. Never skipped.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_and_read, run_cli
from tests.models import tiny_bert_with_tokenizer, tiny_vit_classifier_with_image_processor

ROOT = Path(__file__).resolve().parents[1]
OPTIMUM = Path(__file__).with_name("optimum")
TJS_IMAGE_SCRIPT = Path(__file__).with_name("transformers_js") / "image.mjs"
TJS_TEXT_SCRIPT = Path(__file__).with_name("transformers_js") / "text.mjs"
ATOL, RTOL = 1e-4, 1e-3  # the project's default validation tolerances for a float32 artifact
TEXTS = ["the cat sat", "a dog ran in the park one tiny model", "hello"]  # three lengths: padded


def _optimum_python() -> str:
    from exporters.layouts.child import SIDE_PYTHON, SIDE_PYTHON_SETTING  # the optimum venv

    python = os.environ.get(SIDE_PYTHON_SETTING) or str(SIDE_PYTHON)
    if not Path(python).is_file():
        pytest.fail("optimum is not installed: run `make test-deps` (.cache/optimum-venv, pinned by "
                    "tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python with optimum-onnx "
                    "and sentence-transformers")
    return python


def _in_optimum_venv(*runs: list[str]) -> list[list[dict]]:
    """Run `tests/optimum/<script> <args>` for each `[script, *args]` of `runs` in one process of the optimum venv
    (tests/optimum/several.py: one start of torch, transformers and optimum for all of them), offline, from a folder
    away from the model: each script's JSON lines."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    result = subprocess.run([_optimum_python(), str(OPTIMUM / "several.py")], input=json.dumps(runs),
                            capture_output=True, text=True, timeout=600, env=env, cwd="/", check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    starts = [i for i, line in enumerate(lines) if set(line) == {"script"}]
    assert [lines[i]["script"] for i in starts] == [run[0] for run in runs], result.stdout[-4000:]
    return [lines[start + 1:end] for start, end in zip(starts, [*starts[1:], len(lines)])]


def _transformers_js() -> str:
    """The folder whose node_modules holds transformers.js (`make test-deps`, or HF_EXPORT_TRANSFORMERS_JS), found as
    the product's transformers.js layout finds it."""
    from exporters.layouts.transformers_js import home  # HF_EXPORT_TRANSFORMERS_JS, else .cache

    modules = str(home())
    if shutil.which("node") is None or not (Path(modules) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps`, or set HF_EXPORT_TRANSFORMERS_JS to a "
                    "folder with node_modules/@huggingface/transformers")
    return modules


def _export(root: Path, model_dir: Path) -> tuple[Path, dict]:
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert (out / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, report


def _alone(out: Path, name: str, tmp_path: Path) -> Path:
    """The target folder copied away from the model folder and the run's other files."""
    alone = tmp_path / "alone" / name
    shutil.copytree(out / name, alone)
    return alone


def _run_snippet(target: dict, folder: Path) -> dict:
    from exporters.publish.snippets import exported_model_snippet

    snippet = exported_model_snippet("org/model", target)
    where = f'"org/model", subfolder="exports/{target["name"]}"'
    assert snippet.count(where) == 2, snippet
    namespace: dict = {}
    exec(snippet.replace(where, repr(str(folder))), namespace)  # noqa: S102 - our snippet, our export
    return namespace


# ── BERT: optimum feature extraction and sentence-transformers ────────────────


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders-bert")
    model_dir = tiny_bert_with_tokenizer(root / "model", [
        {"export_format": "onnx", "dynamic": True},
        {"name": "tjs", "export_format": "onnx", "dynamic": True, "layout": "transformers.js"}])
    out, report = _export(root, model_dir)
    targets = {t["name"]: t for t in report["targets"]}
    assert targets["tjs"]["status"] == "passed", targets["tjs"].get("error")
    return model_dir, out, targets["onnx"]


def _eager_bert(model_dir: Path) -> tuple[dict, torch.Tensor]:
    from transformers import AutoModel, AutoTokenizer

    batch = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(model_dir).eval()(**batch).last_hidden_state
    return batch, hidden


def test_bert_passes_with_a_dynamic_batch_in_its_graph(bert):
    import onnx

    _, out, target = bert
    assert target["status"] == "passed", target.get("error")
    graph = onnx.load(out / target["name"] / "model.onnx", load_external_data=False).graph
    batch = {i.name: i.type.tensor_type.shape.dim[0] for i in graph.input}
    assert sorted(batch) == ["attention_mask", "input_ids", "token_type_ids"]
    assert all(d.dim_param and not d.dim_value for d in batch.values()), batch  # symbolic, not fixed at 1


def test_bert_folder_carries_tokenizer_and_sentence_transformers_files(bert):
    model_dir, out, target = bert
    folder = out / target["name"]
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json"]:
        assert (folder / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert not [p for p in folder.rglob("*") if p.is_symlink()]


POOLING_MODES = [["cls"], ["mean"], ["max"], ["mean_sqrt_len_tokens"], ["cls", "mean"]]


@pytest.fixture(scope="module")
def in_side_env(bert, vit, tmp_path_factory) -> dict:
    """One side-environment process (each start imports torch, transformers, optimum and sentence-transformers again,
    ~5.5 CPU s) for both models (#48: it was one per model).

    "bert": for the BERT folder, optimum's and sentence-transformers' encodings of TEXTS from the folder alone,
    sentence-transformers' eager encoding of the model folder, and its `Pooling` of eager's hidden states in every
    POOLING_MODES. "vit": optimum's classification of `_images()` by each ViT target folder, each copied alone (away
    from the model folder and the other target), a result per folder."""
    model_dir, out, target = bert
    bert_folder = _alone(out, target["name"], tmp_path_factory.mktemp("bert-alone"))
    batch, hidden = _eager_bert(model_dir)
    root = tmp_path_factory.mktemp("vit-alone")
    vit_folders = {name: str(_alone(vit[1], name, root / name)) for name in ("onnx", "tjs")}
    bert_lines, vit_lines = _in_optimum_venv(
        ["feature_extraction.py", str(bert_folder), json.dumps(TEXTS), str(model_dir),
         json.dumps([POOLING_MODES, hidden.tolist(), batch["attention_mask"].tolist()])],
        ["image_classification.py", vit_folders["onnx"], json.dumps([i.tolist() for i in _images()]),
         vit_folders["tjs"]])
    assert len(bert_lines) == 2 + len(POOLING_MODES), bert_lines
    by_folder = {result.pop("folder"): result for result in vit_lines}
    return {"bert": {"folder": bert_folder, "got": bert_lines[0], "eager_st": bert_lines[1],
                     "pooled": bert_lines[2:]},
            "vit": {name: by_folder[folder] for name, folder in vit_folders.items()}}


@pytest.fixture(scope="module")
def bert_in_side_env(in_side_env) -> dict:
    return in_side_env["bert"]


def test_optimum_and_sentence_transformers_encode_a_batch_of_three_from_the_folder_alone(bert, bert_in_side_env):
    """optimum's last_hidden_state and sentence-transformers' embeddings (ONNX backend, the folder's own pooling and
    normalization) equal eager transformers' and sentence-transformers' own torch encoding of the model folder."""
    model_dir, out, target = bert
    folder, got, eager_st = bert_in_side_env["folder"], bert_in_side_env["got"], bert_in_side_env["eager_st"]
    batch, hidden = _eager_bert(model_dir)
    assert got["input_ids"] == batch["input_ids"].tolist()
    assert got["attention_mask"] == batch["attention_mask"].tolist()
    assert len(set(map(sum, got["attention_mask"]))) == 3  # three lengths, padded into one batch
    assert 1 not in batch["input_ids"].tolist()  # no [UNK]: the WordPiece vocabulary's own ids
    assert got["inputs"] == ["attention_mask", "input_ids", "token_type_ids"]
    assert np.array(got["last_hidden_state"]).shape == (3, batch["input_ids"].shape[1], 32)
    mask = batch["attention_mask"].bool().numpy()  # padded positions carry no meaning: compare the real ones
    np.testing.assert_allclose(np.array(got["last_hidden_state"])[mask], hidden.numpy()[mask], atol=ATOL, rtol=RTOL)

    assert got["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert Path(got["onnx_file"]) == folder / "model.onnx"  # our graph, not one sentence-transformers exported
    cls = torch.nn.functional.normalize(hidden[:, 0], dim=-1).numpy()  # the folder's CLS pooling, then normalized
    np.testing.assert_allclose(np.array(got["embeddings"]), cls, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(np.array(got["embeddings"]), np.array(eager_st["eager_embeddings"]),
                               atol=ATOL, rtol=RTOL)
    mean = torch.nn.functional.normalize((hidden * batch["attention_mask"][..., None]).sum(1)
                                         / batch["attention_mask"].sum(1, keepdim=True), dim=-1).numpy()
    assert np.abs(cls - mean).max() > 10 * ATOL  # mean pooling (no 1_Pooling copied) would have failed the check


def test_bert_feature_extraction_in_transformers_js_tokenizes_with_the_folders_wordpiece(bert, tmp_path):
    """transformers.js on Node.js: `pipeline('feature-extraction')` loads the transformers.js-layout folder alone and
    tokenizes with its WordPiece tokenizer (a word split into a piece and a `##` continuation) in transformers.js
    itself: the hidden states are eager's for the same text. Installed by `make test-deps`; never skipped."""
    modules = _transformers_js()
    model_dir, out, _ = bert
    alone = _alone(out, "tjs", tmp_path)
    text = "the cats sat on the mat"
    script = Path(modules) / "text.mjs"
    shutil.copyfile(TJS_TEXT_SCRIPT, script)
    result = subprocess.run(["node", str(script), str(alone.parent), "tjs", "feature-extraction", json.dumps(text)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert "##s" in tokenizer.tokenize(text)  # WordPiece's continuation piece is in play
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(model_dir).eval()(**batch).last_hidden_state
    assert got["dims"] == list(hidden.shape)  # as many tokens as transformers' WordPiece makes
    np.testing.assert_allclose(np.array(got["data"]).reshape(got["dims"]), hidden.numpy(), atol=ATOL, rtol=RTOL)


def test_bert_exported_model_snippet_runs_as_written(bert, tmp_path):
    """The card's `ExportedModel` snippet feeds the graph every input it was traced with (token_type_ids too)."""
    model_dir, out, target = bert
    namespace = _run_snippet(target, _alone(out, target["name"], tmp_path))
    from transformers import AutoModel

    with torch.no_grad():
        want = AutoModel.from_pretrained(model_dir).eval()(**namespace["inputs"]).last_hidden_state
    torch.testing.assert_close(namespace["outputs"].last_hidden_state, want, atol=ATOL, rtol=RTOL)


# ── BERT: proven in sentence-transformers by `hf-export run` itself (#49) ───────

ST = "sentence-transformers"


def test_bert_is_proven_in_sentence_transformers_by_the_run(bert):
    """The product's run loads the folder alone with `SentenceTransformer(folder, backend="onnx")` in the side
    environment (never the product's), encodes two sentences and compares them with the eager model's embeddings
    pooled and normalized as the folder's modules say: the report's "runs in" column says it passed. The
    transformers.js-layout target is not sentence-transformers' (its own runtime proves it)."""
    _, out, target = bert
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs[ST]["status"] == "passed", proofs
    assert proofs[ST]["detail"] == ("2 sentences, 32-dim embeddings within atol 0.0001 of eager (cls, normalized; "
                                    "sentence-transformers 5.7.0, ONNX backend)"), proofs
    report = json.loads((out / "report.json").read_text())
    tjs = next(t for t in report["targets"] if t["name"] == "tjs")
    assert ST not in {p["runtime"] for p in tjs.get("runtimes") or []}
    assert "sentence-transformers ✓ 2 sentences" in (out / "report.md").read_text()


def test_the_sentence_transformers_proof_pools_as_sentence_transformers_does(bert, bert_in_side_env):
    """The product's eager side (`proof.pool`, from the model's hidden states and 1_Pooling's modes) equals
    sentence-transformers' own torch encoding of the model folder, run in the side environment, for every mode it
    computes: the reference the run compares with is sentence-transformers' own."""
    from exporters.layouts.sentence_transformers.proof import pool

    model_dir, _, _ = bert
    batch, hidden = _eager_bert(model_dir)
    # the side environment's process of `bert_in_side_env` pooled eager's hidden states in every mode
    lines = bert_in_side_env["pooled"]
    assert [line["modes"] for line in lines] == POOLING_MODES, lines
    for modes, line in zip(POOLING_MODES, lines):
        want = np.array(line["sentence_embedding"])
        got = pool(hidden, batch["attention_mask"], modes).numpy()
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6, err_msg=str(modes))


def test_the_sentence_transformers_card_snippet_is_the_script_the_proof_ran_and_runs_as_written(bert, hub, tmp_path):
    """One template (`ENCODE`) feeds the proof and the card: the card's snippet, run as written by the side
    environment's Python against the Hub emulator holding the folder at the commit it pins, encodes the two
    sentences; the proof's script is the same code with the folder and the line that hands back the answer."""
    from exporters.layouts.sentence_transformers import SENTENCES, encode_script
    from exporters.layouts.sentence_transformers.proof import EMIT, OPTIONS
    from tests.card_snippets import card_snippets, exports_card, run_snippet, upload_exports

    _, out, _ = bert
    commit = upload_exports(hub, "alice/bert", out, ["onnx"])
    snippets = {runtime: (language, code) for runtime, language, code in
                card_snippets(exports_card("alice/bert", out, commit))}
    language, code = snippets[ST]
    assert language == "python" and f'revision="{commit}"' in code, code
    ran = encode_script('spec["folder"]', SENTENCES, EMIT, options=OPTIONS)
    body = code[code.index("from sentence_transformers"):]
    assert body.replace("  # your sentences", "").replace("print(embeddings.shape)", EMIT).replace(
        'backend="onnx")', f'backend="onnx"{OPTIONS})') == ran[ran.index("from sentence_transformers"):]
    done = run_snippet(code, hub, tmp_path / "home", python=_optimum_python())
    assert done.returncode == 0, (code, done.stderr[-3000:])
    assert done.stdout.strip().splitlines()[-1] == "(2, 32)", done.stdout


def test_without_the_side_environment_sentence_transformers_says_not_run_here(bert, tmp_path):
    """No side environment (HF_EXPORT_OPTIMUM_PYTHON names no interpreter): `unverified`, saying how to create it,
    never a pass."""
    model_dir, out, _ = bert
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    done = run_cli("validate", str(model_dir), str(copy), "--target", "onnx",
                   env={"HF_EXPORT_OPTIMUM_PYTHON": str(tmp_path / "no-python")})
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    [proof] = [p for p in target["runtimes"] if p["runtime"] == ST]
    assert proof["status"] == "unverified", (proof, done.stderr[-2000:])
    assert proof["detail"].startswith("not run here: create the side environment with sentence-transformers"), proof
    assert "sentence-transformers – not run here" in (copy / "report.md").read_text()


def test_a_module_sentence_transformers_would_import_from_elsewhere_is_declined_and_never_run(bert, tmp_path):
    """`modules.json` names the classes sentence-transformers imports: one that is not sentence-transformers' own
    (here a module of the repo's) is never loaded: the proof is declined with the reason, the graph's own verdict
    stands."""
    model_dir, out, _ = bert
    source, copy = tmp_path / "model", tmp_path / "out"
    shutil.copytree(model_dir, source)
    shutil.copytree(out / "onnx", copy / "onnx")
    for folder in (source, copy / "onnx"):
        modules = json.loads((folder / "modules.json").read_text())
        modules[2]["type"] = "custom_code.Normalize"
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "custom_code.py").write_text("raise SystemExit('repo code ran')\n")
    done = run_cli("validate", str(source), str(copy), "--target", "onnx")
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    assert target["status"] == "passed", (target.get("error"), done.stderr[-2000:])
    [proof] = [p for p in target["runtimes"] if p["runtime"] == ST]
    assert proof == {"runtime": ST, "status": "declined", "detail": (
        "cannot take this model: modules.json names the module 'custom_code.Normalize': the proof computes "
        "sentence-transformers' own Transformer, Pooling, Normalize only")}, proof



def test_the_plainest_recipe_of_a_sentence_transformers_repo_passes_and_says_why_it_is_not_for_sentence_transformers(
        tmp_path):
    """`{"export_format": "onnx"}` on a repo that ships sentence-transformers' modules: the graph is exported with
    the sample's fixed shape, which sentence-transformers (a batch padded to the longest sentence) cannot feed. The
    graph's own verdict stands and the proof is declined with the fix, never run to fail the target (it did)."""
    model_dir = tiny_bert_with_tokenizer(tmp_path / "model", {"export_format": "onnx"})
    out, report, output = run_and_read(tmp_path, model_dir)
    [target] = report["targets"]
    assert target["status"] == "passed", (target.get("error"), output[-2000:])
    [proof] = [p for p in target["runtimes"] if p["runtime"] == ST]
    assert proof["status"] == "declined", proof
    assert "'input_ids' has the fixed shape [1, " in proof["detail"] and "`dynamic: true`" in proof["detail"], proof
    assert (out / "onnx" / "modules.json").is_file()  # the folder is still the repo's sentence-transformers model

# ── ViT: optimum image classification and transformers.js ─────────────────────

VIT_RECIPE = {"schema_version": 1, "exports": [
    {"name": "onnx", "export_format": "onnx", "dynamic": True},
    {"name": "tjs", "export_format": "onnx", "dynamic": True, "layout": "transformers.js"}]}


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders-vit")
    model_dir = tiny_vit_classifier_with_image_processor(root / "model", VIT_RECIPE)
    out, report = _export(root, model_dir)
    return model_dir, out, {t["name"]: t for t in report["targets"]}


def _images() -> list[np.ndarray]:
    """Two random RGB images of sizes other than the model's 32 x 32: the processor resizes them."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (40, 36, 3), dtype=np.uint8), rng.integers(0, 256, (24, 48, 3), dtype=np.uint8)]


def _eager_vit(model_dir: Path, images: list[np.ndarray]) -> torch.Tensor:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    pixels = AutoImageProcessor.from_pretrained(model_dir)([Image.fromarray(i) for i in images], return_tensors="pt")
    with torch.no_grad():
        return AutoModelForImageClassification.from_pretrained(model_dir).eval()(**pixels).logits


def test_vit_targets_pass_and_carry_the_preprocessor_config(vit):
    model_dir, out, targets = vit
    assert sorted(targets) == ["onnx", "tjs"]
    for name, target in targets.items():
        assert target["status"] == "passed", (name, target.get("error"))
        saved = out / name / "preprocessor_config.json"
        assert saved.read_bytes() == (model_dir / "preprocessor_config.json").read_bytes(), name
    assert (out / "tjs" / "onnx" / "model.onnx").is_file() and (out / "onnx" / "model.onnx").is_file()


@pytest.fixture(scope="module")
def vit_in_optimum(in_side_env) -> dict[str, dict]:
    """optimum's classification of `_images()` by each ViT target folder alone (`in_side_env`'s process)."""
    return in_side_env["vit"]


@pytest.mark.parametrize("name", ["onnx", "tjs"])
def test_optimum_classifies_a_batch_of_two_images_from_the_folder_alone(vit, vit_in_optimum, name):
    model_dir, _, _ = vit
    images = _images()
    got = vit_in_optimum[name]
    want = _eager_vit(model_dir, images)
    assert got["shape"] == [2, 3, 32, 32]
    np.testing.assert_allclose(np.array(got["logits"]), want.numpy(), atol=ATOL, rtol=RTOL)
    assert np.abs(want.numpy()).max() > 0.1  # logits far from zero: the comparison can fail
    labels = ["cat", "dog", "bird"]
    assert got["labels"] == [labels[int(i)] for i in want.argmax(-1)]


def test_vit_image_classification_pipeline_in_transformers_js_from_its_folder(vit, tmp_path):
    """transformers.js itself, on Node.js: `pipeline('image-classification')` loads the transformers.js-layout folder
    alone (its config's labels, its preprocessor_config.json) and scores each label as the eager model does.
    Installed by `make test-deps`; never skipped."""
    modules = _transformers_js()
    model_dir, out, _ = vit
    alone = _alone(out, "tjs", tmp_path)
    rng = random.Random(1)
    pixels = [rng.randrange(256) for _ in range(32 * 32 * 3)]
    script = Path(modules) / "image.mjs"
    shutil.copyfile(TJS_IMAGE_SCRIPT, script)
    result = subprocess.run(["node", str(script), str(alone.parent), "tjs", "image-classification", "32", "32",
                             json.dumps(pixels)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = {entry["label"]: entry["score"] for entry in json.loads(result.stdout.strip().splitlines()[-1])["result"]}
    image = np.array(pixels, dtype=np.uint8).reshape(32, 32, 3)
    want = torch.softmax(_eager_vit(model_dir, [image])[0], -1).numpy()
    assert sorted(scores) == ["bird", "cat", "dog"]
    np.testing.assert_allclose([scores[label] for label in ["cat", "dog", "bird"]], want, atol=ATOL, rtol=RTOL)
    assert want.max() - want.min() > 0.05  # the labels' scores lie apart: a wrong graph could not match them


def test_vit_exported_model_snippet_runs_as_written(vit, tmp_path):
    """The card's `ExportedModel` snippet prepares an image with the folder's own image processor."""
    from transformers import AutoModelForImageClassification

    model_dir, out, targets = vit
    namespace = _run_snippet(targets["onnx"], _alone(out, "onnx", tmp_path))
    pixels = namespace["processor"](namespace["image"], return_tensors="pt").pixel_values
    with torch.no_grad():
        want = AutoModelForImageClassification.from_pretrained(model_dir).eval()(pixel_values=pixels).logits
    torch.testing.assert_close(namespace["outputs"].logits, want, atol=ATOL, rtol=RTOL)


# ── which sentence-transformers files a target folder gets ────────────────────


def _modules_folder(root: Path, modules: list[dict]) -> Path:
    source = root / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "modules.json").write_text(json.dumps(modules))
    return source


def test_module_folders_named_by_modules_json_are_copied_and_nothing_outside(tmp_path):
    """The configs and weights of each module folder `modules.json` names; a path out of the folder is not followed
    (a finding names its JSON path)."""
    from safetensors.torch import save_file

    from exporters.export.folder_files import complete_folder

    source = _modules_folder(tmp_path, [{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"},
                                        {"path": "../outside"}, {"path": str(tmp_path / "outside")}])
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (source / "2_Dense").mkdir()
    (source / "2_Dense" / "config.json").write_text("{}")
    save_file({"linear.weight": torch.ones(2, 2)}, str(source / "2_Dense" / "model.safetensors"))
    (source / "2_Dense" / "pytorch_model.bin").write_bytes(b"a pickle")  # code when loaded: never copied
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text('{"secret": 1}')
    target = tmp_path / "target"
    target.mkdir()
    notes: list[str] = []
    copied = complete_folder(target, source, notes)
    assert sorted(copied) == ["1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors",
                              "config.json", "modules.json"]
    assert [note.split(":")[0] for note in notes] == ["modules.json[3].path", "modules.json[4].path"], notes
    assert (target / "1_Pooling" / "config.json").read_text() == '{"pooling_mode_cls_token": true}'
    assert not [p for p in target.rglob("*") if p.is_file() and "secret" in p.read_text(errors="ignore")]


@pytest.mark.parametrize("linked", ["folder", "file"])
def test_a_linked_module_folder_or_file_is_refused(tmp_path, linked):
    from exporters.errors import ModelSourceError
    from exporters.export.folder_files import complete_folder

    source = _modules_folder(tmp_path, [{"path": ""}, {"path": "1_Pooling"}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("do not copy me")
    if linked == "folder":
        (source / "1_Pooling").symlink_to(elsewhere)
    else:
        (source / "1_Pooling").mkdir()
        (source / "1_Pooling" / "config.json").symlink_to(elsewhere / "config.json")
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(ModelSourceError, match="1_Pooling.* is a link"):
        complete_folder(target, source, [])
    assert not [p for p in target.rglob("*") if p.is_file() and "do not copy me" in p.read_text()]

"""#26: an ONNX encoder-decoder generation target (Whisper, T5) in the files and names optimum and transformers.js
load: `encoder_model.onnx` + `decoder_model_merged.onnx` (`exporters/export/seq2seq_names.py`, the two traced
decoders merged into one graph with a `use_cache_branch` `If`, weights once: `exporters/export/seq2seq_merged.py`),
and the same under `onnx/` for the transformers.js layout. Exported once per model through the real CLI (both layouts
in one run), validated by our own loop on the merged graph (both branches), loaded from the target folder alone by
optimum's `ORTModelForSpeechSeq2Seq` / `ORTModelForSeq2SeqLM` (the optimum test venv, transformers 4.57) and by
transformers.js on Node.js, whose greedy tokens must be eager's. BART and Marian (optimum's layout only) are loaded by
`ORTModelForSeq2SeqLM` the same way.

`dynamic: true` keeps the batch dynamic (every graph is traced at a batch of 2, the prefill at a decoder prompt of
3 tokens: `exporters.capture.probes.fit_encoder_decoder`; our own greedy parity runs them at batch 1 and one start
token): optimum generates eager's tokens for two waveforms / two texts of different lengths at once (padded, with
attention masks), and for Whisper with a decoder prompt of four tokens, which the merged decoder's no-past branch
runs at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from exporters.publish.snippets import target_snippets
from tests.conftest import ROOT, run_cli
from tests.export_store import MODEL, OUT, exported
from tests.models import T5_RECIPE, T5_SEED, WHISPER_ONNX_RECIPE, tiny_bart, tiny_marian, tiny_t5, tiny_whisper

TARGET = {"export_format": "onnx", "mode": "generation", "dynamic": True}
RECIPE = {"exports": [{"name": "onnx", **TARGET}, {"name": "tjs", **TARGET, "layout": "transformers.js"}]}
ONNX_ONLY = {"exports": [{"name": "onnx", **TARGET}]}
NEW_TOKENS = 8
LAYERS = 2  # two decoder layers: optimum feeds the past by position, layer by layer
MERGED = "decoder_model_merged.onnx"
FILES = {"encoder": "encoder_model.onnx", "prefill": MERGED, "decode": MERGED}
TJS_FILES = {name: f"onnx/{file}" for name, file in FILES.items()}
OPTIMUM_SCRIPT = Path(__file__).with_name("optimum") / "seq2seq.py"
TJS_SCRIPT = Path(__file__).with_name("transformers_js") / "seq2seq.mjs"
AUDIO = (np.random.default_rng(0).standard_normal(8000) * 0.1).astype(np.float32).tolist()
TEXT_IDS = [[70, 12, 5]]
# two inputs of different lengths at once: the batch axis must be dynamic (the graphs are traced at 2, the check
# feeds other lengths), the shorter row padded
AUDIO_BATCH = [(np.random.default_rng(1).standard_normal(n) * 0.1).astype(np.float32).tolist() for n in (9000, 4000)]
TEXT_BATCH = [[44, 8, 61, 25, 90], [3, 55]]
WHISPER_PROMPT = [[1, 50, 51, 52]]  # the decoder start, then three prompt tokens: the no-past decoder runs all four


def _past(prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{side}.{kind}" for i in range(LAYERS) for side in ("decoder", "encoder")
            for kind in ("key", "value")]


def _export(root: Path, build, recipe: dict = RECIPE, **options) -> dict:
    """The model `build` makes, exported through the real CLI once (the shared store: tests/export_store.py); the
    tests only read its folders."""
    done = exported(build(root / "model", recipe, decoder_layers=LAYERS, **options), "run", "--no-bench", MODEL,
                    "--out", OUT, "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    targets, out = done.targets, done.out
    return {"model_dir": done.model_dir, "out": out, "folder": out / "onnx", "tjs": out / "tjs", "targets": targets,
            "target": targets["onnx"]}


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """Whisper in both layouts: the run tests/test_speech_onnx_runtimes.py reads too (the store exports it once)."""
    return _export(tmp_path_factory.mktemp("whisper-optimum"), tiny_whisper, WHISPER_ONNX_RECIPE,
                   feature_extractor=True)


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    """T5 in both layouts, and with `merged: false` (`t5_unmerged`), and the `dynamo` target
    tests/test_complete_components.py reads: one run of four targets (the store exports it once)."""
    return _export(tmp_path_factory.mktemp("t5-optimum"), tiny_t5, T5_RECIPE, seed=T5_SEED)


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """BART (learned positions offset by 2, forced EOS at the last step), optimum's layout only."""
    return _export(tmp_path_factory.mktemp("bart-optimum"), tiny_bart, ONNX_ONLY, seed=3)


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """Marian (sinusoidal positions, scaled embeddings, `final_logits_bias`), optimum's layout only."""
    return _export(tmp_path_factory.mktemp("marian-optimum"), tiny_marian, ONNX_ONLY, seed=7, init_std=0.2)


@pytest.fixture(scope="module")
def t5_unmerged(t5):
    """`merged: false`: the two decoders stay optimum's two files (a target of the `t5` run: #48, one model load and
    one eager reference for the three targets)."""
    return {**t5, "folder": t5["out"] / "onnx-split", "target": t5["targets"]["onnx-split"]}


GREEDY = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False, "num_beams": 1}


def _varied(tokens: list[list[int]]) -> list[list[int]]:
    """The last NEW_TOKENS of each row, checked to vary: a model that repeats one token could hide a wrong past."""
    new = [row[-NEW_TOKENS:] for row in tokens]
    assert all(len(set(row)) > 2 for row in new), new
    return new


def _whisper_generate(model_dir: Path, audio, **extra) -> list[list[int]]:
    """Eager transformers' greedy tokens for `audio` (one waveform or a batch: the feature extractor pads), the last
    NEW_TOKENS of each row."""
    from transformers import AutoFeatureExtractor, WhisperForConditionalGeneration

    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    features = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
    model = WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return _varied(model.generate(input_features=features, **extra, **GREEDY).tolist())


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-padded with `pad`, and their attention mask (as tests/optimum/seq2seq.py pads them)."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask


def _text_generate(model_dir: Path, rows: list[list[int]]) -> list[list[int]]:
    """Eager transformers' greedy tokens for the token `rows` (padded), the last NEW_TOKENS of each row."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    ids, mask = _padded(rows, model.config.pad_token_id)
    assert len(rows) == 1 or not bool(mask.all())  # a batch has a padded row
    with torch.no_grad():
        return _varied(model.generate(input_ids=ids, attention_mask=mask, **GREEDY).tolist())


@pytest.fixture(scope="module")
def whisper_eager(whisper) -> list[list[int]]:
    """Eager transformers' greedy tokens for AUDIO (the last NEW_TOKENS)."""
    return _whisper_generate(whisper["model_dir"], AUDIO)


@pytest.fixture(scope="module")
def t5_eager(t5) -> list[list[int]]:
    """Eager transformers' greedy tokens for TEXT_IDS (the last NEW_TOKENS)."""
    return _text_generate(t5["model_dir"], TEXT_IDS)


def _graph(path: Path) -> tuple[list[str], list[str]]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return [v.name for v in proto.graph.input], [v.name for v in proto.graph.output]


def _external_ranges(path: Path) -> list[tuple[str, int, int]]:
    """(file, offset, length) of every external tensor of the graph at `path`, subgraphs included."""
    import onnx

    from exporters.export.onnx_files import external_data_of, initializers

    proto = onnx.load(str(path), load_external_data=False)
    return [(info["location"], int(info.get("offset", 0)), int(info["length"]))
            for tensor in initializers(proto) if (info := external_data_of(tensor))]


def _io_dims(path: Path) -> dict[str, list]:
    """Each graph input's and output's dims: names for symbolic ones, numbers for fixed ones."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*graph.input, *graph.output)}


def _torch_symbols(path: Path) -> list[str]:
    """torch.export's symbols (`s97`) left in the graph's input and output dims (optimum's names replace them)."""
    import re

    return [str(d) for dims in _io_dims(path).values() for d in dims if re.search(r"\bs\d+\b", str(d))]


def _stored_once(graphs: list[Path]) -> None:
    """Every weight the graphs read is stored once: no two stored ranges hold the same bytes (graphs reading the
    same range share it)."""
    seen: dict[str, tuple] = {}
    for graph in graphs:
        for location, offset, length in set(_external_ranges(graph)):
            where = ((graph.parent / location).resolve(), offset)
            with open(where[0], "rb") as handle:
                handle.seek(offset)
                digest = hashlib.sha256(handle.read(length)).hexdigest() + str(length)
            assert seen.setdefault(digest, where) == where, f"{graph.name}: {location}@{offset} repeats {seen[digest]}"
    assert seen


def _optimum_inputs(names: list[str], mask: list[str]) -> None:
    """The merged decoder's inputs: optimum binds the others by name, the past by position (per layer, self then
    cross attention), and `use_cache_branch` comes last, as optimum's `merge_decoders` puts it."""
    past = _past("past_key_values")
    assert names[-1] == "use_cache_branch"
    assert [n for n in names if n.startswith("past_key_values.")] == past
    assert sorted(n for n in names[:-1] if n not in past) == sorted(["input_ids", "encoder_hidden_states", *mask])


def _check_merged_graph(path: Path, mask: list[str]) -> None:
    """The merged decoder: optimum's inputs (past in its order, `use_cache_branch` last) and outputs, one `If`
    whose branches are the no-past and with-past decoders, large weights in the outer graph only, past dims the
    runtimes can feed empty (`batch_size`, symbolic sequence axes)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    _optimum_inputs([v.name for v in graph.input], mask)
    branch = graph.input[-1].type.tensor_type
    assert branch.elem_type == onnx.TensorProto.BOOL and [d.dim_value for d in branch.shape.dim] == [1]
    outputs = [v.name for v in graph.output]
    assert outputs[0] == "logits" and sorted(n for n in outputs if n.startswith("present.")) == sorted(
        _past("present"))
    assert [n.op_type for n in graph.node] == ["If"]
    branches = {a.name: a.g for a in graph.node[0].attribute}
    assert set(branches) == {"then_branch", "else_branch"}
    assert all([o.name for o in g.output] == outputs for g in branches.values())
    # the with-past branch reads the past, the no-past one does not
    reads = {name: {i for n in g.node for i in n.input} for name, g in branches.items()}
    assert "past_key_values.0.decoder.key" in reads["then_branch"]
    assert not [i for i in reads["else_branch"] if i.startswith("past_key_values.")]
    for g in branches.values():  # only scalars and 1-D integer tensors stay in a branch (as optimum keeps them)
        assert all(len(t.dims) == 0 or (len(t.dims) == 1 and t.data_type in (6, 7)) for t in g.initializer)
    assert len({t.name for t in graph.initializer}) == len(graph.initializer) > 0
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    # a batch and a decoder prompt of any size (the no-past branch runs a prompt of several tokens at once)
    assert dims["input_ids"] == ["batch_size", "decoder_sequence_length"], dims["input_ids"]
    assert dims["encoder_hidden_states"][:2] == ["batch_size", "encoder_sequence_length"]
    for value in graph.input:
        if value.name.startswith("past_key_values."):
            dims = value.type.tensor_type.shape.dim
            assert dims[2].dim_param in ("past_decoder_sequence_length", "encoder_sequence_length_out"), value
            assert dims[0].dim_param == "batch_size", value  # `dynamic: true`: the batch too
            assert all(d.dim_value for d in (dims[1], dims[3])), value  # heads, head size: fixed numbers
    onnx.checker.check_model(str(path), full_check=True)


@pytest.mark.parametrize("name", ["whisper", "t5", "bart", "marian"])
def test_the_folder_has_optimums_files_and_names_and_our_checks_ran_on_them(name, request):
    exported = request.getfixturevalue(name)
    folder, target = exported["folder"], exported["target"]
    assert target["status"] == "passed" and target["unverified"] == []
    assert [c["name"] for c in target["components"]] == ["encoder", "prefill", "decode"]
    assert all(c["verdict"] == "passed" for c in target["components"])
    # our checks ran the merged file: its no-past branch as `prefill`, its with-past branch as `decode`
    assert all(any(MERGED in note for note in c["structural"]) for c in target["components"][1:])
    assert target["generation"]["status"] == "passed"  # our greedy parity ran through the merged graph
    # traced at a batch of 2 (the prefill at a prompt of 3 tokens); our greedy parity ran them at batch 1, one token
    for component in ("encoder", "prefill", "decode"):
        assert f"{component}: the batch is traced at size 2" in " ".join(target["findings"]), target["findings"]
    assert "prefill: the decoder prompt is traced at 3 tokens" in " ".join(target["findings"])
    assert sorted(p.name for p in folder.glob("*.onnx")) == sorted(set(FILES.values()))  # no separate decoders
    assert {Path(f["path"]).name for f in target["files"]} >= set(FILES.values())
    manifest = json.loads((folder / "export.json").read_text())
    assert {c: e["file"] for c, e in manifest["components"].items()} == FILES
    assert manifest["components"]["prefill"]["branch"] is False and manifest["components"]["decode"]["branch"]
    # the weights are stored once, beside the encoder; the merged decoder points there
    assert (folder / "encoder_model.onnx.data").stat().st_size > 0
    assert (folder / f"{MERGED}.data").stat().st_size == 0
    assert {location for location, _, _ in _external_ranges(folder / MERGED)} == {"encoder_model.onnx.data"}
    _stored_once([folder / FILES["encoder"], folder / MERGED])

    encoder_in, encoder_out = _graph(folder / FILES["encoder"])
    assert encoder_out == ["last_hidden_state"]
    assert encoder_in == (["input_features"] if name == "whisper" else ["input_ids", "attention_mask"])
    import onnx

    encoder = onnx.load(str(folder / FILES["encoder"]), load_external_data=False).graph
    assert all(v.type.tensor_type.shape.dim[0].dim_param for v in (*encoder.input, *encoder.output))  # batch: any
    # optimum's dim names, one symbol per axis (torch gave T5's ids and mask a symbol each)
    dims = _io_dims(folder / FILES["encoder"])
    if name == "whisper":  # the frames are fixed (Whisper's encoder takes its full window)
        assert dims["input_features"][0] == dims["last_hidden_state"][0] == "batch_size", dims
    else:
        assert dims["input_ids"] == dims["attention_mask"] == ["batch_size", "encoder_sequence_length"], dims
        assert dims["last_hidden_state"][:2] == ["batch_size", "encoder_sequence_length"], dims
    for graph in (FILES["encoder"], MERGED):
        assert not _torch_symbols(folder / graph), (graph, _io_dims(folder / graph))
    mask = [] if name == "whisper" else ["encoder_attention_mask"]
    _check_merged_graph(folder / MERGED, mask)
    merged_in, merged_out = _graph(folder / MERGED)
    assert not [n for n in (*merged_in, *merged_out)
                if n.startswith(("input.", "output.", "cache.", "decoder_input_ids", "encoder_outputs"))]
    # export.json maps every renamed input back to upstream's leaf, for our own loader
    decode_map = manifest["components"]["decode"]["inputs"]
    assert decode_map["input_ids"] == "decoder_input_ids"
    assert decode_map["encoder_hidden_states"] == "encoder_outputs.last_hidden_state"
    assert decode_map["past_key_values.1.encoder.value"] == "cache.cross_attention_cache.layers.1.values"
    assert decode_map["past_key_values.0.decoder.key"] == "cache.self_attention_cache.layers.0.keys"
    assert not [n for n in manifest["components"]["prefill"]["inputs"] if n.startswith("past_key_values.")]
    # upstream's ExportedModel binds its own leaf names: the model card offers no snippet that could not run
    assert [runtime for runtime, _, _ in target_snippets("org/model", target)] == []


@pytest.mark.parametrize("name", ["whisper", "t5"])
def test_the_transformers_js_folder_has_its_graphs_under_onnx_each_with_its_own_data(name, request):
    exported = request.getfixturevalue(name)
    folder, target = exported["tjs"], exported["targets"]["tjs"]
    assert target["status"] == "passed" and target["unverified"] == [], target.get("error")
    assert target["generation"]["status"] == "passed"
    manifest = json.loads((folder / "export.json").read_text())
    assert {c: e["file"] for c, e in manifest["components"].items()} == TJS_FILES
    assert manifest["layout"] == "transformers.js"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.onnx*")) == [
        "onnx/decoder_model_merged.onnx", "onnx/decoder_model_merged.onnx_data", "onnx/encoder_model.onnx",
        "onnx/encoder_model.onnx_data"]
    # the browser build mounts each session's external data as `{file}_data`: each graph reads its own file only
    for graph in ("encoder_model.onnx", MERGED):
        assert {loc for loc, _, _ in _external_ranges(folder / "onnx" / graph)} == {f"{graph}_data"}
        _stored_once([folder / "onnx" / graph])
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"] == {
        "dtype": "fp32", "use_external_data_format": {"encoder_model.onnx": 1, MERGED: 1}}
    for extra in (["preprocessor_config.json"] if name == "whisper" else []) + ["generation_config.json"]:
        assert (folder / extra).is_file()
    _check_merged_graph(folder / "onnx" / MERGED, [] if name == "whisper" else ["encoder_attention_mask"])


def test_no_export_child_builds_torchlibs_registry_again(t5, whisper):
    """torch.onnx builds its registry of torchlib's functions at every export (logging that torchvision is missing
    each time): once per component of each target that exports. The run builds it once before it forks the export
    children (`exporters.upstream.torchlib_registry_ready`), which copy it. Each run's first ONNX target translates
    its graphs; its twins (`exporters.run.twins`: the same components and settings) copy them and translate none."""
    for run, exporting, twins in ((t5, "onnx", ("tjs", "onnx-split")), (whisper, "tjs", ("onnx",))):
        for name in (exporting, *twins):
            log = (run["out"] / "logs" / f"{name}.log").read_text()
            translated = "Translate the graph into ONNX" in log
            assert translated == (name == exporting), f"{name}: the export child's log"
            assert "torchvision is not installed" not in log, f"{name}: the registry was built in the export child"


def test_t5s_generation_parity_compares_tokens_that_vary(t5):
    """Our greedy parity on every target of the T5 run compares eight tokens with at least three distinct ones
    (T5_SEED): a wrong past or a wrong branch changes them, where one token repeated eight times could hide it."""
    for name, target in t5["targets"].items():
        generation = target["generation"]
        assert generation["status"] == "passed", (name, generation)
        tokens = generation["eager_tokens"][0]
        assert len(tokens) == NEW_TOKENS and generation["exported_tokens"][0][:NEW_TOKENS] == tokens, (name, generation)
        assert len(set(tokens)) > 2, (name, tokens)


def test_our_loader_runs_both_branches_of_the_merged_decoder_as_eager_does(t5):
    """`load_exported` binds the merged graph by upstream's leaf names (`RenamedRunner`) and feeds its branch: the
    prefill (`use_cache_branch` false, the past fed empty) and one decode step on the prefill's cache (true) give
    eager's logits."""
    from transformers import AutoModelForSeq2SeqLM, DynamicCache, EncoderDecoderCache

    from exporters.upstream import load_exported, run_component

    model = AutoModelForSeq2SeqLM.from_pretrained(t5["model_dir"]).eval()
    exported = load_exported(t5["folder"], config=model.config)
    ids = torch.tensor([[5, 17, 9, 33, 41, 8]])
    mask = torch.ones_like(ids)
    start = torch.tensor([[model.config.decoder_start_token_id]])
    step = torch.tensor([[42]])
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
        first = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=start, use_cache=True)
        second = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=step,
                       past_key_values=first.past_key_values).logits
    got = run_component(exported.runners["prefill"], {
        "decoder_input_ids": start, "encoder_outputs": encoded, "attention_mask": mask,
        "cache": EncoderDecoderCache(DynamicCache(), DynamicCache())})
    np.testing.assert_allclose(got.logits.numpy(), first.logits.numpy(), atol=1e-4, rtol=1e-3)
    after = run_component(exported.runners["decode"], {
        "decoder_input_ids": step, "encoder_outputs": encoded, "attention_mask": mask,
        "cache": got.past_key_values})
    np.testing.assert_allclose(after.logits.numpy(), second.numpy(), atol=1e-4, rtol=1e-3)
    assert not np.allclose(after.logits.numpy(), got.logits.numpy(), atol=1e-3)  # another step, other logits


def _optimum(runs: list[dict], tmp_path: Path) -> list:
    """optimum's greedy tokens for each job of each run (`{"folder", "kind", "jobs"}`), each folder loaded alone
    (once), in one process of the optimum test venv (`make test-deps`; HF_EXPORT_OPTIMUM_PYTHON names another
    interpreter that has optimum-onnx): a list of results, or `{"error": traceback}`, per run. Never skipped."""
    from exporters.layouts.child import SIDE_PYTHON, SIDE_PYTHON_SETTING  # the optimum venv, as the product finds it

    python = os.environ.get(SIDE_PYTHON_SETTING) or str(SIDE_PYTHON)
    if not Path(python).is_file():
        pytest.fail("optimum is not installed: run `make test-deps` (.cache/optimum-venv, pinned by "
                    "tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python with optimum-onnx")
    inputs = tmp_path / "runs.json"
    inputs.write_text(json.dumps(runs))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([python, str(OPTIMUM_SCRIPT), str(inputs), str(NEW_TOKENS)],
                            capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# What optimum generates from each folder: one optimum process runs them all, each folder loaded once (#48: the
# runtime's imports paid once for the module, not once per folder or test); each test reads its own job's result.
OPTIMUM_JOBS = {
    "whisper": ("speech", {"one": AUDIO, "batch": AUDIO_BATCH,
                           "prompt": {"inputs": AUDIO, "decoder_input_ids": WHISPER_PROMPT}}),
    **{name: ("text", {"one": TEXT_IDS, "batch": TEXT_BATCH}) for name in ("t5", "bart", "marian")},
    "t5_unmerged": ("text", {"batch": TEXT_BATCH}),
}


@pytest.fixture(scope="module")
def optimum(whisper, t5, bart, marian, t5_unmerged, tmp_path_factory):
    """`optimum(name, exported, job)`: optimum's result for that job (OPTIMUM_JOBS) on the folder of `exported`."""
    folders = {"whisper": whisper, "t5": t5, "bart": bart, "marian": marian, "t5_unmerged": t5_unmerged}
    runs = [{"folder": str(folders[name]["folder"]), "kind": kind, "jobs": list(jobs.values())}
            for name, (kind, jobs) in OPTIMUM_JOBS.items()]
    results = _optimum(runs, tmp_path_factory.mktemp("optimum"))
    done = {name: results[i] for i, name in enumerate(OPTIMUM_JOBS)}

    def get(name: str, exported: dict, job: str) -> dict:
        assert str(exported["folder"]) == str(folders[name]["folder"])
        assert "error" not in done[name], f"optimum on {name}: {done[name]['error'][-3000:]}"
        return dict(zip(OPTIMUM_JOBS[name][1], done[name]))[job]

    return get


def _optimum_loaded_the_merged_decoder(got: dict, mask: list[str]) -> None:
    assert got["files"] == {"encoder": FILES["encoder"], "decoder": MERGED} and got["merged"] is True
    _optimum_inputs(got["inputs"]["decoder"], mask)


def test_optimum_speech_seq2seq_generates_what_eager_generates(whisper, whisper_eager, optimum):
    got = optimum("whisper", whisper, "one")
    _optimum_loaded_the_merged_decoder(got, [])
    assert [row[-NEW_TOKENS:] for row in got["tokens"]] == whisper_eager


@pytest.mark.parametrize("name", ["t5", "bart", "marian"])
def test_optimum_seq2seq_lm_generates_what_eager_generates(name, request, optimum):
    exported = request.getfixturevalue(name)
    want = request.getfixturevalue("t5_eager") if name == "t5" else _text_generate(exported["model_dir"], TEXT_IDS)
    got = optimum(name, exported, "one")
    _optimum_loaded_the_merged_decoder(got, ["encoder_attention_mask"])
    assert [row[-NEW_TOKENS:] for row in got["tokens"]] == want


def test_optimum_speech_seq2seq_generates_a_batch_of_two_waveforms_as_eager_does(whisper, optimum):
    """Two waveforms of different lengths at once (the extractor pads them): the batch axis of every graph is
    dynamic, and each row's greedy tokens are eager's on the same batch."""
    want = _whisper_generate(whisper["model_dir"], AUDIO_BATCH)
    got = optimum("whisper", whisper, "batch")
    _optimum_loaded_the_merged_decoder(got, [])
    assert got["batch"] == 2 and [row[-NEW_TOKENS:] for row in got["tokens"]] == want
    assert want[0] != want[1]  # two inputs, two answers: a batch that mixed its rows up would show


@pytest.mark.parametrize("name", ["t5", "bart", "marian"])
def test_optimum_seq2seq_lm_generates_a_padded_batch_of_two_texts_as_eager_does(name, request, optimum):
    """Two texts of different lengths at once, the shorter right-padded with its attention mask 0 there: each row's
    greedy tokens are eager's on the same padded batch (BART and Marian: with the forced EOS at the last step)."""
    exported = request.getfixturevalue(name)
    want = _text_generate(exported["model_dir"], TEXT_BATCH)
    got = optimum(name, exported, "batch")
    _optimum_loaded_the_merged_decoder(got, ["encoder_attention_mask"])
    assert got["batch"] == 2 and [row[-NEW_TOKENS:] for row in got["tokens"]] == want
    assert want[0] != want[1]


def test_optimum_whisper_with_a_decoder_prompt_of_four_tokens_generates_what_eager_generates(whisper, optimum):
    """`generate(input_features, decoder_input_ids=...)` with four start tokens (the decoder start, then a prompt,
    as forced language and task tokens are): the merged decoder's no-past branch runs the four at once, then the
    with-past branch steps on (generate's first call has no past: it feeds the whole prompt, a length the graph
    was not traced with); the tokens are eager's."""
    want = _whisper_generate(whisper["model_dir"], AUDIO, decoder_input_ids=torch.tensor(WHISPER_PROMPT))
    got = optimum("whisper", whisper, "prompt")
    _optimum_loaded_the_merged_decoder(got, [])
    assert [row[-NEW_TOKENS:] for row in got["tokens"]] == want


def _transformers_js(exported: dict, kind: str, data, tmp_path: Path) -> list[int]:
    """transformers.js's greedy tokens for `data` from the `tjs` target folder alone, on Node.js (`make test-deps`
    installs the pinned version into .cache/transformers-js; HF_EXPORT_TRANSFORMERS_JS names another folder holding
    its node_modules). Never skipped: without it the test fails saying how to install it."""
    from exporters.layouts.transformers_js import home  # HF_EXPORT_TRANSFORMERS_JS, else .cache

    modules = str(home())
    if shutil.which("node") is None or not (Path(modules) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps` (Node.js and the pinned "
                    "@huggingface/transformers in .cache/transformers-js), or set HF_EXPORT_TRANSFORMERS_JS to a folder "
                    "with node_modules/@huggingface/transformers")
    script = Path(modules) / TJS_SCRIPT.name
    shutil.copyfile(TJS_SCRIPT, script)
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps(data))
    result = subprocess.run(["node", str(script), str(exported["out"]), "tjs", kind, str(inputs), str(NEW_TOKENS)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_transformers_js_whisper_generates_what_eager_generates(whisper, whisper_eager, tmp_path):
    """The folder's own preprocessor_config.json makes the log-mel features in JavaScript; transformers.js's
    Seq2Seq loop runs `decoder_model_merged.onnx` (empty past first, then its presents)."""
    got = _transformers_js(whisper, "speech", AUDIO, tmp_path)
    assert len(got) == 1 + NEW_TOKENS  # the decoder start token, then the generated ones
    assert [got[-NEW_TOKENS:]] == whisper_eager


def test_transformers_js_t5_generates_what_eager_generates(t5, t5_eager, tmp_path):
    got = _transformers_js(t5, "text", TEXT_IDS[0], tmp_path)
    assert [got[-NEW_TOKENS:]] == t5_eager


def _decoder_pair(folder: Path):
    """Two hand-built decoders as two traces name them: the no-past one's `w` is the with-past one's `v`, its `w`
    other bytes, and its `h` (a node output) the name of the no-past one's initializer; the big weights in one
    external file, as `share_external_data` leaves them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shared, other = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    data = folder / "weights.data"
    data.write_bytes(shared.tobytes() + other.tobytes())

    def external(name: str, offset: int):
        tensor = numpy_helper.from_array(np.zeros((4, 4), np.float32), name)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data.name), ("offset", str(offset)), ("length", "64")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, [1, 4])
    past = helper.make_tensor_value_info("past_key_values.0.decoder.key", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])
    no_past = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["input_ids", "h"], ["logits"])], "no_past", [x], [y], [external("h", 0)]),
        opset_imports=[helper.make_opsetid("", 17)])
    with_past = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["input_ids", "v"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["a"]),
         helper.make_node("Add", ["a", "past_key_values.0.decoder.key"], ["logits"])], "with_past", [x, past], [y],
        [external("v", 0), external("w", 64)]), opset_imports=[helper.make_opsetid("", 17)])
    return no_past, with_past, shared, other


def test_merging_two_decoders_stores_equal_weights_once_and_runs_both_branches(tmp_path):
    """`merge_decoders` on two graphs whose names clash: the weight both hold (under other names) is stored once,
    no outer name shadows a branch's value, and each branch computes what its decoder computes."""
    import onnx
    import onnxruntime as ort

    from exporters.export.seq2seq_merged import merge_decoders

    no_past, with_past, shared, other = _decoder_pair(tmp_path)
    merged = merge_decoders(no_past, with_past, tmp_path)
    onnx.save_model(merged, str(tmp_path / "merged.onnx"))
    onnx.checker.check_model(str(tmp_path / "merged.onnx"), full_check=True)
    outer = {t.name: {e.key: e.value for e in t.external_data}["offset"] for t in merged.graph.initializer}
    assert sorted(outer.values()) == ["0", "64"]  # two distinct weights, from three initializers
    branch_values = {o for a in merged.graph.node[0].attribute for n in a.g.node for o in n.output}
    assert not set(outer) & branch_values  # the with-past branch's `h` is not shadowed by the outer weight
    assert [v.name for v in merged.graph.input] == ["input_ids", "past_key_values.0.decoder.key", "use_cache_branch"]
    session = ort.InferenceSession(str(tmp_path / "merged.onnx"))
    x = np.arange(4, dtype=np.float32)[None] / 4
    add = np.full((1, 4), 0.5, np.float32)
    feed = {"input_ids": x, "past_key_values.0.decoder.key": add}
    first = session.run(None, {**feed, "use_cache_branch": np.array([False])})[0]
    later = session.run(None, {**feed, "use_cache_branch": np.array([True])})[0]
    np.testing.assert_allclose(first, x @ shared, rtol=1e-6)
    np.testing.assert_allclose(later, x @ shared @ other + add, rtol=1e-5)


def test_a_decode_graph_with_a_fixed_past_keeps_upstreams_names_and_says_why(tmp_path):
    """A static cache fixes the decode graph's past length, which optimum cannot feed: the files and names stay
    upstream's, and the report says why."""
    recipe = {"exports": [{"export_format": "onnx", "mode": "generation"}],
              "generation": {"cache_implementation": "static", "max_cache_len": 16}}
    model_dir = tiny_t5(tmp_path / "model", recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed"
    assert sorted(p.name for p in (out / "onnx").glob("*.onnx")) == ["decode.onnx", "encoder.onnx", "prefill.onnx"]
    assert any("has a fixed length" in f and "optimum" in f for f in target["findings"]), target["findings"]


UNMERGED_FILES = {"encoder": "encoder_model.onnx", "prefill": "decoder_model.onnx",
                  "decode": "decoder_with_past_model.onnx"}


def test_merged_false_keeps_optimums_two_decoders_validated_and_optimum_generates_eagers_tokens(t5_unmerged,
                                                                                                optimum):
    """`merged: false` on an encoder-decoder: `encoder_model.onnx` + `decoder_model.onnx` (no past) +
    `decoder_with_past_model.onnx`, in optimum's names, validated by our own loop (every component, greedy parity),
    and optimum's `ORTModelForSeq2SeqLM` loads the two decoders (not merged) and generates eager's tokens for a padded
    batch of two texts."""
    folder, target = t5_unmerged["folder"], t5_unmerged["target"]
    assert target["status"] == "passed" and target["unverified"] == [], target.get("error")
    assert [(c["name"], c["verdict"]) for c in target["components"]] == [
        ("encoder", "passed"), ("prefill", "passed"), ("decode", "passed")]
    assert target["generation"]["status"] == "passed"
    assert sorted(p.name for p in folder.glob("*.onnx")) == sorted(UNMERGED_FILES.values())
    manifest = json.loads((folder / "export.json").read_text())
    assert {c: e["file"] for c, e in manifest["components"].items()} == UNMERGED_FILES
    assert not [e for e in manifest["components"].values() if "branch" in e]
    # every weight stored once, beside the encoder: both decoders read that file
    for graph in UNMERGED_FILES.values():
        assert {location for location, _, _ in _external_ranges(folder / graph)} == {"encoder_model.onnx.data"}
    _stored_once([folder / graph for graph in UNMERGED_FILES.values()])
    for graph in UNMERGED_FILES.values():
        assert not _torch_symbols(folder / graph), (graph, _io_dims(folder / graph))
    assert _io_dims(folder / "decoder_model.onnx")["input_ids"] == ["batch_size", "decoder_sequence_length"]
    past = _io_dims(folder / "decoder_with_past_model.onnx")["past_key_values.0.decoder.key"]
    assert past[0] == "batch_size" and past[2] == "past_decoder_sequence_length", past
    no_past, _ = _graph(folder / "decoder_model.onnx")
    with_past, outputs = _graph(folder / "decoder_with_past_model.onnx")
    assert sorted(no_past) == ["encoder_attention_mask", "encoder_hidden_states", "input_ids"]
    assert [n for n in with_past if n.startswith("past_key_values.")] == _past("past_key_values")
    assert outputs[0] == "logits" and sorted(n for n in outputs if n.startswith("present.")) == sorted(
        _past("present"))
    got = optimum("t5_unmerged", t5_unmerged, "batch")
    assert got["merged"] is False and got["files"] == {"encoder": "encoder_model.onnx",
                                                       "decoder": "decoder_model.onnx",
                                                       "decoder_with_past": "decoder_with_past_model.onnx"}
    assert [n for n in got["inputs"]["decoder_with_past"] if n.startswith("past_key_values.")] == _past(
        "past_key_values")
    want = _text_generate(t5_unmerged["model_dir"], TEXT_BATCH)
    assert got["batch"] == 2 and [row[-NEW_TOKENS:] for row in got["tokens"]] == want


def test_a_sliding_window_encoder_decoder_merged_decoder_takes_only_runtime_names(tmp_path):
    """T5Gemma's decoder cache has sliding-window layers whose window upstream flattens into a graph input
    (`..._sliding_window_tensor`); it is folded into the constant it is, and every input of the merged decoder is
    one optimum, ONNX Runtime and transformers.js feed (#50 item 4). Before: "The graph takes [...] don't hold"."""
    import dataclasses

    import onnx
    import torch

    from exporters.export.seq2seq_names import foreign_inputs
    from matrix.families import FAMILIES, build, tiny_model

    # one encoder layer: the window is the decoder cache's, whose two layer types stay (#48: a smaller encoder graph)
    spec = dataclasses.replace(FAMILIES["t5gemma"], overrides={**FAMILIES["t5gemma"].overrides,
                                                               "encoder.num_hidden_layers": 1,
                                                               "encoder.layer_types": ["sliding_attention"]})
    model = tiny_model(spec)
    assert model.config.decoder.layer_types == ["sliding_attention", "full_attention"], model.config.decoder
    ids = torch.randint(0, 200, (1, 8))
    assert len(set(model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)[0].tolist())) > 2
    recipe = {"schema_version": 1, "generation": {"max_new_tokens": 16},
              "exports": [{"name": "onnx", "export_format": "onnx", "dynamic": True}]}
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed", target["error"]
    assert result.returncode == 0
    generation = target["generation"]
    assert generation["status"] == "passed" and len(set(generation["eager_tokens"][0])) > 1, generation
    assert generation["prompt_length"] + len(generation["eager_tokens"][0]) > 12, "decoding crossed the window"
    proto = onnx.load(out / "onnx" / "decoder_model_merged.onnx", load_external_data=False)
    assert foreign_inputs(proto) == [], [i.name for i in proto.graph.input]
    assert "use_cache_branch" in [i.name for i in proto.graph.input]

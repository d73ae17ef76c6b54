"""Weights stored once per target, the merged generation graph and the transformers.js layout (issues #19, #15 §1).

One run of the real CLI on a tiny Llama exports every target once; the tests read the files it wrote with the
formats' own readers (ONNX protobufs, ExecuTorch's flatbuffer deserializer, the `.pt2` zip) and run the artifacts
against the eager model themselves, independently of the pipeline's validation. The ExecuTorch target `et` (a prefill
and a decode method in one program) is tests/test_pipeline_llm.py's: the same target of the same model, read from that
module's run in the shared export store (#48: exported once in the suite, not once per module).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, run_cli, run_plainest_executorch
from tests.export_store import MODEL, OUT, exported
from tests.models import family_model, tiny_llama
from tests.test_pipeline_llm import RECIPE as LLM_RECIPE, llm_export

ROOT = Path(__file__).resolve().parents[1]

# the ExecuTorch target, a prefill method whose prompt is dynamic and a decode method whose cache is `auto`:
# tests/test_pipeline_llm.py's run exports it (`et_run`), with the same inputs and generation settings as RECIPE's
ET = next(target for target in LLM_RECIPE["exports"] if target["name"] == "et")
RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True},  # merged by default
        {"name": "onnx-split", "export_format": "onnx", "mode": "generation", "dynamic": True, "merged": False},
        {"name": "dynamo", "export_format": "dynamo", "mode": "generation"},  # the plainest: merged by default
        {"name": "dynamo-dynamic", "export_format": "dynamo", "mode": "generation", "dynamic": True},  # merged too
        {"name": "dynamo-split", "export_format": "dynamo", "mode": "generation", "dynamic": True, "merged": False},
        {"name": "tjs", "export_format": "onnx", "mode": "generation", "layout": "transformers.js"},
    ],
    "inputs": {"sequence_length": 6},
    "generation": {"max_new_tokens": 6},
}
# the recipe the `et` folder was exported with besides RECIPE's targets: `hf-export validate` of all of them reads it
FULL_RECIPE = {**RECIPE, "exports": [*RECIPE["exports"][:5], ET, *RECIPE["exports"][5:]]}
assert {k: v for k, v in LLM_RECIPE.items() if k != "exports"} == {k: v for k, v in RECIPE.items() if k != "exports"}
MERGED = ["onnx", "dynamo", "dynamo-dynamic", "tjs"]
LAYERS = 1  # one decoder layer: every check here reads weights, files and graphs, none the depth (#48: a cheaper trace)
PROMPT = [5, 9, 13, 40, 77, 101]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every target, benchmarked, exported once (the shared store, tests/export_store.py: the tests only read)."""
    done = exported(tiny_llama(tmp_path_factory.mktemp("weights-once") / "model", RECIPE, layers=LAYERS), "run", MODEL,
                    "--out", OUT, "--quiet")
    return done.model_dir, done.out, done.result, done.targets


@pytest.fixture(scope="module")
def et_run(tmp_path_factory):
    """The `et` target's run: tests/test_pipeline_llm.py's (the same model: one layer, the same seed), stored once."""
    return llm_export(tmp_path_factory.mktemp("llm"))


def folder_of(run, et_run, name: str) -> tuple[Path, dict]:
    """Where target `name` was written and its report entry: `et` in `et_run`, every other target in `run`."""
    if name == ET["name"]:
        return et_run.out, et_run.targets[name]
    return run[1], run[3][name]


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    """The eager model the run exported (the same seed builds the same weights), without waiting for the run."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama(tmp_path_factory.mktemp("eager"), None,
                                                           layers=LAYERS)).eval()


def parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ── weight bytes as each format's own reader sees them ────────────────────────


def onnx_weight_files(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.name.endswith((".onnx.data", ".onnx_data")))


def pte_weights(path: Path) -> int:
    """Unique named-data buffers (delegate weights) plus the constant buffers, from ExecuTorch's deserializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(path.read_bytes())
    named = sum(len(bytes(buffer)) for buffer in pte.named_data.buffers) if pte.named_data else 0
    return named + sum(len(buffer.storage) for buffer in pte.program.constant_buffer)


def pt2_weights(path: Path) -> int:
    with zipfile.ZipFile(path) as archive:
        return sum(i.file_size for i in archive.infolist()
                   if "data/weights/" in i.filename and not i.filename.endswith(".json"))


def stored_weights(directory: Path, export_format: str) -> int:
    if export_format == "onnx":
        return onnx_weight_files(directory)
    if export_format == "executorch":
        return sum(pte_weights(p) for p in directory.glob("*.pte"))
    return sum(pt2_weights(p) for p in directory.glob("*.pt2"))


# ── driving a merged graph by hand ────────────────────────────────────────────


def merged_call(runner, ids: torch.Tensor, start: int, cache) -> dict:
    feed = {"input_ids": ids, "position_ids": torch.arange(start, start + ids.shape[1])[None], "cache": cache,
            "attention_mask": torch.ones(ids.shape[0], start + ids.shape[1], dtype=torch.long)}
    return runner(**{k: v for k, v in feed.items() if k in runner.metadata.kwargs})


def empty_cache(model, batch: int = 1):
    from transformers import DynamicCache

    config = model.config
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        cache.update(torch.empty(batch, heads, 0, dim), torch.empty(batch, heads, 0, dim), layer)
    return cache


def load(out: Path, name: str):
    from exporters.upstream import load_exported

    return load_exported(out / name, allow_pickles=True)


# ── the tests ─────────────────────────────────────────────────────────────────


def test_every_target_passes_validation_and_generation_parity(run, et_run):
    _, out, result, targets = run
    assert result.returncode == 0, result.stderr[-3000:]
    assert et_run.returncode == 0, et_run.stderr[-3000:]
    for name, target in {**targets, ET["name"]: et_run.target(ET["name"])}.items():
        assert target["status"] == "passed", (name, target["error"])
        assert target["generation"]["status"] == "passed", (name, target["generation"])
        assert target["generation"]["eager_tokens"] == target["generation"]["exported_tokens"]
        assert len(set(target["generation"]["exported_tokens"][0])) > 1  # the check could fail
    assert not list(out.glob(".staging-*"))


@pytest.mark.parametrize("name", ["onnx", "onnx-split", "dynamo", "dynamo-dynamic", "et", "tjs"])
def test_each_target_stores_its_weights_once(run, et_run, eager, name):
    out, target = folder_of(run, et_run, name)
    parameters = parameter_bytes(eager)
    stored = stored_weights(out / name, target["export_format"])
    assert abs(stored - parameters) <= 0.05 * parameters, (name, stored, parameters)
    # the report's numbers agree with the formats' own readers
    assert target["parameter_bytes"] == parameters
    assert abs(target["weights_stored_bytes"] - stored) <= 0.05 * parameters
    assert target["total_bytes"] == sum(f["size"] for f in target["files"])
    assert not any("parameter bytes" in f for f in target["findings"])


def test_onnx_holds_every_parameter_bytes_for_bytes(run, eager):
    """The merged ONNX graph holds each parameter's own bytes: a linear's weight as the transpose its `MatMul`
    takes (written a block at a time, `exporters.upstream.transposed_weights_written_in_blocks`), every other
    parameter as it is; read back with onnx's own reader."""
    import onnx
    from onnx import numpy_helper

    _, out, _, _ = run
    graph = onnx.load(str(out / "onnx" / "model.onnx")).graph  # the weights read from the external-data file
    stored = {(tuple(a.shape), a.tobytes()) for a in map(numpy_helper.to_array, graph.initializer)}
    for name, parameter in eager.named_parameters():
        value = parameter.detach()
        linear = name.endswith("proj.weight") or name == "lm_head.weight"
        want = value.t().contiguous() if linear else value
        assert (tuple(want.shape), want.numpy().tobytes()) in stored, name


def test_separate_dynamo_programs_duplicate_the_weights_and_the_report_says_so(run, eager):
    _, out, _, targets = run
    target = targets["dynamo-split"]
    parameters = parameter_bytes(eager)
    assert sorted(p.name for p in (out / "dynamo-split").glob("*.pt2")) == ["decode.pt2", "prefill.pt2"]
    assert stored_weights(out / "dynamo-split", "dynamo") >= 1.9 * parameters
    finding = next(f for f in target["findings"] if "parameter bytes" in f)
    assert "2.00x" in finding and "merged" in finding


def test_separate_dynamo_programs_hold_their_weights_once_when_loaded(run):
    """Validation loads both `.pt2` programs of a split target: equal weights are one tensor in memory, and a weight
    that differs is never shared."""
    from exporters.upstream import share_identical_weights

    _, out, _, _ = run
    loaded = load(out, "dynamo-split")
    prefill, decode = loaded.components["prefill"].program, loaded.components["decode"].program
    names = prefill.graph_signature.parameters
    assert names and all(decode.state_dict[n] is prefill.state_dict[n] for n in names)
    runner = loaded._runners["decode"]
    assert runner.module.get_parameter(names[0]) is prefill.state_dict[names[0]]  # what the decode runner computes with

    again = load(out, "dynamo-split").components["decode"].program
    changed = again.state_dict[names[0]]
    with torch.no_grad():
        changed.add_(1.0)
    pool = {name: prefill.state_dict[name] for name in names}
    freed = share_identical_weights(again, pool)
    assert again.state_dict[names[0]] is changed
    assert all(again.state_dict[n] is prefill.state_dict[n] for n in names[1:])
    assert freed == sum(prefill.state_dict[n].nbytes for n in names[1:])


def test_onnx_components_share_one_external_data_file(run):
    import onnx

    _, out, _, targets = run
    folder = out / "onnx-split"
    assert targets["onnx-split"]["expected_components"] == ["prefill", "decode"]
    assert (folder / "decode.onnx.data").stat().st_size == 0
    ranges = {}
    for graph in ("prefill", "decode"):
        onnx.checker.check_model(str(folder / f"{graph}.onnx"), full_check=False)
        model = onnx.load(str(folder / f"{graph}.onnx"), load_external_data=False)
        external = [{e.key: e.value for e in t.external_data} for t in model.graph.initializer if t.external_data]
        assert external and {e["location"] for e in external} == {"prefill.onnx.data"}
        ranges[graph] = {(int(e.get("offset", 0)), int(e["length"])) for e in external}
    assert ranges["decode"] <= ranges["prefill"]  # same tensors at the same offsets, nothing appended


def test_executorch_components_are_methods_of_one_program(et_run):
    from executorch.runtime import Runtime
    from transformers.exporters import ExportedModel

    folder = et_run.out / "et"
    assert sorted(p.name for p in folder.glob("*.pte")) == ["model.pte"]
    assert sorted(Runtime.get().load_program(folder / "model.pte").method_names) == ["decode", "prefill"]
    manifest = json.loads((folder / "export.json").read_text())
    assert {n: (e["file"], e["method"]) for n, e in manifest["components"].items()} == {
        "prefill": ("model.pte", "prefill"), "decode": ("model.pte", "decode")}
    # the benchmark's size counts the shared program once, not once per method
    from exporters.validate.benchmark import artifact_size

    assert artifact_size(folder) == (folder / "model.pte").stat().st_size
    # upstream 5.24 runs `forward` only (docs/upstream-gaps.md #8): when this starts passing, drop our loader
    with pytest.raises(Exception, match="forward"):
        ExportedModel.from_pretrained(folder)


@pytest.mark.parametrize("name", ["onnx", "onnx-split", "dynamo", "dynamo-dynamic", "dynamo-split", "et", "tjs"])
def test_every_component_loads_from_disk_and_runs_the_prompt(run, et_run, eager, name):
    from transformers.exporters import ExportedModel

    out, target = folder_of(run, et_run, name)
    exported = load(out, name)
    assert sorted(exported.components) == sorted(target["expected_components"])
    if name not in ("et", "tjs"):  # the layouts upstream's loader reads (see the tests above and below)
        upstream = ExportedModel.from_pretrained(out / name, trust_remote_code=True)
        assert sorted(upstream.components) == sorted(exported.components)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = eager(input_ids=ids).logits
    if "prefill" in exported.components:
        runner = exported.runners["prefill"]
        from transformers import DynamicCache

        feed = {"input_ids": ids, "position_ids": torch.arange(6)[None], "cache": DynamicCache(config=eager.config)}
        got = runner(**{k: v for k, v in feed.items() if k in runner.metadata.kwargs})
    else:
        got = merged_call(exported.runners["model"], ids, 0, empty_cache(eager))
    torch.testing.assert_close(got["logits"], want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", MERGED)
def test_merged_target_is_one_graph_exported_once(run, name):
    _, out, _, targets = run
    folder = out / name
    manifest = json.loads((folder / "export.json").read_text())
    assert list(manifest["components"]) == ["model"]
    assert targets[name]["expected_components"] == ["model"]
    programs = [p for p in folder.rglob("*") if p.suffix in (".onnx", ".pt2", ".pte")]
    assert len(programs) == 1, programs
    if targets[name]["export_format"] == "onnx":  # one graph traced and converted
        assert (out / "logs" / f"{name}.log").read_text().count("Translate the graph into ONNX...\n") == 1


@pytest.mark.parametrize("name", MERGED)
def test_merged_target_is_benchmarked_as_a_generator(run, name):
    """The one graph serves the timed prefill (the prompt on an empty cache) and every decode step."""
    bench = run[3][name]["bench"]
    assert "error" not in bench and "note" not in bench, bench
    assert list(bench["latency"]) == ["model"]
    generation = bench["generation"]
    assert generation["prompt_length"] == 6 and generation["new_tokens"] == 6
    assert generation["prefill_ms"] > 0 and generation["decode_tokens_per_s"] > 0


@pytest.mark.parametrize("name", MERGED)
def test_merged_graph_matches_eager_from_an_empty_cache_through_several_past_lengths(run, eager, name):
    """The prompt at past = 0, then one token at past 6, 7, ..., 11, then three tokens at once at past 12."""
    _, out, _, _ = run
    runner = load(out, name).runners["model"]
    tokens = PROMPT + [17, 23, 29, 31, 37, 41, 43, 47, 53]
    with torch.no_grad():
        want = eager(input_ids=torch.tensor([tokens])).logits
    cache = empty_cache(eager)
    steps = [(0, 6)] + [(p, p + 1) for p in range(6, 12)] + [(12, 15)]
    for start, stop in steps:
        got = merged_call(runner, torch.tensor([tokens[start:stop]]), start, cache)
        torch.testing.assert_close(got["logits"], want[:, start:stop], atol=1e-3, rtol=1e-3,
                                   msg=lambda m: f"{name} at past {start}: {m}")
        cache = got["cache"]
        assert cache.layers[0].keys.shape[2] == stop


@pytest.mark.parametrize("name", ["onnx", "dynamo", "dynamo-dynamic", "tjs"])
def test_validation_probes_the_merged_graph_at_past_zero_and_the_declared_bounds(run, name):
    _, _, _, targets = run
    [component] = targets[name]["components"]
    checks = {c["probe"]: c for c in component["checks"]}
    # no upper bound declared: from the lower bound to past the traced sizes (query 2, cache 6: the 6-token prompt)
    assert checks["traced"]["shapes"]["cache.layers.0.keys"][2] == 6
    # the batch is dynamic too: traced above 1 (a batch of 1 specializes), probed from 1 up
    assert checks["traced"]["shapes"]["input_ids"][0] == 3 and checks["traced"]["shapes"]["cache.layers.0.keys"][0] == 3
    # the three dims probed together: each at its lower bound, a middle value and its upper bound
    assert set(checks) == {"traced", "prompt (past=0)",
                           "batch_size=1, sequence_length=1, past_sequence_length=0",
                           "batch_size=5, sequence_length=4, past_sequence_length=7",
                           "batch_size=9, sequence_length=7, past_sequence_length=15"}
    for probe, check in checks.items():
        assert check["passed"] and not check["skipped"], (name, probe, check)
    sizes = {(c["shapes"]["input_ids"][0], c["shapes"]["input_ids"][1], c["shapes"]["cache.layers.0.keys"][2])
             for probe, c in checks.items() if probe not in ("traced", "prompt (past=0)")}
    assert sizes == {(1, 1, 0), (5, 4, 7), (9, 7, 15)}, sizes
    assert checks["batch_size=1, sequence_length=1, past_sequence_length=0"]["shapes"]["cache.layers.0.keys"][0] == 1
    assert checks["prompt (past=0)"]["shapes"]["input_ids"] == [1, 6]


def _break_logits_above(graph_file: Path, graph_input: str, axis: int, above: int) -> None:
    """Rewrite a saved merged graph so that its logits are off by 1.0 whenever `graph_input`'s `axis` is larger
    than `above`, and right at every other size: a graph wrong on one dim only, from a size on."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph_file), load_external_data=False)  # the weights stay where they are
    graph = model.graph
    [producer] = [node for node in graph.node if "logits" in node.output]
    producer.output[list(producer.output).index("logits")] = "logits_right"
    graph.initializer.extend([helper.make_tensor("broken_axis", TensorProto.INT64, [], [axis]),
                              helper.make_tensor("broken_above", TensorProto.INT64, [], [above])])
    graph.node.extend([
        helper.make_node("Shape", [graph_input], ["broken_shape"]),
        helper.make_node("Gather", ["broken_shape", "broken_axis"], ["broken_size"], axis=0),
        helper.make_node("Greater", ["broken_size", "broken_above"], ["broken_flag"]),
        helper.make_node("Cast", ["broken_flag"], ["broken_offset"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["logits_right", "broken_offset"], ["logits"]),
    ])
    onnx.save(model, str(graph_file))


@pytest.mark.parametrize("dim", ["batch_size", "past_sequence_length"])
def test_a_merged_graph_wrong_on_one_dim_alone_fails_its_probes(run, tmp_path, dim):
    """The dims are probed together (3 probes for batch, query and past): a graph that is right at the traced sizes,
    at the prompt on an empty cache and along generation parity's single-row steps, but wrong once one dim alone grows
    (the batch past 4, or the cache past 14 tokens), still fails the target, by the probes that reach that size."""
    model_dir, out, _, _ = run
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    [graph_file] = (copy / "onnx").glob("*.onnx")
    graph_input, axis, above = {"batch_size": ("input_ids", 0, 4),
                                "past_sequence_length": ("past_key_values.0.key", 2, 14)}[dim]
    _break_logits_above(graph_file, graph_input, axis, above)
    result = run_cli("validate", str(model_dir), str(copy), "--target", "onnx")
    assert result.returncode != 0
    [target] = json.loads((copy / "report.json").read_text())["targets"]
    assert target["status"] == "failed", target
    checks = {c["probe"]: c for c in target["components"][0]["checks"]}
    failed = {probe for probe, check in checks.items() if not check["passed"]}
    assert failed and {"traced", "prompt (past=0)"}.isdisjoint(failed), checks
    key = {"batch_size": ("input_ids", 0), "past_sequence_length": ("cache.layers.0.keys", 2)}[dim]
    for probe, check in checks.items():  # failed exactly where the dim grew past the break
        assert (probe in failed) == (check["shapes"][key[0]][key[1]] > above), (probe, check)


def test_hf_export_validate_rechecks_merged_and_transformers_js_targets_from_disk(run, et_run, tmp_path):
    model_dir = run[0]
    copy = tmp_path / "out"
    for name in ("onnx", "tjs", "et"):
        shutil.copytree(folder_of(run, et_run, name)[0] / name, copy / name)
    config = tmp_path / "export_config.json"  # RECIPE with the `et` target: the recipe of the three folders
    config.write_text(json.dumps(FULL_RECIPE))
    result = run_cli("validate", str(model_dir), str(copy), "--config", str(config), "--target", "onnx", "--target",
                     "tjs", "--target", "et")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((copy / "report.json").read_text())
    for target in report["targets"]:
        assert target["status"] == "passed" and target["generation"]["status"] == "passed", target["error"]


def test_transformers_js_layout_has_its_file_names_inputs_and_config(run, eager):
    import numpy as np
    import onnx
    import onnxruntime as ort

    _, out, _, _ = run
    folder = out / "tjs"
    assert (folder / "onnx" / "model.onnx").is_file() and (folder / "onnx" / "model.onnx_data").is_file()
    assert not list(folder.glob("*.onnx")) and not list(folder.rglob("*.onnx.data"))
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"] == {"dtype": "fp32", "use_external_data_format": {"model.onnx": 1}}
    assert config["model_type"] == "llama" and (folder / "generation_config.json").is_file()
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    layers = eager.config.num_hidden_layers
    cache = {f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")}
    assert [v.name for v in graph.input] == ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    assert set(dims) == {"input_ids", "attention_mask", "position_ids"} | cache
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 8]
    outputs = [v.name for v in graph.output]
    assert outputs == ["logits"] + [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    # run the way transformers.js does: every symbolic cache dim 0 except `batch_size`, names as above
    session = ort.InferenceSession(str(folder / "onnx" / "model.onnx"))
    feed = {"input_ids": np.array([PROMPT]), "attention_mask": np.ones((1, 6), np.int64),
            "position_ids": np.arange(6)[None]}
    feed |= {name: np.zeros([d if isinstance(d, int) else 1 if d == "batch_size" else 0 for d in dims[name]],
                            np.float32) for name in cache}
    logits = session.run(["logits"], feed)[0]
    with torch.no_grad():
        want = eager(input_ids=torch.tensor([PROMPT])).logits.numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=1e-3)


TJS_SCRIPT = Path(__file__).with_name("transformers_js") / "generate.mjs"


def test_transformers_js_generates_the_eager_tokens(run, eager):
    """transformers.js itself, on Node.js: `make test-deps` (part of `make test`) installs the pinned version into
    .cache/transformers-js; HF_EXPORT_TRANSFORMERS_JS points at another folder holding its node_modules. Never
    skipped: without it the test fails saying how to install it."""
    from exporters.layouts.transformers_js import home  # HF_EXPORT_TRANSFORMERS_JS, else .cache

    modules = str(home())
    if shutil.which("node") is None or not (Path(modules) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed: run `make test-deps` (Node.js and the pinned "
                    "@huggingface/transformers in .cache/transformers-js), or set HF_EXPORT_TRANSFORMERS_JS to a folder "
                    "with node_modules/@huggingface/transformers")
    _, out, _, _ = run
    script = Path(modules) / "generate.mjs"
    shutil.copyfile(TJS_SCRIPT, script)
    result = subprocess.run(["node", str(script), str(out), "tjs", json.dumps(PROMPT), "6"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    ids = torch.tensor([PROMPT])
    want = eager.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                          do_sample=False)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == want[0].tolist()


def test_default_merges_only_plain_onnx_decoder_targets():
    from exporters.capture.merged import wants_merged
    from exporters.errors import TargetPlanError
    from exporters.recipe.load import parse_recipe

    def target(**settings):
        return parse_recipe(json.dumps({"export_format": "onnx", "mode": "generation", **settings})).exports[0]

    assert wants_merged(target(dynamic=True), "text", "dynamic")
    assert not wants_merged(target(dynamic=True), "seq2seq", "dynamic")  # several graphs: stays separate
    assert not wants_merged(target(dynamic=True), "text", "static")
    assert not wants_merged(target(), "text", "dynamic")  # static shapes: no merged graph to make
    assert not wants_merged(target(dynamic=True, components={"prefill": {}}), "text", "dynamic")
    # layers that mix sliding-window and full attention: their own caches differ in length past the window, but an
    # ONNX target is captured with every position in every layer (cache_settings.full_length_windows): merged
    mixed = SimpleNamespace(layer_types=["sliding_attention", "full_attention"])
    assert wants_merged(target(dynamic=True), "text", "dynamic", mixed)
    assert wants_merged(target(dynamic=True), "text", "dynamic", SimpleNamespace(layer_types=None, sliding_window=64))
    assert not wants_merged(target(dynamic=True, merged=False), "text", "dynamic")
    # dynamo: merged by default with or without dynamic shapes (one .pt2 holds the weights once), where it can serve
    for settings in ({}, {"dynamic": True}):
        dynamo = parse_recipe(json.dumps({"export_format": "dynamo", "mode": "generation", **settings})).exports[0]
        assert wants_merged(dynamo, "text", "dynamic")
        assert not wants_merged(dynamo, "text", "static")  # a static cache: prefill + decode
        assert not wants_merged(dynamo, "seq2seq", "dynamic")
        assert not wants_merged(dynamo, "text", "dynamic", mixed)  # dynamo keeps the model's own cache: separate
    dynamo = parse_recipe('{"export_format": "dynamo", "mode": "generation", "merged": false}').exports[0]
    assert not wants_merged(dynamo, "text", "dynamic")
    dynamo = parse_recipe('{"export_format": "dynamo", "mode": "generation", "components": {"decode": {}}}').exports[0]
    assert not wants_merged(dynamo, "text", "dynamic")
    executorch = parse_recipe('{"export_format": "executorch", "mode": "generation", "dynamic": true}').exports[0]
    assert not wants_merged(executorch, "text", "dynamic")
    with pytest.raises(TargetPlanError, match="vision-language model") as raised:
        wants_merged(target(merged=True), "vision-language", "dynamic")
    assert raised.value.option == "merged"
    with pytest.raises(TargetPlanError, match="cache_implementation is 'static'") as raised:
        wants_merged(target(layout="transformers.js"), "text", "static")
    assert raised.value.option == "layout"


def test_plainest_dynamo_recipe_of_qwen2_is_one_program_holding_the_weights_once(tmp_path):
    """Qwen2 takes one mask per layer type: its plainest dynamo generation recipe is the merged graph too, one
    `model.pt2` with the weights once, which validates, generates eager's tokens and loads in upstream's loader."""
    from transformers import AutoModelForCausalLM
    from transformers.exporters import ExportedModel

    from tests.models import tiny_qwen2

    # one layer: its masks are one per layer type, whatever the depth (#48: half the graph to trace)
    model_dir = tiny_qwen2(tmp_path / "model", {"export_format": "dynamo", "mode": "generation"}, layers=LAYERS)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    [target] = json.loads((out / "report.json").read_text())["targets"]
    assert result.returncode == 0 and target["status"] == "passed", (result.stderr[-3000:], target["error"])
    assert target["generation"]["status"] == "passed"
    assert target["generation"]["eager_tokens"] == target["generation"]["exported_tokens"]
    assert target["expected_components"] == ["model"]
    folder = out / target["name"]
    assert sorted(p.name for p in folder.glob("*.pt2")) == ["model.pt2"]
    eager = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    parameters = parameter_bytes(eager)
    assert parameters <= stored_weights(folder, "dynamo") <= 1.05 * parameters
    assert target["parameter_bytes"] == parameters and target["weights_stored_bytes"] <= 1.05 * parameters
    assert not any("parameter bytes" in f for f in target["findings"])
    upstream = ExportedModel.from_pretrained(folder, trust_remote_code=True)
    assert list(upstream.components) == ["model"]
    ids = torch.tensor([PROMPT])
    got = merged_call(upstream.runners["model"], ids, 0, empty_cache(eager))
    with torch.no_grad():
        torch.testing.assert_close(got["logits"], eager(input_ids=ids).logits, atol=1e-4, rtol=1e-3)


def test_library_export_for_generation_follows_the_merged_default(eager, tmp_path):
    """`AutoHfExporter.from_pretrained(...).export_for_generation` exports what the pipeline would: one graph."""
    from exporters import AutoHfExporter

    model_dir = tiny_llama(tmp_path / "model", {"export_format": "onnx", "mode": "generation", "dynamic": True})
    exporter = AutoHfExporter.from_pretrained(str(model_dir))
    ids = torch.tensor([PROMPT])
    exported = exporter.export_for_generation(eager, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert list(exported.components) == ["model"]
    got = merged_call(exported.runners["model"], ids, 0, empty_cache(eager))
    with torch.no_grad():
        torch.testing.assert_close(got["logits"], eager(input_ids=ids).logits, atol=1e-4, rtol=1e-3)


def test_merged_contract_names_the_two_axes_that_vary(tmp_path):
    """Without a recipe contract: named `{min, max}` dims on the query and cache axes (an empty cache included);
    ExecuTorch gets `auto` on the same axes and no deferred asserts (docs/upstream-gaps.md #4). A merged ExecuTorch
    export end to end takes minutes, so the suite checks its contract; its runtime runs the empty cache (#11)."""
    from transformers import AutoModelForCausalLM

    from exporters.capture.merged import contract
    from exporters.recipe.load import parse_recipe
    from exporters.upstream import decompose_for_generation

    eager = AutoModelForCausalLM.from_pretrained(tiny_llama(tmp_path / "model", None)).eval()  # two layers: 0 and 1
    ids = torch.tensor([PROMPT])
    decode = decompose_for_generation(eager, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                      multi_token_decode=True)["decode"][1]
    onnx, et = parse_recipe(json.dumps([{"export_format": "onnx", "mode": "generation", "merged": True},
                                        {"export_format": "executorch", "mode": "generation", "merged": True}])).exports
    spec = contract(onnx, decode)
    assert spec.prefer_deferred_runtime_asserts_over_guards is True
    shapes = spec.model_dump(exclude_none=True)["dynamic_shapes"]
    query, batch = {"name": "sequence_length", "min": 1}, {"name": "batch_size", "min": 1}
    assert shapes["input_ids"] == {"0": batch, "1": query} and shapes["position_ids"] == {"0": batch, "1": query}
    assert shapes["cache.layers.1.values"] == {"0": batch, "2": {"name": "past_sequence_length", "min": 0}}
    assert len([k for k in shapes if k.startswith("cache.")]) == 2 * eager.config.num_hidden_layers
    et_spec = contract(et, decode)
    assert et_spec.prefer_deferred_runtime_asserts_over_guards is False
    assert set(et_spec.model_dump()["dynamic_shapes"]["cache.layers.0.keys"].values()) == {"auto"}


@pytest.mark.parametrize("settings, message", [
    ({"merged": True, "mode": "model"}, "merged applies to mode 'generation'"),
    ({"merged": True, "components": {"decode": {}}}, "put these settings under components.model"),
    ({"layout": "transformers.js", "merged": False}, "needs the merged graph"),
    ({"layout": "transformers.js", "dtype": "bfloat16"}, "no bfloat16"),
    ({"layout": "transformers.js", "external_data": False}, "not supported with layout 'transformers.js'"),
])
def test_recipe_refuses_what_cannot_be_one_graph(settings, message):
    from exporters.errors import RecipeError
    from exporters.recipe.load import parse_recipe

    with pytest.raises(RecipeError, match=message):
        parse_recipe(json.dumps({"export_format": "onnx", **settings}))


@pytest.fixture(scope="module")
def half_run(tmp_path_factory):
    recipe = {"export_format": "onnx", "mode": "generation", "dtype": "float16", "layout": "transformers.js"}
    done = exported(tiny_llama(tmp_path_factory.mktemp("half") / "model", recipe, layers=LAYERS), "run", "--no-bench",
                    MODEL, "--out", OUT, "--quiet")
    return done.out, done.result, done.report


def test_a_float16_run_loads_the_model_once_in_float16(half_run, eager):
    out, result, report = half_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["model_dtype"] == "float16"
    [target] = report["targets"]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", target["error"]
    assert target["parameter_bytes"] == parameter_bytes(eager) // 2
    assert (out / "onnx" / "onnx" / "model_fp16.onnx").is_file()
    assert (out / "onnx" / "onnx" / "model_fp16.onnx_data").stat().st_size <= 1.05 * target["parameter_bytes"]
    config = json.loads((out / "onnx" / "config.json").read_text())["transformers.js_config"]
    assert config == {"dtype": "fp16", "use_external_data_format": {"model_fp16.onnx": 1}}


def _plainest_onnx_target(family: str, tmp_path: Path, **overrides) -> dict:
    """The report entry of a matrix family's plainest ONNX target (`dynamic: true`), run through the CLI (`overrides`
    and `never_eos` as `tests.models.family_model` takes them); asserts that it passed."""
    model_dir = family_model(family, tmp_path / family, [{"export_format": "onnx", "dynamic": True}], **overrides)
    out = tmp_path / "out"
    result = run_cli("run", str(model_dir), "--out", str(out), "--quiet", "--no-bench")
    [target] = json.loads((out / "report.json").read_text())["targets"]
    assert result.returncode == 0 and target["status"] == "passed", (result.stderr[-2000:], target.get("unverified"))
    return target


def test_plainest_onnx_recipe_of_a_mixed_window_model_passes_as_one_merged_graph(tmp_path):
    """Gemma 2 alternates sliding-window and full-attention layers: its plainest ONNX target is captured on a
    full-length cache in every layer (one past length: `exporters.capture.cache_settings.full_length_windows`), so it
    is the merged graph, and passes with every probe run."""
    target = _plainest_onnx_target("gemma2", tmp_path)
    assert [c["name"] for c in target["components"]] == ["model"]
    assert target["generation"]["status"] == "passed"
    checks = [check for component in target["components"] for check in component["checks"]]
    assert checks and all(check["passed"] and not check["skipped"] for check in checks), checks


def test_merged_probes_of_a_sliding_window_model_all_run(tmp_path):
    """Mistral's cache layers count their tokens (`cumulative_length`): every probe of the merged graph (other past
    lengths, the prompt on an empty cache) tells the cache its new length and sends a mask of past + query, so the
    eager model runs each one and the target passes, not `unverified`."""
    # one layer: every layer's cache counts its tokens and takes the window tensor; no EOS, so generation is checked
    target = _plainest_onnx_target("mistral", tmp_path, num_hidden_layers=1, never_eos=True)
    checks = {check["probe"]: check for component in target["components"] for check in component["checks"]}
    pasts = {check["shapes"]["cache.layers.0.keys"][2] for check in checks.values()}
    assert {0, 19} <= pasts and "prompt (past=0)" in checks, checks
    assert all(check["passed"] and not check["skipped"] for check in checks.values()), checks
    # every layer keeps every position (no window tensor, which no ONNX runtime feeds): said, and the runtimes run it
    assert any("every layer's cache keeps every position" in f for f in target["findings"]), target["findings"]
    assert not any("_sliding_window_tensor" in f for f in target["findings"]), target["findings"]
    assert {p["runtime"]: p["status"] for p in target["runtimes"]} == {"ONNX Runtime GenAI": "passed",
                                                                        "optimum": "passed"}, target["runtimes"]


# ── a tied embedding table in ExecuTorch (docs/upstream-gaps.md #13) ─────────


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory):
    """The plainest ExecuTorch generation recipe in the methods layout (prefill + decode methods; the runner layout,
    the default, does the same with its one program: tests/test_llm_runner.py) on a tiny Llama whose output
    projection is its embedding table."""
    model_dir = tiny_llama(tmp_path_factory.mktemp("tied") / "model", {**PLAINEST_EXECUTORCH, "layout": "methods"},
                           tie_word_embeddings=True, layers=LAYERS)
    done = exported(model_dir, "run", "--no-bench", MODEL, "--out", OUT, "--quiet")
    [target] = done.report["targets"]
    return done.model_dir, done.out / target["name"], done.result, target


def test_a_tied_executorch_target_stores_the_table_once(tied_run):
    from transformers import AutoModelForCausalLM

    model_dir, folder, result, target = tied_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert target["status"] == "passed" and target["generation"]["status"] == "passed", target["error"]
    eager = AutoModelForCausalLM.from_pretrained(model_dir)
    assert eager.lm_head.weight is eager.model.embed_tokens.weight
    parameters = parameter_bytes(eager)  # the tied table counted once
    assert sorted(p.name for p in folder.glob("*.pt[ed]")) == ["model.ptd", "model.pte"]
    # the program keeps no weights of its own; the data file holds each tensor once (with a small header)
    assert pte_weights(folder / "model.pte") < 0.01 * parameters
    stored = (folder / "model.ptd").stat().st_size
    assert parameters <= stored <= 1.05 * parameters, (stored, parameters)
    assert target["parameter_bytes"] == parameters and target["weights_stored_bytes"] <= 1.05 * parameters
    assert not any("parameter bytes" in f for f in target["findings"])
    manifest = json.loads((folder / "export.json").read_text())
    assert {e["data_file"] for e in manifest["components"].values()} == {"model.ptd"}


def test_a_tied_executorch_program_runs_from_its_two_files(tied_run):
    from executorch.runtime import Runtime
    from transformers import AutoModelForCausalLM, StaticCache

    from exporters.upstream import load_exported

    model_dir, folder, _, _ = tied_run
    program = Runtime.get().load_program(folder / "model.pte", data_path=folder / "model.ptd")
    assert sorted(program.method_names) == ["decode", "prefill"]
    # without its data file the program has no weights to run with
    with pytest.raises(Exception):
        Runtime.get().load_program(folder / "model.pte").load_method("prefill")
    eager = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    runner = load_exported(folder).runners["prefill"]
    ids = torch.tensor([PROMPT + [17, 23]])  # the plainest recipe traces a static prompt of 8 tokens
    cache = StaticCache(config=eager.config, max_cache_len=256)  # the program's static cache (max positions)
    feed = {"input_ids": ids, "position_ids": torch.arange(ids.shape[1])[None], "cache": cache}
    with torch.no_grad():
        want = eager(input_ids=ids).logits
    got = runner(**{k: v for k, v in feed.items() if k in runner.metadata.kwargs})
    torch.testing.assert_close(got["logits"], want, atol=1e-3, rtol=1e-3)


def test_named_data_waits_on_disk_while_executorch_lowers(tmp_path):
    """XNNPACK's serialized weights are kept as files, not bytes, until the program is written (upstream gap #20):
    the store still deduplicates them by content, writes them intact, and the spill folder is gone afterwards."""
    from executorch.exir._serialize._cord import Cord, FileBackedData
    from executorch.exir._serialize._named_data_store import NamedDataStore

    from exporters.upstream import named_data_on_disk

    weight, small = bytes(range(256)) * 64, b"scale"
    original = NamedDataStore.add_named_data
    with named_data_on_disk(tmp_path):
        store = NamedDataStore()
        store.add_named_data("a", weight)
        store.add_named_data("b", bytes(weight))  # same content under another key: one buffer
        store.add_named_data("c", small)
        [spill] = tmp_path.glob(".named-data-*")
        assert len(list(spill.iterdir())) == 1  # the duplicate's file went with it
        assert isinstance(store.buffers[0], FileBackedData) and store.buffers[1] == small
        assert len(store.buffers) == 2 and store.pte_data["a"].buffer_index == store.pte_data["b"].buffer_index
        out = tmp_path / "written"
        with out.open("wb") as handle:
            Cord(store.buffers[0]).write_to_file(handle)
        assert out.read_bytes() == weight
    assert not list(tmp_path.glob(".named-data-*"))
    assert NamedDataStore.add_named_data is original  # the patch is undone


def test_the_cards_snippets_run_as_written(run, hub, tmp_path):
    """Each snippet of the card (#45 §10, #47 §5): the merged ONNX graph through upstream's runner under the names
    ONNX runtimes feed (not `cache=`), GenAI's generator, the split ONNX and dynamo programs; run as written by the
    venv's Python against the Hub emulator holding the folders at the commit the snippets pin."""
    from tests.card_snippets import card_snippets, exports_card, run_snippet, upload_exports

    _, out, _, targets = run
    commit = upload_exports(hub, "alice/weights-once", out, list(targets))
    ran = []
    for i, (runtime, language, code) in enumerate(card_snippets(exports_card("alice/weights-once", out, commit))):
        if runtime in ("optimum", "transformers.js"):  # not this venv's runtimes: each is the script its proof ran
            continue  # in the runtime's own environment (tests/test_layouts.py holds the two equal)
        assert language == "python" and f'revision="{commit}"' in code, code
        done = run_snippet(code, hub, tmp_path / f"home-{i}")
        assert done.returncode == 0, (runtime, code, done.stderr[-3000:])
        ran.append(runtime)
    # GenAI for the merged graphs (onnx, tjs); upstream's loader for every layout it reads (not et's methods, tjs)
    assert sorted(ran) == ["ONNX Runtime GenAI"] * 2 + ["transformers.exporters"] * 5, ran

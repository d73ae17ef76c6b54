"""End to end on a tiny Llama in generation mode, through the real CLI: dynamo, ONNX and ExecuTorch exported once,
then many checks on the result (artifacts load and run, validation at unseen shapes, generation parity, report).

The run is the shared export store's (tests/export_store.py): tests/test_weights_once.py reads its `et` target, the
same target of the same model its own run asked for (#48: one ExecuTorch export of it in the suite, not two); a test
that writes into the output folder (a rerun, a validation's workbench) works on `Export.copy`."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_cli
from tests.export_store import MODEL, OUT, Export, exported
from tests.models import tiny_llama

PREFILL = {"dynamic_shapes": {"input_ids": {"1": {"name": "prompt", "min": 2, "max": 64}},
                              "position_ids": {"1": {"name": "prompt", "min": 2, "max": 64}}},
           "prefer_deferred_runtime_asserts_over_guards": True}
DECODE_NAMED = {"dynamic_shapes": {"cache.layers.*.keys": {"2": {"name": "past", "min": 2, "max": 128}},
                                   "cache.layers.*.values": {"2": {"name": "past", "min": 2, "max": 128}}},
                "prefer_deferred_runtime_asserts_over_guards": True}
DECODE_AUTO = {"dynamic_shapes": {"cache.layers.*.keys": {"2": "auto"}, "cache.layers.*.values": {"2": "auto"}}}
RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "dynamo", "export_format": "dynamo", "mode": "generation",
         "components": {"prefill": PREFILL, "decode": DECODE_NAMED}},
        {"name": "onnx", "export_format": "onnx", "mode": "generation", "opset_version": 18,
         "components": {"prefill": PREFILL, "decode": DECODE_NAMED}},
        {"name": "et", "export_format": "executorch", "mode": "generation",
         "components": {"prefill": PREFILL, "decode": DECODE_AUTO}},
    ],
    "inputs": {"sequence_length": 6},
    "generation": {"max_new_tokens": 6},
}


def llm_export(root: Path) -> Export:
    """RECIPE's run on the one-layer tiny Llama, through the store (tests/test_weights_once.py asks for it too)."""
    model_dir = tiny_llama(root / "model", RECIPE, layers=1)  # no check reads the depth (#48)
    return exported(model_dir, "run", "--no-bench", MODEL, "--out", OUT)  # no test reads timings of the artifacts


@pytest.fixture(scope="module")
def llm_export_done(tmp_path_factory) -> Export:
    return llm_export(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def llm_run(llm_export_done):
    return llm_export_done.model_dir, llm_export_done.out, llm_export_done.result


def test_run_exits_zero_and_reports_all_passed(llm_run):
    _, out, result = llm_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed"
    assert [t["name"] for t in report["targets"]] == ["dynamo", "onnx", "et"]
    assert all(t["status"] == "passed" for t in report["targets"])
    for key in ("schema_version", "source", "recipe", "versions", "findings", "targets"):
        assert key in report
    assert report["versions"]["torch"].startswith("2.13.0") and report["versions"]["transformers"] == "5.24.0"
    assert len(report["recipe"]["sha256"]) == 64


def test_upstream_noise_goes_to_logs_not_the_terminal(llm_run):
    _, out, result = llm_run
    assert "torch.onnx" not in result.stdout + result.stderr
    assert "[torch.onnx]" in (out / "logs" / "onnx.log").read_text()


def test_each_artifact_loads_with_upstream_and_runs(llm_run):
    from transformers.exporters import ExportedModel

    from exporters.upstream import load_exported

    model_dir, out, _ = llm_run
    for name, fmt in (("dynamo", "dynamo"), ("onnx", "onnx"), ("et", "executorch")):
        if fmt == "executorch":  # one program, a method per component: upstream runs `forward` only (upstream gap 11)
            exported = load_exported(out / name)
        else:
            exported = ExportedModel.from_pretrained(out / name, trust_remote_code=True)
        assert str(exported.export_format) == fmt
        assert sorted(exported.components) == ["decode", "prefill"]
        runner = exported.runners["prefill"]
        assert set(runner.metadata.kwargs) >= {"input_ids"}
    assert not list(out.glob(".staging-*")), "no half-written target folder may remain"


def test_files_are_listed_with_size_and_sha256(llm_run):
    import hashlib

    _, out, _ = llm_run
    report = json.loads((out / "report.json").read_text())
    onnx = next(t for t in report["targets"] if t["name"] == "onnx")
    names = {Path(f["path"]).name for f in onnx["files"]}
    assert {"prefill.onnx", "prefill.onnx.data", "decode.onnx", "decode.onnx.data", "export.json"} <= names
    for entry in onnx["files"]:
        data = (out / entry["path"]).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_published_files_hold_no_path_of_the_exporting_machine(llm_run):
    """torch's exporters annotate every node with the source lines it came from, absolute paths of this machine's
    Python installation included (`pkg.torch.onnx.stack_trace`, a `.pt2` node's `stack_trace`): the folders a PR
    publishes must not carry them (nor the rest of the trace's debugging metadata, most of a graph file's bytes)."""
    import zipfile

    import onnx

    model_dir, out, _ = llm_run
    machine = {str(Path(torch.__file__).resolve().parents[1]), str(Path(torch.__file__).parents[1]),
               str(model_dir.resolve()), str(out.resolve()), "site-packages"}
    files = [path for name in ("dynamo", "onnx", "et") for path in (out / name).rglob("*") if path.is_file()]
    assert {path.suffix for path in files} >= {".pt2", ".onnx", ".pte"}
    for path in files:
        data = path.read_bytes()
        assert not [text for text in machine if text.encode() in data], path
    for graph in (out / "onnx").glob("*.onnx"):
        model = onnx.load(str(graph), load_external_data=False)
        assert len(model.graph.node) > 20 and not [n.op_type for n in model.graph.node if n.metadata_props], graph
    for program in (out / "dynamo").glob("*.pt2"):
        with zipfile.ZipFile(program) as archive:
            graphs = [archive.read(name) for name in archive.namelist() if name.endswith("models/model.json")]
        assert graphs and not [g for g in graphs if re.search(rb'"stack_trace": "[^"]', g)], program


def test_validation_probes_unseen_shapes_inside_declared_ranges(llm_run):
    _, out, _ = llm_run
    report = json.loads((out / "report.json").read_text())
    dynamo = next(t for t in report["targets"] if t["name"] == "dynamo")
    prefill = next(c for c in dynamo["components"] if c["name"] == "prefill")
    probes = {c["probe"]: c for c in prefill["checks"]}
    assert set(probes) == {"traced", "prompt=2", "prompt=33", "prompt=64"}
    assert probes["prompt=64"]["shapes"]["input_ids"] == [1, 64]
    decode = next(c for c in dynamo["components"] if c["name"] == "decode")
    assert {c["probe"] for c in decode["checks"]} == {"traced", "past=2", "past=65", "past=128"}
    for component in dynamo["components"]:
        for check in component["checks"]:
            assert check["passed"] and not check["skipped"]
            assert check["outputs"], f"{component['name']} {check['probe']}: no output was compared"
            for output in check["outputs"]:
                assert {"max_abs_diff", "max_rel_diff", "atol", "rtol", "passed"} <= set(output)
                where = (component["name"], check["probe"], output)
                assert output["passed"], where
                assert output["max_abs_diff"] is not None and output["max_rel_diff"] is not None, where
                # a torch.export program runs eager's own kernels: its outputs are within the absolute tolerance
                assert output["max_abs_diff"] <= output["atol"], where


def test_generation_parity_on_all_three_formats(llm_run):
    _, out, _ = llm_run
    report = json.loads((out / "report.json").read_text())
    for target in report["targets"]:
        generation = target["generation"]
        assert generation["status"] == "passed", (target["name"], generation)
        assert generation["max_new_tokens"] == 6
        assert generation["eager_tokens"] == generation["exported_tokens"]
        assert len(generation["eager_tokens"][0]) == 6


def test_eager_reference_computed_once_and_shared(llm_run):
    _, out, _ = llm_run
    report = json.loads((out / "report.json").read_text())
    cache = report["eager_cache"]
    # dynamo and onnx probe the same prefill/decode shapes: the second target reuses every eager reference
    assert cache["hits"] >= 8 and cache["misses"] > 0


def _shifted(reference):
    """A copy of an eager output whose logits are off by one (the first output of a tuple, `logits` of a dict)."""
    if isinstance(reference, dict):
        shifted = copy.copy(reference)
        shifted["logits"] = reference["logits"] + 1.0
        return shifted
    return (reference[0] + 1.0, *reference[1:])


def test_validation_compares_with_the_eager_side_computed_while_exporting(llm_export_done, tmp_path):
    """The run computes the ONNX and ExecuTorch targets' eager references while they export (a torch program's at
    the thread count it is validated at); a precomputed side is what validation compares with, and where it does
    not hold for the target (a torch program, another thread count) it is computed again."""
    from exporters.run.context import RunOptions, prepare_run
    from exporters.run.workbench import Workbench
    from exporters.validate.checks import validate_target
    from exporters.validate.subject import SavedTarget

    copy = llm_export_done.copy(tmp_path)  # the workbench's run context is made in its output folder
    model_dir, out = copy.model_dir, copy.out
    timings = {t["name"]: t["timings"] for t in json.loads((out / "report.json").read_text())["targets"]}
    assert timings["onnx"]["eager_ahead_s"] > 0 and timings["et"]["eager_ahead_s"] > 0
    assert "eager_ahead_s" not in timings["dynamo"]

    options = RunOptions(out_dir=out)
    context = prepare_run(str(model_dir), options)
    workbench = Workbench.load(context, options)
    statuses = {}
    for name, threads in (("onnx", torch.get_num_threads()), ("dynamo", torch.get_num_threads() + 1)):
        target = workbench.plan(next(t for t in context.targets if t.name == name))
        components = workbench.components(target, context.recipe)
        side = workbench.eager_side(target, context, components, workbench.expected(target, components))
        side.planned = [(component, probes, [_shifted(r) for r in references])
                        for component, probes, references in side.planned]
        side.threads = threads
        # a failed check is arbitrated against the module run in float64, which would pass these bytes again: this
        # test is about which reference the float32 comparison reads (the arbitration: test_float64_arbitration)
        side.arbiters = {}
        result = validate_target(
            target=target, recipe=context.recipe, saved=SavedTarget(out / name), components=components,
            subject=workbench.subject(target, context), precomputed=side)
        statuses[name] = [(c.name, c.passed) for c in result.components]
    assert statuses["onnx"] == [("prefill", False), ("decode", False)], "the precomputed references were compared"
    assert statuses["dynamo"] == [("prefill", True), ("decode", True)], "another thread count: computed again"


def test_markdown_report_has_tables_and_stays_small(llm_run):
    _, out, _ = llm_run
    text = (out / "report.md").read_text()
    assert text.startswith("## Export report")
    lines = text.splitlines()
    # the one table (exporters.report.markdown.variants_table) opens the report: one row per target, before any probe row
    # its "runs in" column: this prefill + decode ONNX folder is declined by GenAI and optimum with the reason
    header = lines.index("| variant | format | size | latency / tokens per second | quality | runs in | verdict |")
    probes = lines.index("| component | probe | shapes | worst abs diff | tolerance | verdict |")
    assert header < probes and header < 6
    rows = [line for line in lines[header + 2:] if line.startswith("| `")][:3]
    assert [r.split("|")[1].split()[0] for r in rows] == ["`dynamo`", "`onnx`", "`et`"]  # then size/speed marks
    assert all("✅ passed" in r and re.search(r"✅ (\d+)/\1 tokens", r) for r in rows), rows
    assert "ONNX Runtime GenAI ✗ cannot take this model: its generation export is prefill.onnx and decode.onnx" in rows[1]
    # per-probe rows are folded
    assert lines[probes - 2].startswith("<details><summary>") and "probe(s)" in lines[probes - 2]
    assert "**Generation parity** ✅ passed" in text
    assert len(text.encode()) < 60_000


def test_rerun_with_unchanged_inputs_is_a_cache_hit(llm_export_done, tmp_path):
    copy = llm_export_done.copy(tmp_path)  # the rerun rewrites the report; the run's signing key is its state's
    model_dir, out = copy.model_dir, copy.out
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--target", "dynamo", "--quiet",
                     "--print-report", env={"EXPORT_ACTION_STATE_DIR": str(copy.state)})
    assert result.returncode == 0, result.stderr[-2000:]
    # printed to a pipe, the Markdown keeps every table row on one line (no wrapping at 80 columns)
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert table and all(line.endswith("|") for line in table), result.stdout
    assert any(len(line) > 100 for line in table)
    report = json.loads((out / "report.json").read_text())
    assert report["targets"][0]["cached"] is True and report["targets"][0]["status"] == "passed"


def test_a_rerun_by_changed_product_code_is_not_a_cache_hit(llm_export_done, tmp_path):
    """The cache key holds the product's own sources, not only its version number: the same package copied is a
    hit; one changed line in it (a moved `@v1` tag, a development checkout) exports again."""
    copy = llm_export_done.copy(tmp_path / "copy")  # the run's output folder and signing key (its state)
    model_dir = copy.model_dir
    code = tmp_path / "code"
    shutil.copytree(ROOT / "exporters", code / "exporters", ignore=shutil.ignore_patterns("__pycache__"))
    rerun = copy.out
    env = {"PYTHONPATH": str(code), "EXPORT_ACTION_STATE_DIR": str(copy.state)}

    def dynamo_again() -> dict:
        done = run_cli("run", "--no-bench", str(model_dir), "--out", str(rerun), "--target", "dynamo", "--quiet",
                       env=env, cwd=code)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads((rerun / "report.json").read_text())["targets"][0]

    assert dynamo_again()["cached"] is True  # the copy itself keeps the key
    version = code / "exporters" / "version.py"
    version.write_text(version.read_text() + "\n# changed\n")
    changed = dynamo_again()
    assert changed["cached"] is False and changed["status"] == "passed", changed


def test_corrupted_decode_artifact_fails_validate_with_its_diff(llm_run, tmp_path):
    import onnx
    from onnx import numpy_helper

    model_dir, out, _ = llm_run
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    decode = copy / "onnx" / "decode.onnx"
    graph = onnx.load(str(decode))
    weight = max(graph.graph.initializer, key=lambda t: len(numpy_helper.to_array(t).ravel()))
    array = numpy_helper.to_array(weight).copy()
    array += 0.5  # a perturbed weight in the saved ONNX
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    onnx.save(graph, str(decode), save_as_external_data=True, location="decode.onnx.data")
    result = run_cli("validate", str(model_dir), str(copy), "--target", "onnx")
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((copy / "report.json").read_text())
    target = report["targets"][0]
    assert target["status"] == "failed"
    decode_report = next(c for c in target["components"] if c["name"] == "decode")
    failing = [o for c in decode_report["checks"] for o in c["outputs"] if not o["passed"]]
    assert failing and failing[0]["max_abs_diff"] > failing[0]["atol"]
    assert "decode" in target["error"]["message"]
    # the prefill graph was not touched and still passes
    assert next(c for c in target["components"] if c["name"] == "prefill")["passed"]


def test_tolerance_override_changes_the_verdict(llm_run, tmp_path):
    model_dir, out, _ = llm_run
    strict = json.loads(json.dumps(RECIPE))
    strict["validation"] = {"formats": {"onnx": {"atol": 0.0, "rtol": 0.0}}}
    recipe = tmp_path / "strict.json"
    recipe.write_text(json.dumps(strict))
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    result = run_cli("validate", str(model_dir), str(copy), "--target", "onnx", "--config", str(recipe))
    report = json.loads((copy / "report.json").read_text())
    checks = [c for comp in report["targets"][0]["components"] for c in comp["checks"]]
    nonzero = [o for c in checks for o in c["outputs"] if (o["max_abs_diff"] or 0) > 0]
    assert nonzero, "ONNX Runtime is expected to differ from eager by rounding"
    assert all(o["atol"] == 0.0 and not o["passed"] for o in nonzero)
    assert result.returncode == 1 and report["status"] == "failed"
    # the same artifacts pass again with the default tolerances
    again = run_cli("validate", str(model_dir), str(copy), "--target", "onnx")
    assert again.returncode == 0, again.stderr[-2000:]


def test_removed_component_is_a_named_failure(llm_run, tmp_path):
    model_dir, out, _ = llm_run
    copy = tmp_path / "out"
    shutil.copytree(out / "dynamo", copy / "dynamo")
    manifest = json.loads((copy / "dynamo" / "export.json").read_text())
    del manifest["components"]["decode"]
    (copy / "dynamo" / "export.json").write_text(json.dumps(manifest))
    result = run_cli("validate", str(model_dir), str(copy), "--target", "dynamo", "--trust-remote-code")
    assert result.returncode == 1
    report = json.loads((copy / "report.json").read_text())
    assert "missing component(s) ['decode']" in report["targets"][0]["error"]["message"]


def test_auto_hf_exporter_from_pretrained_applies_the_recipe(llm_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from exporters import AutoHfExporter

    model_dir, _, _ = llm_run
    exporter = AutoHfExporter.from_pretrained(str(model_dir), target="onnx")
    assert exporter.export_format == "onnx" and exporter.target.opset_version == 18
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    exported = exporter.export_for_generation(model, {"input_ids": torch.tensor([[5, 6, 7, 8]]),
                                                      "attention_mask": torch.ones(1, 4, dtype=torch.long)})
    assert sorted(exported.components) == ["decode", "prefill"]
    exported.save_pretrained(tmp_path / "onnx")
    assert (tmp_path / "onnx" / "decode.onnx").is_file()

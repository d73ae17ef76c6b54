"""A target whose exporting process dies or hangs is reported as crashed / timed out; the others finish, the report
is complete, the exit code is 1, and nothing half-written is left.

The crashing and hanging backends are the real ONNX exporter patched in a driver script that then runs the real CLI
code (`exporters.cli.main`): the forked export process inherits the patch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT
from tests.models import BERT_TWO_TARGETS, tiny_bert

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from transformers.exporters import exporter_onnx, exporter_executorch

    def crash(self, *args, **kwargs):
        os.abort()

    def hang(self, *args, **kwargs):
        time.sleep(600)

    exporter_onnx.OnnxExporter.export_program = crash
    exporter_executorch.ExecutorchExporter.export_program = hang
    from exporters.cli import main
    sys.argv = ["hf-export", *sys.argv[1:]]
    main()
    """
)


# The hanging target's timeout: the wall time each isolated run spends waiting on it (5 s until #48; any value
# past a process start shows the same stop).
HANG_TIMEOUT = 2


@pytest.fixture(scope="module", params=["1", "2"], ids=["jobs-1", "jobs-2"])
def isolated_run(tmp_path_factory, request):
    """The same crashing, hanging and fine targets, exported one at a time and two at a time."""
    root = tmp_path_factory.mktemp(f"isolation-jobs{request.param}")
    recipe = [
        {"name": "crashes", "export_format": "onnx"},
        {"name": "hangs", "export_format": "executorch", "timeout": HANG_TIMEOUT},
        {"name": "fine", "export_format": "dynamo"},
    ]
    model_dir = tiny_bert(root / "model", recipe)
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    out = root / "out"
    result = subprocess.run([sys.executable, str(driver), "run", "--no-bench", str(model_dir), "--out", str(out),
                             "--quiet",
                             "--jobs", request.param], capture_output=True, text=True, cwd=ROOT, timeout=600)
    return out, result


def test_crash_and_timeout_are_reported_and_others_finish(isolated_run):
    out, result = isolated_run
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    status = {t["name"]: t["status"] for t in report["targets"]}
    assert status == {"crashes": "crashed", "hangs": "timed_out", "fine": "passed"}
    crashed = next(t for t in report["targets"] if t["name"] == "crashes")
    assert "signal 6" in crashed["error"]["message"]
    timed_out = next(t for t in report["targets"] if t["name"] == "hangs")
    assert f"timeout of {HANG_TIMEOUT} s" in timed_out["error"]["message"]
    md = (out / "report.md").read_text()
    assert "**crashed**" in md and "**timed_out**" in md and "Reproduce: `hf-export run" in md


def test_no_partial_files_are_left(isolated_run):
    out, _ = isolated_run
    assert not (out / "crashes").exists() and not (out / "hangs").exists()
    assert not list(out.glob(".staging-*"))
    assert (out / "fine" / "export.json").is_file()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A dynamo and an ONNX target of a tiny BERT, run with `--jobs 1` and `--jobs 2`: `{jobs: out folder}`. Through
    the shared store (the tests read the folders only): tests/test_genai.py reads the `--jobs 1` run too (#48)."""
    from tests.export_store import MODEL, OUT, exported

    model_dir = tiny_bert(tmp_path_factory.mktemp("two-runs") / "model", BERT_TWO_TARGETS)
    outs = {}
    for jobs in ("1", "2"):
        result = exported(model_dir, "run", "--no-bench", MODEL, "--out", OUT, "--quiet", "--jobs", jobs)
        assert result.returncode == 0, result.stderr[-2000:]
        outs[jobs] = result.out
    return outs


def test_parallel_exports_give_the_same_verdicts_and_artifacts(two_runs):
    """`--jobs 2` exports two targets at once: same verdicts and byte-identical artifacts as `--jobs 1`."""
    reports = {jobs: json.loads((out / "report.json").read_text()) for jobs, out in two_runs.items()}
    assert reports["1"]["jobs"] == 1 and reports["2"]["jobs"] == 2

    def verdicts(report):
        return [(t["name"], t["status"], [(c["name"], [k["verdict"] for k in c["checks"]]) for c in t["components"]])
                for t in report["targets"]]

    def artifacts(report):
        return {f["path"]: f["sha256"] for t in report["targets"] for f in t["files"]}

    assert verdicts(reports["1"]) == verdicts(reports["2"])
    assert artifacts(reports["1"]) == artifacts(reports["2"])


def test_an_export_process_loads_only_the_runtimes_its_format_needs(two_runs):
    """Each export child's log names the runtimes in its `sys.modules` when it finished (its own imports and what it
    inherited from the parent at fork): the dynamo export loads neither ONNX nor ExecuTorch, the ONNX export no
    ExecuTorch, whether the two run one after the other (the ONNX child forks after the dynamo target was validated)
    or at once. torchao is loaded by transformers itself when installed (docs/upstream-gaps.md #29)."""
    from exporters.run.isolation import LOADED_RUNTIMES, RUNTIME_MODULES

    for jobs, out in two_runs.items():
        loaded = {}
        for name in ("dynamo", "onnx"):
            [line] = [line for line in (out / "logs" / f"{name}.log").read_text().splitlines()
                      if line.startswith(LOADED_RUNTIMES)]
            loaded[name] = set(line.removeprefix(LOADED_RUNTIMES).strip().split(", ")) - {"none"}
            assert loaded[name] <= set(RUNTIME_MODULES), line
        assert not loaded["dynamo"] & {"onnx", "onnxscript", "onnxruntime", "executorch"}, (jobs, loaded)
        assert {"onnx", "onnxscript"} <= loaded["onnx"], (jobs, loaded)  # the line names what was loaded
        assert "executorch" not in loaded["onnx"], (jobs, loaded)


def test_validation_next_to_running_exports_uses_the_free_cores():
    """Validation overlapping running exports takes the cores they leave free (torch and ONNX Runtime alike), at
    least one, and gives the threads back afterwards, also when it raises."""
    import torch

    from exporters.run.resources import threads_left
    from exporters.upstream import lean_session_options

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        with threads_left(busy=1, cores=4) as threads:
            assert threads == torch.get_num_threads() == 3
            assert lean_session_options().intra_op_num_threads == 3
        assert torch.get_num_threads() == 4
        with threads_left(busy=3, cores=2) as threads:  # more exports than cores: still one thread
            assert threads == torch.get_num_threads() == 1
        with threads_left(busy=0, cores=8) as threads:  # never more threads than the process had
            assert threads == torch.get_num_threads() == 4
        with pytest.raises(RuntimeError), threads_left(busy=1, cores=4):
            raise RuntimeError("validation failed")
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def test_an_export_child_leaves_what_it_inherits_out_of_its_collections(tmp_path):
    """The export child (`run_isolated`, forked from the run) freezes what it inherits (the imported stack, the
    model): a collection there walks only the objects the child made, and still frees a cycle the child made."""
    import gc
    import weakref

    from exporters.run.isolation import run_isolated

    inherited = [object() for _ in range(10)]  # alive in the parent, and in the child for its whole life

    def work():
        class Node:
            pass

        cycle = Node()
        cycle.self = cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()), "cycle_freed": gone() is None,
                "inherited": len(inherited)}

    result = run_isolated(work, log_path=tmp_path / "child.log", timeout=120)
    assert result["ok"] and result["cycle_freed"] and result["inherited"] == 10, result
    assert result["frozen"] > 100_000 > result["tracked"], result  # the stack (torch's modules) is frozen, not walked



def test_an_export_that_ends_after_its_deadline_is_timed_out_whenever_the_parent_looks(tmp_path):
    """A child that finishes after its timeout while the parent was busy (a run computes the eager side meanwhile)
    is timed out, as one still running when the parent looks: the verdict never depends on when the parent looked
    (CI of this stop: a one-layer export beat the parent's eager side and passed a 0.01 s timeout). One that ends
    in time passes."""
    from exporters.run.isolation import Isolated

    late = Isolated(lambda: time.sleep(0.5) or {"done": True}, log_path=tmp_path / "late.log", timeout=0.1)
    in_time = Isolated(lambda: {"done": True}, log_path=tmp_path / "in-time.log", timeout=60)
    late.process.join()  # the parent busy elsewhere until the child has finished
    in_time.process.join()
    assert late.result() == {"ok": False, "status": "timed_out", "type": "TimeoutError",
                             "message": "the export ran past its timeout of 0.1 s and was stopped"}
    assert in_time.result() == {"ok": True, "done": True}

def test_the_cli_run_freezes_the_stack_it_imported_before_the_run(tmp_path):
    """`hf-export run` freezes what it imported (torch, transformers, the exporters) before the run starts: the
    run's collections (after each target's validation, after the eager weights are freed) walk only its own objects.
    The run itself is replaced here by one that reports what the collector holds."""
    code = textwrap.dedent("""
        import gc, json, sys
        import exporters.run.pipeline as pipeline

        def reported(model, options):
            print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
            sys.exit(0)

        pipeline.run_pipeline = reported
        from exporters.cli import main
        sys.argv = ["hf-export", "run", sys.argv[1], "--out", sys.argv[2], "--no-bench", "--quiet"]
        main()
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model"), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    held = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and held["frozen"] > 100_000 > held["tracked"], (held, done.stderr[-2000:])

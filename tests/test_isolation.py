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

import pytest

from tests.conftest import ROOT
from tests.models import tiny_bert

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


@pytest.fixture(scope="module", params=["1", "2"], ids=["jobs-1", "jobs-2"])
def isolated_run(tmp_path_factory, request):
    """The same crashing, hanging and fine targets, exported one at a time and two at a time."""
    root = tmp_path_factory.mktemp(f"isolation-jobs{request.param}")
    recipe = [
        {"name": "crashes", "export_format": "onnx"},
        {"name": "hangs", "export_format": "executorch", "timeout": 5},
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
    assert "timeout of 5 s" in timed_out["error"]["message"]
    md = (out / "report.md").read_text()
    assert "**crashed**" in md and "**timed_out**" in md and "Reproduce: `hf-export run" in md


def test_no_partial_files_are_left(isolated_run):
    out, _ = isolated_run
    assert not (out / "crashes").exists() and not (out / "hangs").exists()
    assert not list(out.glob(".staging-*"))
    assert (out / "fine" / "export.json").is_file()


def test_parallel_exports_give_the_same_verdicts_and_artifacts(tmp_path):
    """`--jobs 2` exports two targets at once: same verdicts and byte-identical artifacts as `--jobs 1`."""
    from tests.conftest import run_cli

    recipe = [{"name": "dynamo", "export_format": "dynamo", "dynamic": True},
              {"name": "onnx", "export_format": "onnx", "dynamic": True}]
    model_dir = tiny_bert(tmp_path / "model", recipe)
    reports = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"out-{jobs}"
        result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet", "--jobs", jobs)
        assert result.returncode == 0, result.stderr[-2000:]
        reports[jobs] = json.loads((out / "report.json").read_text())
    assert reports["1"]["jobs"] == 1 and reports["2"]["jobs"] == 2

    def verdicts(report):
        return [(t["name"], t["status"], [(c["name"], [k["verdict"] for k in c["checks"]]) for c in t["components"]])
                for t in report["targets"]]

    def artifacts(report):
        return {f["path"]: f["sha256"] for t in report["targets"] for f in t["files"]}

    assert verdicts(reports["1"]) == verdicts(reports["2"])
    assert artifacts(reports["1"]) == artifacts(reports["2"])


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

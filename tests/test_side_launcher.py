"""The side environment's proofs started warm (tests/side_launcher.py, #48): a run's `HF_EXPORT_OPTIMUM_PYTHON -c`
child forked from the side launcher answers as a cold interpreter does, exits as it does, dies with its shim when the
run's timeout kills it, and starts cold whenever the launcher's imports could differ from a cold interpreter's.
Never skipped: `make test-deps` creates the side environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporters.layouts.child import PROOF_PYTHON_SETTING, SIDE_PYTHON_SETTING, child_environment, run_in_child
from exporters.layouts.executorch_llm import RUNTIME_WITHOUT_COMPILER, runner_child_imports
from tests import side_launcher
from tests.conftest import ROOT, process_alive

SIDE = ROOT / ".cache" / "optimum-venv" / "bin" / "python"
# What the child says about itself: who started it (the side launcher when warm, the run when cold), and what it loaded
WHO = """
import json, os, sys
spec = json.loads(sys.argv[1])
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
import transformers
json.dump({"parent": [part.decode() for part in parent if part], "argv": sys.argv, "executable": sys.executable,
           "transformers": transformers.__version__, "x": spec["x"] * 2, "path0": sys.path[0], "cwd": os.getcwd()},
          open(spec["result"], "w"))
"""


@pytest.fixture(scope="module")
def shim() -> Path:
    """This worker's shim (tests/conftest.py installs it for the session)."""
    path = Path(os.environ.get(SIDE_PYTHON_SETTING, ""))
    assert path.name == "python" and path.parent.name.startswith("hf-export-side-"), \
        f"the session installed no side shim ({path}): is .cache/optimum-venv there (make test-deps)?"
    return path


def _warm_env() -> dict[str, str]:
    """The environment a run gives its side proofs (the launcher's)."""
    return {k: v for k, v in child_environment().items() if k != "PYTHONPATH"}


def test_a_side_proof_runs_warm_and_answers_as_a_cold_one(shim):
    warm, why = run_in_child(WHO, {"x": 21}, python=str(shim))
    cold, why_cold = run_in_child(WHO, {"x": 21}, python=str(SIDE))
    assert why == why_cold == "", (why, why_cold)
    assert "tests.cli_launcher" in warm["parent"] and "side" in warm["parent"], warm["parent"]  # forked warm
    assert "tests.cli_launcher" not in cold["parent"], cold["parent"]
    assert warm["transformers"] == cold["transformers"] and warm["transformers"].startswith("4."), (warm, cold)
    for key in ("x", "path0", "executable"):
        assert warm[key] == cold[key], (key, warm[key], cold[key])
    assert warm["argv"][0] == cold["argv"][0] == "-c" and len(warm["argv"]) == len(cold["argv"]) == 2
    assert warm["cwd"] != cold["cwd"] and Path(warm["cwd"]).name.startswith("tmp")  # each child's own scratch


def test_the_exit_status_output_and_a_signal_reach_the_run_as_from_a_cold_interpreter(shim):
    env = _warm_env()
    for code, status, out in (("print('hello'); import sys; sys.exit(3)", 3, "hello\n"),
                              ("import sys; print('to stderr', file=sys.stderr)", 0, ""),
                              ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, ""),
                              ("raise ValueError('bad folder')", 1, "")):
        runs = [subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
                for python in (str(shim), str(SIDE))]
        assert [r.returncode for r in runs] == [status, status], (code, runs)
        assert runs[0].stdout == runs[1].stdout == out, (code, runs)
        assert runs[0].stderr.splitlines()[-1:] == runs[1].stderr.splitlines()[-1:], (code, runs)


def test_a_run_that_kills_the_shim_at_its_timeout_kills_the_warm_child(shim, tmp_path):
    """The child holds the run's output pipes: a child left running would also hold the run until it ended (here
    after 600 s), so the run returning at all says it was killed; its pid is gone."""
    pid_file = tmp_path / "pid"
    code = ("import json, os, sys, time; spec = json.loads(sys.argv[1]); "
            "open(spec['pid_file'], 'w').write(str(os.getpid())); time.sleep(600)")
    started = time.monotonic()
    answer, why = run_in_child(code, {"pid_file": str(pid_file)}, python=str(shim), timeout_s=8)
    assert answer is None and "did not finish in 8 s" in why, why
    assert time.monotonic() - started < 300, "the run waited for the warm child to end on its own"
    pid = int(pid_file.read_text())
    assert not process_alive(pid), f"the warm child {pid} outlived the run's timeout"


def test_a_call_the_launcher_could_answer_otherwise_starts_cold(shim, tmp_path):
    """Another environment (a thread setting), a script instead of `-c`: each runs in the side environment's own
    cold interpreter, with the same answer. A cwd holding a package the launcher imported (`numpy`) is what `-c`
    imports from there, as a cold interpreter does, not the launcher's."""
    script = tmp_path / "who.py"
    script.write_text(WHO)
    spec = json.dumps({"x": 1, "result": str(tmp_path / "result.json")})
    for argv, env in ((["-c", WHO, spec], {**_warm_env(), "OMP_NUM_THREADS": "1"}), ([str(script), spec], _warm_env())):
        done = subprocess.run([str(shim), *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        answer = json.loads((tmp_path / "result.json").read_text())
        assert "tests.cli_launcher" not in " ".join(answer["parent"]), (argv[0], answer["parent"])
        assert answer["x"] == 2 and answer["transformers"].startswith("4."), answer
    work = tmp_path / "work"
    work.mkdir()
    (work / "numpy.py").write_text("print('the cwd numpy')\n")
    code = "import numpy"
    runs = [subprocess.run([python, "-c", code], capture_output=True, text=True, env=_warm_env(), cwd=work,
                           timeout=120) for python in (str(shim), str(SIDE))]
    assert runs[0].stdout == runs[1].stdout == "the cwd numpy\n", runs


# What a proof child of this environment says about itself once it has loaded what the runner and GenAI proofs load
PROOF_WHO = RUNTIME_WITHOUT_COMPILER + runner_child_imports("TextLLMRunner") + """
import json, os, sys
import onnxruntime_genai
spec = json.loads(sys.argv[1])
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
json.dump({"parent": [part.decode() for part in parent if part], "modules": sorted(sys.modules), "argv": sys.argv,
           "executable": sys.executable, "path": sys.path, "group": os.getpgid(0) == os.getpid()},
          open(spec["result"], "w"))
"""


def test_this_environments_proof_launcher_forks_with_one_thread_children_that_load_what_cold_ones_do(monkeypatch):
    """The launcher of this environment's proofs (ExecuTorch's runners, GenAI: `HF_EXPORT_PROOF_PYTHON`) forks with
    one thread; its child, which leads its own process group as a cold one started in its own session does, holds
    no module a cold child of the same code does not (no exporter: executorch.exir, torch._inductor) and has the
    same argv, executable and sys.path. Shut down, the launcher ends and its folder (socket, log, shim) is gone."""
    shim = side_launcher.install(Path(sys.executable), dict(os.environ), "proof", RUNTIME_WITHOUT_COMPILER)
    assert shim is not None and shim.parent.name.startswith("hf-export-proof-")
    config = json.loads((shim.parent / "config.json").read_text())
    [launcher] = [process for process, _, folder in side_launcher._RUNNING if folder == shim.parent]
    try:
        assert config["threads"] == 1, config
        answers = {}
        for how, python in (("warm", str(shim)), ("cold", sys.executable)):
            monkeypatch.setenv(PROOF_PYTHON_SETTING, python)
            answers[how], why = run_in_child(PROOF_WHO, {})
            assert why == "", (how, why)
        warm, cold = answers["warm"], answers["cold"]
        assert side_launcher.calls(shim) == ["warm"]
        assert "tests.cli_launcher" in warm["parent"] and "proof" in warm["parent"], warm["parent"]
        assert "tests.cli_launcher" not in cold["parent"], cold["parent"]
        extra = [name for name in set(warm["modules"]) - set(cold["modules"]) if name.split(".")[0] != "tests"]
        assert not extra, sorted(extra)
        assert "executorch.extension.llm.runner" in warm["modules"] and "executorch.exir" not in warm["modules"]
        for key in ("executable", "path", "group"):
            assert warm[key] == cold[key], (key, warm[key], cold[key])
        assert warm["group"] is True and [len(warm["argv"]), warm["argv"][0]] == [len(cold["argv"]), "-c"]
    finally:
        side_launcher.shut_down(shim.parent)
    assert launcher.poll() is not None and not shim.parent.exists(), "the launcher or its folder was left behind"

"""Shared fixtures: the local Hub and GitHub emulators, and tiny models built once per session.

`run_cli` starts the real CLI in its own process forked from a per-worker launcher that has imported torch and the
rest of the environment-blind stack, through a zygote that imported huggingface_hub, transformers and ours with the
call's own HF_* values (tests/cli_launcher.py, #48); `HF_EXPORT_TEST_COLD_CLI=1` starts every call in a
cold interpreter instead, and a test about the CLI's start-up stays cold (`COLD_MODULES`, `@pytest.mark.cold_cli`).
The runs' runtime proofs start warm: optimum's and sentence-transformers' from a launcher in the side environment,
ExecuTorch's runners and ONNX Runtime GenAI's from one in this environment (tests/side_launcher.py, installed per
worker by `_proofs_warm`).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests import cli_launcher, side_launcher

pytest_plugins = ["tests.servers.hub_fixtures", "tests.servers.github_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
# The product sets PYTORCH_NVML_BASED_CUDA_CHECK=1 in its own process before it asks torch about CUDA (exporters.run.
# context.cuda_available, prepare_run). A test that runs the product in this process would otherwise change this
# worker's environment after its CLI launcher started, and every later CLI call would start cold (CI of stop 59).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
# Importing torch._dynamo (a test's in-process torch.export) writes torch._inductor's default TORCHINDUCTOR_CACHE_DIR
# into os.environ, which restarted a worker's launcher started before it (eleventh round): the same folder, set first.
_USER = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch's default_cache_dir() spells it
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{_USER}"))
# `run_cli` gives every CLI run PYTHONUNBUFFERED=1, which a run hands its proofs (`child_environment`): the proof
# launchers (`_proofs_warm`) start with this worker's environment, so it holds the same value (else every proof a
# run starts differs from its launcher's environment and starts cold).
os.environ.setdefault("PYTHONUNBUFFERED", "1")
CLI = [sys.executable, "-m", "exporters.cli"]
# Modules whose CLI runs are about the start-up itself, started cold (their own subprocesses are cold anyway).
COLD_MODULES = {"tests/test_first_hour.py": "the README's commands run as a user types them"}


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real `hf-export` CLI in its own process, as a user would: forked from this worker's launcher, which
    has imported the stack (the part that reads HF_* in a zygote per set of values), or cold (tests/cli_launcher.py
    says when); the same exit code, output and files either way, and `timeout` kills it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return cli_launcher.launch(list(args), full_env, cwd or ROOT, timeout).done


PLAINEST_EXECUTORCH = {"export_format": "executorch", "mode": "generation"}


def image_proof_context(model_dir: Path, inputs: dict[str, Any]) -> Any:
    """The MultimodalRunner proof's context for a stored folder of the plainest ExecuTorch recipe of the
    vision-language model in `model_dir`, proven on `inputs` (a processor's output): a test re-proves the folder on
    another prompt (two images, a mutant) through the product's own `reference` and `prove`."""
    from exporters.layouts.child import RuntimeContext
    from exporters.recipe.load import parse_recipe

    recipe = parse_recipe(json.dumps(PLAINEST_EXECUTORCH))
    return RuntimeContext(target=recipe.exports[0], recipe=recipe, family="vision-language",
                          generate_inputs=inputs, source_dir=model_dir)


def image_proven(model: Any, model_dir: Path, out: Path, inputs: dict[str, Any]) -> tuple[Any, dict, Any, Any]:
    """The stored folder `out/executorch` proven again on `inputs` through the product's own MultimodalRunner proof:
    (layout, eager's reference, the proof, its context), for a test that asserts the proof's detail and then proves a
    mutant of the folder or of the inputs against the same reference."""
    from exporters.layouts.executorch_multimodal import ExecutorchMultimodal
    from exporters.layouts.executorch_multimodal.proof import prove, reference

    context = image_proof_context(model_dir, inputs)
    layout = ExecutorchMultimodal()
    made = reference(layout, model, context)
    return layout, made, prove(layout, out / "executorch", made, context), context


def run_plainest_executorch(root: Path, build, **model_options) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The first recipe an on-device user writes, on the tiny model `build(folder, recipe, **model_options)` makes
    in `root/model`, through the real CLI into `root/out`: (model folder, output folder, the finished process)."""
    model_dir = build(root / "model", PLAINEST_EXECUTORCH, **model_options)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def run_and_read(root: Path, model_dir: Path, bench: bool = False) -> tuple[Path, dict, str]:
    """`hf-export run` of `model_dir` into `root/out` through the real CLI (`--no-bench` unless `bench`): (output
    folder, report.json's content or {} when none was written, the process's output)."""
    out = root / "out"
    done = run_cli("run", *([] if bench else ["--no-bench"]), str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return out, report, done.stdout + done.stderr


def targets_by_name(report: dict) -> dict[str, dict]:
    """report.json's targets by their name: `targets_by_name(report)["onnx"]["status"]`."""
    return {target["name"]: target for target in report["targets"]}


def pytest_configure(config) -> None:
    """`cold_cli(reason)` marks a test whose `run_cli` calls start a cold interpreter.

    The order below holds under xdist: pytest-xdist (3.8) reorders `--dist loadfile`'s modules by their number
    of tests unless told not to (`--loadscope-reorder`, its default), which put the 247 quick matrix checks first
    and one-export modules such as tests/test_bench_start.py last, whatever they cost."""
    config.addinivalue_line("markers", "cold_cli(reason): run_cli starts the CLI cold (a test about its start-up)")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test about the CLI's start-up runs it cold, its fixtures' runs included."""
    marker = item.get_closest_marker("cold_cli")
    cli_launcher.set_cold(marker.args[0] if marker and marker.args else "marked cold_cli" if marker else
                          COLD_MODULES.get(item.nodeid.split("::")[0], ""))
    try:
        return (yield)
    finally:
        cli_launcher.set_cold("")


def pytest_sessionfinish(session) -> None:
    """Each xdist worker (or the one process) stops its CLI and side launchers at the session's end."""
    cli_launcher.shut_down()
    side_launcher.shut_down()


@pytest.fixture(autouse=True, scope="session")
def _proofs_warm():
    """The runs' runtime proofs start warm (tests/side_launcher.py): this worker's `HF_EXPORT_OPTIMUM_PYTHON` names a
    shim that forks optimum's and sentence-transformers' from a launcher in the side environment, and its
    `HF_EXPORT_PROOF_PYTHON` one that forks ExecuTorch's runners' and ONNX Runtime GenAI's from a launcher in this
    environment, each of which has imported its runtimes once. Not under `HF_EXPORT_TEST_COLD_CLI=1`; the side one
    not without a side environment."""
    from exporters.layouts.child import PROOF_PYTHON_SETTING, SIDE_PYTHON_SETTING, proof_python, side_python
    from exporters.layouts.executorch_llm import RUNTIME_WITHOUT_COMPILER  # how a proof's child loads the runtime

    if os.environ.get(cli_launcher.COLD_ENV) != "1":
        for setting, python, preload, code in ((SIDE_PYTHON_SETTING, side_python(), "side", ""),
                                               (PROOF_PYTHON_SETTING, proof_python(), "proof",
                                                RUNTIME_WITHOUT_COMPILER)):
            shim = side_launcher.install(Path(python), dict(os.environ), preload, code) if python else None
            if shim is not None:
                os.environ[setting] = str(shim)
    yield


def pytest_collection_modifyitems(config, items) -> None:
    """Longest modules first (`tests/module_durations.json`, written by `benchmarks/suite_durations.py
    --write-order` from a run's JUnit XML): with `--dist loadfile` the two workers then end together. A module not
    recorded yet goes first (it may be long); the order inside a module is kept."""
    try:
        recorded = json.loads((ROOT / "tests" / "module_durations.json").read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -float(recorded.get(item.nodeid.split("::")[0], float("inf"))))


FIXTURE_SETUP = "fixture_setup"  # the JUnit property benchmarks/suite_durations.py sums per fixture


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Each fixture's setup seconds on the test that paid for it, as a (`fixture_setup`, `name=seconds`) user
    property (`tests/test_x.py::name` for a module's own fixture): `--junitxml` writes it beside the test, and
    `benchmarks/suite_durations.py` sums it per fixture. A fixture cached for its scope is set up (and counted)
    once; the fixtures it requests are set up before this hook and counted on their own."""
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        seconds = time.perf_counter() - started
        item = getattr(request, "_pyfuncitem", None)  # the test whose setup this is, whatever the fixture's scope
        if item is not None and seconds >= 0.0005:  # tmp_path, monkeypatch and the like would only pad the XML
            where = fixturedef.baseid.split("::")[0]  # a module's own fixture is named with its module
            name = f"{where}::{fixturedef.argname}" if where.endswith(".py") else fixturedef.argname
            item.user_properties.append((FIXTURE_SETUP, f"{name}={seconds:.3f}"))


@pytest.fixture(autouse=True, scope="session")
def _torch_serde_logging():
    """torch 2.13's `.pt2` loader logs a malformed warning; pytest's log capture turns the logging error into a
    failure. Tests that load `.pt2` files with upstream directly get the same fix the library applies."""
    import logging

    from exporters.upstream import TORCH_SERDE_LOGGER

    logging.getLogger(TORCH_SERDE_LOGGER).setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A tiny Llama with a one-target dynamo generation recipe."""
    from tests.models import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def trained_llm_dir(tmp_path_factory) -> Path:
    """The tiny LLM trained once per session (tests/trained.py: its greedy continuations are stable, so quality
    budgets judged on it mean something); copy it with `tests.trained.trained_llama(folder, recipe, this)`."""
    from tests.trained import train_once

    return train_once(tmp_path_factory.mktemp("trained-llm") / "model")


def assert_greedy_parity(generation: dict, prompt_length: int, new_tokens: int) -> None:
    """A generation report that passed: the prompt's length, eager's `new_tokens` greedy tokens equal to the
    exported graphs', and tokens that vary (so the check could fail)."""
    assert generation["status"] == "passed", generation
    assert generation["prompt_length"] == prompt_length
    tokens = generation["eager_tokens"][0]
    assert len(tokens) == new_tokens and tokens == generation["exported_tokens"][0][: len(tokens)]
    assert len(set(tokens)) > 1, tokens  # greedy decoding varies: the check can fail


def teardown_marker(marks: str) -> str:
    """Python source that, run first in a process, appends "atexit " to a file from an exit handler and "teardown "
    from a global's finalizer, which runs only in the interpreter's teardown (it writes with what it holds: builtins
    may be gone by then); `marks` is a Python expression for the file's path, evaluated there (`atexit`, `json`,
    `os` and `sys` are imported first). The tests of the processes that end without that teardown (#48) read the file.

    Example:
        >>> "teardown " in teardown_marker('os.environ["TEARDOWN_MARKS"]')
        True
    """
    return f"""import atexit, json, os, sys
_marks = os.open({marks}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
class _Teardown:
    def __init__(self, write, marks):
        self.write, self.marks = write, marks
    def __del__(self):
        self.write(self.marks, b"teardown ")
_kept = _Teardown(os.write, _marks)
atexit.register(lambda: os.write(_marks, b"atexit "))
"""

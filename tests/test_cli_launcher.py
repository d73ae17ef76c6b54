"""The CLI the tests start warm is the CLI a user starts (#48, tests/cli_launcher.py): the same exit code, output and
report as a cold `python -m exporters.cli`, the environment of each call seen (nothing that reads HF_* preloaded), an
uncaught exception reported as the interpreter reports it, a timeout that kills it, and one launcher per worker
that ends with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import cli_launcher
from tests.conftest import ROOT, process_alive, targets_by_name, teardown_marker
from tests.models import tiny_bert, write_recipe
from tests.servers.hub import HubEmulator

# What a cold `hf-export run` holds when it exports: the CLI and the pipeline it imports, and what every export loads
# at its first symbolic shape (torch's guard provenance, sympy's Add), as a tiny export does
COLD_EXPORT = ("import sys, json, exporters.cli, exporters.run.pipeline, sympy\n"
               "from torch.fx.experimental.symbolic_shapes import uninteresting_files\n"
               "uninteresting_files(); sympy.Symbol('s') + 1\n"
               "print(json.dumps(sorted(sys.modules)))")
_COLD_HELD: dict[str, frozenset[str]] = {}


def _cold_held(export_format: str) -> frozenset[str]:
    """What a cold `hf-export run` holds when it exports (`COLD_EXPORT`), and, for a format, after that format's
    `exporter_ready` too: the two sets are two snapshots of one cold interpreter (a format's loaders only add
    modules), ONNX's process gives the plain set, ExecuTorch's is a process of its own so that it holds nothing ONNX
    loaded (#48: two cold interpreters for the module's four uses of these sets, not four)."""
    if export_format not in _COLD_HELD:
        named = export_format or "onnx"
        then = f"\nexporters.run.pipeline.exporter_ready({named!r})\nprint(json.dumps(sorted(sys.modules)))"
        plain, loaded = subprocess.run([sys.executable, "-c", COLD_EXPORT + then], capture_output=True, text=True,
                                       cwd=ROOT, timeout=300, check=True).stdout.splitlines()
        _COLD_HELD.setdefault("", frozenset(json.loads(plain)))
        _COLD_HELD[named] = frozenset(json.loads(loaded))
    return _COLD_HELD[export_format]


def _both(args: list[str], env: dict[str, str] | None = None,
          cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The same call warm and cold: (warm, cold); the warm one did start warm."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    warm = cli_launcher.launch(args, full_env, cwd, 600, warm=True)
    assert warm.how == "warm", warm.how
    cold = cli_launcher.launch(args, full_env, cwd, 600, warm=False)
    assert cold.how.startswith("cold")
    return warm.done, cold.done


@pytest.mark.parametrize("case", ["help", "bad recipe", "good recipe", "bad flag"])
def test_a_warm_cli_answers_as_a_cold_one(case, tmp_path):
    """`--help`, `check` of a bad and of a good recipe, an unknown flag: the same exit code, stdout and stderr."""
    bad = write_recipe(tmp_path, {"exports": [{"export_format": "tflite"}]}).rename(tmp_path / "bad.json")
    good = write_recipe(tmp_path, {"exports": [{"export_format": "onnx"}]}).rename(tmp_path / "good.json")
    args = {"help": ["--help"], "bad recipe": ["check", str(bad)], "good recipe": ["check", str(good)],
            "bad flag": ["run", "--no-such-flag", str(tmp_path)]}[case]
    warm, cold = _both(args)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.args == cold.args == [sys.executable, "-m", "exporters.cli", *args]
    assert warm.returncode == {"help": 0, "bad recipe": 2, "good recipe": 0, "bad flag": 2}[case], warm.stderr


def test_an_uncaught_exception_comes_back_as_from_a_cold_cli():
    """huggingface_hub reads HF_HUB_ETAG_TIMEOUT at import: a bad value raises in the CLI's own import (it was not
    preloaded), with the interpreter's traceback from `-m`'s frame on and exit code 1, warm as cold."""
    warm, cold = _both(["--version"], {"HF_HUB_ETAG_TIMEOUT": "soon"})
    assert warm.returncode == cold.returncode == 1
    assert warm.stderr == cold.stderr and warm.stdout == cold.stdout
    assert warm.stderr.startswith("Traceback (most recent call last):\n  File \"<frozen runpy>\"")
    assert warm.stderr.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'soon'")


def test_each_warm_call_sees_its_own_environment(tmp_path):
    """Two Hub emulators hold the same repo id with different recipes: each call reads the recipe from the
    HF_ENDPOINT it was given, and HF_HUB_OFFLINE=1 stops the next one before it reaches either; all of them warm."""
    recipes = {"one": [{"name": "onnx-one", "export_format": "onnx"}],
               "two": [{"name": "dynamo-two", "export_format": "dynamo"}]}
    answers = {}
    with HubEmulator() as first, HubEmulator() as second:
        for name, hub in (("one", first), ("two", second)):
            hub.create_model_repo("acme/tiny", {"config.json": json.dumps({"model_type": "bert"}).encode(),
                                                "export_config.json": json.dumps(recipes[name]).encode()})
        for name, hub, offline in (("one", first, "0"), ("two", second, "0"), ("offline", second, "1")):
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": offline,
                   "HF_HOME": str(tmp_path / name), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
            called = cli_launcher.launch(["run", "acme/tiny", "--out", str(tmp_path / f"out-{name}"), "--target",
                                          "nope", "--no-bench", "--quiet"], env, ROOT, 600, warm=True)
            assert called.how == "warm", called.how
            answers[name] = called.done
    assert answers["one"].returncode == answers["two"].returncode == 2, answers["one"].stderr[-2000:]
    assert "onnx-one" in answers["one"].stderr and "dynamo-two" not in answers["one"].stderr
    assert "dynamo-two" in answers["two"].stderr and "onnx-one" not in answers["two"].stderr
    offline = answers["offline"]
    assert offline.returncode != 0 and "HF_HUB_OFFLINE" in offline.stderr, offline.stderr[-2000:]
    assert "dynamo-two" not in offline.stderr


@pytest.mark.parametrize("export_format", ["dynamo", "onnx", "executorch"])
def test_a_tiny_run_warm_writes_what_a_cold_one_writes(export_format, tmp_path):
    """A one-target run of a tiny BERT: the same exit code, verdicts, byte-identical artifacts and tool versions;
    an ONNX or ExecuTorch run is served by its format's zygote (which loaded that exporter before the run)."""
    model = tiny_bert(tmp_path / "model", [{"name": "dynamo", "export_format": export_format}])
    outs = {how: tmp_path / f"out-{how}" for how in ("warm", "cold")}
    runs = {how: cli_launcher.launch(["run", "--no-bench", str(model), "--out", str(out), "--quiet"],
                                     {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 600,
                                     warm=how == "warm")
            for how, out in outs.items()}
    assert runs["warm"].how == "warm" and runs["cold"].how.startswith("cold")
    zygote = "zygote-" + export_format if export_format in cli_launcher.FORMAT_READY else "zygote"
    assert runs["warm"].stage.rsplit(":", 1)[0] == zygote, runs["warm"].stage
    assert runs["warm"].done.returncode == runs["cold"].done.returncode == 0, runs["warm"].done.stderr[-2000:]
    assert runs["warm"].done.stdout.replace("out-warm", "out-cold") == runs["cold"].done.stdout
    reports = {how: json.loads((out / "report.json").read_text()) for how, out in outs.items()}

    def facts(report: dict) -> dict:
        target = targets_by_name(report)["dynamo"]
        return {"status": report["status"], "versions": report["versions"], "target": target["status"],
                "checks": [(c["name"], [k["verdict"] for k in c["checks"]]) for c in target["components"]],
                "files": {f["path"]: f["sha256"] for f in target["files"]}}

    assert facts(reports["warm"]) == facts(reports["cold"])


def test_the_timeout_kills_the_warm_cli(tmp_path):
    """`run_cli(..., timeout=)` raises subprocess.TimeoutExpired and the CLI's process is gone, as with a cold one."""
    model = tiny_bert(tmp_path / "model", [{"export_format": "dynamo"}])
    # the recipe is a FIFO nobody writes: the CLI blocks reading it until it is killed (a tiny export finished within
    # the second once the zygotes had imported the stack, and the test raced it)
    hanging = tmp_path / "recipe.json"
    os.mkfifo(hanging)
    # the launcher and the zygote of this environment started first (a call waits for its zygote's imports)
    assert cli_launcher.launch(["--help"], {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 600).done.returncode == 0
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli_launcher.launch(["run", "--no-bench", str(model), "--config", str(hanging), "--out", str(tmp_path / "out"),
                             "--quiet"], {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 1.0, warm=True)
    assert time.monotonic() - began < 30
    launcher = cli_launcher.launcher().process.pid
    zygotes = _zygotes_of(launcher)
    formats = [pid for zygote in zygotes for pid in _zygotes_of(zygote, cli_launcher.FORMAT_ZYGOTE_NAME)]
    pids = [pid for pid in _children_of(launcher) if pid not in zygotes]
    pids += [pid for zygote in zygotes + formats for pid in _children_of(zygote) if pid not in formats]
    assert not pids, f"the killed CLI still runs: {pids}"


def _children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and process_alive(int(entry.name)):
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _zygotes_of(launcher: int, name: str = cli_launcher.ZYGOTE_NAME) -> list[int]:
    """The launcher's zygotes: its children named ZYGOTE_NAME (each serves the calls of one environment); a zygote's
    format zygotes with `name` FORMAT_ZYGOTE_NAME."""
    found = []
    for pid in _children_of(launcher):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.append(pid)
        except OSError:
            continue
    return found


LAUNCHER_OWNER = """
import json, os
from tests import cli_launcher
from tests.test_cli_launcher import _zygotes_of
done = cli_launcher.launch(["--help"], {**os.environ, "PYTHONUNBUFFERED": "1"}, cli_launcher.ROOT, 120)
launcher = cli_launcher.launcher().process.pid
print(json.dumps({"how": done.how, "stage": done.stage, "launcher": launcher, "code": done.done.returncode,
                  "zygotes": _zygotes_of(launcher)}), flush=True)
os._exit(0)  # no atexit, no session end: as a worker that was killed
"""


def test_a_worker_has_its_own_launcher_and_it_ends_with_the_worker():
    """Each process (each pytest-xdist worker) starts its own launcher on its first call; when the process ends,
    even without a word to it (no atexit, no session end), the launcher ends too: its lifeline pipe closes; and so
    does the zygote that served the call (its pair with the launcher closes)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(LAUNCHER_OWNER)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, cli_launcher.COLD_ENV: "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    told = json.loads(done.stdout)
    assert told["how"] == "warm" and told["code"] == 0
    assert told["stage"] == "zygote:1" and len(told["zygotes"]) == 1, told
    assert told["launcher"] != cli_launcher.launcher().process.pid
    deadline = time.monotonic() + 20
    while any(map(process_alive, [told["launcher"], *told["zygotes"]])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(told["launcher"]), "the launcher outlived its worker"
    assert not process_alive(told["zygotes"][0]), "the zygote outlived its worker"


def test_the_preload_reads_no_setting_the_tests_vary_and_is_loaded_by_a_cold_cli_anyway():
    """What the launcher imported is a subset of what a cold run holds when it exports (`COLD_EXPORT`: so an export
    child forked by the CLI holds what it would hold cold); none of it is huggingface_hub, transformers or ours, and
    the environment keys it read at import include no HF_* or product setting."""
    cold = _cold_held("")
    launcher = cli_launcher.launcher()
    assert "sympy" in launcher.packages and "torch" in launcher.packages
    assert launcher.packages <= {name.split(".")[0] for name in cold}, launcher.packages - cold
    assert not launcher.packages & {"huggingface_hub", "transformers", "exporters", "tests"}, launcher.packages
    assert not {key for key in launcher.reads if key.startswith(("HF_", "HUGGINGFACE", "EXPORT_", "GITHUB_"))}
    assert set(launcher.scanned) <= set(cli_launcher.SCANNERS), launcher.scanned


def test_a_call_that_changes_what_the_preload_read_starts_cold(tmp_path):
    """A PYTHONPATH, a torch setting or a cwd holding a module named like a preloaded one would change what a cold
    interpreter imports: those calls start cold, and say why."""
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    (tmp_path / "torch").mkdir()
    for env, cwd, why in ((base, ROOT, ""), ({**base, "PYTHONPATH": str(tmp_path)}, ROOT, "PYTHONPATH"),
                          ({**base, "TORCH_LOGS": "+dynamo"}, ROOT, "TORCH_LOGS"), (base, tmp_path, "torch")):
        reason = cli_launcher.launcher().cold_reason(env, cwd)
        assert (why in reason) if why else reason == "", (why, reason)


def test_the_product_run_in_this_process_leaves_later_cli_calls_warm(tmp_path):
    """A test that runs the product in the worker (here `prepare_run`, which asks torch about CUDA the way every
    run does) must not change the worker's environment under its launcher: the next CLI call still starts warm.
    (CI of stop 59: the product's PYTORCH_NVML_BASED_CUDA_CHECK, set in process, turned every later call cold.)"""
    from exporters.run.context import RunOptions, prepare_run

    cli_launcher.launcher()  # started before the in-process run, as in a worker that ran CLI tests first
    model = tiny_bert(tmp_path / "model")
    write_recipe(model, {"export_format": "onnx"})
    prepare_run(str(model), RunOptions(out_dir=tmp_path / "out"), exporting=False)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    call = cli_launcher.launch(["--version"], full_env, ROOT, 600, warm=True)
    assert call.how == "warm" and call.done.returncode == 0, (call.how, call.done.stderr[-2000:])


def test_importing_torch_dynamo_in_the_worker_changes_no_setting_its_launcher_read():
    """Importing torch._dynamo (any in-process torch.export) writes torch._inductor's default TORCHINDUCTOR_CACHE_DIR
    into os.environ; a worker whose launcher started before that import restarted it (eleventh round).
    tests/conftest.py sets the same folder first: a fresh interpreter that loads the conftest, then torch._dynamo and
    an export, sees the worker's environment unchanged."""
    code = ("import os, tests.conftest\n"
            "before = dict(os.environ)\n"
            "import torch, torch._dynamo\n"
            "torch.export.export(torch.nn.ReLU(), (torch.ones(2),))\n"
            "print(sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)))\n")
    fresh = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}  # a new worker's
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=fresh, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])


def test_a_worker_whose_own_environment_changed_gets_a_fresh_launcher(monkeypatch):
    """A variable read at start-up set in the worker itself after its launcher started (by anything run in process):
    the next call with the worker's environment still starts warm, from a fresh launcher that has the new value;
    the stale one is stopped and its folder removed."""
    first = cli_launcher.launcher()
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO" if os.environ.get("TORCH_CPP_LOG_LEVEL") != "INFO" else "ERROR")
    call = cli_launcher.launch(["--version"], {**os.environ, "PYTHONUNBUFFERED": "1"}, ROOT, 600, warm=True)
    assert call.how == "warm" and call.done.returncode == 0, (call.how, call.done.stderr[-2000:])
    second = cli_launcher.launcher()
    assert second is not first and second.env["TORCH_CPP_LOG_LEVEL"] == os.environ["TORCH_CPP_LOG_LEVEL"]
    assert first.process.wait(timeout=30) is not None  # the stale launcher was stopped, not left running
    assert not os.path.exists(first.folder), "the stale launcher's folder (socket, log) was left in the temp dir"


def test_another_module_with_its_own_pythonpath_starts_warm_and_sees_what_a_cold_one_sees(tmp_path):
    """`python -m action` goes through the launcher too (tests/test_action.py's `run_action`): a call names its
    module, and a PYTHONPATH of its own puts its entries on sys.path where a cold interpreter puts them (after the
    cwd, before the rest), in place of the launcher's; the module runs as `__main__` with its argv and exit code."""
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "where_am_i.py").write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"name": __name__, "argv": sys.argv[1:], "path": sys.path[:3], "cwd": os.getcwd(),
                          "orig": sys.orig_argv[1:3]}))
        sys.exit(3)
    """))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}
    warm = cli_launcher.launch(["a", "b"], env, work, 120, warm=True, module="where_am_i")
    cold = cli_launcher.launch(["a", "b"], env, work, 120, warm=False, module="where_am_i")
    assert warm.how == "warm" and cold.how.startswith("cold"), (warm.how, cold.how)
    assert warm.done.returncode == cold.done.returncode == 3, warm.done.stderr[-2000:] + cold.done.stderr[-2000:]
    seen = json.loads(warm.done.stdout)
    assert seen == json.loads(cold.done.stdout), (warm.done.stdout, cold.done.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == ["a", "b"] and seen["orig"] == ["-m", "where_am_i"]
    assert seen["path"][:2] == [str(work), str(folder)] and seen["cwd"] == str(work)
    # a PYTHONPATH entry holding a module named like a preloaded package would change what the preload imported
    (folder / "torch").mkdir()
    assert "PYTHONPATH entry" in cli_launcher.launcher().cold_reason(env, work)


def _probe(env: dict[str, str], warm: bool, *args: str, export_format: str = "") -> tuple[cli_launcher.Launch, dict]:
    called = cli_launcher.launch(list(args), env, ROOT, 300, warm=warm, module="tests.hub_settings_probe",
                                 export_format=export_format)
    assert called.done.returncode == 0, called.done.stderr[-3000:]
    return called, json.loads(called.done.stdout)


def test_a_warm_call_sees_its_own_hub_settings_though_a_zygote_imported_huggingface_hub(tmp_path):
    """huggingface_hub and transformers read HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE and the rest at import, and a
    zygote has imported them with an earlier call's environment: a call with other values gets another zygote (or the
    launcher), never the values of the first. Each call sees exactly what a cold interpreter with its environment
    sees, and the later call with the first one's values is served by the first one's zygote, preloaded."""
    base = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
    envs = {name: {**base, "PYTHONUNBUFFERED": "1", "HF_ENDPOINT": f"http://127.0.0.1:{port}",
                   "HF_HOME": str(tmp_path / name), "HF_HUB_OFFLINE": offline, "HF_TOKEN": f"hf_{name}_token",
                   "HF_HUB_DISABLE_PROGRESS_BARS": offline, "HF_HUB_DISABLE_XET": "1"}
            for name, port, offline in (("first", 9, "0"), ("second", 10, "1"))}
    seen, stages, cold_seen = {}, [], {}
    for name in ("first", "second", "first", "second"):
        warm, values = _probe(envs[name], True)
        if name not in cold_seen:  # a cold interpreter's answer depends on its environment only: asked once (#48)
            cold, cold_values = _probe(envs[name], False)
            assert cold.how.startswith("cold") and not cold_values.pop("preloaded"), cold.how
            cold_seen[name] = cold_values
        assert warm.how == "warm", warm.how
        assert values.pop("preloaded"), "the zygote did not preload them"
        assert values == cold_seen[name], (name, values, cold_seen[name])
        assert seen.setdefault(name, values) == values
        stages.append(warm.stage)
    first, second = seen["first"], seen["second"]
    assert first["endpoint"] == first["api_endpoint"] == "http://127.0.0.1:9" and first["offline"] is False
    assert second["endpoint"] == second["api_endpoint"] == "http://127.0.0.1:10" and second["offline"] is True
    assert (first["token"], second["token"]) == ("hf_first_token", "hf_second_token")
    assert first["home"] == str(tmp_path / "first") and second["modules_cache"] == str(tmp_path / "second" / "modules")
    assert first["progress_bars_disabled"] is False and second["progress_bars_disabled"] is True
    assert all(stage.startswith("zygote:") for stage in stages), stages
    assert stages[2] != "zygote:1" and stages[3] != "zygote:1", f"the same values were imported again: {stages}"


@pytest.mark.parametrize("export_format", ["", "executorch", "onnx"])
def test_a_zygote_holds_what_a_cold_cli_run_imports_and_no_thread(export_format, tmp_path):
    """What a zygote imported before a call is a subset of what a cold `hf-export run` holds when it exports (the
    CLI's imports, the pipeline and `EXPORT_INTERNALS`: `COLD_EXPORT`), without the CLI itself (`-m` runs it as
    __main__), and it forks with one thread; a format zygote's, of what a cold run of that format holds when it
    exports (what `exporter_ready` loads before the first export child)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    warm, held = _probe(env, True, "modules", export_format=export_format)
    assert warm.stage.rsplit(":", 1)[0] == (f"zygote-{export_format}" if export_format else "zygote"), warm.stage
    cold = _cold_held(export_format)
    if export_format:
        assert {"executorch": "executorch.exir", "onnx": "onnxscript"}[export_format] in held["modules"]
    preloaded = set(held["modules"]) - {"__main__", "tests", "tests.hub_settings_probe", "runpy"}
    assert set(cli_launcher.EXPORT_INTERNALS) <= preloaded
    assert {"transformers", "huggingface_hub", "exporters.run.pipeline"} <= preloaded
    assert "exporters.cli" not in preloaded and "tests.cli_launcher" not in preloaded
    assert preloaded - cold <= {"tests.cli_launcher"} | {name for name in preloaded if name.startswith("tests")}, \
        sorted(preloaded - cold)
    assert held["threads"] == 1, held


def test_a_cwd_that_holds_its_own_exporters_or_transformers_is_not_served_by_a_zygote(tmp_path):
    """`-m` imports from the cwd first: a cwd holding a package named like one a zygote imported (ours or
    transformers) gets a child of the launcher, which imports it from there, as a cold interpreter does."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    assert cli_launcher.launch(["--help"], env, ROOT, 120, warm=True).stage.startswith("zygote:")
    for package, module in (("exporters", "exporters.cli"), ("transformers", "transformers.cli")):
        work = tmp_path / package
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text("")
        (work / package / "cli.py").write_text(f"print('the cwd\\'s own {package}')\n")
        warm = cli_launcher.launch([], env, work, 120, warm=True, module=module)
        cold = cli_launcher.launch([], env, work, 120, warm=False, module=module)
        assert warm.how == "warm" and warm.stage.startswith("base:"), (package, warm.stage)
        assert warm.done.stdout == cold.done.stdout == f"the cwd's own {package}\n", (warm.done, cold.done)


def test_at_most_three_zygotes_live_and_the_workers_own_outlives_the_others(tmp_path):
    """Calls with four other HF_HOMEs (as each `run_action` gives): the least recently used zygote ends each time a
    fourth would live, never the one of the worker's own environment, which serves the next call again."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stages = [cli_launcher.launch(["--help"], {**env, **extra}, ROOT, 300, warm=True).stage
              for extra in [{}, *({"HF_HOME": str(tmp_path / name)} for name in "abcd"), {}]]
    assert stages[0].startswith("zygote:") and stages[1:5] == ["zygote:1"] * 4, stages
    assert stages[5] != "zygote:1" and stages[5].startswith("zygote:"), stages
    deadline = time.monotonic() + 30
    while len(_zygotes_of(cli_launcher.launcher().process.pid)) > cli_launcher.MAX_ZYGOTES:
        assert time.monotonic() < deadline, "an ended zygote was never reaped"
        time.sleep(0.1)


def test_quiet_mutes_the_weight_loading_bars_of_a_transformers_imported_before_it():
    """A warm start (and a long-lived worker) imported transformers before `--quiet` was parsed: transformers read
    HF_HUB_DISABLE_PROGRESS_BARS then, so `no_progress_bars` must switch its bars off itself (the fresh-clone CI of
    the eighth round showed "Loading weights" bars under --quiet)."""
    code = ("import transformers.utils.logging as logging_\n"
            "assert logging_.is_progress_bar_enabled()\n"
            "from exporters.quiet import no_progress_bars\n"
            "no_progress_bars()\n"
            "print(logging_.is_progress_bar_enabled())\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr[-2000:]


SNIPPET = """
import json, os, sys
import __main__
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "orig": sys.orig_argv[1:], "main": sorted(vars(__main__)), "spec": __spec__,
                  "loader": repr(__loader__), "home": os.environ.get("HF_HOME"),
                  "imported": sorted(name for name in ("huggingface_hub", "transformers", "exporters")
                                     if name in sys.modules)}))
sys.stdout.flush()
"""


@pytest.mark.parametrize("ending", ["returns", "raises", "exits"])
def test_code_runs_warm_as_python_c_runs_it(ending, tmp_path):
    """A model card's snippet (tests/card_snippets.py's `run_snippet`) runs as `python -c CODE`, forked from the
    launcher and never from a zygote: `__main__`, argv, sys.path's '' and the cwd as `-c` makes them, the environment
    given, nothing of huggingface_hub, transformers or ours imported before the code imports it, an uncaught exception
    reported from the code's `<string>` frame, and the exit code: the same stdout, stderr and code as a cold one."""
    code = SNIPPET + {"returns": "", "raises": "def broken():\n    raise ValueError('boom')\nbroken()\n",
                      "exits": "sys.exit(3)\n"}[ending]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HOME": str(tmp_path / "home")}
    warm = cli_launcher.launch([], env, tmp_path, 120, warm=True, code=code)
    cold = cli_launcher.launch([], env, tmp_path, 120, warm=False, code=code)
    assert warm.how == "warm" and warm.stage.startswith("base:") and cold.how.startswith("cold"), (warm, cold)
    assert (warm.done.returncode, warm.done.stdout, warm.done.stderr) == (
        cold.done.returncode, cold.done.stdout, cold.done.stderr), (warm.done, cold.done)
    assert warm.done.args == cold.done.args == [sys.executable, "-c", code]
    seen = json.loads(warm.done.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == ["-c"] and seen["path0"] == "" and seen["spec"] is None
    assert seen["cwd"] == str(tmp_path) and seen["home"] == str(tmp_path / "home") and seen["imported"] == []
    assert warm.done.returncode == {"returns": 0, "raises": 1, "exits": 3}[ending], warm.done.stderr
    if ending == "raises":
        assert warm.done.stderr.startswith('Traceback (most recent call last):\n  File "<string>", line ')
        assert warm.done.stderr.rstrip().endswith("ValueError: boom")


# A `-c` code that marks its exit handlers and the interpreter's teardown (a global's finalizer, which writes with what
# it holds: builtins may be gone by then), prints its answer, and with "thread" leaves a non-daemon thread running
# that prints after the code's end
MARKING = teardown_marker('os.environ["TEARDOWN_MARKS"]') + """import threading, time
print("answer")
if sys.argv[1:] == ["thread"]:
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
"""


@pytest.mark.parametrize("thread", [False, True])
def test_code_that_ran_to_its_end_skips_the_interpreters_teardown_but_not_its_exit_handlers(thread, tmp_path):
    """A warm `-c` call (a card snippet) whose code ran to its end ends as `hf-export` ends (#48: the teardown of the
    stack a snippet imported is ~1 CPU s): its exit handlers run and its output is flushed, the teardown is skipped.
    With a non-daemon thread still running it ends as the interpreter ends it, after the thread."""
    marks = tmp_path / "marks"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TEARDOWN_MARKS": str(marks)}  # as `run_snippet` calls it
    launched = cli_launcher.launch(["thread"] if thread else [], env, tmp_path, 120, warm=True, code=MARKING)
    assert launched.how == "warm", launched.how
    assert launched.done.returncode == 0, launched.done.stderr[-3000:]
    assert launched.done.stdout.split("\n") == ["answer", *(["thread done"] if thread else []), ""]
    assert marks.read_text().split() == (["atexit", "teardown"] if thread else ["atexit"])

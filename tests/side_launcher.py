"""The runtime proofs started warm (#48). The side environment's (optimum's and sentence-transformers'), which a run
starts as `$HF_EXPORT_OPTIMUM_PYTHON -c CODE SPEC` (exporters/layouts/child.py `run_in_child`), are forked from a
per-worker launcher in the side environment that has already imported torch, transformers 4.x, ONNX and
sentence-transformers, instead of a cold interpreter importing them again (~6 of a tiny model's ~7 CPU s proof). This
environment's (ExecuTorch's TextLLMRunner, MultimodalRunner and ASR proof, ONNX Runtime GenAI), which a run starts as
`$HF_EXPORT_PROOF_PYTHON -c CODE SPEC`, the same way from a launcher in this environment that has imported numpy,
torch, onnxruntime_genai and executorch's runtime without its compiler (`"proof"`; ~2 CPU s a child).

    hf-export run ──(Popen: [SHIM, "-c", CODE, SPEC], the child environment, its scratch cwd, own session)
        ▼
    SHIM (written per worker; `python -SI`, stdlib only): warm when the call is `-c CODE ...`, its environment is
        exactly the launcher's and its cwd holds no module named like a preloaded package; else it `exec`s the
        environment's own python with the same argv (cold, as the run asked)
        ├──(argv, env, cwd; fds 0/1/2)──► launcher: `PYTHON -m tests.cli_launcher SOCKET LIFELINE side|proof [CODE]`,
        ◄──"pid stage", exit status──     forks one child per call that runs CODE as `python -c` does (tests/
                                          cli_launcher.py `become_cli`) in its own process group, ends it as the
                                          interpreter would, kills the group when the shim ends first, and closes
                                          the call's fds only once it has reaped it
        ▼
    exits with the child's status (a signal's death as that signal)

The product is unchanged: it reads `HF_EXPORT_OPTIMUM_PYTHON` and `HF_EXPORT_PROOF_PYTHON` as an operator's
settings, starts the shim in its own session with the allow-listed environment, applies the memory limit in the
code's first line (in the child, as in a cold one), and kills the shim's process group past the target's timeout: the
shim's end makes the launcher kill the child's group. The proof's code, its runtime's code and the folder it reads are the same; what a warm child shares with its
launcher that a cold interpreter draws afresh: the hash seed. `HF_EXPORT_TEST_COLD_CLI=1` installs no shim (every
proof cold). Each call appends a line to its launcher's `calls.log` (`HF_EXPORT_TEST_SIDE_LOG=FILE`: to FILE): `side`
or `proof`, warm or cold and why, the launcher's folder (`calls`). A launcher's folder (socket, log, config, shim) is removed when `shut_down` ends it.

Example:
    >>> shim = install(Path(".cache/optimum-venv/bin/python"), dict(os.environ))  # doctest: +SKIP
    >>> os.environ["HF_EXPORT_OPTIMUM_PYTHON"] = str(shim)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG_ENV = "HF_EXPORT_TEST_SIDE_LOG"
SHIM = """#!{python} -SI
import sys
sys.path.insert(0, {root!r})
from tests.side_launcher import shim_main
shim_main({config!r})
"""


def install(python: Path, worker_env: dict[str, str], preload: str = "side", code: str = "") -> Path | None:
    """Start this worker's launcher of `preload`'s proofs under `python` with the environment a run gives them (the
    product's `child_environment` of `worker_env`; without PYTHONPATH for a side environment's, `"side"`), which
    imports `tests.cli_launcher.PRELOADS[preload]` then runs `code`, and write the shim that reaches it; the shim's
    path (what `HF_EXPORT_OPTIMUM_PYTHON` or `HF_EXPORT_PROOF_PYTHON` names), or None where the launcher did not
    start (proofs stay cold). `shut_down` ends it and removes its folder (the shim's)."""
    from exporters.layouts.child import child_environment  # what a run gives its proofs

    env = {k: v for k, v in child_environment(worker_env).items() if preload != "side" or k != "PYTHONPATH"}
    folder = Path(tempfile.mkdtemp(prefix=f"hf-export-{preload}-"))
    socket_path = folder / "socket"
    lifeline_read, lifeline = os.pipe()  # the launcher ends when this worker does (EOF on its end)
    with open(folder / "launcher.log", "wb") as log:
        process = subprocess.Popen([str(python), "-m", "tests.cli_launcher", str(socket_path), str(lifeline_read),
                                    preload, *([code] if code else [])], cwd=ROOT, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                   pass_fds=[lifeline_read])
    os.close(lifeline_read)
    ready = process.stdout.readline()
    process.stdout.close()
    _RUNNING.append((process, lifeline, folder))
    if not ready:
        shut_down(folder)
        return None
    facts = json.loads(ready)
    config = folder / "config.json"
    config.write_text(json.dumps({"python": str(python), "socket": str(socket_path), "env": env, "name": preload,
                                  "packages": facts["packages"], "threads": facts["threads"],
                                  "log": worker_env.get(LOG_ENV) or str(folder / "calls.log")}))
    shim = folder / "python"
    shim.write_text(SHIM.format(python=python, root=str(ROOT), config=str(config)))
    shim.chmod(0o755)
    return shim


_RUNNING: list[tuple[subprocess.Popen, int, Path]] = []


def shut_down(only: Path | None = None) -> None:
    """End this worker's proof launchers (EOF on their lifeline; their running children finish on their own) and
    remove their folders (socket, log, shim); `only`: the one in that folder."""
    for entry in [entry for entry in _RUNNING if only in (None, entry[2])]:
        _RUNNING.remove(entry)
        process, lifeline, folder = entry
        os.close(lifeline)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def calls(shim: Path) -> list[str]:
    """How each call the shim `shim` took started, in order: "warm", or "cold: why" (its launcher's log lines).

    Example:
        >>> calls(Path(os.environ["HF_EXPORT_PROOF_PYTHON"]))[-1:]  # doctest: +SKIP
        ['warm']
    """
    config = json.loads((shim.parent / "config.json").read_text())
    try:
        lines = Path(config["log"]).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.split("\t")[1] for line in lines if line.endswith(f"\t{shim.parent}")]


def cold_reason(config: dict, argv: list[str], env: dict[str, str], cwd: str) -> str:
    """Why a call `python *argv` with `env` in `cwd` cannot start warm ("" when it can).

    Example:
        >>> cold_reason({"env": {"PATH": "/bin"}, "packages": ["torch"]}, ["x.py"], {"PATH": "/bin"}, "/")
        'not -c CODE'
    """
    if len(argv) < 2 or argv[0] != "-c":
        return "not -c CODE"
    if env != config["env"]:
        differs = sorted(key for key in set(env) | set(config["env"]) if env.get(key) != config["env"].get(key))
        return f"the environment differs from the launcher's ({differs[0]})"
    try:
        shadows = {name.removesuffix(".py") for name in os.listdir(cwd)} & set(config["packages"])
    except OSError:
        return f"cwd {cwd} cannot be listed"
    return f"the cwd holds {sorted(shadows)[0]}, which -c would import from there" if shadows else ""


def shim_main(config_path: str) -> None:
    """The shim: run `python *sys.argv[1:]` warm through the side launcher, or cold by `exec`."""
    with open(config_path) as file:
        config = json.load(file)
    argv, env, cwd = sys.argv[1:], dict(os.environ), os.getcwd()
    reason = cold_reason(config, argv, env, cwd)
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if not reason:
        try:
            control.connect(config["socket"])
        except OSError as err:  # the launcher is gone (its worker ended): the call runs cold, as asked
            reason = f"the side launcher cannot be reached: {err}"
    with open(config["log"], "a") as log:
        log.write(f"{config['name']}\t{'cold: ' + reason if reason else 'warm'}\t{os.path.dirname(config_path)}\n")
    if reason:
        os.execve(config["python"], [config["python"], *argv], env)
    status = _warm(control, argv, env, cwd)
    if status < 0:  # the child died of a signal: so does the shim, as a cold interpreter's status would read
        os.kill(os.getpid(), -status)
    os._exit(status if status >= 0 else 1)


def _warm(control: socket.socket, argv: list[str], env: dict[str, str], cwd: str) -> int:
    """The call forked from the side launcher on this process's fds 0/1/2; its exit status (negative: a signal;
    1 with a line on stderr when the launcher ended before it said the status)."""
    from tests.cli_launcher import _HEADER, _valid_fd  # stdlib only, as the shim's interpreter (`-SI`) has

    # the product appended its own ending to the code (`END_WITHOUT_TEARDOWN`): past it, the interpreter's
    request = json.dumps({"args": argv[2:], "env": env, "cwd": cwd, "code": argv[1], "leave": "kill",
                          "teardown": True}).encode()
    stdin = 0 if _valid_fd(0) else os.open(os.devnull, os.O_RDONLY)
    socket.send_fds(control, [_HEADER.pack(len(request))], [stdin, 1, 2])
    control.sendall(request)
    answer = b""
    while answer.count(b"\n") < 2:
        data = control.recv(64)
        if not data:
            print("the side launcher ended mid-call", file=sys.stderr, flush=True)
            return 1
        answer += data
    return int(answer.decode().split("\n")[1])



def warm_and_cold(code: str, spec: dict, folder: Path) -> dict:
    """A proof's child of this environment (`code`, `spec`, on `folder`) run as a run runs it (`run_in_child`),
    through this worker's proof shim (`HF_EXPORT_PROOF_PYTHON`), then in a cold interpreter: {"warm": (answer, why),
    "cold": (answer, why), "calls": how the shim started the first ("warm" or "cold: why")}."""
    from exporters.layouts.child import PROOF_PYTHON_SETTING, run_in_child

    shim = Path(os.environ.get(PROOF_PYTHON_SETTING, ""))
    assert shim.name == "python" and shim.parent.name.startswith("hf-export-proof-"), \
        f"the session installed no proof shim ({shim}): HF_EXPORT_TEST_COLD_CLI=1?"
    before = len(calls(shim))
    found = {"warm": run_in_child(code, spec, folder=folder)}
    found["calls"] = calls(shim)[before:]
    os.environ[PROOF_PYTHON_SETTING] = sys.executable
    try:
        found["cold"] = run_in_child(code, spec, folder=folder)
    finally:
        os.environ[PROOF_PYTHON_SETTING] = str(shim)
    return found

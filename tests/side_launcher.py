"""The side environment's runtime proofs started warm (#48): optimum's and sentence-transformers' proofs, which a run
starts as `$HF_EXPORT_OPTIMUM_PYTHON -c CODE SPEC` (exporters/layouts/child.py `run_in_child`), forked from a
per-worker launcher in the side environment that has already imported torch, transformers 4.x, ONNX Runtime, optimum
and sentence-transformers, instead of a cold interpreter importing them again (~6 of a tiny model's ~7 CPU s proof).

    hf-export run ──(Popen: [SHIM, "-c", CODE, SPEC], the child environment, its scratch cwd, own session)
        ▼
    SHIM (written per worker; `python -SI`, stdlib only): warm when the call is `-c CODE ...`, its environment is
        exactly the launcher's and its cwd holds no module named like a preloaded package; else it `exec`s the side
        environment's own python with the same argv (cold, as the run asked)
        ├──(argv, env, cwd; fds 0/1/2)──► side launcher: `SIDE_PYTHON -m tests.cli_launcher SOCKET LIFELINE side`,
        ◄──"pid stage", exit status──     forks one child per call that runs CODE as `python -c` does (tests/
                                          cli_launcher.py `become_cli`), and kills it when the shim ends first
        ▼
    exits with the child's status (a signal's death as that signal)

The product is unchanged: it reads `HF_EXPORT_OPTIMUM_PYTHON` as a user's setting, starts the shim in its own
session with the allow-listed environment, applies the memory limit in the code's first line (in the child, as in a
cold one), and kills the shim's process group past the target's timeout: the shim's end makes the launcher kill the
child. The proof's code, its runtime's code and the folder it reads are the same; what a warm child shares with its
launcher that a cold interpreter draws afresh: the hash seed. `HF_EXPORT_TEST_COLD_CLI=1` installs no shim (every
proof cold); `HF_EXPORT_TEST_SIDE_LOG=FILE` appends one line per call (warm, or cold and why).

Example:
    >>> shim = install(Path(".cache/optimum-venv/bin/python"), dict(os.environ))  # doctest: +SKIP
    >>> os.environ["HF_EXPORT_OPTIMUM_PYTHON"] = str(shim)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
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


def install(side_python: Path, worker_env: dict[str, str]) -> Path | None:
    """Start this worker's side launcher under `side_python` with the environment a run's side proof gets (the
    product's `child_environment` of `worker_env`, without PYTHONPATH) and write the shim that reaches it; the shim's
    path (what `HF_EXPORT_OPTIMUM_PYTHON` names), or None where the launcher did not start (proofs stay cold)."""
    from exporters.layouts.child import child_environment  # what a run gives its side proofs

    env = {k: v for k, v in child_environment(worker_env).items() if k != "PYTHONPATH"}
    folder = Path(tempfile.mkdtemp(prefix="hf-export-side-"))
    socket_path = folder / "socket"
    lifeline_read, lifeline = os.pipe()  # the launcher ends when this worker does (EOF on its end)
    with open(folder / "launcher.log", "wb") as log:
        process = subprocess.Popen([str(side_python), "-m", "tests.cli_launcher", str(socket_path),
                                    str(lifeline_read), "side"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=log, pass_fds=[lifeline_read])
    os.close(lifeline_read)
    ready = process.stdout.readline()
    process.stdout.close()
    if not ready:
        os.close(lifeline)
        process.wait()
        return None
    facts = json.loads(ready)
    config = folder / "config.json"
    config.write_text(json.dumps({"python": str(side_python), "socket": str(socket_path), "env": env,
                                  "packages": facts["packages"], "log": worker_env.get(LOG_ENV, "")}))
    shim = folder / "python"
    shim.write_text(SHIM.format(python=side_python, root=str(ROOT), config=str(config)))
    shim.chmod(0o755)
    _RUNNING.append((process, lifeline))
    return shim


_RUNNING: list[tuple[subprocess.Popen, int]] = []


def shut_down() -> None:
    """End this worker's side launchers (EOF on their lifeline; their running children finish on their own)."""
    while _RUNNING:
        process, lifeline = _RUNNING.pop()
        os.close(lifeline)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    if config.get("log"):
        with open(config["log"], "a") as log:
            log.write(f"{'cold: ' + reason if reason else 'warm'}\n")
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

    request = json.dumps({"args": argv[2:], "env": env, "cwd": cwd, "code": argv[1], "leave": "kill"}).encode()
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


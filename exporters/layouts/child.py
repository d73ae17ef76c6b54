"""A runtime's proof runs in a child process held short: the one way every layout's runtime runs (its Python, a side
environment's Python, Node).

A child ([`run_child`]) runs a runtime's code on a folder nobody vouched for: its environment is an allow-list
(`child_environment`: the paths, locale, temporary folder and thread settings a runtime reads; never a token, a
secret, a key or a password, whatever the name), its memory is limited by the folder's size (`memory_limit`:
`RLIMIT_DATA`, the heap and every private writable mapping, at `MEMORY_FLOOR_BYTES` plus `MEMORY_PER_FOLDER_BYTE`
times the folder's bytes; not `RLIMIT_AS`, which counts the virtual space runtimes and CUDA reserve without using
it), set by a Python launcher before it `exec`s the runtime (so it holds for Node too), and it is killed, with
everything it started, past the target's timeout. [`run_in_child`] is the same for Python code in this environment
(its interpreter `proof_python()`: `HF_EXPORT_PROOF_PYTHON` may name another of this environment) or in another
environment's interpreter (a side environment's).

Example:
    >>> RuntimeProof("ONNX Runtime GenAI", "passed", "8/8 tokens").to_dict()
    {'runtime': 'ONNX Runtime GenAI', 'status': 'passed', 'detail': '8/8 tokens'}
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from exporters.redact import secret_name
from exporters.status import judge_token_count
from exporters.recipe.model import Recipe, Target

# "declined": the runtime cannot take this model (a family, cache or tokenizer kind it does not hold): not the
# artifact's verdict, which stands
ProofStatus = Literal["passed", "failed", "unverified", "declined"]
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where `make` puts the side environments (.cache/)
# The side environment of the runtimes that need transformers 4.x (optimum, sentence-transformers): never the
# product's environment
SIDE_PYTHON_SETTING = "HF_EXPORT_OPTIMUM_PYTHON"
SIDE_PYTHON = PROJECT_ROOT / ".cache" / "optimum-venv" / "bin" / "python"
# The interpreter this environment's Python proofs run under (ExecuTorch's runners, its ASR proof, ONNX Runtime
# GenAI): another interpreter of this same environment (a wrapper, a pre-started one); default this process's own
PROOF_PYTHON_SETTING = "HF_EXPORT_PROOF_PYTHON"
# A side environment's child runs this before its runtime's script: whether its transformers (4.x) knows the folder's
# model type; a family it does not know is one its runtime cannot take (`declined`, the artifact's verdict stands)
KNOWS = r"""
import json, sys
spec = json.loads(sys.argv[1])
from transformers import CONFIG_MAPPING
model_type = json.load(open(spec["folder"] + "/config.json")).get("model_type")
if model_type not in CONFIG_MAPPING:
    import transformers
    why = f"the side environment's transformers {transformers.__version__} has no model type {model_type!r}"
    json.dump({"declined": why}, open(spec["result"], "w"))
    sys.exit(0)
"""
# A Python child's last lines once its code has run to the end with its answer written whole (the result file reads
# as JSON): the exit handlers run, the output is flushed, and the interpreter's teardown is skipped (`os._exit`), as
# `hf-export` itself ends (`exporters.cli.exit_without_teardown`): freeing torch, transformers and the runtime module
# by module is ~1 CPU s of a side environment's ~6 s proof (benchmarks/RESULTS.md, ninth round). A child that raised,
# called `sys.exit`, left its answer unflushed (a file it never closed) or still runs a non-daemon thread ends as the
# interpreter ends it.
END_WITHOUT_TEARDOWN = """
import atexit as _atexit, json as _json, os as _os, sys as _sys, threading as _threading
def _answered():
    try:
        with open(_json.loads(_sys.argv[1])["result"], encoding="utf-8") as _answer:
            _json.load(_answer)
        return True
    except Exception:
        return False
if _answered() and not any(_t is not _threading.main_thread() and not _t.daemon and _t.is_alive()
                           for _t in _threading.enumerate()):
    _atexit._run_exitfuncs()
    _sys.stdout.flush()
    _sys.stderr.flush()
    _os._exit(0)
"""
CHILD_TIMEOUT_S = 3600.0  # a target without a timeout of its own (the run's default per target)
MEMORY_FLOOR_BYTES = 2 << 30  # Python and the runtime's own libraries (the measured children: 120-370 MB of data)
MEMORY_PER_FOLDER_BYTE = 4  # the weights loaded (ONNX Runtime copies external data), the arena and activations
# What a runtime child's environment may hold (`child_environment`), and what it never holds whatever the name
CHILD_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
                       "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
                       "PYTHONUNBUFFERED", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
CHILD_ENV_PREFIXES = ("LC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_")
OUT_OF_MEMORY = re.compile(r"MemoryError|bad_alloc|Cannot allocate memory|out of memory|failed to allocate",
                           re.IGNORECASE)


@dataclass
class RuntimeProof:
    """What one deployment runtime showed for a target folder. A generating runtime's proof also says how many new
    tokens it compared with eager's (`compared`, before the end of sequence) of the `asked` ones (the recipe's
    `max_new_tokens`, over every row), and, where fewer, why (`ended`): [`judged`] flags it.

    Example:
        >>> RuntimeProof("r", "passed", "1/1 tokens", compared=1, asked=8).judged().to_dict()["status"]
        'unverified'
    """

    runtime: str
    status: ProofStatus
    detail: str = ""
    compared: int | None = None
    asked: int | None = None
    ended: str | None = None  # why fewer than `asked` were compared: "eager and the runner stopped at eos"

    def to_dict(self) -> dict[str, Any]:
        """`{runtime, status, detail}`, with `compared`, `asked` and `ended` where the proof counted tokens."""
        return {key: value for key, value in dataclasses.asdict(self).items()
                if value is not None or key in ("runtime", "status", "detail")}

    def judged(self) -> RuntimeProof:
        """The proof as reports show it (`exporters.status.judge_token_count`): a pass over fewer tokens than asked is
        flagged at the head of its detail; one over fewer than two is `unverified`.

        Example:
            >>> RuntimeProof("r", "passed", "5/5 tokens", 5, 8, "eos came first").judged().detail
            '⚠ 5 of 8 tokens compared (eos came first): 5/5 tokens'
        """
        status, detail = judge_token_count(self.status, self.detail, self.compared, self.asked, self.ended)
        short = self.compared is not None and self.asked is not None and self.compared < self.asked
        return dataclasses.replace(self, status=status, detail=detail, ended=self.ended if short else None)


@dataclass
class RuntimeContext:
    """What a runtime check may read: the target, its recipe, the model's kind and the eager side's inputs."""

    target: Target
    recipe: Recipe
    family: str
    generate_inputs: dict[str, Any]
    generation_config: Any = None
    source_dir: Path | None = None  # the model folder (tokenizer and processor files), read as data only
    # eager results two runtimes of the target ask alike, computed once (`greedy.batch_reference`: GenAI's and
    # optimum's batch); the model is held weakly, so keeping a context keeps no weights
    eager_once: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def timeout_s(self) -> float:
        """How long a runtime's child may run: the target's timeout (a run sets it on the planned target: the
        recipe's, else `--timeout`, else the default)."""
        return float(getattr(self.target, "timeout", None) or CHILD_TIMEOUT_S)


def child_timeout(context: RuntimeContext | None) -> float:
    """The seconds a runtime's child may run for `context` (`RuntimeContext.timeout_s`); the default without one."""
    return context.timeout_s if context is not None else float(CHILD_TIMEOUT_S)



_CHILDREN: dict[int | None, subprocess.Popen] = {}  # the runtime child each proving thread waits on


def run_in_child(code: str, spec: dict[str, Any], *, folder: Path | None = None,
                 timeout_s: float = CHILD_TIMEOUT_S, python: str | None = None) -> tuple[Any, str]:
    """Run a runtime's own code in a child Python (a native crash or a hang there ends the proof, not the run):
    `code` reads `json.loads(sys.argv[1])` (`spec` plus `"result"`, a path) and writes its JSON answer there.
    `python`: another environment's interpreter (a side environment's, which holds a runtime this one must not; its
    child gets no PYTHONPATH); default this environment's (`proof_python`).

    The child holds no secret (`child_environment`), may use `memory_limit(folder)` bytes, and is killed with its
    process group after `timeout_s` seconds. Once `code` has run to its end the child exits without the interpreter's
    teardown ([`END_WITHOUT_TEARDOWN`]).

    Returns `(answer, "")`, or `(None, why)` with the child's own error lines.

    Example:
        >>> run_in_child("import json, sys; s = json.loads(sys.argv[1]); json.dump(s['x'] * 2, open(s['result'], 'w'))",
        ...              {"x": 21})
        (42, '')
    """
    interpreter = python or proof_python()
    if not os.access(interpreter, os.X_OK) or os.path.isdir(interpreter):
        return None, (f"the proof's interpreter {interpreter} is not an executable file: set {PROOF_PYTHON_SETTING} "
                      "to a Python of this environment, or unset it" if python is None else
                      f"the interpreter {interpreter} is not an executable file")
    limit = memory_limit(folder)
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        # the limit is the child's first statement (hard and soft: what runs after it cannot raise it)
        first = f"import resource; resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit}))\n"
        command = [interpreter, "-c", first + code + "\n" + END_WITHOUT_TEARDOWN,
                   json.dumps({**spec, "result": str(result)})]
        # another interpreter keeps its own packages: none of this environment's paths
        env = child_environment() if python is None else {k: v for k, v in child_environment().items()
                                                           if k != "PYTHONPATH"}
        return _run(command, Path(scratch), result, folder, timeout_s, env)


# Node (or any program) starts under this launcher: it sets the memory limit, then becomes the program (`exec`
# keeps the limit), so a runtime that is not Python is held as short as one that is.
LAUNCHER = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_DATA, (n, n)); "
            "os.execvp(sys.argv[2], sys.argv[2:])")


def run_script(program: list[str], script: str, spec: dict[str, Any], *, folder: Path | None = None,
               timeout_s: float = CHILD_TIMEOUT_S, links: dict[str, Path] | None = None) -> tuple[Any, str]:
    """Run `script` (written to `script.mjs`, say, in a scratch folder: `program`'s last item names the file) with
    `program` (`["node"]`), held as `run_in_child`'s children are. The script reads
    its spec (`process.argv[2]` in Node, `sys.argv[1]` in Python: `spec` plus `"result"`) and writes its JSON answer to `result`.
    `links`: names made in the scratch folder, each a link to a folder (`node_modules`: the runtime's install).

    Example:
        >>> run_script([sys.executable], "import json, sys; s = json.loads(sys.argv[1]); "
        ...            "json.dump(s['x'] + 1, open(s['result'], 'w'))", {"x": 1})
        (2, '')
    """
    limit = memory_limit(folder)
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        path = Path(scratch) / "script"
        path = path.with_suffix(".mjs" if Path(program[0]).name.startswith("node") else ".py")
        path.write_text(script, encoding="utf-8")
        for name, target in (links or {}).items():
            (Path(scratch) / name).symlink_to(target, target_is_directory=True)
        command = [sys.executable, "-c", LAUNCHER, str(limit), *program, str(path),
                   json.dumps({**spec, "result": str(result)})]
        return _run(command, Path(scratch), result, folder, timeout_s, child_environment())


def _run(command: list[str], scratch: Path, result: Path, folder: Path | None, timeout_s: float,
         env: dict[str, str]) -> tuple[Any, str]:
    """Start `command` in `scratch` with the allow-listed environment `env`, in its own process group; its answer."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=scratch,
                          env=env, start_new_session=True) as run:
        _CHILDREN[threading.get_ident()] = run
        try:
            _, stderr = run.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(run)
            run.communicate()
            return None, f"it did not finish in {timeout_s:g} s (the target's timeout) and was killed"
        finally:
            _CHILDREN.pop(threading.get_ident(), None)
    if run.returncode != 0 or not result.is_file():
        why = child_message(stderr) or f"exit status {run.returncode}"
        if OUT_OF_MEMORY.search(stderr):
            limit = memory_limit(folder)
            why = (f"it ran out of memory: a runtime child may use {limit >> 20} MiB ({MEMORY_FLOOR_BYTES >> 20} "
                   f"MiB and {MEMORY_PER_FOLDER_BYTE}x the folder's {_folder_bytes(folder) >> 20} MiB): {why}")
        return None, why
    return json.loads(result.read_text()), ""


def proof_python() -> str:
    """The interpreter this environment's Python proofs run under: `HF_EXPORT_PROOF_PYTHON` (an operator's: another
    interpreter of this environment), else this process's own. Whichever it is, the child gets the same code, memory
    limit, environment, timeout and scratch folder.

    Example:
        >>> proof_python() == (os.environ.get(PROOF_PYTHON_SETTING) or sys.executable)
        True
    """
    return os.environ.get(PROOF_PYTHON_SETTING) or sys.executable


def side_python() -> Path | None:
    """The side environment's interpreter (optimum, sentence-transformers): `HF_EXPORT_OPTIMUM_PYTHON`, else the
    project's `.cache/optimum-venv` (`make test-deps`); None where neither exists."""
    path = Path(os.environ.get(SIDE_PYTHON_SETTING) or SIDE_PYTHON)
    return path if path.is_file() else None


def kill_child_of(thread: int | None) -> None:
    """Kill the runtime child the thread `thread` waits on (and what it started), if any."""
    child = _CHILDREN.get(thread)
    if child is not None:
        _kill_group(child)


def child_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a runtime child: the allow-listed variables of `environ` (default `os.environ`: paths,
    locale, temporary folder, thread settings), never one whose name says token, secret, key, password, credential or
    auth (`HF_TOKEN`, `GITHUB_TOKEN`, `WEBHOOK_SECRET`, `AWS_SECRET_ACCESS_KEY`...).

    Example:
        >>> child_environment({"PATH": "/usr/bin", "HF_TOKEN": "hf_x", "OMP_NUM_THREADS": "2", "OMP_API_KEY": "k"})
        {'PATH': '/usr/bin', 'OMP_NUM_THREADS': '2'}
    """
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if (name in CHILD_ENV or name.startswith(CHILD_ENV_PREFIXES)) and not secret_name(name)}


def memory_limit(folder: Path | None) -> int:
    """The bytes of data (`RLIMIT_DATA`) a runtime child may use on `folder`: `MEMORY_FLOOR_BYTES` plus
    `MEMORY_PER_FOLDER_BYTE` times the folder's bytes.

    Example:
        >>> memory_limit(None) == MEMORY_FLOOR_BYTES
        True
    """
    return MEMORY_FLOOR_BYTES + MEMORY_PER_FOLDER_BYTE * _folder_bytes(folder)


def _folder_bytes(folder: Path | None) -> int:
    """The bytes of the files under `folder` (links not followed)."""
    if folder is None:
        return 0
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _kill_group(run: subprocess.Popen) -> None:
    """Kill a runtime child and whatever it started (its own process group)."""
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        run.kill()


def child_message(stderr: str) -> str:
    """A runtime's own error lines (ExecuTorch logs `E ...` / `[file:line] ...`, Python a traceback), else the
    last lines."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if " E " in f" {line}" or "Error" in line or "error" in line or "Missing" in line]
    return " | ".join((errors or lines)[-4:])[:600]

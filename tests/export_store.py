"""Export once, use everywhere (#48): a content-addressed store of finished `hf-export run`s shared by test modules,
xdist workers and, while the product's code is unchanged, later runs on the same machine.

    key = sha256(the model folder's files, the CLI arguments, the environment given, the product's code)
    <store>/<code hash>/<key>/model   the model folder that was exported (a copy of the one the test built)
    <store>/<code hash>/<key>/out     the finished output folder, report.json and report.md in it
    <store>/<code hash>/<key>/state   EXPORT_ACTION_STATE_DIR of that run (its signing key)
    <store>/<code hash>/<key>/entry.json   the process's exit code, stdout, stderr and a digest of `out`
    <store>/<code hash>/uses.log           one line per use: the key, built or reused, the test that asked

A `filelock.FileLock` beside each entry makes one xdist worker build it while the others wait, then read it. The
product's code hash covers `exporters/**/*.py`, `pyproject.toml` and `constraints.txt` (the pinned stack), so a
change to the product builds everything again; the store lives in `.cache/test-exports` (`HF_EXPORT_TEST_STORE`
names another folder), which a fresh clone does not have: CI always builds. A run that did not exit 0 is reused
only within the pytest session that made it (a failure may be an overloaded machine's timeout).

Stored exports are shared: a test that changes an output folder (plants a file, edits a report, reruns into it)
works on `Export.copy(tmp_path)`. Every read checks the folder's digest and fails, naming the entry, when an earlier
test changed it. A test whose point is the export itself (its timing, a crash, a fault injected mid-export, what a
rerun reuses) runs the CLI itself (`tests.conftest.run_cli`).

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text("{}")
    >>> key_of(folder, ("run", "--no-bench"), {}) == key_of(folder, ("run", "--no-bench"), {})
    True
    >>> key_of(folder, ("run",), {}) == key_of(folder, ("run", "--no-bench"), {})
    False
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
STORE_ENV = "HF_EXPORT_TEST_STORE"
MODEL, OUT = "{model}", "{out}"  # placeholders in the CLI arguments for the stored model folder and output folder
CODE_FILES = ("pyproject.toml", "constraints.txt")
PRUNE_DAYS = 3


def _tree_digest(folder: Path) -> str:
    """sha256 over every file under `folder` (relative path, link target or bytes), in path order."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink():
            digest.update(f"link {relative} {os.readlink(path)}\0".encode())
        elif path.is_file():
            digest.update(f"file {relative}\0".encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """The product's version as the store sees it: its Python sources and its pins."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "exporters").rglob("*.py")) + [ROOT / name for name in CODE_FILES]:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def key_of(model_dir: Path, args: tuple[str, ...], env: dict[str, str]) -> str:
    """The store's key for `hf-export <args>` on `model_dir` with `env` added, under this code."""
    what = {"model": _tree_digest(model_dir), "args": list(args), "env": dict(sorted(env.items())),
            "code": code_hash()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def store_dir() -> Path:
    """This code's folder of the store (`$HF_EXPORT_TEST_STORE`, else `.cache/test-exports`); the folders of other
    code untouched for PRUNE_DAYS are removed on first use."""
    base = Path(os.environ.get(STORE_ENV) or ROOT / ".cache" / "test-exports")
    _prune(base)
    return base / code_hash()


@functools.lru_cache(maxsize=None)
def _prune(base: Path) -> None:
    if not base.is_dir():
        return
    for folder in base.iterdir():
        if folder.name != code_hash() and time.time() - folder.stat().st_mtime > PRUNE_DAYS * 86400:
            shutil.rmtree(folder, ignore_errors=True)


def _session() -> str:
    """This pytest session, the same in every xdist worker (the controller's id before workers exist)."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"


@dataclass(frozen=True)
class Export:
    """A finished export: the model folder it ran on, its output folder, the process's end and report.json.

    Example: `Export.report["targets"]`, `Export.target("onnx")`, `Export.copy(tmp_path).out` to change files."""

    model_dir: Path
    out: Path
    state: Path
    returncode: int
    stdout: str
    stderr: str
    key: str

    @property
    def report(self) -> dict[str, Any]:
        """report.json's content ({} when the run wrote none)."""
        path = self.out / "report.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def targets(self) -> dict[str, dict[str, Any]]:
        """The report's targets by name."""
        return {target["name"]: target for target in self.report.get("targets", [])}

    def target(self, name: str) -> dict[str, Any]:
        """One target of the report, by name."""
        return self.targets[name]

    @property
    def result(self) -> subprocess.CompletedProcess:
        """The run as `run_cli` returns it."""
        return subprocess.CompletedProcess(["hf-export"], self.returncode, self.stdout, self.stderr)

    def copy(self, destination: Path) -> "Export":
        """A private copy under `destination` (model, out, state), for a test that changes files."""
        destination.mkdir(parents=True, exist_ok=True)
        folders = {}
        for name in ("model", "out", "state"):
            source = getattr(self, {"model": "model_dir"}.get(name, name))
            folders[name] = destination / name
            if source.exists():
                shutil.copytree(source, folders[name], symlinks=True, dirs_exist_ok=True)
        return Export(folders["model"], folders["out"], folders["state"], self.returncode, self.stdout, self.stderr,
                      self.key)


def _read(entry: Path) -> tuple[dict[str, Any], Export] | None:
    try:
        meta = json.loads((entry / "entry.json").read_text())
    except (OSError, ValueError):
        return None
    export = Export(entry / "model", entry / "out", entry / "state", meta["returncode"], meta["stdout"],
                    meta["stderr"], entry.name)
    return meta, export


def exported(model_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> Export:
    """`hf-export <args>` on the model folder `model_dir` (a tiny model a test just built), once per key: the first
    caller runs the real CLI (with `{model}` and `{out}` in `args` standing for the stored model and output folders),
    later callers, in any module or xdist worker, get the same stored result.

    Example:
        exported(tiny_llama(tmp_path / "model", RECIPE), "run", "--no-bench", MODEL, "--out", OUT, "--quiet")
    """
    from tests.conftest import run_cli

    env = dict(env or {})
    key = key_of(model_dir, args, env)
    entry = store_dir() / key
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        found = _read(entry)
        if found and (found[0]["returncode"] == 0 or found[0]["session"] == _session()):
            meta, export = found
            if _tree_digest(export.out) != meta["out_digest"]:
                raise AssertionError(f"the stored export {entry} was changed by an earlier test: a test that changes "
                                     "an output folder must work on `Export.copy(tmp_path)`")
            _log_use(key, "reused")
            return export
        shutil.rmtree(entry, ignore_errors=True)
        shutil.copytree(model_dir, entry / "model", symlinks=True)
        (entry / "state").mkdir()
        filled = [a.replace(MODEL, str(entry / "model")).replace(OUT, str(entry / "out")) for a in args]
        done = run_cli(*filled, env={**env, "EXPORT_ACTION_STATE_DIR": str(entry / "state")}, timeout=timeout)
        meta = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "session": _session(),
                "built": f"{os.getpid()} {time.time()}",
                "out_digest": _tree_digest(entry / "out")}
        (entry / "entry.json").write_text(json.dumps(meta))
        _log_use(key, "built")
        return _read(entry)[1]


def _log_use(key: str, how: str) -> None:
    """One line per use in `<store>/<code hash>/uses.log` (key, built or reused, the asking test): which modules
    share an export, measured rather than guessed."""
    asking = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
    with (store_dir() / "uses.log").open("a", encoding="utf-8") as log:
        log.write(f"{key} {how} {asking}\n")


def stored_run(model_dir: Path, bench: bool = False) -> tuple[Path, dict[str, Any], str]:
    """`tests.conftest.run_and_read` through the store: (the stored output folder, report.json's content or {},
    the process's output), for fixtures whose tests only read the folder."""
    done = exported(model_dir, "run", *([] if bench else ["--no-bench"]), MODEL, "--out", OUT, "--quiet")
    return done.out, done.report, done.stdout + done.stderr

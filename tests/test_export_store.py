"""The tests' shared export store (#48, `tests/export_store.py`): one export per model, recipe, arguments and code,
built by one process while the others wait, reused by every later caller, and guarded against a test that changes
a shared output folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import export_store
from tests.conftest import ROOT
from tests.export_store import MODEL, OUT, exported, key_of
from tests.models import tiny_bert

RECIPE = {"export_format": "dynamo", "mode": "model"}
RUN = ("run", "--no-bench", MODEL, "--out", OUT, "--quiet")


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """A store of this test's own: every export in it is built here."""
    monkeypatch.setenv(export_store.STORE_ENV, str(tmp_path / "store"))
    return tmp_path / "store"


@pytest.fixture(scope="module")
def bert_store(tmp_path_factory) -> Path:
    """A store of this module's own, holding the module's one real export (the tests share it, as modules do)."""
    return tmp_path_factory.mktemp("bert-store")


def _built(entry: Path) -> str:
    return json.loads((entry / "entry.json").read_text())["built"]


def test_the_same_model_and_recipe_is_exported_once_and_read_by_the_next_caller(bert_store, tmp_path,
                                                                                 monkeypatch):
    """Two modules building the same seeded model ask for the same export: the second gets the first's output
    folder and report without a second run; another recipe, other arguments or another environment is another
    key."""
    monkeypatch.setenv(export_store.STORE_ENV, str(bert_store))
    first = exported(tiny_bert(tmp_path / "a", RECIPE), *RUN)
    assert first.returncode == 0, first.stderr[-3000:]
    [target] = first.report["targets"]
    assert target["status"] == "passed", target.get("error")
    assert first.targets == {target["name"]: target} and first.result.returncode == 0
    assert (first.out / "report.md").is_file() and first.out.is_relative_to(bert_store)
    built = _built(first.out.parent)
    second = exported(tiny_bert(tmp_path / "b", RECIPE), *RUN)  # built again, in another folder, same bytes
    assert second.key == first.key and second.out == first.out and _built(second.out.parent) == built
    assert second.report == first.report and second.stdout == first.stdout
    other = tiny_bert(tmp_path / "c", {**RECIPE, "dynamic": True})
    assert key_of(other, RUN, {}) != first.key
    assert key_of(tmp_path / "a", RUN, {}) == first.key
    assert key_of(tmp_path / "a", RUN[:-1], {}) != first.key
    assert key_of(tmp_path / "a", RUN, {"HF_HUB_OFFLINE": "1"}) != first.key


def test_a_test_that_changes_a_stored_output_is_caught_and_its_copy_is_its_own(bert_store, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv(export_store.STORE_ENV, str(bert_store))
    shared = exported(tiny_bert(tmp_path / "model", RECIPE), *RUN)
    mine = shared.copy(tmp_path / "mine")
    (mine.out / "report.md").write_text("changed")  # a copy is free to change
    assert mine.report == shared.report and mine.model_dir != shared.model_dir and mine.state.is_dir()
    assert exported(tmp_path / "model", *RUN).out == shared.out  # the stored one is intact
    (shared.out / "report.md").write_text("changed")
    with pytest.raises(AssertionError, match=r"changed by an earlier test.*Export.copy"):
        exported(tmp_path / "model", *RUN)


def test_other_code_is_another_export(store, tmp_path, monkeypatch):
    model = tiny_bert(tmp_path / "model", RECIPE)
    before = key_of(model, RUN, {})
    monkeypatch.setattr(export_store, "code_hash", lambda: "0" * 16)
    assert key_of(model, RUN, {}) != before and export_store.store_dir().name == "0" * 16


def test_a_failed_run_is_reused_within_its_session_only(store, tmp_path, monkeypatch):
    """A run that exited non-zero (here a recipe `check` refuses) may be a loaded machine's timeout: the session
    that saw it reuses it, the next session runs it again."""
    model = tiny_bert(tmp_path / "model", {"export_format": "dynamo", "mode": "nope"})
    args = ("check", f"{MODEL}/export_config.json")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "session-1")
    failed = exported(model, *args)
    assert failed.returncode == 2 and "mode" in failed.stderr, failed.stderr
    built = _built(failed.out.parent)
    assert _built(exported(model, *args).out.parent) == built
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "session-2")
    assert _built(exported(model, *args).out.parent) != built


WORKER = """
import json, sys
from pathlib import Path
from tests.export_store import MODEL, exported
done = exported(Path(sys.argv[1]), "check", MODEL + "/export_config.json")
print(json.dumps({"built": json.loads((done.out.parent / "entry.json").read_text())["built"],
                  "returncode": done.returncode}))
"""


def test_two_workers_asking_at_once_get_one_build(store, tmp_path):
    """Two processes (two xdist workers) ask for the same export at the same moment: the file lock lets one build
    it while the other waits, then both read the one result."""
    model = tiny_bert(tmp_path / "model", RECIPE)
    env = {"PYTHONPATH": str(ROOT), export_store.STORE_ENV: str(store), "PATH": "/usr/bin:/bin"}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(model)], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [worker.communicate(timeout=600) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), [err[-2000:] for _, err in results]
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert answers[0] == answers[1] and answers[0]["returncode"] == 0, answers
    assert len(list(store.glob("*/*/entry.json"))) == 1

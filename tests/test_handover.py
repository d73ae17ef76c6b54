"""`init` hands its checked export to `run` (issue #48; exporters.run.handover): the real CLI's `init` on a tiny Llama,
then `run` of the recipe it wrote takes that export instead of exporting again (the report and the log say so), every
check still runs on it; a changed weight file exports again, and so does a tampered handed-over folder; two runs at once
take it once. The export key (what a change of exports again) and the store's lock and signature are checked on
the library's own functions.

Each test works on a copy of the state folder init wrote (`EXPORT_ACTION_STATE_DIR`: the signing key and the handed
over export), since `run` takes an entry out of it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters.run import handover
from exporters.errors import ArtifactError
from exporters.run.handover import ENTRY, Store, export_key
from exporters.run.reuse import Signer
from tests.conftest import ROOT, run_cli
from tests.models import tiny_llama

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> SimpleNamespace:
    """`init --formats dynamo` on a one-layer Llama: the model, the recipe it wrote, the state folder it left."""
    root = tmp_path_factory.mktemp("handover")
    model = tiny_llama(root / "model", None, max_position_embeddings=64, layers=1)
    state, recipe = root / "state", root / "export_config.json"
    done = run_cli("init", str(model), "--formats", "dynamo", "--out", str(recipe), "--fp32-only", "--quiet",
                   env={"EXPORT_ACTION_STATE_DIR": str(state)})
    assert done.returncode == 0, done.stderr[-4000:]
    [entry] = [p for p in (state / "handover").iterdir() if not p.name.startswith(".")]
    return SimpleNamespace(root=root, model=model, recipe=recipe, state=state, entry=entry.name)


def test_init_told_no_run_follows_here_keeps_no_export(checked, tmp_path):
    """`--no-hand-over` (the bot's proposals and the Action's init mode: the recipe goes to a PR): the same init
    passes and leaves nothing waiting in the state folder."""
    state = tmp_path / "state"
    done = run_cli("init", str(checked.model), "--formats", "dynamo", "--out", str(tmp_path / "recipe.json"),
                   "--fp32-only", "--quiet", "--no-hand-over", env={"EXPORT_ACTION_STATE_DIR": str(state)})
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads((tmp_path / "recipe.json").read_text()) == json.loads(checked.recipe.read_text())  # the same
    assert not (state / "handover").exists() or not _waiting(state)


def _state(checked: SimpleNamespace, tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(checked.state, state)
    return state


def _run(checked: SimpleNamespace, state: Path, out: Path, *extra: str, model: Path | None = None) -> dict:
    done = run_cli("run", str(model or checked.model), "--config", str(checked.recipe), "--out", str(out), "--quiet",
                   "--no-bench", *extra, env={"EXPORT_ACTION_STATE_DIR": str(state)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [target] = json.loads((out / "report.json").read_text())["targets"]
    said = " (init's export, checked again)" in done.stdout + done.stderr  # the CLI's line for the target
    assert said == (target["handed_over"] is not None and not target["cached"]), done.stdout + done.stderr
    return target


def _waiting(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "handover").iterdir() if not p.name.startswith("."))


def test_run_takes_the_export_init_checked_and_checks_it_again(checked, tmp_path):
    state = _state(checked, tmp_path)
    refused = _run(checked, state, tmp_path / "refused", "--no-cache")  # refusing reuse exports
    assert refused["status"] == "passed" and refused["handed_over"] is None, refused["findings"]
    assert _waiting(state) == [checked.entry]  # and leaves the export for a run that takes it
    out = tmp_path / "out"
    target = _run(checked, state, out)
    assert target["status"] == "passed", target["error"]
    assert target["handed_over"]["from"] == "hf-export init" and target["handed_over"]["export_key"] == checked.entry
    assert any(f.startswith("not exported again: `hf-export init` exported this target") for f in target["findings"])
    assert (out / "logs" / "dynamo.log").read_text().startswith("not exported: handed over by hf-export init")
    # every check ran here: the components compared with eager at unseen shapes, generation parity
    assert target["components"] and all(c["verdict"] == "passed" for c in target["components"]), target["components"]
    assert target["generation"]["status"] == "passed"
    # the same bytes a fresh export writes, and the export taken out of the store (a second run exports)
    files = {f["path"].split("/", 1)[1]: f["sha256"] for f in target["files"]}
    assert files == {f["path"].split("/", 1)[1]: f["sha256"] for f in refused["files"]}
    assert _waiting(state) == [] and not list(out.glob(".staging-*"))
    # signed by this run like any target it validated: a rerun into the same folder reuses its own record
    again = _run(checked, state, out)
    assert again["cached"] is True and again["handed_over"] == target["handed_over"]


def test_a_changed_weight_file_exports_again(checked, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(checked.model, model)
    weights = load_file(model / "model.safetensors")
    name = next(iter(sorted(weights)))
    weights[name] = weights[name] + 1e-3
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    state = _state(checked, tmp_path)
    target = _run(checked, state, tmp_path / "out", model=model)
    assert target["status"] == "passed" and target["handed_over"] is None, target["findings"]
    assert _waiting(state) == [checked.entry]  # not the export of these weights: left where it was


def test_a_tampered_handed_over_folder_is_not_used(checked, tmp_path):
    state = _state(checked, tmp_path)
    folder = state / "handover" / checked.entry / "dynamo"
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 32', '"hidden_size": 33'))
    target = _run(checked, state, tmp_path / "out")
    assert target["status"] == "passed" and target["handed_over"] is None
    assert any("handed over for this target was not used (its files are not the ones init validated" in f
               for f in target["findings"]), target["findings"]
    assert json.loads((tmp_path / "out" / "dynamo" / "config.json").read_text())["hidden_size"] == 32


def test_two_runs_at_once_take_the_export_once(checked, tmp_path):
    state = _state(checked, tmp_path)
    env = {**os.environ, "EXPORT_ACTION_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-m", "exporters.cli", "run", str(checked.model), "--config",
                              str(checked.recipe), "--out", str(tmp_path / f"out{i}"), "--quiet", "--no-bench"],
                             env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(2)]
    for run in runs:
        output, _ = run.communicate(timeout=900)
        assert run.returncode == 0, output[-4000:]
    targets = [json.loads((tmp_path / f"out{i}" / "report.json").read_text())["targets"][0] for i in range(2)]
    assert all(t["status"] == "passed" for t in targets)
    assert sorted(t["handed_over"] is not None for t in targets) == [False, True], [t["findings"] for t in targets]
    assert _waiting(state) == [] and not list((state / "handover").glob(".taken-*"))


# ── The key and the store, on the library's own functions ────────────────────


def _context(**changes) -> SimpleNamespace:
    from exporters.recipe.load import parse_recipe_data

    recipe = {"exports": [{"export_format": "onnx", "mode": "generation"}], "inputs": {"seed": 0},
              "validation": {"formats": {"onnx": {"atol": 1e-4}}}}
    recipe.update(changes.pop("recipe", {}))
    values = {"weights": "w" * 64, "versions": {"torch": "2.9"}, "source": SimpleNamespace(revision=None)}
    values.update(changes)
    return SimpleNamespace(recipe=parse_recipe_data(recipe), **values)


def test_the_export_key_holds_what_the_export_depends_on_and_not_the_tolerances(monkeypatch):
    def key(context: SimpleNamespace, device: str = "cpu", **target_changes) -> str:
        target = context.recipe.exports[0].model_copy(update=target_changes)
        return export_key(context, target, device)

    base = key(_context())
    assert key(_context()) == base
    changed = {
        "weights": key(_context(weights="x" * 64)),
        "target": key(_context(), dtype="float16"),
        "inputs": key(_context(recipe={"inputs": {"seed": 1}})),
        "generation": key(_context(recipe={"generation": {"max_new_tokens": 3}})),
        "versions": key(_context(versions={"torch": "2.10"})),
        "device": key(_context(), device="cuda"),
        "revision": key(_context(source=SimpleNamespace(revision="abc"))),
    }
    monkeypatch.setattr(handover, "code_fingerprint", lambda: "another product")
    changed["code"] = key(_context())
    monkeypatch.undo()
    assert base not in changed.values() and len(set(changed.values())) == len(changed), changed
    # the verdict is given again by `run` with the recipe's own tolerances: they are not part of what is exported
    assert key(_context(recipe={"validation": {"formats": {"onnx": {"atol": 1e-2}}}})) == base
    assert key(_context(), timeout=5.0) == base  # nor is how long the run waits for it


def _folder(root: Path) -> Path:
    folder = root / "dynamo"
    folder.mkdir(parents=True)
    (folder / "model.pt2").write_bytes(b"program")
    (folder / "config.json").write_text("{}")
    return folder


def _deposit(store: Store, folder: Path, key: str = "k" * 64) -> None:
    from exporters.hashing import file_entries

    assert store.deposit(key, folder, {"outcome": {"notes": []}}, file_entries(folder, folder))


def test_a_planted_or_edited_entry_is_never_taken(tmp_path):
    store = Store(tmp_path / "state" / "handover", Signer(tmp_path / "state"))
    _deposit(store, _folder(tmp_path / "export"))
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700  # the exports of the user's models: no one else's to read
    entry = store.root / ("k" * 64) / ENTRY
    record = json.loads(entry.read_text())
    entry.write_text(json.dumps({**record, "outcome": {"notes": ["planted"]}}))
    with pytest.raises(ArtifactError, match="not one this tool signed"):
        store.take("k" * 64, tmp_path / "staging")
    assert not (tmp_path / "staging").exists() and not (store.root / ("k" * 64)).exists()
    # a folder that changed between its export and the deposit (validation wrote into it) is not kept
    folder = _folder(tmp_path / "again")
    from exporters.hashing import file_entries

    exported = file_entries(folder, folder)
    (folder / "config.json").write_text('{"changed": 1}')
    assert not store.deposit("k" * 64, folder, {"outcome": {}}, exported)
    assert store.take("k" * 64, tmp_path / "staging") is None


def _take(root: str, index: int, barrier) -> None:
    store = Store(Path(root) / "state" / "handover", Signer(Path(root) / "state"))
    barrier.wait()
    entry = store.take("k" * 64, Path(root) / f"staging-{index}")
    (Path(root) / f"took-{index}").write_text("yes" if entry else "no")


def test_two_takers_at_once_get_one_entry_between_them(tmp_path):
    for attempt in range(5):
        root = tmp_path / str(attempt)
        store = Store(root / "state" / "handover", Signer(root / "state"))
        _deposit(store, _folder(root / "export"))
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(4)
        takers = [context.Process(target=_take, args=(str(root), i, barrier)) for i in range(4)]
        for taker in takers:
            taker.start()
        for taker in takers:
            taker.join(60)
            assert taker.exitcode == 0
        took = [(root / f"took-{i}").read_text() for i in range(4)]
        assert sorted(took) == ["no", "no", "no", "yes"], took
        [winner] = [i for i in range(4) if took[i] == "yes"]
        assert (root / f"staging-{winner}" / "model.pt2").read_bytes() == b"program"
        assert [p.name for p in store.root.iterdir()] == [".lock"]

"""Re-validating a saved ExecuTorch methods-layout program (issue #48's brief, item 4): `hf-export validate` checks
the prompt the program was exported with, as its export.json records it (`dynamic_prompt`), not today's default for a
recipe that leaves `dynamic` unset (a dynamic prompt, where the methods program replaces the runner's); a folder
written before the record existed holds a program whose prompt is fixed at the traced length, and is validated so.

One export (a one-layer Falcon, whose multi-query keys refuse the runner's static cache: the methods layout), its
prompt fixed by `dynamic: false`; each validation runs the real CLI on a copy of it, with the plainest recipe.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import PLAINEST_EXECUTORCH, run_cli
from tests.export_store import MODEL, OUT, exported
from tests.models import family_model

GENERATION = {"max_new_tokens": 8}


@pytest.fixture(scope="module")
def falcon_fixed_prompt(tmp_path_factory):
    """Falcon's methods program with its prompt at the traced length (`dynamic: false`)."""
    root = tmp_path_factory.mktemp("falcon-fixed-prompt")
    recipe = {"schema_version": 1, "generation": GENERATION, "exports": [{**PLAINEST_EXECUTORCH, "dynamic": False}]}
    return exported(family_model("falcon", root / "model", recipe, num_hidden_layers=1), "run", "--no-bench", MODEL,
                    "--out", OUT, "--quiet")


def _prompt_lengths(target: dict) -> set[int]:
    prefill = next(c for c in target["components"] if c["name"] == "prefill")
    return {check["shapes"]["input_ids"][1] for check in prefill["checks"]}


@pytest.mark.parametrize("older", [False, True], ids=["recorded", "older-folder"])
def test_validate_checks_the_prompt_the_methods_program_was_exported_with(falcon_fixed_prompt, tmp_path, older):
    """The run records `dynamic_prompt: false`; `hf-export validate` with a recipe that leaves `dynamic` unset (today:
    a dynamic prompt, probed at other lengths, which the program cannot take) validates the traced prompt only and
    passes, with the same verdict as the run; so does a folder whose export.json has no record (an older one)."""
    run = falcon_fixed_prompt
    target = run.targets.get("executorch", {})
    assert run.returncode == 0 and target.get("status") == "passed", (run.stderr[-3000:], json.dumps(target)[:3000])
    manifest = json.loads((run.out / "executorch" / "export.json").read_text())
    assert manifest.get("layout") != "runner" and manifest["dynamic_prompt"] is False, manifest
    copy = run.copy(tmp_path / "copy")
    if older:  # what an earlier version wrote: no record
        path = copy.out / "executorch" / "export.json"
        path.write_text(json.dumps({k: v for k, v in manifest.items() if k != "dynamic_prompt"}))
    plainest = tmp_path / "plainest.json"
    plainest.write_text(json.dumps({"schema_version": 1, "generation": GENERATION, "exports": [PLAINEST_EXECUTORCH]}))
    done = run_cli("validate", str(copy.model_dir), str(copy.out), "--config", str(plainest))
    again = json.loads((copy.out / "report.json").read_text())["targets"]
    assert done.returncode == 0 and again[0]["status"] == "passed", (done.stderr[-3000:], json.dumps(again)[:4000])
    assert _prompt_lengths(again[0]) == _prompt_lengths(target) and len(_prompt_lengths(target)) == 1
    assert not any("keeps the prompt axis dynamic" in f for f in again[0]["findings"]), again[0]["findings"]

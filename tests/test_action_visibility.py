"""A private or gated model's weights are not uploaded as workflow artifacts unless the operator opts in.

The Action says who can read the model (`model-visibility`, read from the Hub: the real entrypoint against the Hub
emulator), and the example workflows upload `export-out` (the exported weights) only when it says `public` or the
operator opted in; the report alone is always kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.models import tiny_llama
from tests.servers.hub_fixtures import BOT_TOKEN
from tests.test_action import PASSING, run_action, upload_model

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "examples" / "workflows"

pytestmark = pytest.mark.slow


def test_the_action_says_who_can_read_the_model(hub, tmp_path):
    folder = tiny_llama(tmp_path / "model", recipe=PASSING)
    repos = {"alice/open": {}, "export-bot/secret": {"private": True}, "alice/terms": {}}
    for repo_id, options in repos.items():
        hub.create_model_repo(repo_id, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()},
                              **options)
    hub.set_gated("alice/terms", "manual")
    tiny_llama(tmp_path / "ws-local" / "tiny", recipe=PASSING)
    expected = {"alice/open": "public", "export-bot/secret": "private", "alice/terms": "gated", "tiny": "local",
                "alice/gone": None}  # a run that cannot start says nothing: not public
    for model, visibility in expected.items():
        workspace = tmp_path / ("ws-local" if model == "tiny" else f"ws-{model.replace('/', '-')}")
        inputs = {"model": model, "mode": "list-targets", "hf-token": BOT_TOKEN}
        run = run_action(workspace, inputs, github=None, hub_url=hub.url)
        assert run.outputs.get("model-visibility") == visibility, (model, run.log[-3000:])
        assert run.returncode == (2 if model == "alice/gone" else 0), run.log[-3000:]


def test_a_run_says_it_too(hub, tmp_path):
    """run mode (and aggregate, through the same ending) writes it with the other outputs."""
    upload_model(hub, "export-bot/secret-run", tiny_llama(tmp_path / "model", recipe=PASSING))
    run = run_action(tmp_path / "ws", {"model": "export-bot/secret-run", "hf-token": BOT_TOKEN, "open-pr": "false",
                                       "comment": "false", "benchmark": "false"},
                     github=None, hub_url=hub.url)
    assert run.returncode == 0 and run.outputs["status"] == "passed", run.log[-3000:]
    assert run.outputs["model-visibility"] == "public"


def _workflow(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads `on` as True
    return workflow


def _uploads(job: dict) -> list[dict]:
    return [s for s in job.get("steps", []) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]


OPT_IN = ("inputs.upload-weights", "vars.UPLOAD_WEIGHTS == 'true'")


def test_the_one_job_workflow_uploads_the_weights_only_for_a_public_model_or_by_opt_in():
    workflow = _workflow("export.yml")
    assert workflow["on"]["workflow_dispatch"]["inputs"]["upload-weights"] == {
        **workflow["on"]["workflow_dispatch"]["inputs"]["upload-weights"], "type": "boolean", "default": False}
    uploads = _uploads(workflow["jobs"]["export"])
    weights = [s for s in uploads if s["with"]["path"].strip() == "export-out"]
    reports = [s for s in uploads if s not in weights]
    assert len(weights) == 1 and len(reports) == 1
    condition = " ".join(weights[0]["if"].split())
    assert "steps.export.outputs.model-visibility == 'public'" in condition
    assert all(opt_in in condition for opt_in in OPT_IN)
    # the report is always kept, and it is only the report
    assert reports[0]["if"] == "always()"
    assert reports[0]["with"]["path"].split() == ["export-out/report.json", "export-out/report.md", "export-out/logs/"]


def test_the_matrix_stops_before_any_leg_unless_the_model_is_public_or_opted_in():
    workflow = _workflow("matrix.yml")
    assert workflow["on"]["workflow_dispatch"]["inputs"]["upload-weights"]["default"] is False
    jobs = workflow["jobs"]
    gate = jobs["plan"]["steps"][-1]
    condition = " ".join(gate["if"].split())
    assert "steps.plan.outputs.model-visibility != 'public'" in condition
    assert "!inputs.upload-weights" in condition and "vars.UPLOAD_WEIGHTS != 'true'" in condition
    assert gate["run"].rstrip().endswith("exit 1") and "::error " in gate["run"]
    # every job that uploads weights runs only after that gate (needs: plan, which failed)
    for name, job in jobs.items():
        if name != "plan" and _uploads(job):
            needs = job["needs"] if isinstance(job["needs"], list) else [job["needs"]]
            assert "plan" in needs, name
    for leg in ("export-cpu", "export-gpu"):
        assert _uploads(jobs[leg])[0]["with"]["retention-days"] == 1
    assert "needs.plan.result == 'success'" in jobs["aggregate"]["if"]

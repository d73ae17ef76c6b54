"""A declared dynamic axis that the export fixed is reported as exactly that, never as an output mismatch (#30)."""

from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.models import tiny_mamba


def test_a_specialised_dynamic_axis_is_named_with_its_guard(tmp_path):
    # Mamba's forward is traced with the sequence axis fixed to the traced length (torch.export adds the guard
    # `input_ids.size()[1] == 8`): the probe at another length cannot run, which is not an output difference. (In
    # generation mode its prompt is stepped through the decode instead: tests/test_state_space.py.)
    model_dir = tiny_mamba(tmp_path / "model", [{"export_format": "dynamo", "mode": "model", "dynamic": True}])
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 1, result.stderr[-2000:]
    target = json.loads((out / "report.json").read_text())["targets"][0]
    message = target["error"]["message"]
    assert target["status"] == "failed"
    assert "a declared dynamic axis was specialised at export: 'input_ids' axis 1 is fixed at 8" in message, message
    assert "guard `input_ids.size()[1] == 8`" in message
    assert "outputs differ" not in message
    assert "specialised at export" in (out / "report.md").read_text()

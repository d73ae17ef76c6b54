"""Links never followed (#27 §5, §10, §11): a model folder's linked files are not copied into an artifact, and no
file the CLI or the Action writes goes through a link planted where it goes. Each attack runs through the real CLI
(`hf-export` as a subprocess) or the Action's entrypoint as the runner runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.models import tiny_bert, tiny_llama
from tests.servers.hub_fixtures import TEST_TOKEN

pytestmark = pytest.mark.slow

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- the runner's own key"


def _secret(root: Path) -> Path:
    outside = root / "outside"
    outside.mkdir()
    secret = outside / "secret.key"
    secret.write_bytes(SECRET)
    return secret


def _files_holding(folder: Path, data: bytes) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and not p.is_symlink() and data in p.read_bytes())


def test_a_linked_tokenizer_file_in_a_model_folder_is_refused_not_copied(tmp_path):
    """`chat_template.jinja -> secret.key` in a local model folder (a PR checkout as `model: ./dir`): the
    transformers.js layout would copy the secret into the artifact to publish; the run refuses the folder instead,
    naming the file, and nothing of the secret is in the output."""
    secret = _secret(tmp_path)
    model = tiny_llama(tmp_path / "model", {"name": "tjs", "export_format": "onnx", "mode": "generation",
                                            "layout": "transformers.js"})
    (model / "chat_template.jinja").symlink_to(secret)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "chat_template.jinja in the model folder is a link" in result.stderr, result.stderr[-3000:]
    assert not out.exists() or _files_holding(out, SECRET) == []
    assert not (out / "tjs").exists(), "nothing was exported from a folder that was refused"
    assert secret.read_bytes() == SECRET


def test_a_linked_config_in_a_model_folder_is_refused(tmp_path):
    """`generation_config.json -> a JSON file elsewhere`: loading would rewrite its keys into the artifact's own
    generation_config.json; the folder is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "credentials.json").write_text(json.dumps({"client_secret": "s3cr3t", "bos_token_id": 1}))
    model = tiny_bert(tmp_path / "model", {"export_format": "dynamo", "mode": "model"})
    (model / "generation_config.json").symlink_to(outside / "credentials.json")
    result = run_cli("run", "--no-bench", str(model), "--out", str(tmp_path / "out"), "--quiet")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "generation_config.json in the model folder is a link" in result.stderr


def test_hub_cache_links_are_copied_and_planted_ones_are_not(hf_env, tmp_path):
    """The one link followed is the one huggingface_hub makes (`snapshots/<rev>/x -> ../../blobs/<hash>`): a Hub
    repo's tokenizer file is copied from its snapshot; a planted link, even in a snapshot folder, is refused."""
    from huggingface_hub import HfApi, snapshot_download

    from exporters import fsutil
    from exporters.errors import ModelSourceError

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text("{}")
    (repo / "chat_template.jinja").write_text("{{ messages }}")
    api = HfApi(endpoint=hf_env.url, token=TEST_TOKEN)
    api.create_repo("alice/tok")
    api.upload_folder(repo_id="alice/tok", folder_path=str(repo))
    snapshot = Path(snapshot_download("alice/tok", endpoint=hf_env.url, token=TEST_TOKEN))
    assert (snapshot / "chat_template.jinja").is_symlink(), "the cache links its files (the case this covers)"
    assert fsutil.copy_model_file(snapshot, "chat_template.jinja", tmp_path / "copied.jinja")
    assert (tmp_path / "copied.jinja").read_text() == "{{ messages }}"
    (snapshot / "tokenizer.json").symlink_to(_secret(tmp_path))
    with pytest.raises(ModelSourceError, match="tokenizer.json in the model folder is a link"):
        fsutil.copy_model_file(snapshot, "tokenizer.json", tmp_path / "stolen.json")
    assert not (tmp_path / "stolen.json").exists()


def test_no_file_the_run_writes_goes_through_a_planted_link(tmp_path):
    """Links planted in the output folder where the run writes its report (and the temporary files it renames into
    place) and a child's result: each link is replaced by the tool's file, what it pointed to is untouched."""
    victims = tmp_path / "victims"
    victims.mkdir()
    model = tiny_bert(tmp_path / "model", {"export_format": "dynamo", "mode": "model", "name": "target"})
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    planted = [".report.json.tmp", ".report.md.tmp", "report.json", "report.md", "logs/target.result.json",
               "logs/target.log"]
    for index, name in enumerate(planted):
        (victims / f"v{index}").write_text("untouched")
        (out / name).symlink_to(victims / f"v{index}")
    result = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(victims / f"v{i}").read_text() for i in range(len(planted))] == ["untouched"] * len(planted)
    for name in ("report.json", "report.md", "logs/target.log"):
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert json.loads((out / "report.json").read_text())["status"] == "passed"


def test_a_failed_runs_problem_json_goes_through_no_link(tmp_path):
    """`OUT/problem.json` (what stopped a run) is written the same way: a link there, or at its old temporary name,
    is not written through."""
    victims = tmp_path / "victims"
    victims.mkdir()
    model = tiny_bert(tmp_path / "model", {"export_format": "onnx", "opset": 18})
    out = tmp_path / "out"
    out.mkdir()
    for index, name in enumerate((".problem.json.tmp", "problem.json")):
        (victims / f"v{index}").write_text("untouched")
        (out / name).symlink_to(victims / f"v{index}")
    result = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet")
    assert result.returncode == 2, result.stderr[-3000:]
    assert [(victims / f"v{i}").read_text() for i in range(2)] == ["untouched"] * 2
    assert not (out / "problem.json").is_symlink()
    assert json.loads((out / "problem.json").read_text())["kind"] == "recipe"


def test_the_actions_init_mode_writes_through_no_link(tmp_path):
    """`mode: init` on `model: ./model`, with links planted at `export-out/export_config.json` and
    `export-out/init-summary.md`: the recipe and the summary replace the links; their targets are untouched."""
    from tests.test_action import run_action

    workspace = tmp_path / "ws"
    tiny_bert(workspace / "model")
    victims = tmp_path / "victims"
    victims.mkdir()
    out = workspace / "export-out"
    out.mkdir()
    for name in ("export_config.json", "init-summary.md"):
        (victims / name).write_text("untouched")
        (out / name).symlink_to(victims / name)
    run = run_action(workspace, {"model": "./model", "mode": "init", "formats": "dynamo", "open-pr": "false"},
                     github=None, hub_url=None, event_name="workflow_dispatch", event={})
    assert run.returncode == 0, run.log[-4000:]
    assert run.outputs["status"] == "passed", run.log[-4000:]
    assert [(victims / n).read_text() for n in ("export_config.json", "init-summary.md")] == ["untouched"] * 2
    assert not (out / "export_config.json").is_symlink() and not (out / "init-summary.md").is_symlink()
    assert json.loads((out / "export_config.json").read_text())["exports"][0]["export_format"] == "dynamo"
    assert "| target | components |" in (out / "init-summary.md").read_text()

"""Every third-party image is pinned by digest, and the digests live in one place (docker/base-images.json).

`docker/pin_images.py` is run as it is in a checkout: on this repository (it must pass), on copies broken the ways
a pin drifts (a tag, another digest, a placeholder, a new unlisted image, a `# syntax=` frontend), and in its update
mode with a stand-in `crane` (no registry can be reached here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker" / "pin_images.py"
LOCK = ROOT / "docker" / "base-images.json"
COPIED = ("Dockerfile", "docker/base-images.json", "docker/bot.Dockerfile", "examples/space/Dockerfile",
          ".github/workflows/ci.yml", ".github/workflows/release.yml", "examples/workflows/export.yml",
          "examples/workflows/matrix.yml", "examples/workflows/bot-dispatch.yml")


def _pin_images(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in COPIED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    return root


def _digests() -> dict[str, str]:
    return {name: entry["digest"] for name, entry in json.loads(LOCK.read_text())["images"].items()}


def test_every_image_is_pinned_by_the_digest_recorded_in_one_place():
    result = _pin_images(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    digests = _digests()
    assert set(digests) == {"python:3.11-slim-bookworm", "python:3.11-bookworm"}
    # the references the check saw are the real ones: the Action's base (and so the bot's) and CI's container
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE=python:3.11-slim-bookworm@{digests['python:3.11-slim-bookworm']}\n" in dockerfile
    ci = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    assert ci["jobs"]["test"]["container"] == f"python:3.11-bookworm@{digests['python:3.11-bookworm']}"
    for name in COPIED:  # no frontend image is pulled by tag at build time
        if name.endswith("Dockerfile"):
            assert not (ROOT / name).read_text().startswith("# syntax="), name
    # every recorded digest says where it was read (the official images' repo-info, at a commit)
    for entry in json.loads(LOCK.read_text())["images"].values():
        assert entry["source"] and entry["used_by"]


def test_the_pin_check_refuses_a_tag_another_digest_a_placeholder_and_an_unlisted_image(tmp_path):
    root = _copy(tmp_path)
    digests = _digests()
    slim, full = "python:3.11-slim-bookworm", "python:3.11-bookworm"
    dockerfile, ci = root / "Dockerfile", root / ".github" / "workflows" / "ci.yml"
    dockerfile.write_text("# syntax=docker/dockerfile:1\n" + dockerfile.read_text().replace(
        f"{slim}@{digests[slim]}", slim))
    other = "sha256:" + "0" * 64
    ci.write_text(ci.read_text().replace(digests[full], other))
    matrix = root / "examples" / "workflows" / "matrix.yml"
    workflow = yaml.safe_load(matrix.read_text())
    workflow["jobs"]["plan"]["services"] = {"db": {"image": "postgres:16"}}
    matrix.write_text(yaml.safe_dump(workflow, sort_keys=False))
    lock = json.loads((root / "docker" / "base-images.json").read_text())
    lock["images"]["debian:bookworm-slim"] = {"digest": "sha256:<TO_FILL>", "source": "", "used_by": ""}
    (root / "docker" / "base-images.json").write_text(json.dumps(lock))

    result = _pin_images(root)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()[1:]
    expected = [
        f"Dockerfile:1 (# syntax=): docker/dockerfile:1 is not in docker/base-images.json",
        f"(ARG BASE_IMAGE (FROM)): {slim} is not pinned by digest: write {slim}@{digests[slim]}",
        f".github/workflows/ci.yml:",
        f"{full}@sha256:{'0' * 64} has another digest than docker/base-images.json ({digests[full]})",
        "examples/workflows/matrix.yml:",
        "(jobs.plan.services.db): postgres:16 is not in docker/base-images.json",
        "debian:bookworm-slim: digest 'sha256:<TO_FILL>' is not sha256:<64 lower-case hex digits>",
        "debian:bookworm-slim is used nowhere",
    ]
    for text in expected:
        assert any(text in line for line in lines), f"{text!r} not in:\n{result.stderr}"
    assert len(lines) == 6, result.stderr


def test_update_resolves_the_tags_and_rewrites_the_one_place_and_every_reference(tmp_path):
    """`--update` where a registry answers (here a stand-in `crane`, the only thing that cannot run offline)."""
    root = _copy(tmp_path)
    tools = tmp_path / "bin"
    tools.mkdir()
    crane = tools / "crane"
    crane.write_text("#!/bin/sh\n[ \"$1\" = digest ] || exit 9\n"
                     "printf 'sha256:%s\\n' \"$(printf '%s' \"$2\" | sha256sum | cut -c1-64)\"\n")
    crane.chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin"}  # no docker client: crane answers

    result = _pin_images(root, "--update", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    import hashlib

    new = {name: "sha256:" + hashlib.sha256(name.encode()).hexdigest() for name in _digests()}
    lock = json.loads((root / "docker" / "base-images.json").read_text())
    assert {name: entry["digest"] for name, entry in lock["images"].items()} == new
    assert f"ARG BASE_IMAGE=python:3.11-slim-bookworm@{new['python:3.11-slim-bookworm']}\n" in (
        root / "Dockerfile").read_text()
    ci = yaml.safe_load((root / ".github" / "workflows" / "ci.yml").read_text())
    assert ci["jobs"]["test"]["container"] == f"python:3.11-bookworm@{new['python:3.11-bookworm']}"
    assert _pin_images(root).returncode == 0
    # without a registry client nothing is rewritten, and it says why
    crane.unlink()
    failed = _pin_images(root, "--update", env=env)
    assert failed.returncode == 2 and "no registry answered" in failed.stderr
    assert json.loads((root / "docker" / "base-images.json").read_text()) == lock


def test_the_release_builds_the_bot_on_the_action_image_by_digest():
    """The bot image's base is this project's own image: the release passes it by the digest it just pushed."""
    release = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    script = "\n".join(step.get("run", "") for step in release["jobs"]["bot"]["steps"])
    assert '--build-arg "ACTION_IMAGE=$image@$CPU_DIGEST"' in script
    own = json.loads(LOCK.read_text())["own"]
    assert set(own) == {"ghcr.io/hf/export-action"}

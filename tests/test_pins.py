"""Every installed distribution is pinned: docker/check_pins.py, which the image's install and `make venv` run.

The script runs as the Dockerfile runs it (a subprocess of the interpreter, the constraints file as argument), on
site folders built here with real `.dist-info` metadata, and on this test environment itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker" / "check_pins.py"


def site(folder: Path, **dists: str) -> Path:
    """A site-packages folder holding `name==version` distributions (their metadata only)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in dists.items():
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def check(constraints: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(constraints), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def constraints(tmp_path) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text("# pins\nPyYAML==6.0.4\ntorch==2.13.0\nsetuptools==84.2.1\nonnxruntime==1.32.0\n")
    return path


def test_every_distribution_pinned_passes(tmp_path, constraints):
    # names compare normalized (pyyaml / PyYAML), a local label is ignored (2.13.0+cpu is torch==2.13.0)
    folder = site(tmp_path / "site", pyyaml="6.0.4", torch="2.13.0+cpu", setuptools="84.2.1")
    result = check(constraints, "--path", str(folder))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3 distributions installed, each pinned in constraints.txt"


def test_an_unpinned_build_tool_and_a_drifted_pin_fail_the_install(tmp_path, constraints):
    folder = site(tmp_path / "site", pyyaml="6.0.4", torch="2.13.0", setuptools="85.0.0", wheel="0.48.0")
    result = check(constraints, "--path", str(folder))
    assert result.returncode == 1
    assert "2 of 4 installed distributions are not pinned" in result.stderr
    assert "  setuptools 85.0.0 is installed but constraints.txt:4 pins ==84.2.1" in result.stderr
    assert "  wheel 0.48.0 is installed but not pinned" in result.stderr
    assert "pyyaml" not in result.stderr and "torch" not in result.stderr


def test_the_project_itself_may_be_allowed(tmp_path, constraints):
    folder = site(tmp_path / "site", torch="2.13.0", **{"export-action": "0.1.0"})
    assert check(constraints, "--path", str(folder)).returncode == 1
    assert check(constraints, "--path", str(folder), "--allow", "export_action").returncode == 0


def test_two_onnx_runtimes_are_refused_even_when_both_are_pinned(tmp_path, constraints):
    cuda = tmp_path / "constraints-cuda.txt"
    cuda.write_text("-c constraints.txt\nonnxruntime-gpu==1.31.1\n")
    one = site(tmp_path / "one", torch="2.13.0", **{"onnxruntime-gpu": "1.31.1"})
    assert check(cuda, "--path", str(one)).returncode == 0  # the included file's pins count
    both = site(tmp_path / "both", torch="2.13.0", onnxruntime="1.32.0", **{"onnxruntime-gpu": "1.31.1"})
    result = check(cuda, "--path", str(both))
    assert result.returncode == 1
    assert "onnxruntime and onnxruntime-gpu are both installed" in result.stderr


def test_a_bad_constraints_file_is_its_own_error(tmp_path):
    bad = tmp_path / "constraints.txt"
    bad.write_text("torch>=2\n")
    result = check(bad, "--path", str(site(tmp_path / "site")))
    assert result.returncode == 2 and "constraints.txt:1: expected `name==version`, got 'torch>=2'" in result.stderr
    bad.write_text("torch==2.13.0\nTorch==2.12.0\n")
    result = check(bad, "--path", str(tmp_path / "site"))
    assert result.returncode == 2 and "torch is pinned twice" in result.stderr


def test_the_repos_constraints_pin_the_build_tools_and_the_cuda_stack():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from check_pins import read_pins
    finally:
        sys.path.remove(str(SCRIPT.parent))
    cpu, cuda = read_pins(ROOT / "constraints.txt"), read_pins(ROOT / "constraints-cuda.txt")
    assert {"pip", "setuptools", "wheel"} <= set(cpu)
    assert set(cpu) < set(cuda)  # the CUDA file adds to constraints.txt, overriding nothing
    assert {"onnxruntime-gpu", "triton", "cuda-toolkit", "nvidia-cudnn-cu13"} <= set(cuda) - set(cpu)
    assert "onnxruntime-gpu" not in cpu


def test_this_environment_holds_only_pinned_distributions():
    """The test environment (`make venv`) is what constraints.txt says: what the Makefile checks after installing."""
    result = check(ROOT / "constraints.txt", "--allow", "export-action")
    assert result.returncode == 0, result.stderr

"""Shared fixtures: the local Hub and GitHub emulators, and tiny models built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tests.servers.hub_fixtures", "tests.servers.github_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "exporters.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real `hf-export` CLI as a subprocess, as a user would."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full_env, cwd=cwd or ROOT,
                          timeout=timeout)


@pytest.fixture(autouse=True, scope="session")
def _torch_serde_logging():
    """torch 2.13's `.pt2` loader logs a malformed warning; pytest's log capture turns the logging error into a
    failure. Tests that load `.pt2` files with upstream directly get the same fix the library applies."""
    import logging

    from exporters.upstream import TORCH_SERDE_LOGGER

    logging.getLogger(TORCH_SERDE_LOGGER).setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A tiny Llama with a one-target dynamo generation recipe."""
    from tests.models import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))

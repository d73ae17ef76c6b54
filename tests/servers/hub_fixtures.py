"""Pytest fixtures for the Hub emulator (`tests.servers.hub`).

- ``hub_server`` (session): one `HubEmulator` on a free loopback port for the whole run.
- ``hub`` (function): that emulator, reset to an empty Hub before the test (tokens: ``TEST_TOKEN`` ->
  ``TEST_USER``, ``BOT_TOKEN`` -> ``BOT_USER``).
- ``hf_env`` (function): ``hub`` plus an environment pointing ``huggingface_hub`` at it: ``HF_ENDPOINT``,
  ``HF_HUB_DISABLE_XET=1``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``HF_HOME`` in a tmp dir, ``HF_TOKEN=TEST_TOKEN``.
  ``huggingface_hub`` reads most of these at import time, so the matching ``huggingface_hub.constants`` (and
  the endpoint of the module-level ``HfApi`` behind ``huggingface_hub.upload_file`` & co.) are patched too,
  for the test only. Passing ``endpoint=hub.url`` explicitly is still the most robust.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.hub import HubEmulator

TEST_TOKEN, TEST_USER = "hf_test_token", "alice"
BOT_TOKEN, BOT_USER = "hf_bot_token", "export-bot"


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubEmulator]:
    """One Hub emulator for the session (use ``hub`` in tests: it starts from an empty Hub)."""
    with HubEmulator(tokens={TEST_TOKEN: TEST_USER, BOT_TOKEN: BOT_USER}) as emulator:
        yield emulator


@pytest.fixture
def hub(hub_server: HubEmulator) -> HubEmulator:
    """The session's Hub emulator, emptied: no repos, no discussions, construction tokens."""
    hub_server.reset()
    return hub_server


@pytest.fixture
def hf_env(hub: HubEmulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HubEmulator:
    """Point ``huggingface_hub`` at ``hub`` (env vars and import-time constants) for one test."""
    from huggingface_hub import constants, hf_api

    home = tmp_path / "hf-home"
    home.mkdir()
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HOME": str(home), "HF_TOKEN": TEST_TOKEN, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HUGGING_FACE_HUB_TOKEN",
                 "HF_TOKEN_PATH", "HF_XET_CACHE", "HF_ASSETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    patched = {
        "ENDPOINT": hub.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_OFFLINE": False,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HUGGINGFACE_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
    }
    for name, value in patched.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    monkeypatch.setattr(hf_api.api, "endpoint", hub.url)
    return hub

"""Pytest fixtures for the Jobs API emulator (`tests.servers.jobs`), served on the session's Hub emulator.

Import them explicitly in a test module::

    from tests.servers.jobs_fixtures import jobs, jobs_server  # noqa: F401

- ``jobs_server`` (session): the `JobsEmulator` on ``hub_server`` (registered once), whose known images are
  ``IMAGE`` and ``CUDA_IMAGE`` (both this checkout: ``python`` is this interpreter, ``PYTHONPATH`` the repository);
  its jobs' environment has ``HF_HUB_DISABLE_XET=1`` as the image would (the Hub emulator has no Xet).
- ``jobs`` (function): that emulator reset, on the ``hub`` fixture's emptied Hub.
"""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.servers.hub import HubEmulator
from tests.servers.jobs import JobsEmulator

IMAGE = "ghcr.io/hf/export-action@sha256:" + "1" * 64
CUDA_IMAGE = "ghcr.io/hf/export-action@sha256:" + "2" * 64


@pytest.fixture(scope="session")
def jobs_server(hub_server: HubEmulator) -> JobsEmulator:
    """The Jobs API on the session's Hub emulator (its routes are added once per server)."""
    emulator = getattr(hub_server, "jobs_emulator", None)
    if emulator is None:
        emulator = JobsEmulator(hub_server, image_root=ROOT, images={IMAGE, CUDA_IMAGE},
                                base_env={"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
        hub_server.jobs_emulator = emulator  # type: ignore[attr-defined]
    return emulator


@pytest.fixture
def jobs(jobs_server: JobsEmulator, hub: HubEmulator):
    """The Jobs emulator with no job, on an empty Hub; every job it ran is stopped afterwards."""
    jobs_server.reset()
    yield jobs_server
    jobs_server.reset()

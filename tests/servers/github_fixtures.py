"""Pytest fixtures for the local GitHub REST emulator (:mod:`tests.servers.github`).

Import the fixture explicitly in a test module::

    from tests.servers.github_fixtures import github_server  # noqa: F401

``github_server`` is a running :class:`~tests.servers.github.GitHubEmulator` on a free
loopback port with fresh state for every test: two tokens (``GITHUB_BOT_TOKEN`` →
``github-actions[bot]``, ``GITHUB_USER_TOKEN`` → ``someone``) and one repository
``acme/widgets`` (default branch ``main``) with pull request #1 (head ``add-recipe`` at
``PR_HEAD_SHA``) and workflow ``export.yml`` named ``Export``.

Starting takes ~0.1 s but uvicorn needs ~0.2 s to shut down, so one server lives for the
session (``github_server_session``, unseeded) and ``github_server`` calls
:meth:`~tests.servers.github.GitHubEmulator.reset` and reseeds it around each test.
Import ``github_server_session`` as well only if a module needs the bare server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.github import GitHubEmulator

GITHUB_BOT_TOKEN = "ghs_test"
GITHUB_BOT_LOGIN = "github-actions[bot]"
GITHUB_USER_TOKEN = "ghp_other"
GITHUB_USER_LOGIN = "someone"
REPO = "acme/widgets"
PR_NUMBER = 1
PR_HEAD_SHA = "0123456789abcdef0123456789abcdef01234567"
WORKFLOW_FILE = "export.yml"


@pytest.fixture(scope="session")
def github_server_session() -> Iterator[GitHubEmulator]:
    """One running emulator for the whole session, knowing the two test tokens and nothing else."""
    with GitHubEmulator({GITHUB_BOT_TOKEN: GITHUB_BOT_LOGIN, GITHUB_USER_TOKEN: GITHUB_USER_LOGIN}) as emulator:
        yield emulator


@pytest.fixture
def github_server(github_server_session: GitHubEmulator) -> Iterator[GitHubEmulator]:
    """The session emulator, reset and seeded with ``acme/widgets``, PR #1 and ``export.yml``."""
    emulator = github_server_session
    emulator.reset()
    emulator.create_repo(REPO, default_branch="main")
    emulator.create_pull(REPO, PR_NUMBER, "Add export recipe", PR_HEAD_SHA, base="main", head_ref="add-recipe")
    emulator.add_workflow(REPO, file=WORKFLOW_FILE, name="Export")
    yield emulator
    emulator.reset()

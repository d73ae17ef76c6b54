"""Pytest fixtures for the local GitHub REST emulator (:mod:`tests.servers.github`).

Import the fixture explicitly in a test module::

    from tests.servers.github_fixtures import github_server  # noqa: F401

``github_server`` is a started :class:`~tests.servers.github.GitHubEmulator` on a free
loopback port, knowing two tokens (``GITHUB_BOT_TOKEN`` → ``github-actions[bot]`` and
``GITHUB_USER_TOKEN`` → ``someone``) and one repository ``acme/widgets`` (default
branch ``main``) with pull request #1 at ``PR_HEAD_SHA`` and workflow ``export.yml``.
Startup takes a few milliseconds, so the fixture is function-scoped: every test gets
fresh state.
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


@pytest.fixture
def github_server() -> Iterator[GitHubEmulator]:
    """A running GitHub emulator seeded with ``acme/widgets``, PR #1 and ``export.yml``."""
    emulator = GitHubEmulator({GITHUB_BOT_TOKEN: GITHUB_BOT_LOGIN, GITHUB_USER_TOKEN: GITHUB_USER_LOGIN})
    emulator.create_repo(REPO, default_branch="main")
    emulator.create_pull(REPO, PR_NUMBER, "Add export recipe", PR_HEAD_SHA, base="main", head_ref="add-recipe")
    emulator.add_workflow(REPO, file=WORKFLOW_FILE, name="Export")
    with emulator:
        yield emulator

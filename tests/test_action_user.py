"""The Action's container starts as root; its entrypoint runs the export as an unprivileged user (action/privileges.py).

The real entrypoint (`python -m action`) is started as root, as GitHub starts a Docker action, with
`EXPORT_ACTION_USER` set as the image sets it, by an interpreter every user can run (the image's is
/usr/local/bin/python; here a venv of the system's Python 3.11 over this venv's packages, since this machine's own
interpreter lives under /root). The workspace, the runner's files and HOME are laid out as on a hosted runner (the
runner's user, uid 1001, owns them) or as on a runner that runs as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from action.privileges import target_user
from tests.models import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
RUNNER_UID = 1001  # the runner's user on GitHub-hosted runners
IMAGE_USER = (10001, 10001)  # the Dockerfile's EXPORT_ACTION_USER

pytestmark = pytest.mark.slow


def _readable_by_all(path: Path) -> bool:
    path = path.resolve()
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents] if p.is_dir()) and bool(
        os.stat(path).st_mode & 0o001)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp folder is root's only)."""
    if os.geteuid() != 0:
        pytest.fail("these tests start the entrypoint as root, as GitHub starts a Docker action: run them as root "
                    "(CI's container does)")
    folder = Path(tempfile.mkdtemp(prefix="action-user-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def python(base: Path) -> str:
    """An interpreter with this venv's packages that an unprivileged user can run."""
    if _readable_by_all(Path(sys.executable)):
        return sys.executable
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    assert system.is_file(), f"no Python {sys.version_info[:2]} that every user can run: install it"
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(base / "venv")], check=True, timeout=120)
    purelib = sysconfig.get_paths()["purelib"]
    (base / "venv" / "lib" / system.name / "site-packages" / "stack.pth").write_text(purelib + "\n")
    return str(base / "venv" / "bin" / "python")


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid)


def run_entrypoint(python: str, workspace: Path, runner: Path, inputs: dict[str, str], prefix: tuple[str, ...] = (),
                   user: str = "%d:%d" % IMAGE_USER) -> tuple[subprocess.CompletedProcess, str, str]:
    """`python -m action` as root, with the runner's files in `runner` (made root's, 0600, unless they exist)."""
    output, summary = runner / "output", runner / "summary"
    for path in (output, summary):
        if not path.exists():
            path.touch(mode=0o600)
    event = runner / "event.json"
    event.write_text(json.dumps({"repository": {"full_name": "acme/widgets"}}))
    event.chmod(0o644)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INPUT_", "GITHUB_", "HF_", "HUGGING", "RUNNER_"))}
    env.update({
        "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "CI": "true", "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": "workflow_dispatch", "GITHUB_EVENT_PATH": str(event), "GITHUB_REPOSITORY": "acme/widgets",
        "GITHUB_WORKSPACE": str(workspace), "GITHUB_SERVER_URL": "https://github.com", "GITHUB_RUN_ID": "1",
        "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary), "HOME": str(runner / "home"),
        "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "1", "EXPORT_ACTION_USER": user,
    })
    env.update({f"INPUT_{name.upper()}": value for name, value in inputs.items()})
    proc = subprocess.run([*prefix, python, "-m", "action"], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, output.read_text(), summary.read_text()


@pytest.fixture(scope="module")
def hosted_run(base: Path, python: str):
    """A hosted runner: the workspace (a checkout holding a model) and HOME are uid 1001's; the file-command files
    are root's and private here, so only the entrypoint's relay can fill them."""
    workspace, runner = base / "hosted" / "workspace", base / "hosted" / "runner"
    tiny_llama(workspace / "tiny", recipe={"export_format": "dynamo", "mode": "model"})
    (runner / "home").mkdir(parents=True)
    _chown_tree(workspace, RUNNER_UID, RUNNER_UID)
    os.chown(runner / "home", RUNNER_UID, RUNNER_UID)
    proc, output, summary = run_entrypoint(python, workspace, runner, {
        "model": "tiny", "open-pr": "false", "comment": "false", "benchmark": "false"})
    return {"proc": proc, "output": output, "summary": summary, "workspace": workspace}


def test_the_export_runs_as_the_workspace_owner_and_its_outputs_reach_the_runner(hosted_run):
    proc = hosted_run["proc"]
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "status=passed" in hosted_run["output"].splitlines()
    assert "**passed** (1/1 targets passed)" in hosted_run["summary"]
    out = hosted_run["workspace"] / "export-out"
    assert (out / "report.json").is_file() and (out / "dynamo" / "model.pt2").is_file()
    # everything the run wrote (the export children's artifacts and logs included) is the runner user's, not root's
    written = [out, *out.rglob("*")]
    assert {p.lstat().st_uid for p in written} == {RUNNER_UID}, [str(p) for p in written if p.lstat().st_uid == 0]
    assert not [p for p in hosted_run["workspace"].rglob("*") if p.lstat().st_uid == 0]


def test_a_root_owned_workspace_runs_as_the_images_user_and_hands_over_nothing_outside_it(base, python):
    """A runner that runs as root: the image's user, the output folder (inside the workspace) made its own; a folder
    outside the workspace, or reached through a link, is never handed over."""
    workspace, runner = base / "rooted" / "workspace", base / "rooted" / "runner"
    tiny_llama(workspace / "tiny", recipe={"export_format": "dynamo", "mode": "model"})
    (runner / "home").mkdir(parents=True)
    assert target_user({"GITHUB_WORKSPACE": str(workspace), "EXPORT_ACTION_USER": "10001:10001"}) == IMAGE_USER
    proc, output, _ = run_entrypoint(python, workspace, runner, {"model": "tiny", "mode": "list-targets"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert 'targets=["dynamo"]' in output.splitlines()
    assert (workspace / "export-out").stat().st_uid == IMAGE_USER[0]
    outside = base / "rooted" / "elsewhere"
    outside.mkdir()
    (workspace / "linked").symlink_to(outside)
    for folder in (str(outside), "linked"):
        proc, output, _ = run_entrypoint(python, workspace, runner, {"model": "tiny", "mode": "list-targets",
                                                                     "output-dir": folder})
        assert outside.stat().st_uid == 0, folder
    assert not (runner / "home").stat().st_uid  # HOME was root's: the child got its own, this one is untouched


def test_where_the_container_cannot_change_user_it_says_so_and_runs_as_root(base, python):
    workspace, runner = base / "nocaps" / "workspace", base / "nocaps" / "runner"
    tiny_llama(workspace / "tiny", recipe={"export_format": "dynamo", "mode": "model"})
    (runner / "home").mkdir(parents=True)
    no_setuid = ("setpriv", "--bounding-set=-setuid,-setgid", "--inh-caps=-setuid,-setgid")
    proc, output, _ = run_entrypoint(python, workspace, runner, {"model": "tiny", "mode": "list-targets",
                                                                 "hf-token": "hf_secret_value"}, prefix=no_setuid)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert 'targets=["dynamo"]' in output.splitlines()
    assert "::warning title=export-action runs as root::the container cannot change user" in proc.stdout
    assert proc.stdout.index("::add-mask::hf_secret_value") < proc.stdout.index("::warning")
    # a user variable that names root (or no user) is said, not guessed at
    proc, output, _ = run_entrypoint(python, workspace, runner, {"model": "tiny", "mode": "list-targets"}, user="0")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "::warning title=export-action runs as root::EXPORT_ACTION_USER is not `uid[:gid]`" in proc.stdout


def test_the_image_has_the_unprivileged_user_the_entrypoint_falls_back_to():
    from tests.test_static_checks import dockerfile_env, parse_dockerfile

    instructions = parse_dockerfile((ROOT / "Dockerfile").read_text())
    assert "USER" not in [kind for kind, _ in instructions]  # GitHub starts the container as root: see the module
    assert dockerfile_env(instructions)["EXPORT_ACTION_USER"] == "%d:%d" % IMAGE_USER
    run = " ".join(rest for kind, rest in instructions if kind == "RUN")
    assert f"useradd --no-log-init --system --user-group --uid {IMAGE_USER[0]} " in run

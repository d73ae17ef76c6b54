"""Run the Action's work as an unprivileged user, although GitHub starts a Docker action's container as root.

GitHub runs a Docker action's container as root and discourages `USER` in its Dockerfile (the workspace and the
file-command files are the runner's user's, so another fixed user could not write them). The export loads the model,
its tokenizer, native runtimes and, when allowed, the repo's own code: none of it needs root. So `python -m action`,
started as root in the image (which sets `EXPORT_ACTION_USER`), runs itself again as a child under another user:

    this process (root)                              the child (that uid and gid, no supplementary groups)
    ───────────────────                              ─────────────────────────────────────────────────────
    the user: the workspace's owner (the runner's    python -m action as ever: inputs, export, publish,
      user: uid 1001 on GitHub-hosted runners),        output-dir; GITHUB_OUTPUT / GITHUB_STEP_SUMMARY are
      else EXPORT_ACTION_USER (the image's user)  ──►  its own relay files
    output-dir (inside the workspace), HOME and
      HF_HOME made that user's where they are not
    wait, passing on SIGTERM / SIGINT             ◄──  exit code
    append the relay files to the runner's GITHUB_OUTPUT and GITHUB_STEP_SUMMARY; exit with the child's code

Files the run writes to the workspace are then the runner user's, as a `run:` step's are (not root's). Where the
container may not change user (no CAP_SETUID / CAP_SETGID: `--cap-drop`, some rootless runtimes), a warning says so
and the run goes on as root, as before. Not started as root, or without `EXPORT_ACTION_USER` (outside the image),
nothing changes.

Example:
    >>> parse_user("10001:10001"), parse_user("1001")
    ((10001, 10001), (1001, 1001))
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .commands import add_mask, warning
from .settings import DEFAULT_OUTPUT_DIR, read_input

USER_VARIABLE = "EXPORT_ACTION_USER"  # uid[:gid] of the image's unprivileged user (the Dockerfile sets it)
RELAYED = ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")


def parse_user(value: str) -> tuple[int, int]:
    """`uid[:gid]` → (uid, gid); the gid defaults to the uid."""
    uid, _, gid = value.partition(":")
    return int(uid), int(gid or uid)


def target_user(env: Mapping[str, str]) -> tuple[int, int] | None:
    """Whom to run as: None (stay) unless root in the image; the workspace's owner, else the image's user."""
    if os.geteuid() != 0 or not env.get(USER_VARIABLE):
        return None
    try:
        owner = Path(env.get("GITHUB_WORKSPACE") or os.getcwd()).stat()
    except OSError:  # no workspace: the image's user (settings then say what is missing)
        owner = None
    if owner is not None and owner.st_uid != 0:
        return owner.st_uid, owner.st_gid
    user = parse_user(env[USER_VARIABLE])
    if user[0] == 0:
        raise ValueError(f"{USER_VARIABLE}={env[USER_VARIABLE]} names root, not an unprivileged user")
    return user


def _give(path: Path, uid: int, gid: int) -> None:
    """Make `path` (a folder) and what is in it `uid:gid`'s, never following a link."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def _inside(path: Path, folder: Path) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == os.path.realpath(folder)


def prepare(env: Mapping[str, str], uid: int, gid: int, scratch: Path) -> dict[str, str]:
    """The child's environment, with the folders it writes made its own. Runs as root, before the child."""
    child = dict(env)
    workspace = Path(env.get("GITHUB_WORKSPACE") or os.getcwd())
    out = Path(read_input(env, "output-dir") or DEFAULT_OUTPUT_DIR)
    out = out if out.is_absolute() else workspace / out
    # Only inside the workspace: an input never makes this root process hand over a folder elsewhere.
    if _inside(out, workspace) and not out.is_symlink():
        out.mkdir(parents=True, exist_ok=True)
        if out.stat().st_uid != uid:
            _give(out, uid, gid)
    for name in ("HOME", "HF_HOME"):
        current = env.get(name)
        if current and os.path.isdir(current) and os.stat(current).st_uid == uid:
            continue
        if name == "HF_HOME" and not current:
            continue  # huggingface_hub's default is under HOME
        own = scratch / name.lower()
        own.mkdir(mode=0o700)
        os.chown(own, uid, gid)
        child[name] = str(own)
    try:
        child["USER"] = child["LOGNAME"] = pwd.getpwuid(uid).pw_name
    except KeyError:  # the runner's user has no entry in the image: getpass and torch read USER first
        child["USER"] = child["LOGNAME"] = f"uid{uid}"
    for name in RELAYED:
        relay = scratch / name.lower()
        relay.touch(mode=0o600)
        os.chown(relay, uid, gid)
        child[name] = str(relay)
    return child


def _relay(env: Mapping[str, str], scratch: Path) -> None:
    """Append what the child wrote to its relay files to the runner's own files."""
    for name in RELAYED:
        relay, target = scratch / name.lower(), env.get(name)
        text = relay.read_bytes() if relay.is_file() else b""
        if target and text:
            with open(target, "ab") as handle:
                handle.write(text)


def _stay_root(env: Mapping[str, str], why: str) -> None:
    for name in ("hf-token", "github-token"):  # masks still come first
        add_mask(read_input(env, name))
    add_mask(env.get("HF_TOKEN"))
    warning(f"{why}: the export runs as root.", title="export-action runs as root")


def run_unprivileged(env: Mapping[str, str]) -> int | None:
    """Run `python -m action` again as the unprivileged user and return its exit code; None: run here, as is."""
    try:
        user = target_user(env)
    except ValueError as err:  # a malformed EXPORT_ACTION_USER: say so, do not guess a user
        _stay_root(env, f"{USER_VARIABLE} is not `uid[:gid]` of an unprivileged user ({err})")
        return None
    if user is None:
        return None
    uid, gid = user
    scratch = Path(tempfile.mkdtemp(prefix="export-action-"))
    os.chmod(scratch, 0o711)  # the child reaches its own files in it by name; nobody lists it
    try:
        child_env = prepare(env, uid, gid, scratch)
        try:
            process = subprocess.Popen([sys.executable, "-m", "action"], env=child_env, user=uid, group=gid,
                                       extra_groups=[])
        except PermissionError as err:
            _stay_root(env, f"the container cannot change user ({err.strerror}). Give the container CAP_SETUID "
                            "and CAP_SETGID (Docker's default) to run it as the workspace's owner")
            return None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda number, _frame: process.send_signal(number))
        code = process.wait()
        _relay(env, scratch)
        return code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

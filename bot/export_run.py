"""The bot's export run: `hf-export` itself, with the bot's note (how to stop it for a repo) added to every PR and
discussion text it publishes (`exporters.publish.texts.NOTES`).

    python -m bot.export_run run REPO --revision SHA --out DIR --push ...   # same arguments as `hf-export`
    python -m bot.export_run run REPO --revision SHA --out DIR --push --recipe-sha256 HASH --outcome-line ...

Two options are the bot's own, for a run on another machine (the `hf-jobs` backend), whose files the bot never sees:

- `--recipe-sha256 HASH`: the recipe the bot decided to export. The run first reads the repo's recipe at `--revision`
  with this image's code and stops (exit 2, nothing exported) when it hashes differently: an image older or newer
  than the bot reads recipes another way, and the bot's "already exported" records would no longer match.
- `--outcome-line`: at the end, one line `export-bot-outcome: {json}` on stdout with what `--push` did
  (`OUT/publish.json`), what stopped the run (`OUT/problem.json`) and the targets that did not pass: the job's log
  is the only thing the bot reads back.

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-m", "bot.export_run", "--help"], capture_output=True).returncode
    0
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

from exporters.cli import main as hf_export
from exporters.publish import texts

from .hubcheck import HubCheckError, inspect_repo
from .texts import OPT_OUT_NOTE

OUTCOME_MARKER = "export-bot-outcome: "
EXIT_RECIPE_MISMATCH = 2


def _pop(argv: list[str], name: str, *, flag: bool = False) -> str | None:
    """Remove `name` (and its value) from `argv`; its value ('' for a flag), None when absent."""
    if name not in argv:
        return None
    at = argv.index(name)
    value = "" if flag else (argv[at + 1] if at + 1 < len(argv) else "")
    del argv[at:at + (1 if flag else 2)]
    return value


def _option(argv: list[str], name: str, default: str = "") -> str:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


def outcome(out_dir: Path) -> dict[str, Any]:
    """What the bot needs from a finished run's folder: the publish outcome, the problem, the failed targets."""
    record: dict[str, Any] = {}
    for key, name in (("publish", "publish.json"), ("problem", "problem.json"), ("report", "report.json")):
        try:
            record[key] = json.loads((out_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    report = record.pop("report", None)
    if isinstance(report, dict):
        record["status"] = report.get("status")
        record["failed"] = [{"name": t.get("name"), "status": t.get("status"), "error": t.get("error")}
                            for t in report.get("targets") or [] if isinstance(t, dict) and t.get("status") != "passed"]
    return record


def _check_recipe(argv: list[str], expected: str, tell: bool) -> None:
    """Exit 2 when the repo's recipe at `--revision` does not hash to `expected` with this image's code (with `tell`,
    the outcome line says why)."""
    repo, revision = argv[1] if len(argv) > 1 else "", _option(argv, "--revision", "main")
    try:
        state = inspect_repo(repo, revision, token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"))
        found = state.recipe_sha256
        message = "" if found == expected else (
            f"the recipe of {repo} at {revision} hashes to {found} in this image, not {expected} as the bot read it: "
            "the image and the bot read recipes differently; nothing was exported")
    except HubCheckError as err:
        message = f"could not read the recipe of {repo} at {revision}: {err}"
    if message:
        print(f"error: {message}", file=sys.stderr, flush=True)
        if tell:
            print(OUTCOME_MARKER + json.dumps({"stopped": message}), flush=True)
        sys.exit(EXIT_RECIPE_MISMATCH)


def main() -> None:
    """Run `hf-export` with the bot's note in the texts it publishes (and the bot's own options, above)."""
    if OPT_OUT_NOTE not in texts.NOTES:
        texts.NOTES.append(OPT_OUT_NOTE)
    argv = sys.argv[1:]
    expected = _pop(argv, "--recipe-sha256")
    tell = _pop(argv, "--outcome-line", flag=True) is not None
    if expected:
        _check_recipe(argv, expected, tell)
    if tell:
        out_dir = Path(_option(argv, "--out", "out"))
        atexit.register(lambda: print(OUTCOME_MARKER + json.dumps(outcome(out_dir), sort_keys=True), flush=True))
    sys.argv = [sys.argv[0], *argv]
    hf_export()


if __name__ == "__main__":
    main()

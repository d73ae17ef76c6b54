"""`init` hands its checked export to `run`: a target folder that `hf-export init` exported and validated, kept
under a key of everything that determines it, is taken by the `run` that asks for the same export instead of
exporting again. Every check of `run` still runs on it.

```
init's round (RunOptions.hand_over) ─► target exported, validated, passed, its files unchanged by validation
   ─► <state dir>/handover/<export key>/ (the folder + entry.json: the child's outcome, the files' sha256s, signed)
run (same export key, the same planned target) ─► the entry taken out of the store under its lock (one run gets it)
   ─► moved (or copied) into the run's staging folder ─► every file hashed again against the signed entry
   ─► renamed into place and validated as a fresh export │ anything amiss: exported again, the finding says why
```

The export key ([`export_key`]) is the run's cache key less the recipe's `validation` (tolerances and probe sizes
decide the verdict, which `run` gives again, not the bytes): the weights, configs, tokenizer and code files (hashed
again on every run), the target as it exports (its default dtype and ONNX opset filled in), the recipe's `inputs` and `generation`, the tools and this tool's own sources, the device and the
revision. The store is the signing key's folder (`EXPORT_ACTION_STATE_DIR`, private to the user); an entry is signed
with that key ([`exporters.run.reuse.Signer`]), so a folder planted there is never taken; nothing in it runs until the
run's own checks load it, as they load what that run exported. An entry is taken once (a second `run` into the same
folder reuses its own signed targets, `exporters.run.reuse`); one not taken within `MAX_AGE_S` is removed.
`--no-cache` (`RunOptions.use_cache`) refuses it.

Example:
    >>> import tempfile
    >>> store = Store(Path(tempfile.mkdtemp()))
    >>> store.take("0" * 64, Path(tempfile.mkdtemp()) / "staging") is None
    True
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from exporters import fsutil
from exporters.errors import ArtifactError
from exporters.hashing import file_entries
from exporters.recipe.model import Target
from exporters.run.reuse import Signer, state_dir
from exporters.status import PASSED
from exporters.version import code_fingerprint

STORE = "handover"
ENTRY = "entry.json"
MAX_AGE_S = 24 * 3600.0  # an export init checked waits this long for its run
MAX_ENTRIES = 8  # and at most this many wait (the oldest go first)
MADE_BY = "hf-export init"
# what a target's export does not depend on: where its run stops waiting for it
NOT_EXPORTED = {"timeout"}


def planned_form(target: Target) -> dict[str, Any]:
    """The target as the run planned it (layout, components, its dtype and ONNX opset filled in by `prepare_run`),
    less what only times it."""
    data = target.model_dump(mode="json")
    for name in NOT_EXPORTED:
        data.pop(name, None)
    return data


def export_key(context: Any, target: Target, device: str) -> str:
    """What an export depends on (see the module): the run's `cache_key` material less the recipe's `validation`,
    with the target as the run planned it (`planned_form`): an entry is taken only by a run that plans the same
    export."""
    recipe = context.recipe.model_dump(mode="json", include={"inputs", "generation"})
    material = json.dumps({"weights": context.weights, "target": planned_form(target), "recipe": recipe,
                           "versions": context.versions, "code": code_fingerprint(), "device": device,
                           "revision": context.source.revision}, sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def _identity(entries: list[dict[str, Any]]) -> list[tuple[Any, Any, Any]]:
    return [(f.get("path"), f.get("size"), f.get("sha256")) for f in entries if isinstance(f, dict)]


class Store:
    """The folder of handed-over exports (`<state dir>/handover`), one entry per export key, under one lock."""

    def __init__(self, root: Path | None = None, signer: Signer | None = None):
        self.root = root or state_dir() / STORE
        self.signer = signer or Signer(self.root.parent)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The store's lock (a private folder: the exports of the user's models are no one else's to read)."""
        self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.root.is_symlink():
            self.root.unlink()  # the link, never what it points to
        self.root.mkdir(exist_ok=True, mode=0o700)
        descriptor = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def deposit(self, key: str, folder: Path, record: dict[str, Any], exported: list[dict[str, Any]]) -> bool:
        """Keep `folder` (a validated target's folder) under `key` with `record` (the child's outcome, the planned
        target, where it came from). Its files are linked (or copied) into a new folder and hashed there; only when
        they are `exported` (the files as the export wrote them: validation changed nothing) is the entry renamed
        into place, whole (a reader never sees half of one). False when it was not kept."""
        name = folder.name
        with self._locked():
            self._prune()
            building = self.root / f".new-{secrets.token_hex(8)}"
            try:
                shutil.copytree(folder, building / name, symlinks=True, copy_function=_link_or_copy)
                entry = {**record, "export_key": key, "name": name, "made_by": MADE_BY, "created": time.time(),
                         "files": file_entries(building / name, building / name)}
                if _identity(entry["files"]) != _identity(exported):
                    raise OSError("the folder changed after its export")
                entry["signature"] = self.signer.sign(entry)
                fsutil.write_file(building / ENTRY, json.dumps(entry, sort_keys=True))
                fsutil.remove(self.root / key)
                building.rename(self.root / key)
            except OSError:
                fsutil.remove(building)
                return False
        return True

    def take(self, key: str, staging: Path) -> dict[str, Any] | None:
        """The entry kept under `key`, its folder moved into `staging` (a new folder), or None when there is none.
        The entry leaves the store under the lock (two runs: one takes it, the other exports). Raises
        `ArtifactError` (staging removed) when it is not one to use: not signed by this tool for this key, or its
        files are not, byte for byte, the ones it signed (they are hashed again in `staging`)."""
        taken = self.root / f".taken-{secrets.token_hex(8)}"
        if not (self.root / key / ENTRY).is_file():
            return None
        with self._locked():
            try:
                (self.root / key).rename(taken)
            except OSError:  # another run took it first
                return None
        try:
            return self._move_out(taken, key, staging)
        finally:
            fsutil.remove(taken)

    def _move_out(self, taken: Path, key: str, staging: Path) -> dict[str, Any]:
        try:
            entry = json.loads((taken / ENTRY).read_text())
        except (OSError, ValueError):
            raise ArtifactError("its entry does not read") from None
        if not isinstance(entry, dict) or not self.signer.verify(entry) or entry.get("export_key") != key:
            raise ArtifactError("its entry is not one this tool signed for this export")
        name = entry.get("name")
        source = taken / str(name)
        if not isinstance(name, str) or source.is_symlink() or not source.is_dir():
            raise ArtifactError("its folder is missing")
        fsutil.remove(staging)
        try:
            source.rename(staging)  # the same file system: no copy
        except OSError:
            shutil.copytree(source, staging, symlinks=True)
        links = [p for p in staging.rglob("*") if p.is_symlink()]
        if links or not entry.get("files") or _identity(file_entries(staging, staging)) != _identity(entry["files"]):
            fsutil.remove(staging)
            raise ArtifactError("its files are not the ones init validated (changed since)")
        return entry

    def _prune(self) -> None:
        """Entries older than `MAX_AGE_S`, beyond the newest `MAX_ENTRIES`, and leftovers of runs that died."""
        now = time.time()
        entries = sorted((p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink()),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        kept = 0
        for path in entries:
            old = now - path.stat().st_mtime > (3600.0 if path.name.startswith(".") else MAX_AGE_S)
            if path.name.startswith("."):
                if old:
                    fsutil.remove(path)
                continue
            kept += 1
            if old or kept >= MAX_ENTRIES:
                fsutil.remove(path)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination)


# ── The pipeline's two ends ──────────────────────────────────────────────────


def as_exported(outcome: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What a run that hands over keeps of a finished export: the child's outcome and the files as it wrote them."""
    kept = {name: outcome.get(name) for name in ("notes", "quantization", "inventory", "export_only_s", "save_s")}
    return {"outcome": kept, "files": file_entries(folder, folder)}


def hand_over(item: Any, context: Any, folder: Path) -> bool:
    """After validation: a passed target whose files are still as exported kept for the `run` that asks for it."""
    result, exported = item.result, item.exported
    if exported is None or result.status != PASSED:
        return False
    record = {"outcome": exported["outcome"], "target": planned_form(item.target), "model": context.source.display}
    return Store().deposit(export_key(context, item.target, result.device), folder, record, exported["files"])


def take_over(item: Any, context: Any, options: Any, staging_prefix: str) -> bool:
    """Before exporting: the export init handed over for this planned target moved into place with what its child
    reported (True: not exported again), or False (none, `--no-cache`, or one refused: the finding says why)."""
    if not options.use_cache:
        return False
    result, started, final = item.result, time.time(), context.out_dir / item.target.name
    staging = context.out_dir / f"{staging_prefix}{item.target.name}"
    key = export_key(context, item.target, result.device)
    try:
        entry = Store().take(key, staging)
    except (ArtifactError, OSError) as why:
        result.findings.append(f"an export `{MADE_BY}` handed over for this target was not used ({why}): exported "
                               "again")
        return False
    if entry is None:
        return False
    outcome = entry.get("outcome") or {}
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.get("created") or 0))
    result.findings += list(outcome.get("notes") or [])
    result.quantization, item.inventory = outcome.get("quantization"), outcome.get("inventory")
    result.handed_over = {"from": MADE_BY, "exported_at": when, "export_key": key, "model": entry.get("model")}
    result.findings.append(f"not exported again: `{MADE_BY}` exported this target when it checked the recipe "
                           f"({when}) and handed it over; its files were hashed again against init's signed record, "
                           "and every check ran again here")
    fsutil.move_into_place(staging, final)
    result.timings.update(export_s=round(time.time() - started, 3), trace_s=outcome.get("export_only_s"),
                          save_s=outcome.get("save_s"))
    fsutil.fresh_file(context.out_dir / "logs" / f"{item.target.name}.log", f"not exported: handed over by "
                      f"{MADE_BY} ({when}), export key {key}\n")
    return True

"""Merge the report parts of a split run (one matrix leg per target) into one output folder and one report.

A part is what one run wrote to its output folder: `report.json`, `report.md`, `<target>/` and `logs/<target>.log`.
The parts of one export must come from the same model commit, weights and recipe; artifacts are checked against the
sizes and sha256 their part recorded (an interrupted artifact upload or download shows up as a failed target).
Targets the recipe lists but no part reports (a leg that died before writing its report) are reported as failed,
so a partial set of exports is never published as complete.

Example:
    >>> part = {"source": {"model": "acme/x", "revision": "a" * 40}, "recipe": {"sha256": "r"}, "versions": {},
    ...         "targets": [{"name": "onnx", "status": "passed"}]}
    >>> merged = merge_reports([part], expected=["onnx", "dynamo"])
    >>> merged["status"], [(t["name"], t["status"]) for t in merged["targets"]]
    ('failed', [('onnx', 'passed'), ('dynamo', 'failed')])
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

from exporters import fsutil
from exporters.errors import AggregateError
from exporters.hashing import sha256_file
from exporters.recipe.model import TARGET_NAME_PATTERN
from exporters.report.build import write_report
from exporters.status import FAILED, PASSED, overall_status


def find_parts(parts_dir: Path) -> list[Path]:
    """Folders under `parts_dir` holding a `report.json` (the folder itself, or its direct subfolders), sorted."""
    parts_dir = Path(parts_dir)
    if not parts_dir.is_dir():
        raise AggregateError(f"no folder {parts_dir}: download the legs' output folders there first "
                             "(actions/download-artifact with a pattern, one subfolder per leg)")
    found = sorted(p.parent for p in parts_dir.glob("*/report.json"))
    if not found and (parts_dir / "report.json").is_file():
        found = [parts_dir]
    if not found:
        raise AggregateError(f"no report parts in {parts_dir}: expected {parts_dir}/<leg>/report.json")
    return found


def _read_part(folder: Path) -> dict[str, Any]:
    try:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AggregateError(f"cannot read {folder / 'report.json'}: {err}") from None
    if not isinstance(report, dict) or not isinstance(report.get("targets"), list):
        raise AggregateError(f"{folder / 'report.json'} is not an export report (no 'targets' list)")
    for target in report["targets"]:
        name = target.get("name") if isinstance(target, dict) else None
        if not isinstance(name, str) or not re.match(TARGET_NAME_PATTERN, name) or name == "logs":
            raise AggregateError(f"{folder / 'report.json'} names a target {name!r}: target names are lower-case "
                                 "letters, digits, '.', '_' and '-' (as in recipes); the part was not written by "
                                 "this tool")
    return report


def _identity(report: dict[str, Any]) -> dict[str, Any]:
    source = report.get("source") or {}
    return {"model": source.get("model"), "revision": source.get("revision"),
            "weights_sha256": source.get("weights_sha256"), "recipe_sha256": (report.get("recipe") or {}).get("sha256")}


def _missing_target(name: str, info: dict[str, Any] | None) -> dict[str, Any]:
    info = info or {}
    return {
        "name": name, "export_format": info.get("export_format", "unknown"), "mode": info.get("mode") or "unknown",
        "status": FAILED, "device": info.get("device", "cpu"), "components": [], "files": [], "timings": {},
        "findings": [],
        "error": {"type": "MissingPart",
                  "message": f"no report part has target '{name}': its run (matrix leg) did not finish or did not "
                             "upload its output folder; see that leg's log"},
    }


def merge_reports(parts: list[dict[str, Any]], *, expected: list[str | dict[str, Any]] | None = None,
                  names: list[str] | None = None) -> dict[str, Any]:
    """One report from the reports of a split run.

    `expected` lists the recipe's targets (names, or dicts with `name`, `export_format`, `mode`, `device`) in recipe
    order: targets no part has are added as failed, and the merged targets follow that order. `names` labels the
    parts (e.g. the legs' artifact names) in `aggregated_from`.
    """
    if not parts:
        raise AggregateError("nothing to merge: no report parts")
    identities = [_identity(p) for p in parts]
    for key in ("model", "revision", "weights_sha256", "recipe_sha256"):
        values = {str(i[key]) for i in identities}
        if len(values) > 1:
            raise AggregateError(
                f"the report parts disagree on {key}: {sorted(values)}; every leg must export the same model commit "
                "with the same recipe (pin the revision: pass list-targets' 'revision' output to every leg)"
            )
    names = names or [f"part-{i}" for i in range(len(parts))]
    merged = copy.deepcopy(parts[0])
    targets: dict[str, dict[str, Any]] = {}
    for label, part in zip(names, parts):
        for target in part["targets"]:
            if target["name"] in targets:
                raise AggregateError(f"target '{target['name']}' is in two report parts (also in {label}): run each "
                                     "target in one leg only")
            targets[target["name"]] = copy.deepcopy(target)
    order = [e if isinstance(e, str) else e["name"] for e in (expected or [])]
    info = {e["name"]: e for e in (expected or []) if isinstance(e, dict)}
    for name in order:
        if name not in targets:
            targets[name] = _missing_target(name, info.get(name))
    ordered = [targets[n] for n in order] + [t for n, t in targets.items() if n not in order]
    findings: list[str] = []
    for part in parts:
        findings += [f for f in part.get("findings", []) if f not in findings]
    versions = [json.dumps(p.get("versions"), sort_keys=True) for p in parts]
    if len(set(versions)) > 1:
        findings.append("the legs ran with different tool versions: see each target's 'versions' in report.json")
    hits = sum((p.get("eager_cache") or {}).get("hits", 0) for p in parts)
    misses = sum((p.get("eager_cache") or {}).get("misses", 0) for p in parts)
    totals = [(p.get("timings") or {}).get("total_s") for p in parts]
    loads = [(p.get("timings") or {}).get("load_s") for p in parts]
    machines = {json.dumps(p.get("machine"), sort_keys=True) for p in parts if p.get("machine")}
    merged.update(
        machine=json.loads(machines.pop()) if len(machines) == 1 else None,  # legs on other machines: per target
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        status=overall_status([t["status"] for t in ordered]),
        family=next((p.get("family") for p in parts if p.get("family")), None),
        timings={"total_s": max((t for t in totals if t is not None), default=None),
                 "load_s": max((t for t in loads if t is not None), default=None)},
        eager_cache={"hits": hits, "misses": misses},
        targets=ordered,
        findings=findings,
        aggregated_from=[{"part": label, "targets": [t["name"] for t in part["targets"]],
                          "created_at": part.get("created_at")} for label, part in zip(names, parts)],
    )
    return merged


def _copy_target(part: Path, target: dict[str, Any], out_dir: Path) -> None:
    """Copy a target's folder and log into `out_dir`, failing the target when its files are not as recorded."""
    name = target["name"]
    source, destination = part / name, out_dir / name
    fsutil.remove(destination)
    links = [p for p in source.rglob("*") if p.is_symlink()] if source.is_dir() else []
    if source.is_symlink() or links:
        target["status"] = FAILED
        target["error"] = {"type": "ArtifactMismatch",
                           "message": f"the part's {name}/ holds links ({[str(p) for p in links[:3]] or str(source)}): "
                                      "artifacts are plain files; links are not followed or copied"}
        return
    if source.is_dir():
        shutil.copytree(source, destination, symlinks=True)
    log = part / "logs" / f"{name}.log"
    if log.is_file() and not log.is_symlink():
        fsutil.real_dir(out_dir / "logs")
        fsutil.remove(out_dir / "logs" / log.name)
        shutil.copyfile(log, out_dir / "logs" / log.name)
    if target.get("status") != PASSED:
        return
    problems = []
    for entry in target.get("files") or []:
        path = out_dir / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']} is missing")
        elif path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']} differs from what the export wrote (size or sha256)")
    if not target.get("files") and not source.is_dir():
        problems.append(f"{name}/ is missing")
    if problems:
        target["status"] = FAILED
        target["error"] = {"type": "ArtifactMismatch",
                           "message": "the artifacts did not survive the transfer between jobs: "
                                      + "; ".join(problems[:5]) + (" …" if len(problems) > 5 else "")}


def aggregate(parts_dir: Path, out_dir: Path, *, expected: list[str | dict[str, Any]] | None = None) -> dict[str, Any]:
    """Merge every part under `parts_dir` into `out_dir` (artifacts, logs, report.json, report.md); return the report."""
    folders = find_parts(Path(parts_dir))
    out_dir = Path(out_dir)
    if any(out_dir.resolve() == f.resolve() for f in folders):
        raise AggregateError(f"the output folder {out_dir} is one of the parts: aggregate into another folder")
    parts = [_read_part(f) for f in folders]
    out_dir.mkdir(parents=True, exist_ok=True)
    for folder, part in zip(folders, parts):
        for target in part["targets"]:
            _copy_target(folder, target, out_dir)
    report = merge_reports(parts, expected=expected, names=[f.name for f in folders])
    write_report(report, out_dir)
    return report

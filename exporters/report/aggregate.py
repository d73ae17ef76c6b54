"""Merge the report parts of a split run (one matrix leg per target) into one output folder and one report.

A part is what one run wrote to its output folder: `report.json`, `report.md`, `<target>/` and `logs/<target>.log`.
A part is data from another machine, not evidence: the parts of one export must come from the plan's model commit
and recipe (and agree on the weights), name only the plan's targets, and a target's verdict counts only as far as
the checks it records back it (derived again here by validation's own rules); artifacts are checked against the
files, sizes and sha256 their part recorded (an interrupted artifact upload or download shows up as a failed target).
Targets the recipe lists but no part reports (a leg that died before writing its report) are reported as failed,
so a partial set of exports is never published as complete.

A leg's runtime proofs ("runs in") are claims too: each is kept, as data (`runtime`, `status`, `detail` and nothing
else), only when it names a runtime whose check applies to the planned target in the merged folder (`runtimes`, from
the registered checks' `applies`); any other claim is dropped with a finding, and a failed proof fails the target as
it does in a run. Nothing a leg wrote becomes code: the card's snippets come from our own templates
(`exporters.publish.snippets`).

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
from typing import Any, Callable, Collection

from exporters import fsutil
from exporters.errors import AggregateError
from exporters.hashing import sha256_file
from exporters.recipe.model import TARGET_NAME_PATTERN
from exporters.report.build import write_report
from exporters.report.results import Check, ComponentReport, GenerationReport, OutputDiff, ValidationResult
from exporters.status import FAILED, PASSED, UNVERIFIED, judge_token_count, overall_status

_RANK = {FAILED: 0, UNVERIFIED: 1, PASSED: 2}
PROOF_STATUSES = (PASSED, FAILED, UNVERIFIED, "declined")  # exporters.layouts.child.ProofStatus
# The command a run records to reproduce a target (exporters.run.pipeline); a leg's other text is not kept as one
REPRODUCE = r"hf-export run [\w.@/-]+ --target {name}( --revision [0-9a-f]{{40}})?( --config [\w./-]+)?"
# (target name, its merged folder) -> the runtimes whose proof applies to the planned target there
RuntimePlan = Callable[[str, Path], Collection[str]]
_UNCHECKED = object()  # merge_reports' revision / recipe_sha256 when the caller has no plan to check against


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


def _check_plan(parts: list[dict[str, Any]], names: list[str], expected: list[str | dict[str, Any]] | None,
                revision: Any, recipe_sha256: Any) -> None:
    """Refuse parts the plan does not account for: another commit or recipe, or a target it does not list."""
    plan = {"revision": revision, "recipe_sha256": recipe_sha256}
    for label, part in zip(names, parts):
        identity = _identity(part)
        for key, value in plan.items():
            if value is not _UNCHECKED and identity[key] != value:
                raise AggregateError(
                    f"the report part {label} has {key} {identity[key]!r}, the plan's is {value!r}: every leg must "
                    "export the planned commit with the planned recipe (pass list-targets' 'revision' output to "
                    "every leg); a part from another run is not merged")
        if expected is not None:
            order = [e if isinstance(e, str) else e["name"] for e in expected]
            stray = [t["name"] for t in part["targets"] if t["name"] not in order]
            if stray:
                raise AggregateError(f"the report part {label} has target(s) {stray}, which the plan does not list "
                                     f"({order}): only the recipe's planned targets are merged")


def merge_reports(parts: list[dict[str, Any]], *, expected: list[str | dict[str, Any]] | None = None,
                  names: list[str] | None = None, revision: Any = _UNCHECKED,
                  recipe_sha256: Any = _UNCHECKED) -> dict[str, Any]:
    """One report from the reports of a split run.

    `expected` lists the plan's targets (names, or dicts with `name`, `export_format`, `mode`, `device`) in recipe
    order: targets no part has are added as failed, a part with any other target is refused, and the merged targets
    follow that order. `revision` and `recipe_sha256`, when given, are the plan's: a part that exported another
    commit (None: a local folder) or another recipe is refused. `names` labels the parts (e.g. the legs' artifact
    names) in `aggregated_from`.
    """
    if not parts:
        raise AggregateError("nothing to merge: no report parts")
    names = names or [f"part-{i}" for i in range(len(parts))]
    _check_plan(parts, names, expected, revision, recipe_sha256)
    identities = [_identity(p) for p in parts]
    order = [e if isinstance(e, str) else e["name"] for e in (expected or [])]
    for key in ("model", "revision", "weights_sha256", "recipe_sha256"):
        values = {str(i[key]) for i in identities}
        if len(values) > 1:
            raise AggregateError(
                f"the report parts disagree on {key}: {sorted(values)}; every leg must export the same model commit "
                "with the same recipe (pin the revision: pass list-targets' 'revision' output to every leg)"
            )
    merged = copy.deepcopy(parts[0])
    targets: dict[str, dict[str, Any]] = {}
    for label, part in zip(names, parts):
        for target in part["targets"]:
            if target["name"] in targets:
                raise AggregateError(f"target '{target['name']}' is in two report parts (also in {label}): run each "
                                     "target in one leg only")
            targets[target["name"]] = copy.deepcopy(target)
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


def _token_count(claim: dict[str, Any]) -> dict[str, Any]:
    """A leg's proof's token count (`compared` of `asked`, `ended`) where it is well formed, else nothing.

    Example:
        >>> _token_count({"compared": 1, "asked": 8, "ended": "eos"}), _token_count({"compared": True, "asked": 8})
        ({'compared': 1, 'asked': 8, 'ended': 'eos'}, {})
    """
    compared, asked, ended = claim.get("compared"), claim.get("asked"), claim.get("ended")
    if not all(type(n) is int and n >= 0 for n in (compared, asked)) or compared > asked:
        return {}
    return {"compared": compared, "asked": asked, **({"ended": ended} if isinstance(ended, str) else {})}


def back_runtime_claims(target: dict[str, Any], possible: Collection[str]) -> str | None:
    """Keep the target's runtime proofs that name a runtime in `possible` (those whose check applies to the planned
    target), with a known status and a text detail, as `{runtime, status, detail}` (one per runtime, with its token
    count where well formed: a pass over too few tokens is judged as ours, `judge_token_count`); drop the
    others. Returns a finding when something was dropped (the leg's own text is not quoted in it).

    Example:
        >>> target = {"name": "onnx", "runtimes": [{"runtime": "ONNX Runtime GenAI", "status": "passed", "x": 1},
        ...                                       {"runtime": "![x](https://evil.example)", "status": "passed"}]}
        >>> back_runtime_claims(target, ["ONNX Runtime GenAI"])[:49]
        "'onnx': 1 of the leg's 2 runtime proof(s) dropped"
        >>> target["runtimes"]
        [{'runtime': 'ONNX Runtime GenAI', 'status': 'passed', 'detail': ''}]
    """
    claims = target.get("runtimes")
    claims = claims if isinstance(claims, list) else [claims] if claims else []
    kept: dict[str, dict[str, Any]] = {}
    for claim in claims:
        claim = claim if isinstance(claim, dict) else {}
        runtime, status, detail = claim.get("runtime"), claim.get("status"), claim.get("detail") or ""
        if (isinstance(runtime, str) and runtime in possible and runtime not in kept and status in PROOF_STATUSES
                and isinstance(detail, str)):
            kept[runtime] = {"runtime": runtime, "status": status, "detail": detail, **_token_count(claim)}
            # a leg's pass over too few tokens is judged here as our own proofs are (never a plain pass)
            kept[runtime]["status"], kept[runtime]["detail"] = judge_token_count(
                status, detail, kept[runtime].get("compared"), kept[runtime].get("asked"), kept[runtime].get("ended"))
    target["runtimes"] = list(kept.values())
    dropped = len(claims) - len(kept)
    if not dropped:
        return None
    return (f"{target['name']!r}: {dropped} of the leg's {len(claims)} runtime proof(s) dropped: only a proof of a "
            f"runtime whose check applies to the planned target's layout ({', '.join(sorted(possible)) or 'none'}), "
            "once, with a status passed, failed or unverified, is merged (a leg's report is data from another "
            "machine)")


def _copy_target(part: Path, target: dict[str, Any], out_dir: Path, runtimes: RuntimePlan | None = None) -> str | None:
    """Copy a target's folder and log into `out_dir`, failing the target when its files are not as recorded; keep
    only the runtime proofs `runtimes` says apply to it. Returns a finding about dropped proofs, if any."""
    name = target["name"]
    source, destination = part / name, out_dir / name
    fsutil.remove(destination)
    links = [p for p in source.rglob("*") if p.is_symlink()] if source.is_dir() else []
    if source.is_symlink() or links:
        target["status"] = FAILED
        target["error"] = {"type": "ArtifactMismatch",
                           "message": f"the part's {name}/ holds links ({[str(p) for p in links[:3]] or str(source)}): "
                                      "artifacts are plain files; links are not followed or copied"}
        return back_runtime_claims(target, ())
    if source.is_dir():
        shutil.copytree(source, destination, symlinks=True)
    log = part / "logs" / f"{name}.log"
    if log.is_file() and not log.is_symlink():
        fsutil.real_dir(out_dir / "logs")
        fsutil.remove(out_dir / "logs" / log.name)
        shutil.copyfile(log, out_dir / "logs" / log.name)
    possible = runtimes(name, destination) if runtimes is not None and destination.is_dir() else ()
    finding = back_runtime_claims(target, possible)
    if not re.fullmatch(REPRODUCE.format(name=re.escape(name)), str(target.get("reproduce"))):
        target["reproduce"] = None  # report.md shows it as a command to copy: only the one a run writes
    if target.get("status") in (PASSED, UNVERIFIED):
        _check_verdict_and_files(target, out_dir)
    return finding


def _check_verdict_and_files(target: dict[str, Any], out_dir: Path) -> None:
    """Fail a passed or unverified target whose recorded checks do not back its verdict, or whose files are not
    the ones its part lists."""
    name = target["name"]
    destination = out_dir / name
    claimed, shown = target["status"], _verdict_shown(target)
    if _RANK[shown] < _RANK[claimed]:
        target["status"] = FAILED
        target["error"] = {"type": "UnbackedVerdict",
                           "message": f"the part says {name!r} is {claimed}, but the checks it records show {shown} "
                                      "(a check or runtime proof that did not run, failed or is missing): a leg's "
                                      "verdict counts only as far as the checks that ran back it; export the target "
                                      "again"}
        return
    problems = []
    listed = {entry.get("path") for entry in target.get("files") or [] if isinstance(entry, dict)}
    on_disk = {p.relative_to(out_dir).as_posix() for p in destination.rglob("*") if p.is_file()} \
        if destination.is_dir() else set()
    for entry in target.get("files") or []:
        relative = str(entry.get("path")) if isinstance(entry, dict) else ""
        path = out_dir / relative
        if not relative.startswith(f"{name}/") or ".." in Path(relative).parts:
            problems.append(f"{relative!r} is not a file of {name}/")
        elif not path.is_file():
            problems.append(f"{relative} is missing")
        elif path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            problems.append(f"{relative} differs from what the export wrote (size or sha256)")
    problems += [f"{extra} is not listed in the part's report" for extra in sorted(on_disk - listed)]
    if not target.get("files"):
        problems.append(f"the part lists no files for {name}/")
    if problems:
        target["status"] = FAILED
        target["error"] = {"type": "ArtifactMismatch",
                           "message": "the artifacts are not the ones the leg's report lists (did they survive the "
                                      "transfer between jobs?): " + "; ".join(problems[:5])
                                      + (" …" if len(problems) > 5 else "")}


def _fields(cls: type, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    return {key: value for key, value in data.items() if key in cls.__dataclass_fields__}


def _verdict_shown(target: dict[str, Any]) -> str:
    """The verdict a target's recorded checks back, derived again by the rules validation uses (components, each
    check's outputs, generation parity for generation targets, the quality budget): `failed` for a record that
    cannot be read back. A leg's report is data from another machine; its `status` is only its claim."""
    try:
        components = [
            ComponentReport(str(c["name"]), [
                Check(**{**_fields(Check, check), "outputs": [OutputDiff(**_fields(OutputDiff, o))
                                                              for o in check.get("outputs") or []]})
                for check in c.get("checks") or []])
            for c in target.get("components") or []]
        generation = target.get("generation")
        validation = ValidationResult(
            components, GenerationReport(**_fields(GenerationReport, generation)) if generation else None, [], [],
            generation_expected=target.get("mode") == "generation", quality=target.get("quality"),
            runtimes=list(target.get("runtimes") or []))
        verdict = validation.verdict
    except (KeyError, TypeError, ValueError, AttributeError):
        return FAILED
    if target.get("error"):
        return FAILED
    missing = set(target.get("expected_components") or []) - {c.name for c in components}
    return UNVERIFIED if missing and verdict == PASSED else verdict


def aggregate(parts_dir: Path, out_dir: Path, *, expected: list[str | dict[str, Any]] | None = None,
              revision: Any = _UNCHECKED, recipe_sha256: Any = _UNCHECKED,
              runtimes: RuntimePlan | None = None) -> dict[str, Any]:
    """Merge every part under `parts_dir` into `out_dir` (artifacts, logs, report.json, report.md); return the report.

    With the plan (`expected` targets, the `revision` every leg exported, the recipe's `recipe_sha256`), a part
    the plan does not account for is refused before anything is copied. Each passed or unverified target counts only
    as far as the checks its part records back it, and only with exactly the files its part lists, each of the
    recorded size and sha256; otherwise it is merged as failed. A runtime proof is kept only where `runtimes`
    (target name, merged folder -> the runtimes whose check applies to the planned target there; the front door
    builds it from the recipe and the registered checks) names its runtime; without it, every runtime proof is
    dropped. Each drop is a finding.
    """
    folders = find_parts(Path(parts_dir))
    out_dir = Path(out_dir)
    if any(out_dir.resolve() == f.resolve() for f in folders):
        raise AggregateError(f"the output folder {out_dir} is one of the parts: aggregate into another folder")
    parts = [_read_part(f) for f in folders]
    _check_plan(parts, [f.name for f in folders], expected, revision, recipe_sha256)
    out_dir.mkdir(parents=True, exist_ok=True)
    dropped = [finding for folder, part in zip(folders, parts) for target in part["targets"]
               if (finding := _copy_target(folder, target, out_dir, runtimes)) is not None]
    report = merge_reports(parts, expected=expected, names=[f.name for f in folders], revision=revision,
                           recipe_sha256=recipe_sha256)
    report["findings"] += dropped
    write_report(report, out_dir)
    return report

"""The plan: which files a publish would push, read from the run's output folder alone (no network).

A run's `OUT/report.json` decides the kind of thread: a pull request with the artifacts of every target that passed
(`exports` kind), or, when a target did not pass, a discussion with the report (`failure` kind). A target that is
`unverified` (some check did not run) counts like a failed one unless the run opts in (`publish_unverified`).

Then [`merge_plan`] folds in what the Hub already holds at the ref the commit goes on (the open PR, else the base
branch), keyed by target: targets this run did not cover but the recipe still lists are kept (a run of some targets
updates only its targets), a target's stale files are deleted only when this run replaced the target or the recipe
dropped it, and nothing outside this recipe's own targets is ever touched (another recipe file's artifacts stay).

Example:
    >>> report_paths("repo"), report_paths("edge.json")
    (('exports/report.json', 'exports/report.md'), ('exports/report.edge.json', 'exports/report.edge.md'))
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from exporters.errors import PublishError
from exporters.files import EXPORTS_DIR, RECIPE_SOURCES
from exporters.hashing import sha256_file
from exporters.status import PASSED, UNVERIFIED, overall_status

KIND_EXPORTS, KIND_FAILURE = "exports", "failure"
MARKER_VERSION = 1
REQUIRED_KEYS = ("status", "targets", "recipe", "versions", "source")


@dataclass
class PlannedFile:
    """One file of the commit: where it goes (`path_in_repo`), and where its bytes come from: a `local` file, or
    generated `data` (a merged report)."""

    path_in_repo: str
    size: int
    local: Path | None = None
    sha256: str | None = None
    note: str = ""
    target: str | None = None
    data: bytes | None = None


@dataclass
class PublishPlan:
    """What a publish would push. Plain data: the texts (title, description, card) are rendered by `texts`.

    Example:
        >>> plan = plan_publish("org/model", Path("out"))  # doctest: +SKIP
        >>> plan.kind, plan.published, plan.upload_bytes  # doctest: +SKIP
        ('exports', ['onnx'], 1234567)
    """

    repo_id: str
    kind: str  # KIND_EXPORTS (a pull request) or KIND_FAILURE (a discussion)
    base: str
    report: dict[str, Any]
    markdown: str
    published: list[str]
    failed: list[str]
    files: list[PlannedFile]
    marker: dict[str, Any]
    unverified: list[str] = field(default_factory=list)  # published although some check did not run (opted in)
    carried: list[str] = field(default_factory=list)  # kept from what the Hub holds (not part of this run)
    deletions: list[str] = field(default_factory=list)

    @property
    def is_pull_request(self) -> bool:
        return self.kind == KIND_EXPORTS

    @property
    def recipe(self) -> str:
        return str(self.marker.get("recipe"))

    @property
    def source_sha(self) -> str | None:
        return self.marker.get("source_sha")

    @property
    def upload_bytes(self) -> int:
        """Bytes this run uploads (its own files; carried targets are already on the Hub)."""
        return sum(f.size for f in self.files if f.local is not None or f.data is not None)

    def target_bytes(self) -> dict[str, int]:
        """Bytes uploaded per published target, in publishing order."""
        sizes = {name: 0 for name in self.published if name not in self.carried}
        for planned in self.files:
            if planned.target in sizes:
                sizes[planned.target] += planned.size
        return sizes

    def targets(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The report entries of `names` (default: the published targets), in report order."""
        wanted = set(self.published if names is None else names)
        return [t for t in self.report["targets"] if t["name"] in wanted]


def recipe_identity(report: dict[str, Any]) -> str:
    """`repo` for the model's own recipe, else the recipe file's name (its own PR slot)."""
    name = str(report["recipe"].get("file") or "")
    return "repo" if name in RECIPE_SOURCES else name


def report_paths(recipe: str) -> tuple[str, str]:
    """Where a slot's report.json and report.md go in the repo (one pair per recipe file, so two recipes publishing
    to one repo do not overwrite each other's reports)."""
    if recipe == "repo":
        return f"{EXPORTS_DIR}/report.json", f"{EXPORTS_DIR}/report.md"
    stem = PurePosixPath(recipe).stem
    return f"{EXPORTS_DIR}/report.{stem}.json", f"{EXPORTS_DIR}/report.{stem}.md"


def load_report(out_dir: Path) -> tuple[dict[str, Any], str]:
    """`OUT/report.json` and `OUT/report.md`, as a run wrote them."""
    out_dir = Path(out_dir)
    try:
        report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
        markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise PublishError(f"{err.filename} is missing: run the export first (its output folder is {out_dir})",
                           retryable=False) from None
    except ValueError as err:
        raise PublishError(f"{out_dir / 'report.json'} is not valid JSON ({err}): run the export again",
                           retryable=False) from None
    missing = [key for key in REQUIRED_KEYS if not isinstance(report, dict) or key not in report]
    if missing:
        raise PublishError(f"{out_dir / 'report.json'} has no {missing[0]!r}: it was not written by an export run",
                           retryable=False)
    return report, markdown


def _target_files(report: dict[str, Any], out_dir: Path, name: str) -> list[PlannedFile]:
    target = next(t for t in report["targets"] if t["name"] == name)
    files = []
    for entry in target.get("files") or []:
        relative = PurePosixPath(Path(entry["path"]).as_posix())
        if relative.parts[:1] != (name,) or ".." in relative.parts:
            raise PublishError(f"report.json lists {entry['path']!r} for target {name!r}: run the export again",
                               retryable=False)
        local = out_dir / Path(*relative.parts)
        # The bytes, not the size: a file changed after validation (same size, mtime put back) is not published.
        if (local.is_symlink() or not local.is_file() or local.stat().st_size != entry.get("size")
                or not isinstance(entry.get("sha256"), str) or sha256_file(local) != entry["sha256"]):
            raise PublishError(f"{local} is missing or changed since it was validated (its size or sha256 differs "
                               "from report.json): run the export again before publishing", retryable=False)
        files.append(PlannedFile(f"{EXPORTS_DIR}/{relative}", entry["size"], local, entry.get("sha256"),
                                 target=name))
    if not files:
        raise PublishError(f"target {name!r} passed but report.json lists no files for it: run the export again",
                           retryable=False)
    return files


def plan_publish(repo_id: str, out_dir: Path, *, publish_failed: bool = False, publish_unverified: bool = False,
                 revision: str = "main") -> PublishPlan:
    """The plan for publishing `out_dir`'s run to `repo_id` (a PR against the branch `revision`), from the report
    alone: nothing is sent.

    Example:
        >>> plan = plan_publish("org/model", Path("out"))  # doctest: +SKIP
        >>> [f.path_in_repo for f in plan.files][:2]  # doctest: +SKIP
        ['exports/dynamo/config.json', 'exports/dynamo/decode.pt2']
    """
    out_dir = Path(out_dir)
    report, markdown = load_report(out_dir)
    statuses = {t["name"]: t["status"] for t in report["targets"]}
    passing = [n for n, s in statuses.items() if s == PASSED or (s == UNVERIFIED and publish_unverified)]
    failed = [n for n in statuses if n not in passing]
    as_pr = bool(passing) and (not failed or publish_failed)
    published = passing if as_pr else []
    files: list[PlannedFile] = []
    for name in published:
        files += _target_files(report, out_dir, name)
    recipe = recipe_identity(report)
    if as_pr:
        for local, path in zip((out_dir / "report.json", out_dir / "report.md"), report_paths(recipe)):
            files.append(PlannedFile(path, local.stat().st_size, local, note="validation report"))
    kind = KIND_EXPORTS if as_pr else KIND_FAILURE
    unverified = [n for n in published if statuses[n] == UNVERIFIED]
    marker = {
        "v": MARKER_VERSION, "kind": kind, "recipe": recipe, "base": revision,
        "source_sha": report["source"].get("revision"), "weights_sha256": report["source"].get("weights_sha256"),
        "recipe_sha256": report["recipe"].get("sha256"), "versions": report["versions"],
        "cache_keys": {t["name"]: t.get("cache_key") for t in report["targets"]},
        "published": published, "failed": failed, "unverified": unverified,
    }
    return PublishPlan(repo_id=repo_id, kind=kind, base=revision, report=report, markdown=markdown,
                       published=published, failed=failed, files=files, marker=marker, unverified=unverified)


@dataclass(frozen=True)
class Held:
    """What the Hub holds at the ref a commit goes on: every file path there, and the slot's report (None when the
    slot never published there)."""

    files: tuple[str, ...] = ()
    report: dict[str, Any] | None = None


def _target_of(path: str) -> str | None:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == EXPORTS_DIR else None


def merge_plan(plan: PublishPlan, held: Held, render: Any = None) -> PublishPlan:
    """`plan` merged with what the Hub holds, keyed by target (pure: no network).

    Kept (`carried`): targets the held report published that this run did not cover and the recipe still lists,
    when their files are still there. Deleted: files under `exports/<target>/` of a target this run covered that it
    does not push again, and of a target the held report listed but the recipe no longer does. Nothing else.
    `render(report) -> str` renders the merged report.md (needed only when targets are carried).

    Example:
        >>> plan = PublishPlan("o/m", KIND_EXPORTS, "main", {"targets": [{"name": "a", "status": "passed"}],
        ...                    "recipe": {"targets": ["a", "b"]}}, "", ["a"], [],
        ...                    [PlannedFile("exports/a/x.onnx", 1, target="a")], {"cache_keys": {}, "published": ["a"]})
        >>> held = Held(("exports/a/old.onnx", "exports/b/y.onnx", "exports/c/z.onnx"),
        ...             {"targets": [{"name": "b", "status": "passed", "files": [{"path": "b/y.onnx"}]}]})
        >>> merged = merge_plan(plan, held, render=lambda report: "")
        >>> merged.carried, merged.deletions, merged.published
        (['b'], ['exports/a/old.onnx'], ['a', 'b'])
    """
    if not plan.is_pull_request:
        return plan
    covered = {t["name"] for t in plan.report["targets"]}
    recipe_targets = set(plan.report["recipe"].get("targets") or covered)
    present = set(held.files)
    previous = [t for t in (held.report or {}).get("targets") or [] if isinstance(t, dict) and t.get("name")]
    carried = [t for t in previous
               if t["name"] not in covered and t["name"] in recipe_targets and t["name"] in _published_in(held.report)
               and all(f"{EXPORTS_DIR}/{f['path']}" in present for f in t.get("files") or [])]
    dropped = {t["name"] for t in previous if t["name"] not in recipe_targets}
    keep = {f.path_in_repo for f in plan.files}
    deletions = sorted(p for p in present if p not in keep and (_target_of(p) in covered or _target_of(p) in dropped))
    if not carried:
        return replace(plan, deletions=deletions)
    report = copy.deepcopy(plan.report)
    held_source = ((held.report or {}).get("source") or {}).get("revision")
    for target in carried:
        report["targets"].append({**copy.deepcopy(target), "carried_from": held_source})
    report["status"] = overall_status([t["status"] for t in report["targets"]])
    names = [t["name"] for t in carried]
    marker = copy.deepcopy(plan.marker)
    marker["published"] = plan.published + names
    marker["cache_keys"].update({t["name"]: t.get("cache_key") for t in carried})
    markdown = render(report) if render is not None else plan.markdown
    files = [f for f in plan.files if f.note != "validation report"]
    json_path, md_path = report_paths(plan.recipe)
    for path, text in ((json_path, json.dumps(report, indent=2, default=str) + "\n"), (md_path, markdown)):
        data = text.encode("utf-8")
        files.append(PlannedFile(path, len(data), data=data, note="validation report (merged)"))
    return replace(plan, report=report, markdown=markdown, files=files, marker=marker, carried=names,
                   published=plan.published + names, deletions=deletions)


def _published_in(report: dict[str, Any] | None) -> set[str]:
    """Targets a held report published: passed, or unverified when that run opted in (its files are there)."""
    return {t["name"] for t in (report or {}).get("targets") or [] if isinstance(t, dict)
            and t.get("status") in (PASSED, UNVERIFIED) and t.get("files")}

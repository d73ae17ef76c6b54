"""The Action's entrypoint (`python -m action`): settings in, library calls, runner-facing output out.

Four modes:

- `run` (default): `exporters.run.pipeline.run_pipeline` on the model, then the Hub PR (`exporters.publish`), the job
  summary, the step outputs and one sticky PR comment.
- `list-targets`: the recipe's target names as the `targets` output (a JSON list for `strategy.matrix`), split by
  runner as `cpu-targets` / `gpu-targets` (targets whose device is `cuda`), plus `matrix` (each target's format and
  device) and `revision` (the resolved commit, to pin every leg to).
- `aggregate`: `exporters.report.aggregate.aggregate` merges the legs' output folders, then the same Hub PR, summary,
  outputs and comment as `run`.
- `init`: `exporters.init` proposes a recipe for a model that has none (`action/init_mode.py`): the recipe in the
  output folder, the summary table in the job summary, and with `open-pr` the Hub PR that adds it.

Every decision about recipes, exports, validation, reports and publishing (where to publish included) is the
library's; this module only turns inputs into calls and results into workflow commands, outputs, a summary and a
comment. Everything printed that came from upstream, the model's code, logs or the Hub is printed inside
`commands.untrusted()`, so no workflow command inside it is obeyed.

Exit codes: 0 success (or `fail-on-error: false`), 1 a target or the publishing failed, 2 a bad input, recipe or
model.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from exporters.errors import (AggregateError, DeviceError, ExportActionError, MemoryPlanError, ModelSourceError,
                               PublishError, RecipeError, RemoteCodeError)
from exporters.publish import PublishOptions, check_publish_access, publish_report
from exporters.publish.problem import problem_from_error
from exporters.quiet import mute_import_chatter, no_progress_bars
from exporters.report.aggregate import aggregate
from exporters.report.build import ICONS

from .commands import add_mask, emit, error, group, set_outputs, untrusted, write_summary
from .init_mode import init_mode
from .outcome import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    OPTION_NAMES,
    NoPublish,
    comment,
    fail,
    relative,
    worded,
)
from .settings import Settings, SettingsError, read_input
from .summary import recipe_url, run_markdown, targets_markdown
from .visibility import model_visibility

LOG_TAIL_CHARS = 20_000
REPORT_OUTPUT_LIMIT = 512 * 1024  # bytes of report-json; step outputs share a 1 MiB budget per job
PR_OPERATIONS = ("created", "updated", "unchanged", "superseded")  # the pr-operation output; else "none"
# ── Plumbing ──────────────────────────────────────────────────────────────────


def _quiet_libraries(settings: Settings) -> None:
    """Environment for the libraries (and the children they start); progress bars off in this process too."""
    mute_import_chatter()  # torchao's CUDA kernels, pytree's enums: as the CLI and the bot
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:  # a log has no use for bars, unless the workflow asks
        no_progress_bars()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if settings.hf_endpoint:
        os.environ["HF_ENDPOINT"] = settings.hf_endpoint
    import warnings

    warnings.filterwarnings("ignore")


def _report_json(report: dict[str, Any]) -> str:
    """The report for the `report-json` output: whole when small, else without logs and file lists."""
    text = json.dumps(report, separators=(",", ":"), default=str)
    if len(text.encode()) <= REPORT_OUTPUT_LIMIT:
        return text
    slim = json.loads(text)
    slim["truncated"] = "log excerpts, file lists and validation details removed; read the report-path file"
    for target in slim.get("targets", []):
        (target.get("error") or {}).pop("log_excerpt", None)
        target.pop("files", None)
        for component in target.get("components") or []:
            component.pop("checks", None)
    text = json.dumps(slim, separators=(",", ":"), default=str)
    if len(text.encode()) <= REPORT_OUTPUT_LIMIT:
        return text
    keep = ("schema_version", "status", "source", "recipe", "versions", "truncated")
    return json.dumps({**{k: slim.get(k) for k in keep},
                       "targets": [{"name": t["name"], "status": t["status"]} for t in slim.get("targets", [])]},
                      separators=(",", ":"), default=str)


def _recipe_failure(settings: Settings, err) -> int:
    file = relative(settings, err.file)
    name = Path(err.file).name if err.file else "recipe"
    located = []
    for problem in err.problems:
        path, line = problem.path, problem.line
        message = ExportActionError(problem.message).worded(OPTION_NAMES)
        where = f"{path}: " if path and path != "$" else ""
        if file is None:  # a Hub repo's recipe: no file in this repository to point at
            located.append((None, None, f"{settings.model}/{name}" + (f" line {line}" if line else "") +
                            f": {where}{message}"))
        else:
            located.append((file, line, f"{where}{message}"))
    return fail(settings, "Invalid export recipe", located, problem=problem_from_error(err),
                 file_url=recipe_url(settings, file, name))


# ── Mode: run ─────────────────────────────────────────────────────────────────


def _show_targets(settings: Settings, report: dict[str, Any], out_dir: Path) -> None:
    """One log group per target (verdict, error, files, its export log), and an error annotation per failure."""
    for target in report.get("targets", []):
        name, status = target["name"], target["status"]
        cached = " (cached)" if target.get("cached") else ""
        err = target.get("error") or {}
        with group(f"{ICONS.get(status, '')} {name}: {target.get('export_format')}, {target.get('mode')} mode — "
                   f"{status}{cached}"), untrusted():
            if err:
                emit(f"{err.get('type')}: {err.get('message')}")
            for key, value in (target.get("timings") or {}).items():
                emit(f"{key}: {value}")
            for entry in target.get("files") or []:
                emit(f"{entry['path']}  {entry['size']} B  sha256 {entry['sha256']}")
            for finding in target.get("findings") or []:
                emit(f"finding: {finding}")
            if target.get("reproduce") and status != "passed":
                emit(f"reproduce: {target['reproduce']}")
            log = out_dir / "logs" / f"{name}.log"
            if log.is_file():
                text = log.read_text(errors="replace")
                if text.strip():
                    emit(f"── {log.relative_to(out_dir)} " + ("(last part)" if len(text) > LOG_TAIL_CHARS else ""))
                    sys.stdout.write(text[-LOG_TAIL_CHARS:].rstrip("\n") + "\n")
                    sys.stdout.flush()
        if status != "passed":
            message = str(err.get("message") or "see the target's log group")
            error(f"{err.get('type') or 'Error'}: {message}", title=f"Export target '{name}' {status}")


def _publish(settings: Settings, out_dir: Path):
    if not settings.open_pr:
        return None
    destination = settings.destination
    if destination is None:
        what = ("a folder in the workspace" if settings.model_path is not None
                else "not a Hub repo id with a namespace (org/name)")
        return NoPublish(message=f"`{settings.model}` is {what}: there is no repo to open a PR on "
                                 "(set open-pr: false to silence this)")
    repo_id = destination.repo_id
    try:
        with group(f"Publishing to the Hub: {repo_id} (PR against {destination.base})"), untrusted():
            result = publish_report(repo_id, out_dir, token=settings.hf_token, endpoint=settings.hf_endpoint,
                                    options=PublishOptions(dry_run=settings.dry_run, revision=destination.base,
                                                           publish_unverified=settings.publish_unverified,
                                                           max_upload_bytes=settings.max_upload_bytes))
            url = result.pr_url or result.discussion_url
            emit(f"Hub PR: {result.operation}" + (f" {url}" if url else "") +
                 (f" — {result.message}" if result.message else ""))
    except Exception as err:
        message = worded(err) if isinstance(err, PublishError) else f"{type(err).__name__}: {err}"
        error(message, title=f"Publishing to {repo_id} failed")
        return NoPublish(message=f"publishing failed: {message}", failed=True)
    return result


def _check_publish_access(settings: Settings) -> str | None:
    """Before a long export: can the token publish to the repo? The problem, or None (also when not publishing)."""
    if not settings.open_pr or settings.dry_run or settings.hub_repo_id is None:
        return None
    try:
        account = check_publish_access(settings.hub_repo_id, token=settings.hf_token, endpoint=settings.hf_endpoint)
    except PublishError as err:
        return f"{worded(err)} (or set open-pr: false / dry-run: true to export without publishing)"
    emit(f"Publishing as {account} to {settings.hub_repo_id}")
    return None


def _finish(settings: Settings, report: dict[str, Any], extra: list[str] | None = None) -> int:
    """After a run or an aggregation: per-target groups, Hub PR, summary, outputs, comment, exit code."""
    out_dir = settings.output_dir
    _show_targets(settings, report, out_dir)
    publish = _publish(settings, out_dir)
    report_md = (out_dir / "report.md").read_text(encoding="utf-8")
    markdown = run_markdown(report, report_md, publish, run_url=settings.github.run_url, dry_run=settings.dry_run,
                            extra=extra)
    write_summary(settings.github.summary_file, run_markdown(
        report, report_md, publish, run_url=settings.github.run_url, dry_run=settings.dry_run, extra=extra,
        collapse_report=False))
    operation = publish.operation if publish is not None else "none"
    set_outputs(settings.github.output_file, {
        "status": report["status"],
        "report-path": relative(settings, out_dir / "report.json") or str(out_dir / "report.json"),
        "pr-url": (getattr(publish, "pr_url", None) or "") if operation in PR_OPERATIONS else "",
        "pr-operation": operation if operation in PR_OPERATIONS else "none",
        "discussion-url": getattr(publish, "discussion_url", None) or "",
        "targets": json.dumps([t["name"] for t in report.get("targets", [])]),
        "report-json": _report_json(report),
        "model-visibility": model_visibility(settings),  # output-dir holds the weights: upload it only when public
    })
    comment(settings, markdown)
    failed = report["status"] != "passed" or bool(getattr(publish, "failed", False))
    if failed and settings.fail_on_error:
        return EXIT_FAILED
    return EXIT_OK


def run_mode(settings: Settings) -> int:
    from exporters.run.pipeline import RunOptions, run_pipeline  # loads torch and the exporters: not for list-targets

    options = RunOptions(
        out_dir=settings.output_dir, targets=list(settings.targets), config_path=settings.config,
        device=settings.device, revision=settings.revision, token=settings.hf_token, endpoint=settings.hf_endpoint,
        trust_remote_code=settings.trust_remote_code, progress=False, jobs=settings.jobs, bench=settings.benchmark,
    )
    label = ", ".join(settings.targets) if settings.targets else "every target"
    failure = _check_publish_access(settings)
    if failure is not None:
        return fail(settings, "Cannot publish to the Hub", [(None, None, failure)])
    with group(f"Exporting {settings.model} ({label})"), untrusted():
        try:
            report = run_pipeline(settings.model_arg, options)
        except RecipeError as err:
            failure = err
        except RemoteCodeError as err:
            failure = ("Remote code refused", err)
        except (ModelSourceError, DeviceError) as err:
            failure = ("Cannot load the model", err)
        except MemoryPlanError as err:
            failure = ("Not enough memory for this run", err)
    if isinstance(failure, RecipeError):
        return _recipe_failure(settings, failure)
    if failure is not None:
        title, err = failure
        return fail(settings, title, [(None, None, worded(err))], problem=problem_from_error(err))
    return _finish(settings, report)


# ── Mode: list-targets ────────────────────────────────────────────────────────


def load_recipe(settings: Settings):
    """The recipe this run would use, read without downloading weights: `(recipe, file, resolved revision)`."""
    # both load transformers (the source's loader, the run's memory plan): only this mode needs them
    from exporters.capture.source import resolve_source
    from exporters.run.context import load_run_recipe

    model = str(settings.model_path) if settings.model_path is not None else settings.model
    source = resolve_source(model, revision=settings.revision, token=settings.hf_token,
                            endpoint=settings.hf_endpoint, recipe_only=True)
    recipe, file, _ = load_run_recipe(source.folder, settings.config)
    return recipe, file, source.revision


def list_targets_mode(settings: Settings) -> int:
    try:
        recipe, file, revision = load_recipe(settings)
        targets = recipe.select(settings.targets)
    except RecipeError as err:
        return _recipe_failure(settings, err)
    except ModelSourceError as err:
        return fail(settings, "Cannot read the model", [(None, None, worded(err))])
    rows = [{"name": t.name, "export_format": t.export_format, "mode": t.mode, "device": settings.device or t.device}
            for t in targets]  # the device input overrides the recipe's, in the plan as in the run
    names = [t.name for t in targets]
    emit(f"targets: {json.dumps(names)}" + (f" at {revision}" if revision else ""))
    write_summary(settings.github.summary_file, targets_markdown(settings.model, rows))
    set_outputs(settings.github.output_file, {
        "status": "passed",
        "targets": json.dumps(names),
        "cpu-targets": json.dumps([r["name"] for r in rows if r["device"] != "cuda"]),
        "gpu-targets": json.dumps([r["name"] for r in rows if r["device"] == "cuda"]),
        "matrix": json.dumps({"include": [{"target": r["name"], "format": r["export_format"], "device": r["device"]}
                                          for r in rows]}),
        "revision": revision or settings.revision or "",
        "model-visibility": model_visibility(settings),
    })
    return EXIT_OK


# ── Mode: aggregate ───────────────────────────────────────────────────────────


def aggregate_mode(settings: Settings) -> int:
    # the runtimes' checks load torch: only this mode needs them (`checks` registers each check with its `applies`)
    from exporters.validate import checks  # noqa: F401
    from exporters.validate.runtimes import runtimes_applying

    # The plan the legs ran: the recipe's targets (or the `targets` input's, all of them recipe names), the commit
    # `revision` resolves to and the recipe's hash. A part that does not match it is not merged: a leg's report is
    # data from another machine.
    try:
        recipe, _, revision = load_recipe(settings)
        targets = recipe.select(settings.targets)
    except RecipeError as err:
        return _recipe_failure(settings, err)
    except ModelSourceError as err:
        return fail(settings, "Cannot read the recipe the legs ran", [(None, None, worded(err))])
    expected = [{"name": t.name, "export_format": t.export_format, "mode": t.mode, "device": settings.device or t.device}
                for t in targets]
    parts = relative(settings, settings.parts_dir) or str(settings.parts_dir)
    try:
        with group(f"Merging the report parts in {parts}"), untrusted():
            report = aggregate(settings.parts_dir, settings.output_dir, expected=expected, revision=revision,
                               recipe_sha256=recipe.sha256(), runtimes=runtimes_applying(targets))
            for part in report.get("aggregated_from", []):
                emit(f"{part['part']}: {', '.join(part['targets']) or 'no targets'}")
    except AggregateError as err:
        return fail(settings, "Cannot merge the report parts", [(None, None, str(err))])
    legs = len(report.get("aggregated_from", []))
    return _finish(settings, report, extra=[f"Merged from {legs} report part(s) in `{parts}`.", ""])


# ── Entry point ───────────────────────────────────────────────────────────────


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    for name in ("hf-token", "github-token"):  # before anything else is printed
        add_mask(read_input(env, name))
    add_mask(env.get("HF_TOKEN"))
    try:
        settings = Settings.from_env(env)
    except SettingsError as err:
        for name, message in err.problems:
            error(message, title=f"Invalid input '{name}'")
        set_outputs(Path(env["GITHUB_OUTPUT"]) if env.get("GITHUB_OUTPUT") else None,
                    {"status": "error", "pr-operation": "none"})
        return EXIT_USAGE
    _quiet_libraries(settings)
    try:
        if settings.mode == "list-targets":
            return list_targets_mode(settings)
        if settings.mode == "aggregate":
            return aggregate_mode(settings)
        if settings.mode == "init":
            return init_mode(settings)
        return run_mode(settings)
    except Exception as err:  # a bug or an unexpected environment: say so on the run's page, then the traceback
        error(f"{type(err).__name__}: {err}", title="export-action failed unexpectedly")
        traceback.print_exc()
        set_outputs(settings.github.output_file, {"status": "error", "pr-operation": "none"})
        return EXIT_FAILED

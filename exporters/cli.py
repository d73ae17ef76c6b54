"""`hf-export`: run a recipe, check a recipe, re-validate saved artifacts, propose a recipe (`init`).

Exit codes: 0 all good, 1 a target failed or is unverified (export or validation), 2 a bad recipe or usage (no repo
to publish to, an invalid repo id; a recipe, model, remote-code or device problem that stopped `run` before any export
is also in OUT/problem.json), 3 publishing failed (token, permissions, the Hub, a PR over the size limit; what
happened is in OUT/publish.json, with whether a retry may help).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from exporters import fsutil
from exporters.errors import (DeviceError, ExportActionError, InitError, MemoryPlanError, ModelSourceError,
                               PublishError, RecipeError, RemoteCodeError, error_record, first_line,
                               render_root_cause)
from exporters.publish import (PublishOptions, PublishResult, check_publish_access, publish_report, render_plan,
                                write_outcome)
from exporters.publish.destination import parse_size, publish_destination
from exporters.publish.problem import problem_from_error, write_problem
from exporters.recipe.load import load_recipe_file
from exporters.recipe.model import FORMATS
from exporters.recipe.model_limits import check_cache_len, positions_in
from exporters.report.build import summary_lines

from .quiet import exit_without_teardown, mute_import_chatter, no_progress_bars

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Export a model with its repo's recipe (export_config.json), validate every artifact, report.",
)
console = Console(stderr=True, soft_wrap=True)  # long lines stay whole (logs, CI, pipes)
mute_import_chatter()  # the stack's import chatter (torchao CUDA kernels, pytree enums): exporters/quiet.py
out = Console(soft_wrap=True)
# The stages that load torch (run, init, validate) are imported inside the commands that run them (a front door is
# the one place that defers imports of ours): `hf-export check`, `--help` and a bad flag answer without loading torch.

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PUBLISH = 0, 1, 2, 3
# How this front end spells the library's options in messages (tokens: the environment or a login, never argv).
OPTION_NAMES = {"trust_remote_code": "--trust-remote-code", "target": "--target", "config": "--config",
                "token": "HF_TOKEN (or `huggingface-cli login`)", "revision": "--revision", "repo_id": "--repo-id",
                "device": "--device", "max_upload_size": "--max-upload-size",
                "publish_unverified": "--publish-unverified", "jobs": "--jobs", "formats": "--formats"}


def _recipe_error(err: RecipeError) -> None:
    console.print(f"[bold red]recipe error[/] in {err.file or 'recipe'}:")
    for problem in err.problems:
        console.print(f"  {ExportActionError(problem.render()).worded(OPTION_NAMES)}", markup=False, highlight=False)


def _error(label: str, err: ExportActionError) -> None:
    console.print(f"[bold red]{label}:[/] {escape(err.worded(OPTION_NAMES))}", highlight=False)
    record = error_record(err)
    if first_line((record.get("root_cause") or {}).get("message") or str(err)) not in str(err):  # not said twice
        console.print(f"  {render_root_cause(record)}", markup=False, highlight=False)


def _version(value: bool) -> None:
    if value:
        from exporters.run.context import tool_versions  # loads torch, to read its version

        versions = tool_versions()
        out.print(f"hf-export {versions.pop('export-action')}", markup=False, highlight=False)
        for name, version in versions.items():
            out.print(f"  {name} {version}", markup=False, highlight=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the tool's and the stack's versions, then exit.")) -> None:
    """Export a model with its repo's recipe (export_config.json), validate every artifact, report."""


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import warnings

    warnings.filterwarnings("ignore")


def _print_summary(report: dict, out_dir: Path) -> None:
    for line in summary_lines(report, out_dir):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


# Where the model comes from (the library's SourceOptions): the same four options on every command that loads one.
REVISION_OPTION = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit).")
TOKEN_OPTION = typer.Option(None, "--token", envvar="HF_TOKEN", show_envvar=True,
                            help="Hub token; prefer HF_TOKEN or `huggingface-cli login` (argv is public).")
ENDPOINT_OPTION = typer.Option(None, "--endpoint", envvar="HF_ENDPOINT", help="Hub endpoint URL.")
def _flag(name: str, help: str) -> typer.models.OptionInfo:  # noqa: A002  (typer's own word)
    return typer.Option(False, name, help=help, metavar="")  # shown as `--push`, never `--push <bool>`


REMOTE_CODE_OPTION = _flag("--trust-remote-code", "Allow code from the model repo.")


@app.command()
def run(
    model: str = typer.Argument(..., help="A local model folder or a Hub repo id (org/name)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Recipe file (default: the model's own)."),
    target: list[str] = typer.Option([], "--target", help="Only this target (repeatable)."),
    out_dir: Path = typer.Option(Path("out"), "--out", help="Output folder."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda or auto: overrides the recipe."),
    revision: Optional[str] = REVISION_OPTION,
    token: Optional[str] = TOKEN_OPTION,
    endpoint: Optional[str] = ENDPOINT_OPTION,
    trust_remote_code: bool = REMOTE_CODE_OPTION,
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per target (default: recipe or 3600)."),
    jobs: str = typer.Option("auto", "--jobs", help="Exports at once: a number, or auto (from cores and memory)."),
    no_cache: bool = _flag("--no-cache", "Export even when inputs are unchanged (reuse neither an earlier run's "
                           "targets nor an export hf-export init checked)."),
    no_bench: bool = _flag("--no-bench", "Skip timing each artifact (size, load, latency)."),
    print_report: bool = _flag("--print-report", "Print report.md to stdout at the end."),
    quiet: bool = _flag("--quiet", "No progress display."),
    push: bool = _flag("--push", "Publish to the Hub as a pull request: exports/<target>/, the report, a card "
                                 "section."),
    dry_run: bool = _flag("--dry-run", "Print the publish plan and PR text; push nothing."),
    publish_failed: bool = _flag("--publish-failed", "With --push: publish the passing targets even when others "
                                                     "failed."),
    publish_unverified: bool = _flag("--publish-unverified", "With --push: also publish unverified targets (some "
                                     "check did not run); the PR and the model card name the checks that did not run."),
    max_upload_size: str = typer.Option(
        "20GB", "--max-upload-size", help="With --push: refuse a PR that uploads more than this (e.g. 50GB; 0: no "
                                          "limit)."
    ),
    repo_id: Optional[str] = typer.Option(
        None, "--repo-id", help="Hub repo to publish to (ORG/NAME); defaults to MODEL when it is a Hub repo id."
    ),
) -> None:
    """Export every target of the recipe, validate each artifact, write OUT/report.json and OUT/report.md;
    with --push, publish them to the Hub as a pull request (against --revision when it names a branch).

    Example: hf-export run ./my-model --out out --print-report (--dry-run: the PR it would open; --push: open it)
    """
    if device not in (None, "cpu", "cuda", "auto"):
        console.print(f"--device must be cpu, cuda or auto, got {device!r}")
        raise typer.Exit(EXIT_USAGE)
    if jobs != "auto" and (not jobs.isdigit() or int(jobs) < 1):
        console.print(f"--jobs must be a positive number or auto, got {jobs!r}", markup=False)
        raise typer.Exit(EXIT_USAGE)
    upload_limit = _upload_limit(max_upload_size)
    destination = _destination(model, repo_id, revision, push or dry_run)
    if quiet:
        no_progress_bars()
    if destination is not None and push and not dry_run:
        _check_publish_access(destination.repo_id, token, endpoint, out_dir)
    _quiet_libraries()
    from exporters.run.pipeline import RunOptions, run_pipeline  # loads torch and the exporters

    # The stack just imported lives as long as this one-shot process: the collector leaves it alone, so a
    # collection (after a target's validation, after the eager weights are freed) walks only the run's own objects
    gc.freeze()

    options = RunOptions(
        out_dir=out_dir, targets=list(target), config_path=config, device=device, revision=revision, token=token,
        endpoint=endpoint, trust_remote_code=trust_remote_code, timeout=timeout, use_cache=not no_cache,
        bench=not no_bench, progress=not quiet, jobs=None if jobs == "auto" else int(jobs),
    )
    try:
        report = run_pipeline(model, options)
    except RecipeError as err:
        _recipe_error(err)
        _record_problem(out_dir, err)
        raise typer.Exit(EXIT_USAGE) from None
    except (ModelSourceError, RemoteCodeError, DeviceError, MemoryPlanError) as err:
        _error("error", err)
        _record_problem(out_dir, err)
        raise typer.Exit(EXIT_USAGE) from None
    _print_summary(report, out_dir)
    if print_report:
        out.print((out_dir / "report.md").read_text(), markup=False, highlight=False)
    if destination is not None:
        _publish(destination, out_dir, token=token, endpoint=endpoint, publish_failed=publish_failed,
                 publish_unverified=publish_unverified, dry_run=dry_run, max_upload_bytes=upload_limit)
    raise typer.Exit(EXIT_OK if report["status"] == "passed" else EXIT_FAILED)


def _record_problem(out_dir: Path, err: Exception) -> None:
    """OUT/problem.json: what stopped the run before any export (read by the bot to tell the repo)."""
    problem = problem_from_error(err)
    if problem is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_problem(out_dir, problem)


def _upload_limit(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        console.print(f"--max-upload-size: {err}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None


def _destination(model: str, repo_id: str | None, revision: str | None, publishing: bool):
    """Where --push publishes (the library decides: --repo-id, else MODEL; the PR base from --revision); exit 2
    when there is no repo to publish to."""
    if not publishing:
        if repo_id is not None:
            console.print("--repo-id is only used with --push or --dry-run", markup=False)
        return None
    try:
        return publish_destination(model, repo_id=repo_id, revision=revision)
    except PublishError as err:
        _error("error", err)
        raise typer.Exit(EXIT_USAGE) from None


def _publish_failed(label: str, err: PublishError, out_dir: Path) -> None:
    """Say what failed, record it in OUT/publish.json, exit 3."""
    _error(label, err)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_outcome(out_dir, PublishResult("failed", message=err.worded(OPTION_NAMES), retryable=err.retryable))
    raise typer.Exit(EXIT_PUBLISH)


def _check_publish_access(repo_id: str, token: str | None, endpoint: str | None, out_dir: Path) -> None:
    """Before a long export: the token works and the repo is visible (exit 3 otherwise, nothing exported)."""
    try:
        check_publish_access(repo_id, token=token, endpoint=endpoint)
    except PublishError as err:
        _publish_failed("cannot publish", err, out_dir)


def _publish(destination, out_dir: Path, *, token: str | None, endpoint: str | None, publish_failed: bool,
             publish_unverified: bool, dry_run: bool, max_upload_bytes: int) -> None:
    """Publish OUT to the Hub (or print the plan); a publishing error exits 3 with what to do."""
    try:
        result = publish_report(destination.repo_id, out_dir, token=token, endpoint=endpoint, options=PublishOptions(
            publish_failed=publish_failed, publish_unverified=publish_unverified, dry_run=dry_run,
            revision=destination.base, max_upload_bytes=max_upload_bytes))
    except PublishError as err:
        _publish_failed("publish failed", err, out_dir)
    if dry_run and result.plan is not None:
        out.print(render_plan(result.plan, result.action), markup=False, highlight=False, soft_wrap=True)
    console.print(f"publish: {result.operation} — {result.message}", markup=False, highlight=False, soft_wrap=True)
    url = result.pr_url or result.discussion_url
    if url:
        out.print(url, markup=False, highlight=False, soft_wrap=True)


@app.command()
def check(file: Path = typer.Argument(..., help="export_config.json, or a config.json with export_config.")) -> None:
    """Validate a recipe file: exit 0 when valid, 2 with the JSON path and line of each problem otherwise (with the
    model's config.json beside it, or as the file, also what depends on the model: a static cache past its
    positions).

    Example: hf-export check ./my-model/export_config.json
    """
    try:
        recipe = load_recipe_file(file)
        config_file = file if file.name == "config.json" else file.with_name("config.json")
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
        except (OSError, ValueError):
            config = None  # not the model's config: the run reads it and says what is wrong
        if isinstance(config, dict):
            check_cache_len(recipe, positions_in(config))
    except RecipeError as err:
        _recipe_error(err)
        raise typer.Exit(EXIT_USAGE) from None
    for t in recipe.exports:
        out.print(f"{t.name}: {t.export_format}" + (f", {t.mode} mode" if t.mode else ""), markup=False)
    console.print(f"{file}: valid ({len(recipe.exports)} target(s))", markup=False)


@app.command()
def init(
    model: str = typer.Argument(..., help="A local model folder or a Hub repo id (org/name)."),
    formats: str = typer.Option("dynamo,onnx,executorch", "--formats", help="Formats to try, comma-separated."),
    out_file: Path = typer.Option(Path("export_config.json"), "--out", help="Where to write the proposed recipe."),
    max_seconds: float = typer.Option(1800.0, "--max-seconds", min=1, help="Time budget for all the probing."),
    max_probe_elements: int = typer.Option(1_000_000, "--max-probe-elements", min=1,
                                           help="Largest probe input (elements): bounds are searched within it."),
    revision: Optional[str] = REVISION_OPTION,
    token: Optional[str] = TOKEN_OPTION,
    endpoint: Optional[str] = ENDPOINT_OPTION,
    trust_remote_code: bool = REMOTE_CODE_OPTION,
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Keep each round's recipe, report and logs here."),
    push: bool = _flag("--push", "Open (or update) a Hub PR adding export_config.json."),
    repo_id: Optional[str] = typer.Option(None, "--repo-id", help="Hub repo for --push (default: MODEL)."),
    summary_file: Optional[Path] = typer.Option(None, "--summary", help="Also write the summary as Markdown here."),
    fp32_only: bool = _flag("--fp32-only", "Do not try a decoder-only LLM's int4 variants (ONNX int4, ExecuTorch "
                                           "8da4w) beside fp32."),
    no_hand_over: bool = _flag("--no-hand-over", "Do not keep the checked exports for a later `hf-export run` on "
                                                 "this machine (where no run follows here: a bot, a CI job)."),
    quiet: bool = _flag("--quiet", "No progress lines."),
) -> None:
    """Propose a recipe known to work: export and validate every format with the real pipeline, find the largest
    dynamic bounds that hold and the tolerances, write the full-form recipe and print a summary.

    Example: hf-export init ./my-model --out ./my-model/export_config.json --formats onnx,executorch
    """
    wanted = [f.strip() for f in formats.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in FORMATS]
    if unknown or not wanted:
        console.print(f"--formats: unknown {unknown or 'empty list'}; choose from {', '.join(FORMATS)}", markup=False)
        raise typer.Exit(EXIT_USAGE)
    destination = _destination(model, repo_id, revision, push)
    if quiet:
        no_progress_bars()
    if destination is not None:  # before a long search: the token works and the repo is visible (exit 3)
        _check_publish_access(destination.repo_id, token, endpoint, out_file.parent)
    _quiet_libraries()
    # exporters.init loads torch and the exporters (its probes)
    from exporters.init.propose import InitOptions, init_recipe
    from exporters.init.summary import print_table, render_markdown

    def progress(message: str) -> None:
        console.print(f"init: {message}", markup=False, highlight=False, soft_wrap=True)

    options = InitOptions(formats=wanted, max_seconds=max_seconds, max_probe_elements=max_probe_elements,
                          revision=revision, token=token, endpoint=endpoint, trust_remote_code=trust_remote_code,
                          work_dir=work_dir, progress=None if quiet else progress, quantized=not fp32_only,
                          hand_over=not no_hand_over)
    try:
        result = init_recipe(model, options)
    except InitError as err:
        print_table(err.result, console)
        if summary_file is not None:
            fsutil.write_file(summary_file, render_markdown(err.result))
        _error("no recipe written", err)
        raise typer.Exit(EXIT_FAILED) from None
    except (ModelSourceError, RemoteCodeError, MemoryPlanError) as err:
        _error("error", err)
        raise typer.Exit(EXIT_USAGE) from None
    out_file.parent.mkdir(parents=True, exist_ok=True)
    fsutil.write_file(out_file, json.dumps(result.recipe, indent=2) + "\n")
    print_table(result, console)
    if summary_file is not None:
        fsutil.write_file(summary_file, render_markdown(result))
    console.print(f"recipe: {out_file} ({len(result.passed)} target(s)); check it with `hf-export check {out_file}`",
                  markup=False, highlight=False, soft_wrap=True)
    if destination is not None:
        _publish_recipe(destination, result, out_file.parent, token=token, endpoint=endpoint)
    raise typer.Exit(EXIT_OK)


def _publish_recipe(destination, result, out_dir: Path, *, token: str | None, endpoint: str | None) -> None:
    """The Hub PR proposing the recipe, its outcome in `publish.json` beside the recipe (as `run` writes
    OUT/publish.json); a publishing error exits 3 with what to do."""
    from exporters.init.push import publish_recipe  # exporters.init loads torch (its probes)
    try:
        published = publish_recipe(destination.repo_id, result, token=token, endpoint=endpoint,
                                   revision=destination.base)
    except PublishError as err:
        _publish_failed("publish failed", err, out_dir)
    write_outcome(out_dir, published)
    console.print(f"publish: {published.operation} — {published.message}", markup=False, highlight=False,
                  soft_wrap=True)
    if published.pr_url:
        out.print(published.pr_url, markup=False, highlight=False, soft_wrap=True)


@app.command()
def validate(
    model: str = typer.Argument(..., help="The model the artifacts came from (folder or Hub repo id)."),
    out_dir: Path = typer.Argument(..., help="The folder holding <target>/ exports."),
    config: Optional[Path] = typer.Option(None, "--config", help="Recipe file (default: the model's own)."),
    target: list[str] = typer.Option([], "--target", help="Only this target (repeatable)."),
    revision: Optional[str] = REVISION_OPTION,
    token: Optional[str] = TOKEN_OPTION,
    endpoint: Optional[str] = ENDPOINT_OPTION,
    trust_remote_code: bool = REMOTE_CODE_OPTION,
    print_report: bool = _flag("--print-report", "Print report.md to stdout at the end."),
) -> None:
    """Re-run the validation checks on artifacts already saved, and rewrite the report.

    Example: hf-export validate ./my-model out --target onnx --print-report
    """
    _quiet_libraries()
    from exporters.run.revalidate import RunOptions, validate_existing  # loads torch and the runtimes

    options = RunOptions(out_dir=out_dir, targets=list(target), config_path=config, revision=revision, token=token,
                         endpoint=endpoint, trust_remote_code=trust_remote_code, progress=False)
    try:
        report = validate_existing(model, options)
    except RecipeError as err:
        _recipe_error(err)
        raise typer.Exit(EXIT_USAGE) from None
    except (ModelSourceError, RemoteCodeError, DeviceError, MemoryPlanError) as err:
        _error("error", err)
        raise typer.Exit(EXIT_USAGE) from None
    _print_summary(report, out_dir)
    if print_report:
        out.print((out_dir / "report.md").read_text(), markup=False, highlight=False)
    raise typer.Exit(EXIT_OK if report["status"] == "passed" else EXIT_FAILED)


def main() -> None:
    """Console entry point; usage errors exit 2 (typer's default for bad options too)."""
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)
    except SystemExit as done:
        exit_without_teardown(done)


if __name__ == "__main__":
    main()

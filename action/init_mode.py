"""The Action's `init` mode: propose a recipe for a model that has none (`exporters.init`), write it to the output
folder, show the summary table in the job summary, and with `open-pr` open (or update) the Hub PR that adds it.

Outputs: `status` (passed: a recipe was written; failed: no format works; error: bad input or model),
`recipe-path`, `pr-url`, `pr-operation`, `targets` (the formats in the recipe) and `init-json` (the summary as data).
"""

from __future__ import annotations

import json
from typing import Any

from exporters import fsutil
from exporters.errors import InitError, ModelSourceError, PublishError, RemoteCodeError
from exporters.files import RECIPE_FILE

from .commands import emit, error, group, set_outputs, untrusted, write_summary
from .outcome import EXIT_FAILED, EXIT_OK, NoPublish, comment, fail, relative, worded
from .settings import Settings
from .summary import publish_line

SUMMARY_NAME = "init-summary.md"
PR_OPERATIONS = ("created", "updated", "unchanged")


def _publish(settings: Settings, result) -> Any | None:
    """The Hub PR adding the recipe, or a stand-in saying why there is none."""

    if not settings.open_pr:
        return None
    destination = settings.destination
    if destination is None:
        return NoPublish(message=f"`{settings.model}` is not a Hub repo id: there is no repo to open a PR on "
                                 "(set open-pr: false to silence this)")
    if settings.dry_run:
        return NoPublish(message="dry run: the recipe was written to the output folder; no PR was opened")
    from exporters.init.push import publish_recipe  # exporters.init loads torch (its probes): init mode only

    try:
        with group(f"Proposing the recipe on the Hub: {destination.repo_id} (PR against {destination.base})"), \
                untrusted():
            published = publish_recipe(destination.repo_id, result, token=settings.hf_token,
                                       endpoint=settings.hf_endpoint, revision=destination.base)
            emit(f"Hub PR: {published.operation} {published.pr_url or ''} — {published.message}")
    except Exception as err:
        message = worded(err) if isinstance(err, PublishError) else f"{type(err).__name__}: {err}"
        error(message, title=f"Proposing the recipe on {destination.repo_id} failed")
        return NoPublish(message=f"publishing failed: {message}", failed=True)
    return published


def init_mode(settings: Settings) -> int:
    # exporters.init loads torch (its probes): only this mode needs it
    from exporters.init.propose import InitOptions, init_recipe
    from exporters.init.summary import render_markdown, to_dict

    out_dir = settings.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    options = InitOptions(formats=settings.formats, max_seconds=settings.max_seconds, revision=settings.revision,
                          token=settings.hf_token, endpoint=settings.hf_endpoint,
                          trust_remote_code=settings.trust_remote_code,
                          progress=emit, hand_over=False)  # the recipe goes to a PR: no run follows in this job
    failure: Exception | None = None
    with group(f"Proposing a recipe for {settings.model} ({', '.join(settings.formats)})"), untrusted():
        try:  # the progress lines quote the model's and torch's errors: no workflow command is obeyed in them
            result = init_recipe(settings.model_arg, options)
        except (InitError, RemoteCodeError, ModelSourceError) as err:
            failure = err
    if isinstance(failure, RemoteCodeError):
        return fail(settings, "Remote code refused", [(None, None, str(failure))])
    if isinstance(failure, ModelSourceError):
        return fail(settings, "Cannot load the model", [(None, None, str(failure))])
    failed = isinstance(failure, InitError)
    if failed:
        result = failure.result
        error(str(failure), title="No format could be exported")
    markdown = render_markdown(result)
    fsutil.write_file(out_dir / SUMMARY_NAME, markdown)
    recipe_path = out_dir / RECIPE_FILE
    publish = None
    if not failed:
        fsutil.write_file(recipe_path, json.dumps(result.recipe, indent=2) + "\n")
        emit(f"recipe written to {relative(settings, recipe_path) or recipe_path}")
        publish = _publish(settings, result)
    lines = [markdown, publish_line(publish, dry_run=settings.dry_run), ""]
    if settings.github.run_url:
        lines.append(f"<sub>[Workflow run]({settings.github.run_url})</sub>")
    body = "\n".join(lines)
    write_summary(settings.github.summary_file, body)
    operation = getattr(publish, "operation", "none") if publish is not None else "none"
    set_outputs(settings.github.output_file, {
        "status": "failed" if failed else "passed",
        "recipe-path": "" if failed else (relative(settings, recipe_path) or str(recipe_path)),
        "pr-url": (getattr(publish, "pr_url", None) or "") if operation in PR_OPERATIONS else "",
        "pr-operation": operation if operation in PR_OPERATIONS else "none",
        "targets": json.dumps([f.export_format for f in result.passed]),
        "init-json": json.dumps(to_dict(result), separators=(",", ":"), default=str),
    })
    comment(settings, body)
    publish_failed = bool(getattr(publish, "failed", False))
    return EXIT_FAILED if (failed or publish_failed) and settings.fail_on_error else EXIT_OK

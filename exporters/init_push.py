"""Propose `hf-export init`'s recipe on the Hub: one pull request adding `export_config.json`, the summary table in
its description.

```
InitResult ──► export_config.json + description + marker {kind: recipe} ──► find our PR of the slot ──► create / update / nothing
```

The same rules as publishing exports (`exporters.publish`): a hidden marker names the slot (kind `recipe`, the
repo's own recipe, the base branch); only PRs of the token's account count; an open PR of the slot gets a commit
and a refreshed description when the proposal changed, nothing when it did not (`unchanged`), and a PR the owner
closed is not reopened for the same recipe.

Example:
    >>> result = publish_recipe("org/model", init_result, token=os.environ["HF_TOKEN"])  # doctest: +SKIP
    >>> result.operation  # doctest: +SKIP
    'created'
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import PublishError
from .publish import (
    MARKER_VERSION,
    HubClient,
    PublishResult,
    _first_comment_id,
    render_marker,
    same_fingerprint,
    same_slot,
)
from .recipe import RECIPE_FILE, canonical_json

KIND_RECIPE = "recipe"


def recipe_marker(recipe: dict[str, Any], base: str) -> dict[str, Any]:
    """The slot (kind, recipe, base) and the fingerprint (the proposed recipe's hash) of a recipe PR.

    Example:
        >>> recipe_marker({"exports": []}, "main")["kind"]
        'recipe'
    """
    digest = hashlib.sha256(canonical_json(recipe).encode()).hexdigest()
    return {"v": MARKER_VERSION, "kind": KIND_RECIPE, "recipe": "repo", "base": base, "recipe_sha256": digest}


def recipe_title(result, replaces: bool) -> str:
    """E.g. `Add an export recipe (export_config.json): dynamo, onnx`."""
    verb = "Update the export recipe" if replaces else "Add an export recipe"
    return f"{verb} ({RECIPE_FILE}): {', '.join(f.export_format for f in result.passed)}"[:200]


def recipe_description(result, marker: dict[str, Any], replaces: bool) -> str:
    """The PR text: what it adds, the summary table and notes, the recipe, the marker."""
    from .init_summary import render_markdown

    what = ("replaces the repo's current recipe with" if replaces else "adds")
    lines = [
        f"This PR {what} `{RECIPE_FILE}`: an export recipe proposed by `hf-export init`, which exported every "
        "target below with the real pipeline and validated it against the eager model at unseen shapes. Once it "
        f"is merged, `hf-export run {result.model}` (or the export bot) exports and validates it again and opens a "
        "PR with the artifacts.",
        "",
        render_markdown(result, heading="### What was probed"),
        "<details><summary>The recipe</summary>",
        "",
        "```json",
        json.dumps(result.recipe, indent=2),
        "```",
        "",
        "</details>",
        "",
        render_marker(marker),
    ]
    return "\n".join(lines)


def publish_recipe(repo_id: str, result, *, token: str | None = None, endpoint: str | None = None,
                   revision: str = "main") -> PublishResult:
    """Open, update, or leave as is the PR proposing `result.recipe` as `repo_id`'s `export_config.json`.

    Raises `PublishError` (what to do; never the token).
    """
    from huggingface_hub import CommitOperationAdd

    if result.recipe is None:
        raise PublishError("there is no recipe to propose: no format passed")
    marker = recipe_marker(result.recipe, revision)
    hub = HubClient(repo_id, token=token, endpoint=endpoint)
    threads = hub.threads(hub.whoami())
    mine = [t for t in threads if t.is_pull_request and same_slot(t.marker, marker)]
    open_pr = next((t for t in mine if t.is_open), None)
    latest = open_pr or (mine[0] if mine else None)
    if latest is not None and same_fingerprint(latest.marker, marker):
        state = "" if latest.is_open else f" ({latest.status}; not reopened for the same recipe)"
        return PublishResult("unchanged", pr_url=latest.url, pr_num=latest.num,
                             message=f"PR #{latest.num}{state} already proposes this recipe: nothing to do")
    ref = f"refs/pr/{open_pr.num}" if open_pr else revision
    head, files = hub.head(revision)
    replaces = RECIPE_FILE in files
    title, text = recipe_title(result, replaces), recipe_description(result, marker, replaces)
    content = (json.dumps(result.recipe, indent=2) + "\n").encode("utf-8")
    operations = [CommitOperationAdd(RECIPE_FILE, content)]
    if open_pr is not None:
        pr_head, _ = hub.head(ref)
        info = hub.call(f"push to {ref}", hub.api.create_commit, repo_id, operations,
                        commit_message=f"Update the proposed {RECIPE_FILE}", revision=ref, parent_commit=pr_head)
        how = hub.refresh(open_pr, title, text)
        return PublishResult("updated", pr_url=open_pr.url, pr_num=open_pr.num, commit=info.oid,
                             message=f"updated PR #{open_pr.num} with commit {info.oid[:7]} ({how})")
    info = hub.call("open a pull request", hub.api.create_commit, repo_id, operations, commit_message=title,
                    commit_description=text, revision=revision, create_pr=True, parent_commit=head)
    if info.pr_num is None:
        return PublishResult("unchanged", commit=info.oid,
                             message=f"{revision} already holds exactly this {RECIPE_FILE}: no PR opened")
    if _first_comment_id(hub, info.pr_num) is None:  # the commit description should be the PR's first comment
        hub.comment(info.pr_num, text)
    return PublishResult("created", pr_url=info.pr_url, pr_num=info.pr_num, commit=info.oid,
                         message=f"opened PR #{info.pr_num} proposing {RECIPE_FILE} "
                                 f"({', '.join(f.export_format for f in result.passed)})")

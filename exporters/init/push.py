"""Propose `hf-export init`'s recipe on the Hub: one pull request adding `export_config.json`, the summary table in
its description.

```
InitResult ──► export_config.json + title + description + marker {kind: recipe, fingerprint} ──► publish_files
                                                        (exporters.publish: our PR of the slot ─► create / update / nothing)
```

The same rules as publishing exports, by the same code (`exporters.publish.publish_files`): a hidden marker names
the slot (kind `recipe`, the repo's own recipe, the base branch); only PRs of the token's account count; a PR opened
twice by racing runs is closed again; an open PR of the slot gets a commit and a refreshed description when the
proposal changed, nothing when it did not (`unchanged`), and a PR the owner closed is not reopened for the same
recipe.

Example:
    >>> result = publish_recipe("org/model", init_result, token=os.environ["HF_TOKEN"])  # doctest: +SKIP
    >>> result.operation  # doctest: +SKIP
    'created'
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from exporters.errors import PublishError
from exporters.files import RECIPE_FILE
from exporters.init.summary import render_markdown
from exporters.publish import HubClient, Proposal, PublishResult, publish_files, texts
from exporters.recipe.model import canonical_json

KIND_RECIPE = "recipe"


def recipe_marker(recipe: dict[str, Any]) -> dict[str, Any]:
    """The slot (kind, the repo's own recipe) and the fingerprint (the proposed recipe's hash) of a recipe PR.

    Example:
        >>> recipe_marker({"exports": []})["kind"]
        'recipe'
    """
    digest = hashlib.sha256(canonical_json(recipe).encode()).hexdigest()
    return {"kind": KIND_RECIPE, "recipe": "repo", "fingerprint": digest}


def recipe_title(result, replaces: bool) -> str:
    """E.g. `Add an export recipe (export_config.json): dynamo, onnx`."""
    verb = "Update the export recipe" if replaces else "Add an export recipe"
    return f"{verb} ({RECIPE_FILE}): {', '.join(f.export_format for f in result.passed)}"[:200]


def recipe_description(result, replaces: bool) -> str:
    """The PR text: what it adds, the summary table and notes, the recipe (the marker is appended by publishing)."""

    what = "replaces the repo's current recipe with" if replaces else "adds"
    return "\n".join([
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
        "Closing this PR is fine: a closed proposal is not reopened for the same recipe; a different one opens a new "
        "PR.",
        *texts.NOTES,
    ])


def publish_recipe(repo_id: str, result, *, token: str | None = None, endpoint: str | None = None,
                   revision: str = "main") -> PublishResult:
    """Open, update, or leave as is the PR proposing `result.recipe` as `repo_id`'s `export_config.json`.

    Raises `PublishError` (what to do; never the token).
    """
    if result.recipe is None:
        raise PublishError("there is no recipe to propose: no format passed")
    _, files = HubClient(repo_id, token=token, endpoint=endpoint).head(revision)
    replaces = RECIPE_FILE in files
    text = recipe_description(result, replaces)
    proposal = Proposal(marker=recipe_marker(result.recipe), title=recipe_title(result, replaces),
                        description=lambda _num: text, commit_message=f"Propose {RECIPE_FILE}", base=revision)
    return publish_files(repo_id, {RECIPE_FILE: (json.dumps(result.recipe, indent=2) + "\n").encode("utf-8")},
                         proposal, token=token, endpoint=endpoint)

"""Publish a run's validated artifacts to the Hub as a pull request (or its report as a discussion).

```
OUT/report.json ──► plan (files, no network) ──► what the Hub holds (our threads, the base branch, the PR's files)
                         │                                   │
                         └──── merge_plan (keyed by target) ─┴──► decide ──► create | update | unchanged
                                                                             | superseded | discussion
```

The rooms: `plan` (which files; merge with what the Hub holds), `markers` (slot and fingerprint), `decide` (one
pure decision), `texts` (titles, descriptions, model card), `hub` (the thin client), `destination` (where to publish,
the size limit), `run` (doing it; the outcome in `OUT/publish.json`), `problem` (a repo that cannot be exported at
all: invalid recipe, model that cannot be loaded, refused remote code; told in the failure discussion).
`snippets` (how to run a published target in each runtime it was proven in: the model card's code).

What goes into the model repo (one commit per run, on `refs/pr/N`):

- `exports/<target>/...`: the artifacts of every target that passed, loadable with
  `ExportedModel.from_pretrained(repo, revision="refs/pr/N", subfolder="exports/<target>")`;
- the validation report: `exports/report.json` and `exports/report.md` (a recipe file other than the model's own:
  `exports/report.<stem>.json|md`, so two recipes do not overwrite each other's reports);
- `README.md`: an "Exports" section between `<!-- export-action:exports:start -->` and
  `<!-- export-action:exports:end -->`, replaced on every run (the rest of the card untouched).

**Identity.** A hidden marker in each thread names its slot (repo, account, kind, recipe, base branch) and records a
fingerprint of the run. A slot holds at most one open thread; only the token's account's threads count.

**Safe under racing runs.** Two runs that both find no PR and both open one converge: after opening, each lists the
slot again and the higher-numbered PR is closed by the run that opened it. A run of an older commit never overwrites a
newer export (`superseded`). A run of some of the targets updates only those: the others stay in the PR.

The token never appears in messages or errors: every Hub error is re-raised as `PublishError` with the token
scrubbed, saying what to do and whether a retry may help.

Example:
    >>> from exporters.publish import decide, HubView
    >>> decide({"kind": "exports", "recipe": "repo", "base": "main"}, HubView(())).operation
    'create'
"""

from exporters.errors import PublishError
from exporters.publish.decide import Decision, HubView, ThreadState, decide
from exporters.publish.destination import (
    DEFAULT_MAX_UPLOAD_BYTES,
    Destination,
    parse_size,
    pr_base,
    publish_destination,
)
from exporters.publish.hub import HubClient
from exporters.publish.markers import parse_marker, render_marker, same_fingerprint, same_slot
from exporters.publish.plan import (
    EXPORTS_DIR,
    KIND_EXPORTS,
    KIND_FAILURE,
    MARKER_VERSION,
    Held,
    PlannedFile,
    PublishPlan,
    load_report,
    merge_plan,
    plan_publish,
    recipe_identity,
)
from exporters.publish.problem import (
    PROBLEM_FILE,
    Problem,
    close_failure_discussions,
    problem_description,
    problem_from_error,
    read_problem,
    report_problem,
    write_problem,
)
from exporters.publish.run import (
    OUTCOME_FILE,
    Proposal,
    PublishOptions,
    PublishResult,
    check_publish_access,
    publish_files,
    publish_report,
    write_outcome,
)
from exporters.publish.texts import (
    CARD_END,
    CARD_START,
    NOTES,
    SECTIONS,
    card_section,
    render_plan,
    update_model_card,
)

__all__ = [
    "CARD_END", "CARD_START", "DEFAULT_MAX_UPLOAD_BYTES", "EXPORTS_DIR", "KIND_EXPORTS", "KIND_FAILURE",
    "MARKER_VERSION", "NOTES", "OUTCOME_FILE", "PROBLEM_FILE", "SECTIONS", "Decision", "Destination", "Held",
    "HubClient", "HubView", "PlannedFile", "Problem", "Proposal", "PublishError", "PublishOptions", "PublishPlan", "PublishResult", "ThreadState",
    "card_section", "check_publish_access", "close_failure_discussions", "decide", "load_report", "merge_plan",
    "parse_marker", "parse_size", "plan_publish", "pr_base", "problem_description", "problem_from_error",
    "publish_destination", "publish_files", "publish_report", "read_problem", "recipe_identity", "render_marker",
    "render_plan", "report_problem", "same_fingerprint", "same_slot", "update_model_card", "write_outcome",
    "write_problem",
]

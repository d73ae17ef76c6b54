"""The texts of a publish: titles, the PR and discussion descriptions, the model card's Exports section, the plan.

Nothing here claims more than the report shows: the sentence about checking is built from the checks that ran
(probes compared, generation parity), and a target published without every check (`unverified`, opted in) is named
with the checks that did not run. Log excerpts arrive inside report.md's fences; a description cut to fit the Hub
closes any fence it cut through, so nothing after it (the marker) is swallowed.

Other modules add sections to the PR and the card through `SECTIONS` (e.g. a variants table): each hook takes the
plan and returns Markdown lines, or none. A publisher adds its own lines to every PR and discussion text through
`NOTES` (the bot: how to stop it for a repo).

Example:
    >>> fit_markdown("intro\\n````\\nlog ``` line\\nmore", 24)
    'intro\\n````\\nlog ``` line\\n````\\n\\n_Cut to fit; the full report is `exports/report.md`._'
    >>> load_snippet("org/model", "onnx", "onnx").splitlines()[-1]
    'model = ExportedModel.from_pretrained("org/model", subfolder="exports/onnx")'
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from exporters.publish.markers import render_marker
from exporters.publish.plan import EXPORTS_DIR, report_paths
from exporters.publish.snippets import NEEDS_TRUST, PIN_COMMENT, needs_pin, proven_runtimes, target_snippets
from exporters.report.markdown import close_fences, human_size, inert, reason, variants_table

if TYPE_CHECKING:
    from exporters.publish.plan import PublishPlan

CARD_START = "<!-- export-action:exports:start -->"
CARD_END = "<!-- export-action:exports:end -->"
# The report part of a PR / discussion text: room is left for the summary and the marker under the Hub's limit.
DESCRIPTION_REPORT_LIMIT = 55_000
# Hooks adding sections to the PR description and the model card (e.g. quantized variants): plan -> lines.
SECTIONS: list[Callable[[PublishPlan], list[str]]] = []
# The publisher's own lines in every PR and discussion text (the bot: how to stop it for a repo).
NOTES: list[str] = []
# True of every publisher: `decide` never reopens a closed PR for the same fingerprint.
CLOSING_IS_FINE = ("Closing this PR is fine: a closed PR is not reopened for the same source commit, recipe and tool "
                   "versions; a new commit or a changed recipe opens a new one.")
def fit_markdown(text: str, limit: int, note: str = "") -> str:
    """`text` cut to `limit` characters (at a line end); a code fence left open by the cut is closed, then `note`."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit("\n", 1)[0] if "\n" in text[:limit] else text[:limit]
    return close_fences(cut) + "\n\n" + (note or f"_Cut to fit; the full report is `{EXPORTS_DIR}/report.md`._")


def card_markers(recipe: str) -> tuple[str, str]:
    """The card section's start and end markers: one pair per recipe file (the model's own recipe: the plain pair)."""
    if recipe == "repo":
        return CARD_START, CARD_END
    return (f"<!-- export-action:exports:start recipe={recipe} -->",
            f"<!-- export-action:exports:end recipe={recipe} -->")


def short_sha(report: dict[str, Any]) -> str:
    """The source commit, 7 characters (`local` for a run on a local folder)."""
    revision = report["source"].get("revision")
    return revision[:7] if revision else "local"


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} +{len(names) - 3}"


def _quoted(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def pr_title(plan: PublishPlan) -> str:
    """E.g. `Add exports: dynamo, onnx (source 1a2b3c4)`, plus `; failed: x` when failed targets are left out."""
    title = f"Add exports: {_names(plan.published)} (source {short_sha(plan.report)}"
    if plan.unverified:
        title += f"; unverified: {_names(plan.unverified)}"
    if plan.failed:
        title += f"; failed: {_names(plan.failed)}"
    return (title + ")")[:200]


def failure_title(plan: PublishPlan) -> str:
    """E.g. `Export failed: onnx (source 1a2b3c4)`."""
    return f"Export failed: {_names(plan.failed) or 'no target'} (source {short_sha(plan.report)})"[:200]


def title(plan: PublishPlan) -> str:
    return pr_title(plan) if plan.is_pull_request else failure_title(plan)


def load_snippet(repo_id: str, target: str, export_format: str, revision: str | None = None) -> str:
    """Python that loads one published target with `transformers.exporters`."""
    arguments = [json.dumps(repo_id)]
    if revision:
        arguments.append(f"revision={json.dumps(revision)}")
    arguments.append(f"subfolder={json.dumps(f'{EXPORTS_DIR}/{target}')}")
    why = ""
    if export_format in NEEDS_TRUST:
        arguments.append("trust_remote_code=True")  # own artifact: the snippet loads what this run exported
        why = PIN_COMMENT.format(what="a .pt2 is a pickle: trust_remote_code") + "\n" if revision else ""
    return ("from transformers.exporters import ExportedModel\n\n" + why
            + f"model = ExportedModel.from_pretrained({', '.join(arguments)})")


def what_was_checked(target: dict[str, Any]) -> str:
    """One sentence built from the checks that ran on `target` (never a fixed claim).

    Example:
        >>> what_was_checked({"name": "onnx", "components": [{"name": "model", "checks": [
        ...     {"probe": "traced", "verdict": "passed"}, {"probe": "seq=9", "verdict": "passed"}]}]})
        '`onnx`: 1 component loaded back from disk and compared with the eager model at 2 probes (1 at shapes it was not traced with), within tolerance.'
    """
    components = target.get("components") or []
    checks = [c for component in components for c in component.get("checks") or []]
    ran = [c for c in checks if c.get("verdict") == "passed"]
    unseen = [c for c in ran if c.get("probe") != "traced"]
    text = f"`{target['name']}`: "
    if ran:
        plural = "s" if len(components) != 1 else ""
        text += (f"{len(components)} component{plural} loaded back from disk and compared with the eager model at "
                 f"{len(ran)} probe{'s' if len(ran) != 1 else ''} ({len(unseen)} at shapes it was not traced with), "
                 "within tolerance")
    else:
        text += "no probe compared it with the eager model"
    generation = target.get("generation") or {}
    steps = generation.get("max_new_tokens")
    if generation.get("status") == "passed":
        text += (f"; greedy generation through the exported components matched eager `generate()` for "
                 f"{steps if isinstance(steps, int) else 'its'} tokens")
    elif generation:
        text += f"; generation parity {inert(generation.get('status'), 40)}"
    return text + "."


def _checks_lines(plan: PublishPlan) -> list[str]:
    lines = ["What was checked before publishing (from the report):", ""]
    lines += [f"- {what_was_checked(t)}" for t in plan.targets()]
    for target in plan.targets(plan.unverified):
        lines += ["", f"> [!WARNING]\n> **`{target['name']}` is published unverified** (opted in): these checks did "
                      "**not** run, so nothing says this artifact matches the eager model on them:"]
        # a reason names the recipe's dims and the model's inputs: inert, no mention, no image
        lines += [f"> - {inert(reason)}" for reason in (target.get("unverified") or [])[:20]]
    return lines


def _size_lines(plan: PublishPlan) -> list[str]:
    sizes = plan.target_bytes()
    if not sizes:
        return []
    lines = ["| target | upload |", "|---|---|"]
    lines += [f"| `{name}` | {human_size(size)} |" for name, size in sizes.items()]
    return lines + [f"| **total** (with the reports) | **{human_size(plan.upload_bytes)}** |"]


def _hook_lines(plan: PublishPlan) -> list[str]:
    lines: list[str] = []
    for hook in SECTIONS:
        lines += hook(plan) or []
    return lines


def card_needs_pin(plan: PublishPlan) -> bool:
    """Whether the card holds a snippet that loads code or a pickle: it is pinned to the commit that holds the
    files, so the card is written again once that commit exists (`card_section(plan, commit)`)."""
    return any(needs_pin(runtime, target) for target in plan.targets()
               for runtime, _, _ in target_snippets(plan.repo_id, target))


def card_section(plan: PublishPlan, commit: str | None = None) -> str:
    """The model card's Exports section, markers included (no dates: the same run gives the same text). Its
    snippets download the files at `commit` (the commit that holds them); without it, a snippet that loads code or
    a pickle is left out, with a line saying it comes with the next commit (`card_needs_pin`). Text from the report
    is inert; code is our templates' (`exporters.publish.snippets`)."""
    report = plan.report
    start, end = card_markers(plan.recipe)
    json_path, md_path = report_paths(plan.recipe)
    lines = [start, "## Exports", "",
             f"Exports of this model made by export-action from its recipe `{report['recipe']['file']}` (source "
             f"revision `{short_sha(report)}`); the report is [`{md_path}`]({md_path}).", "",
             *_checks_lines(plan), "", *variants_table(report, names=list(plan.published)), "", *_hook_lines(plan)]
    for target in plan.targets():
        components = ", ".join(str(c.get("name")) for c in target.get("components") or []) or "–"
        lines += [f"### `{target['name']}`", "",
                  inert(f"{target['export_format']}, {target['mode']} mode: {components}", 600), ""]
        proofs = proven_runtimes(target)
        if proofs:
            runs_in = ", ".join(f"{inert(p.get('runtime'), 60)} ✓ {inert(p.get('detail') or '', 120)}".strip()
                                for p in proofs)
            lines += [f"Runs in (proven from this folder alone): {runs_in}", ""]
        for runtime, language, code in target_snippets(plan.repo_id, target, commit):
            if commit is None and needs_pin(runtime, target):
                lines += [f"{runtime}: the snippet loads code or a pickle, so it is pinned to the commit that holds "
                          "these files; it is written in the next commit, once that commit exists.", ""]
                continue
            lines += [f"{runtime}:", "", f"```{language}", code, "```", ""]
    if any(t["export_format"] in NEEDS_TRUST for t in plan.targets()):
        trust = "`trust_remote_code=True`"  # own artifact: what this run exported and validated
        lines += [f"{trust} is needed to load `torch.export` programs (`.pt2`, pickled): pass it only for exports "
                  "you trust. The snippets pin `revision` to the commit that holds these files, so they load the "
                  "validated bytes, never what a later commit put under the same names.", ""]
    lines.append(end)
    return "\n".join(lines)


def update_model_card(readme: str | None, section: str, title: str = "", recipe: str = "repo") -> str:
    """`readme` with its Exports section (of `recipe`) replaced by `section` (appended when absent; a new card when
    `readme` is None). YAML front matter and everything outside the markers are kept byte for byte. A start marker
    without an end marker runs to the end of the card.

    Example:
        >>> card = update_model_card("---\\nlicense: mit\\n---\\n# M\\n", "<!-- export-action:exports:start -->\\nX\\n"
        ...                          "<!-- export-action:exports:end -->")
        >>> card.startswith("---\\nlicense: mit\\n---\\n# M\\n")
        True
    """
    start_marker, end_marker = card_markers(recipe)
    if readme is None:
        heading = f"# {title}\n\n" if title else ""
        return f"{heading}{section}\n"
    start = readme.find(start_marker)
    if start == -1:
        separator = "" if not readme or readme.endswith("\n\n") else ("\n" if readme.endswith("\n") else "\n\n")
        return f"{readme}{separator}{section}\n"
    end = readme.find(end_marker, start)
    tail = readme[end + len(end_marker):] if end != -1 else "\n"
    return readme[:start] + section + tail


def _summary(plan: PublishPlan) -> str:
    report = plan.report
    source = report["source"]
    where = f"`{source['model']}` @ `{short_sha(report)}`" if source.get("revision") else f"`{source['model']}`"
    return (f"Exports of {where} made by export-action {report['tool'].get('version', '')} from the recipe "
            f"`{report['recipe']['file']}` (sha256 `{str(report['recipe'].get('sha256'))[:12]}`).")


def _excerpt(plan: PublishPlan) -> str:
    return fit_markdown(plan.markdown.strip(), DESCRIPTION_REPORT_LIMIT,
                        f"_Report cut to fit; the full report is `{report_paths(plan.recipe)[1]}`._")


def pr_description(plan: PublishPlan, pr_num: int | None = None, commit: str | None = None) -> str:
    """The PR text: what it adds, what was checked, sizes, failed targets, how to try it (pinned to `commit`, the
    PR's commit that holds the files, when known; a `.pt2`, which loads a pickle, only then), the report, the
    marker."""
    json_path, md_path = report_paths(plan.recipe)
    lines = [_summary(plan), "",
             f"This PR adds `{EXPORTS_DIR}/<target>/` for {_quoted(plan.published)}, the validation report "
             f"(`{md_path}`, `{json_path}`) and an *Exports* section in the model card.", "", *_checks_lines(plan)]
    if plan.carried:
        lines += ["", f"Kept from the PR's earlier run (not part of this one): {_quoted(plan.carried)}."]
    if plan.failed:
        lines += ["", f"> [!WARNING]\n> **Not all targets passed**: {_quoted(plan.failed)} did not pass and are "
                      "**not** included (published anyway by choice); see the report below."]
    sizes = _size_lines(plan)
    if sizes:
        lines += ["", "Upload size:", "", *sizes]
    lines += _hook_lines(plan)
    if plan.published:
        first = plan.targets()[0]
        revision = commit or (f"refs/pr/{pr_num}" if pr_num else "refs/pr/<this PR's number>")
        if commit is None and first["export_format"] in NEEDS_TRUST:  # a pickle: only from a pinned commit
            lines += ["", "Try it before merging: the snippet, pinned to this PR's commit, follows once it exists."]
        else:
            lines += ["", "Try it before merging:", "", "```python",
                      load_snippet(plan.repo_id, first["name"], first["export_format"], revision), "```"]
    lines += ["", CLOSING_IS_FINE, *NOTES, "", "---", "", _excerpt(plan), "", render_marker(plan.marker)]
    return "\n".join(lines)


def _failure_lines(plan: PublishPlan) -> list[str]:
    """Each target that did not pass: why, in the line that says what to change, and the command that runs it again
    on the owner's machine (its `logs/<target>.log` holds the whole message and traceback)."""
    lines = []
    for target in plan.targets(plan.failed):
        lines.append(f"- `{target['name']}` ({target['export_format']}) {target['status']}: "
                     f"{inert(reason(target), 400)}")
        if target.get("reproduce"):
            command = " ".join(str(target["reproduce"]).replace("`", "").split())[:300]  # one code span, whole
            lines.append(f"  reproduce it: `{command}`; its `logs/{inert(target['name'], 100)}.log` holds the whole "
                         "message and traceback")
    return lines


def failure_description(plan: PublishPlan) -> str:
    """The failure discussion's text: what did not pass, that nothing was published, the report, the marker."""
    failed = _quoted(plan.failed) or "no target"
    lines = [_summary(plan), "",
             f"**The export did not pass** for {failed}: no artifact was published.", "", *_failure_lines(plan), "",
             "Next: change what the line says and push again; this discussion is updated by the next run (and "
             "closed once the exports pass).",
             *([""] + NOTES if NOTES else []), "", "---", "", _excerpt(plan), "", render_marker(plan.marker)]
    return "\n".join(lines)


def description(plan: PublishPlan, pr_num: int | None = None) -> str:
    return pr_description(plan, pr_num) if plan.is_pull_request else failure_description(plan)


def render_plan(plan: PublishPlan, action: str = "") -> str:
    """A readable plan: the action, the title, every file with its size, then the PR or discussion text."""
    what = "pull request" if plan.is_pull_request else "discussion (no artifacts: the run did not pass)"
    lines = [f"Publish plan for {plan.repo_id} ({what} against {plan.base})"]
    if action:
        lines.append(f"  action: {action}")
    lines.append(f"  title:  {title(plan)}")
    if plan.is_pull_request:
        ours = [f for f in plan.files if f.local is not None or f.data is not None]
        lines.append(f"  files:  {len(ours) + 1} to upload ({human_size(plan.upload_bytes)} + README.md)")
        for name, size in plan.target_bytes().items():
            lines.append(f"    target {name}: {human_size(size)}")
        width = max((len(f.path_in_repo) for f in ours), default=10)
        for planned in ours:
            lines.append(f"    {planned.path_in_repo:<{width}}  {human_size(planned.size):>9}  {planned.note}".rstrip())
        lines.append(f"    {'README.md':<{width}}  {'':>9}  model card: the Exports section is replaced")
        lines += [f"    {p:<{width}}  {'':>9}  deleted (not in this run)" for p in plan.deletions]
        lines += [f"    exports/{name}/  kept (not in this run)" for name in plan.carried]
    lines += ["", "----- description -----", description(plan), "----- end -----"]
    if plan.is_pull_request:  # what the model card's Exports section would say
        lines += ["", "----- model card (README.md, Exports section) -----", card_section(plan), "----- end -----"]
    return "\n".join(lines)

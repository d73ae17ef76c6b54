"""docs/coverage.md from the measured rows: a family x format table, the reasons of every failure, and how and
where it was measured."""

from __future__ import annotations

from typing import Any

CAUSES = {
    "upstream": "raised inside upstream (transformers.exporters, torch.export, the ONNX exporter, ExecuTorch or a "
                "runtime) on inputs the eager model accepts",
    "mismatch": "the artifact ran but its outputs or tokens differ from the eager model",
    "ours": "this tool could not prepare the model (sample inputs, component capture)",
    "unverified": "a check did not run (the reason says which): not a pass",
    "timeout": "the run did not finish in time",
}
ICONS = {"passed": "✅", "failed": "❌", "unverified": "❔", "crashed": "💥", "timed_out": "⏱️"}


def _cell(cell: Any, notes: list[str]) -> str:
    icon = ICONS.get(cell.status, "❌")
    if cell.status == "passed":
        extra = " (gen ✓)" if cell.generation == "passed" else ""
        for proof in cell.runtimes or []:  # the runtime the artifact is for: ran it (✓), or did not run (❔)
            if proof["status"] == "passed":
                extra += f"; {proof['runtime']} ✓"
            elif proof["status"] == "declined":  # the runtime cannot take the model: not the artifact's verdict
                notes.append(f"{proof['runtime']} {proof['detail'] or 'cannot take this model'}")
                extra += f"; {proof['runtime']} ✗ declined [{len(notes)}]"
            else:
                notes.append(f"{proof['runtime']} did not run it: {proof['detail'] or 'no reason recorded'}")
                extra += f"; {proof['runtime']} ❔ not run [{len(notes)}]"
        return f"{icon} passed{extra}"
    notes.append(cell.reason or "(no reason recorded)")
    cause = f" {cell.cause}" if cell.cause else ""
    return f"{icon} {cell.status}{cause} [{len(notes)}]"


def render(rows: list[Any], meta: dict[str, Any]) -> str:
    formats = meta["formats"]
    lines = [
        "# Support matrix",
        "",
        "Measured, not claimed: `make coverage` (`python -m matrix`) builds a tiny random-weight model of each "
        "family from transformers' own default config (shrunk consistently: hidden 32, 1-2 layers, vocabulary "
        "256, or the tokenizer's, with the special tokens inside it; `matrix/families.py`), runs the plainest "
        "recipe through the real CLI and reads report.json. No processor is in the folders; the decoder-only, "
        "vision-language and audio-language families have a tokenizer (a byte-level BPE trained in code, the "
        "model's vocabulary, BOS, EOS, padding and image or audio tokens its own: `matrix/tokenizer.py`), which "
        "their ExecuTorch LLM runner or MultimodalRunner proof, and GenAI's processor, read; sample inputs are synthesized in each family's layout (SigLIP2's NaFlex "
        "patches, pixel mask and spatial shapes by an image processor built from its config). A pass means every "
        "component matched the eager model at the traced inputs and at unseen shapes, and, for generators, greedy"
        " tokens from raw inputs through the exported graphs matched eager `generate()` (\"gen ✓\"). The runtime an"
        " artifact is for, where it has one (the ExecuTorch LLM runner, ONNX Runtime GenAI), runs it from its "
        "folder alone: ✓ when it ran and matched, \"❔ not run\" when it could not run here (the reason is listed): "
        "that proof is not claimed; \"✗ declined\" when that runtime cannot take the model (a latent attention "
        "cache, a tokenizer kind, a vision-language model outside MultimodalRunner's one image: listed), which "
        "leaves the artifact's own verdict standing.",
        "",
        f"- Measured {meta['date']} on {meta['machine']}, {meta['jobs']} families at a time, "
        f"{meta['elapsed_s'] / 60:.0f} min in all."
        + _partial(meta)
        + (f" The rows of {meta['kept']} families are kept from earlier runs ({meta['kept_from']})." if meta.get("kept")
           else "")
        + _estimate(rows, meta),
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "- Recipe: `" + _compact(meta["recipe"]["exports"]) + "`.",
        "",
    ]
    totals = {f: sum(1 for r in rows if r.cells.get(f) and r.cells[f].status == "passed") for f in formats}
    lines.append("Passed: " + ", ".join(f"{f} {totals[f]}/{len(rows)}" for f in formats) + "." + _unproven(rows))
    lines += ["", "| Family | Kind | Class | Mode | " + " | ".join(formats) + " |",
              "|---|---|---|---|" + "---|" * len(formats)]
    notes: list[str] = []
    for row in rows:
        cells = [_cell(row.cells[f], notes) if f in row.cells else "–" for f in formats]
        lines.append(f"| {row.family} | {row.kind} | `{row.model_class}` | {row.mode or '–'} | " + " | ".join(cells)
                     + " |")
    lines += ["", "Causes: " + "; ".join(f"**{k}**: {v}" for k, v in CAUSES.items()) + ".", ""]
    noted = [row for row in rows if row.note]
    if noted:
        lines += ["Family notes: " + "; ".join(f"{row.family}: {row.note}" for row in noted) + ".", ""]
    if notes:
        lines += ["## Failures", ""]
        lines += [f"{i}. {_escape(note)}" for i, note in enumerate(notes, 1)]
        lines.append("")
    lines += ["Upstream gaps found on the way are described, with reproductions, in "
              "[upstream-gaps.md](upstream-gaps.md).", ""]
    return "\n".join(lines)


def _unproven(rows: list[Any]) -> str:
    """The totals' word on passes whose runtime proof did not run, and on passes measured before proofs were kept."""
    passes = [cell for row in rows for cell in row.cells.values() if cell.status == "passed"]
    unproven = sum(1 for cell in passes
                   if any(p["status"] not in ("passed", "declined") for p in cell.runtimes or []))
    declined = sum(1 for cell in passes if any(p["status"] == "declined" for p in cell.runtimes or []))
    unrecorded = sum(1 for cell in passes if cell.runtimes is None)
    text = ""
    if unproven:
        text += (f" {unproven} of the passes were not run by the runtime the artifact is for (❔ not run: the "
                 "numbers and generation matched eager, that runtime's own proof did not run).")
    if declined:  # a runtime that cannot take the model: said apart, never counted as a proof that did not run
        text += (f" {declined} of the passes are declined by a runtime that cannot take the model (✗ declined: the "
                 "reason is listed; the artifact's own verdict stands).")
    if unrecorded:
        text += (f" {unrecorded} passes were measured before the matrix kept runtime proofs: whether the runtime "
                 "the artifact is for ran it is not recorded.")
    return text


def _partial(meta: dict[str, Any]) -> str:
    """The header's word on a run that stopped before all its families were measured."""
    if meta.get("complete", True):
        return ""
    unfinished = meta.get("unfinished")
    if unfinished and meta.get("kept"):
        return (f" **Partial**: the run stopped before measuring {', '.join(unfinished)}: their rows (if any) are "
                "the earlier ones.")
    return f" **Partial**: {meta.get('planned', '?')} families planned, the run stopped before the rest."


def _estimate(rows: list[Any], meta: dict[str, Any]) -> str:
    """The header's estimate of a full run on an idle machine, and how it was made."""
    if not meta.get("estimate_s"):
        return ""
    cores = meta.get("estimate_cores") or meta["jobs"]
    text = (f" A full run of these {len(rows)} families on an idle machine of {cores} cores at {cores} at a time "
            f"(`--jobs {cores}`) takes about {meta['estimate_s'] / 60:.0f} min: the CPU seconds of each family's run "
            "and of the exports it forked, summed over the families and spread over the cores.")
    missing = meta.get("untimed") or []
    if missing:
        text += (f" {len(missing)} of the {len(rows)} rows were measured before CPU time was recorded and count the "
                 "median CPU seconds of their kind's timed rows that passed a format: " + ", ".join(missing) + ".")
    return text


def _compact(exports: list[dict[str, Any]]) -> str:
    import json

    return json.dumps([{k: v for k, v in e.items() if k != "name"} for e in exports])


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")

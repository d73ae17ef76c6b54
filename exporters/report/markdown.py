"""report.md: what maintainers read in the PR, the discussion, the job summary and the sticky comment.

It opens with one table ([`variants_table`]: a row per target with its format and variant, size, speed, quality and
verdict), failed and unverified targets first with their reason in the row; then each target's details, its
per-probe table folded in `<details>`. It renders on GitHub and on the Hub and stays under 60 KB.

Example:
    >>> code_block("a ``` fence inside")
    '````\\na ``` fence inside\\n````'
    >>> cell("a | b\\nc")
    'a \\\\| b c'
    >>> cell("upstream said <!-- x")
    'upstream said &lt;!-- x'
"""

from __future__ import annotations

import re
from typing import Any

from exporters.errors import error_line, first_line

MARKDOWN_LIMIT = 60_000
ICONS = {"passed": "✅", "failed": "❌", "unverified": "⚠️", "crashed": "💥", "timed_out": "⏱️", "skipped": "⏭️"}
# Failed and unverified targets come first: they are what a reviewer must read.
ORDER = {"crashed": 0, "timed_out": 0, "failed": 0, "unverified": 1, "passed": 2}


def human_size(n: float) -> str:
    """`1536` as `1.5 KB`.

    Example:
        >>> human_size(1536), human_size(3 * 1024 ** 3)
        ('1.5 KB', '3.0 GB')
    """
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def code_block(text: str, info: str = "") -> str:
    """`text` in a fenced block that nothing inside it can close (the fence is longer than any backtick run in it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def cell(text: str, limit: int = 300) -> str:
    """`text` fit for one table cell: one line, pipes escaped, `<` escaped (an upstream message holding `<!--` or a
    tag would otherwise hide the rest of the report), cut to `limit` characters."""
    flat = " ".join(str(text).split())
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    return flat.replace("|", "\\|").replace("<", "&lt;")


_ACTIVE = re.compile(r"[\\\[\]]")  # a backslash (ours stay escapes) and brackets (links, images)
WORD_JOINER = "\u2060"  # invisible: breaks a mention or an autolink where it sits, shows nothing


def inert(text: str, limit: int = 300) -> str:
    """Text someone else wrote (a recipe's key, a repo's value) as plain text in one table cell or line that no
    renderer turns into anything: [`cell`]'s escapes (pipes, `<`), and `&`, backslashes and the brackets of links
    and images escaped; `@` and URL schemes broken by an invisible word joiner so no mention notifies anyone and no
    address becomes a link or a tracking image. Backticks and emphasis stay (a code span only makes text more inert),
    so our own messages keep their `option` formatting.

    Example:
        >>> shown = inert("unknown key '@everyone ![x](https://evil.example/a.png)'")
        >>> print(shown.replace(WORD_JOINER, "+"))
        unknown key '@+everyone !\\[x\\](https:+//evil.example/a.png)'
    """
    flat = " ".join(str(text).split())
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    flat = flat.replace("&", "&amp;")
    flat = _ACTIVE.sub(lambda m: "\\" + m[0], flat)
    flat = flat.replace("@", "@" + WORD_JOINER).replace("://", ":" + WORD_JOINER + "//")
    flat = re.sub(r"(?i)\bwww\.", lambda m: m[0][:-1] + WORD_JOINER + ".", flat)
    return flat.replace("|", "\\|").replace("<", "&lt;")


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return "0" if value == 0 else f"{value:.2e}"


def _outputs(target: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for c in target.get("components") or [] for check in c.get("checks") or []
            for o in check.get("outputs") or []]


def worst_diff(target: dict[str, Any]) -> str:
    """The largest absolute difference of any output at any probe, against its tolerance."""
    outputs = [o for o in _outputs(target) if o.get("max_abs_diff") is not None]
    if not outputs:
        return "–"
    worst = max(outputs, key=lambda o: o["max_abs_diff"])
    return f"{_fmt(worst['max_abs_diff'])} / atol {worst['atol']:g}"


def parity_cell(target: dict[str, Any]) -> str:
    """Generation parity in a few words: tokens matched, where it diverged, or that it did not run."""
    generation = target.get("generation")
    if not generation:
        return "–"
    steps = generation.get("max_new_tokens")
    tokens = generation.get("eager_tokens") or []
    if generation["status"] == "passed":
        ties = len(generation.get("near_ties") or [])
        others = "- and ".join(str(o["prompt_length"]) for o in generation.get("other_prompts") or [])
        return (f"✅ {len(tokens[0]) if tokens else steps}/{steps} tokens" + (f" ({ties} near tie(s))" if ties else "")
                + (f", also at {others}-token prompts" if others else ""))
    if generation["status"] == "failed":
        divergence = generation.get("first_divergence") or {}
        prompt = f" of a {divergence['prompt_length']}-token prompt" if divergence.get("prompt_length") else ""
        return f"❌ diverged at token {divergence['step']}{prompt}" if divergence.get("step") is not None \
            else "❌ failed"
    return "⏭️ not run"


def reason(target: dict[str, Any]) -> str:
    """Why a target did not pass, in one line ('' when it passed)."""
    if target["status"] == "passed":
        return ""
    if target.get("unverified"):
        return f"not verified: {first_line(target['unverified'][0], 200)}" + (
            f" (+{len(target['unverified']) - 1} more)" if len(target["unverified"]) > 1 else "")
    return error_line(target.get("error"), 240)


def _size(target: dict[str, Any]) -> int | None:
    """Bytes of the artifact's program files (the benchmark's count), else of every file but the manifests."""
    bench = target.get("bench") or {}
    if bench.get("size_bytes") is not None:
        return int(bench["size_bytes"])
    files = [f for f in target.get("files") or [] if not f["path"].endswith(".json")]
    return sum(f.get("size", 0) for f in files) if files else None


def _speed(target: dict[str, Any]) -> tuple[str, float, bool] | None:
    """`(group, value, higher is better)`: decode tokens/s for generation, the traced-shape latency otherwise."""
    bench = target.get("bench") or {}
    generation = bench.get("generation") or {}
    if generation.get("decode_tokens_per_s"):
        return "generation", float(generation["decode_tokens_per_s"]), True
    latency = bench.get("latency") or {}
    if latency:
        return target.get("mode") or "model", float(sum(v["median_ms"] for v in latency.values())), False
    return None


def speed_cell(target: dict[str, Any]) -> str:
    """Decode tokens/s and prefill time (generation), else the median (p90) latency at the traced shape."""
    bench = target.get("bench") or {}
    if not bench:
        return "not measured"
    if bench.get("error"):
        return "benchmark failed"
    generation = bench.get("generation")
    if generation:
        return (f"{generation['decode_tokens_per_s']:,.0f} tok/s, prefill {generation['prefill_ms']:.2f} ms "
                f"({generation['prompt_length']} tokens)")
    latency = bench.get("latency") or {}
    return ", ".join(f"{v['median_ms']:.2f} ms (p90 {v['p90_ms']:.2f})" + (f" `{n}`" if len(latency) > 1 else "")
                     for n, v in latency.items()) or "–"


def quality_cell(target: dict[str, Any]) -> str:
    """Worst difference against atol and parity (float32), or the task metrics (quantized, half-precision)."""
    quality = target.get("quality") or {}
    if quality.get("judged_by") != "metrics":
        return " · ".join([worst_diff(target)] + ([parity_cell(target)] if target.get("generation") else []))
    metrics, parts = quality.get("metrics") or {}, []
    if metrics.get("top1_agreement") is not None:
        ties = f" ({metrics['top1_ties']} ties)" if metrics.get("top1_ties") else ""
        parts.append(f"top-1 {metrics['top1_agreement']:.1%}{ties} of {metrics.get('positions')} positions{_media(metrics)}")
    if metrics.get("kl") is not None:
        parts.append(f"KL {metrics['kl']:.2g}")
    if metrics.get("cosine") is not None:
        parts.append(f"cos {metrics['cosine']:.4f}")
    if metrics.get("greedy_match") is not None:
        parts.append(f"greedy {metrics['greedy_match']} matched (≥ {metrics.get('greedy_required')})")
    elif target.get("generation"):
        parts.append(parity_cell(target))
    return " · ".join(parts) or "–"


def _variant(target: dict[str, Any]) -> str:
    # what was quantized; else, for a target that failed before it was, what its recipe asked (never "fp32")
    quantization = target.get("quantization") or target.get("quantize_asked") or {}
    if quantization:
        scheme = (quantization.get("options") or {}).get("scheme")
        held = target.get("artifact_dtype") or ""  # what the files hold, read from them (quantized: described)
        return quantization["method"] + (f" {scheme}" if scheme else "") + (f" · {held}" if " weights" in held else "")
    dtype = target.get("artifact_dtype") or target.get("dtype")  # what the files hold, where it was read
    return str(dtype) if dtype in ("float16", "bfloat16") else "fp32"


def _marks(targets: list[dict[str, Any]]) -> tuple[str | None, set[str]]:
    """The smallest passing target, and the fastest passing one of each kind (generation, model)."""
    passing = [t for t in targets if t["status"] == "passed"]
    sizes = {t["name"]: size for t in passing if (size := _size(t)) is not None}
    smallest = min(sizes, key=lambda name: sizes[name]) if len(sizes) > 1 else None
    groups: dict[str, list[tuple[float, bool, str]]] = {}
    for target in passing:
        speed = _speed(target)
        if speed is not None:
            groups.setdefault(speed[0], []).append((speed[1], speed[2], target["name"]))
    return smallest, {(max(e) if e[0][1] else min(e))[2] for e in groups.values() if len(e) > 1}


def variants_table(report: dict[str, Any], names: list[str] | None = None, runtime_details: bool = True) -> list[str]:
    """The one table of a run (or of the targets `names`): variant, format, size, latency / tokens per second,
    quality, verdict; failed and unverified first with their reason, the smallest and the fastest passing variant
    marked; then one line per variant naming the metric that decided, and the machine the timings come from.
    report.md opens with it (so the PR description and the Action's job summary show it); the sticky comment and
    the model card's Exports section call it too. Without `runtime_details` the "runs in" cells hold each runtime's
    mark alone (a table too long for a PR description otherwise: report.json keeps what each showed).

    Example:
        >>> variants_table({"targets": []})
        []
    """
    targets = [t for t in report.get("targets", []) if names is None or t["name"] in names]
    if not targets:
        return []
    smallest, fastest = _marks(targets)
    proven = any(t.get("runtimes") for t in targets)  # a "runs in" column once a target was run by its runtime
    lines = ["| variant | format | size | latency / tokens per second | quality |" + (" runs in |" if proven else "")
             + " verdict |", "|---|---|---|---|---|" + ("---|" if proven else "") + "---|"]
    for target in sorted(targets, key=lambda t: ORDER.get(t["status"], 0)):
        marks = (" 🪶 smallest" if target["name"] == smallest else "") + (
            " ⚡ fastest" if target["name"] in fastest else "")
        verdict = f"{ICONS.get(target['status'], '')} {target['status']}"
        why = reason(target)
        verdict += (f": {inert(why, 400)}" if why else "") + (" (cached)" if target.get("cached") else "")
        size = _size(target)
        lines.append(f"| `{target['name']}`{marks} | {target['export_format']} · {target['mode']} · "
                     f"{_variant(target)} | {human_size(size) if size else '–'} | {speed_cell(target)} | "
                     f"{quality_cell(target)} | " + (f"{runtime_cell(target.get('runtimes'), 120 if runtime_details else 0)} | " if proven else "")
                     + f"{verdict} |")
    lines.append("")
    decided = [t for t in targets if (t.get("quality") or {}).get("decided_by")]
    for target in decided:
        quality = target["quality"]
        judged = "atol/rtol" if quality.get("judged_by") == "tolerance" else "task metrics"
        lines.append(f"- `{target['name']}` ({quality.get('kind')}, judged by {judged}): "
                     f"{cell(str(quality['decided_by']), 300)}")
    lines += [""] if decided else []
    benched = [t for t in targets if t.get("bench") and not t["bench"].get("error")]
    if benched:
        machines = {t["name"]: machine_line(t["bench"].get("machine") or report.get("machine")) for t in benched}
        where = next(iter(machines.values())) if len(set(machines.values())) == 1 else "; ".join(
            f"`{name}` on {line}" for name, line in machines.items())
        counts = {(t["bench"].get("timed_runs"), t["bench"].get("warmup_runs")) for t in benched}
        timed, warmups = next(iter(counts)) if len(counts) == 1 else (None, None)
        runs = f"of {timed} runs after {warmups} warm-ups" if timed and warmups else "of the timed runs after warm-ups"
        lines += [f"<sub>Timed with each artifact's own runtime on {where}: median (p90) {runs} at the traced shape; tokens per second over `max_new_tokens` greedy decode "
                  "steps.</sub>", ""]
    return lines


def _measured(quality: dict[str, Any]) -> str:
    if quality.get("positions"):
        ties = f" + {quality['top1_ties']} ties" if quality.get("top1_ties") else ""
        return (f"top-1 {quality['top1_matches']}/{quality['positions']}{ties}, "
                f"KL {quality['kl_sum'] / quality['positions']:.2g}{_media(quality)}")
    return f"cos {quality['cosine']:.4f}{_media(quality)}" if quality.get("cosine") is not None else _media(quality)[2:] or "–"


def _media(metrics: dict[str, Any]) -> str:  # an image's (audio's) rows a budget does not judge: validate.judged_rows
    return f", {metrics['media_positions']} image/audio rows not judged" if metrics.get("media_positions") else ""


def _probe_rows(target: dict[str, Any]) -> list[str]:
    rows = ["| component | probe | shapes | worst abs diff | tolerance | verdict |", "|---|---|---|---|---|---|"]
    for component in target.get("components") or []:
        for check in component.get("checks") or []:
            outputs = check.get("outputs") or []
            worst = max(outputs, key=lambda o: (o["max_abs_diff"] is None, o["max_abs_diff"] or 0), default=None)
            diff = f"{_fmt(worst['max_abs_diff'])} (`{worst['name']}`)" if worst else "–"
            tolerance = f"atol {worst['atol']:g}, rtol {worst['rtol']:g}" if worst else "–"
            if check.get("quality"):  # a quantized or half-precision target: task metrics, judged on the whole
                diff, tolerance = _measured(check["quality"]), "task metrics"
            verdict = check.get("verdict") or ("skipped" if check.get("skipped") else
                                               "passed" if check.get("passed") else "failed")
            text = ICONS.get(verdict, verdict)
            if check.get("error"):
                text += f" {cell(check['error'], 160)}"
            shapes = ", ".join(f"{k} {v}" for k, v in list((check.get("shapes") or {}).items())[:3])
            rows.append(f"| `{component['name']}` | `{check['probe']}` | {cell(shapes, 80) or '–'} | {diff} | "
                        f"{tolerance} | {text} |")
    return rows


def _generation_details(generation: dict[str, Any]) -> list[str]:
    """How parity selected tokens: the cache driven, eager's logits processors (applied to both sides), near ties."""
    cache = generation.get("cache") or {}
    parts = []
    if cache.get("implementation") == "static":
        parts.append(f"static cache of {cache.get('max_cache_len')} positions")
    processors = generation.get("logits_processors")
    if processors is not None:
        names = ", ".join(f"`{name}`" for name in processors) or "none"
        parts.append(f"eager `generate()`'s logits processors, applied to both sides: {names}")
    lines = [f"Parity: {'; '.join(parts)}.", ""] if parts else []
    for tie in (generation.get("near_ties") or [])[:20]:
        lines.append(f"- near tie at step {tie['step']} (batch {tie['batch']}): eager {tie['eager']}, exported "
                     f"{tie['exported']}, eager score gap {tie['eager_score_gap']:.3g} within tolerance "
                     f"{tie['tolerance']:.3g}; decoding went on with eager's token")
    return lines + [""] if generation.get("near_ties") else lines


def render_target(target: dict[str, Any], details: bool = True) -> list[str]:
    """One target's details: the reason it did not pass, its probes (folded), parity, files, log excerpt
    (`details=False`: without the probe and file tables, to fit the size limit)."""
    icon = ICONS.get(target["status"], "")
    cached = " (cached: inputs unchanged)" if target.get("cached") else ""
    lines = [f"### {icon} `{target['name']}` — {target['export_format']}, {target['mode']} mode: "
             f"**{target['status']}**{cached}", ""]
    if target.get("error"):  # the line that says what to change; the whole message and traceback: the log
        where = f" · full message and traceback: `{cell(target['log'], 200)}`" if target.get("log") else ""
        kind = str(target["error"].get("type") or "Error")
        said = error_line(target["error"], 600).removeprefix(f"{kind}: ")
        lines += [f"> **{cell(kind, 100)}**: {inert(said, 1200)}{where}", ""]
    if target.get("unverified"):
        lines += ["> **Not verified**: these checks did not run, so this target is not a pass:", ">"]
        lines += [f"> - {cell(line, 300)}" for line in target["unverified"][:20]] + [""]
    checks = sum(len(c.get("checks") or []) for c in target.get("components") or [])
    if checks and details:
        lines += [f"<details><summary>{checks} probe(s) of {len(target['components'])} component(s)</summary>", "",
                  *_probe_rows(target), "", "</details>", ""]
    generation = target.get("generation")
    if generation:
        text = (f"**Generation parity** {ICONS.get(generation['status'], '')} {generation['status']}: greedy "
                f"{generation['max_new_tokens']} tokens")
        if generation.get("first_divergence"):
            text += f"; first divergence {generation['first_divergence']}"
        if generation.get("reason"):
            text += f" — {cell(generation['reason'], 300)}"
        others = [f"{o['prompt_length']} tokens {o['status']}" for o in generation.get("other_prompts") or []]
        if others:
            text += f"; the prompt stepped at other lengths too: {', '.join(others)}"
        lines += [text, ""] + _generation_details(generation)
    files = target.get("files") or []
    timings = target.get("timings") or {}
    if timings or files:
        parts = [f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items() if isinstance(v, (int, float))]
        stored, parameters = target.get("weights_stored_bytes"), target.get("parameter_bytes")
        weights = f" · weights stored {stored / parameters:.2f}x the parameters" if stored and parameters else ""
        lines += [f"Timings: {', '.join(parts) or '–'} · {len(files)} files, "
                  f"{human_size(sum(f['size'] for f in files))}{weights}", ""]
    if files and details:
        lines += ["<details><summary>Files</summary>", "", "| file | size | sha256 |", "|---|---|---|"]
        lines += [f"| `{cell(f['path'], 200)}` | {human_size(f['size'])} | `{f['sha256'][:16]}…` |" for f in files]
        lines += ["", "</details>", ""]
    if target["status"] != "passed":
        if target.get("reproduce"):
            lines += [f"Reproduce: `{target['reproduce']}`", ""]
        excerpt = (target.get("error") or {}).get("log_excerpt")
        if excerpt:
            lines += ["<details><summary>Log excerpt</summary>", "", code_block(excerpt[-4000:]), "", "</details>",
                      ""]
    return lines


def headline(report: dict[str, Any]) -> str:
    """`⚠️ **unverified**: 1 passed, 1 unverified for `model` @ `sha` (recipe ...)`."""
    targets = report["targets"]
    counts: dict[str, int] = {}
    for target in targets:
        counts[target["status"]] = counts.get(target["status"], 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda i: ORDER.get(i[0], 0)))
    source = report["source"]
    revision = f" @ `{source['revision'][:12]}`" if source.get("revision") else ""
    return (f"{ICONS.get(report['status'], '')} **{report['status']}**: {tally or 'no target'} of {len(targets)} "
            f"for `{source['model']}`{revision} (recipe `{report['recipe']['file']}`, sha256 "
            f"`{report['recipe']['sha256'][:12]}`)")


def render_markdown(report: dict[str, Any], details: bool = True) -> str:
    """The report as GitHub/Hub-flavoured Markdown, under 60 KB: the summary table first, then the details (the
    probe and file tables are left out when the whole would not fit; report.json always has everything)."""
    targets = report["targets"]
    table = variants_table(report)
    if len("\n".join(table).encode()) > MARKDOWN_LIMIT // 2:  # the table stays whole: runtimes' marks alone
        table = variants_table(report, runtime_details=False)
    lines = ["## Export report", "", headline(report), "", *table]
    for target in sorted(targets, key=lambda t: ORDER.get(t["status"], 0)):
        lines += render_target(target, details)
    if report.get("findings"):
        lines += ["<details><summary>Findings</summary>", ""]
        lines += [f"- {cell(f, 600)}" for f in report["findings"]] + ["", "</details>", ""]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines += [f"<sub>{versions}</sub>", ""]
    text = "\n".join(lines)
    if len(text.encode()) > MARKDOWN_LIMIT and details:
        return render_markdown(report, details=False)
    if len(text.encode()) > MARKDOWN_LIMIT:
        note = "\n\n_Report truncated to fit a PR description; the full report is `report.json`._\n"
        text = text.encode()[: MARKDOWN_LIMIT - len(note.encode())].decode(errors="ignore") + note
    return text


def machine_line(machine: dict[str, Any] | None) -> str:
    """`Intel Xeon …, 2 cores, 23.5 GB, no GPU`."""
    if not machine:
        return "unknown machine"
    cores = f"{machine.get('cores')} cores"
    if machine.get("usable_cores") not in (None, machine.get("cores")):
        cores += f" ({machine['usable_cores']} usable)"
    memory = f", {machine['memory_gb']} GB" if machine.get("memory_gb") else ""
    return f"{machine.get('cpu')}, {cores}{memory}, {machine.get('gpu') or 'no GPU'}"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)


def close_fences(text: str) -> str:
    """`text`, with the code fence it leaves open (if any) closed, so what follows it is not swallowed."""
    opened = None
    for match in _FENCE.finditer(text):
        fence = match.group(1)
        if opened is None:
            opened = fence
        elif fence[0] == opened[0] and len(fence) >= len(opened) and not text[match.end():].split("\n", 1)[0].strip():
            opened = None
    return f"{text}\n{opened}" if opened else text


# "declined": the runtime cannot take this model (said why); the artifact's own verdict stands
RUNTIME_MARKS = {"passed": "✓", "failed": "✗", "unverified": "–", "declined": "✗"}


def runtime_cell(proofs: list[dict[str, Any]] | None, detail_chars: int = 120) -> str:
    """The report's "runs in" cell: each deployment runtime with its mark and what it showed (at most `detail_chars`
    of it), as inert text (a merged matrix leg's proofs are data from another machine: no link, image or mention).

    Example:
        >>> runtime_cell([{"runtime": "ONNX Runtime GenAI", "status": "passed", "detail": "8/8 tokens"},
        ...               {"runtime": "optimum", "status": "unverified", "detail": "not installed"}])
        'ONNX Runtime GenAI ✓ 8/8 tokens · optimum – not installed'
    """
    if not proofs:
        return "–"
    return " · ".join(f"{inert(p.get('runtime'), 60)} {RUNTIME_MARKS.get(str(p.get('status')), '?')} "
                      f"{inert(p.get('detail') or '', detail_chars) if detail_chars else ''}".rstrip() for p in proofs
                      if isinstance(p, dict))

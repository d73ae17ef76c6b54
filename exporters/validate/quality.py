"""Quality of quantized and half-precision artifacts: task metrics against the eager float32 model, on the same
probes as every other check. A float32 artifact is held to atol/rtol; these artifacts cannot be, and are never
passed by loosening atol.

Per probe ([`measure`]): for outputs named `*logits`, the top-1 agreement of every position and the KL divergence
KL(eager ‖ artifact) of its next-token distribution (for a half-precision artifact, a position whose argmax differs
only between tokens eager itself scores within the dtype's tolerance of each other is a tie, not a disagreement: each
score may move by that much in a correct half-precision program, as in generation parity's near ties); for
components without logits, the cosine similarity of their hidden states (`last_hidden_state`, `pooler_output`, else
every float output), per vector (each position's hidden state), keeping the lowest. Pooled over all probes of a
target ([`judge`]): agreement (ties counted, and reported as `top1_ties`) and mean KL over every judged position, the
lowest cosine of any vector, and for generation targets the greedy tokens that match eager before the first
divergence. The budget (`exporters.recipe.budgets.resolve_budget`) decides, and the verdict names the metric that did.

A decoder fed an image's (audio's) features is judged on its text positions only (`rows`: the probe's rows a runtime
reads the logits of, `exporters.validate.judged_rows`); its image (audio) rows are counted apart
(`media_positions`), and still checked for NaN and shape. The metrics say over how many `positions` they were taken.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])
    >>> m = measure({"logits": logits}, {"logits": logits * 0.9})
    >>> (m["positions"], m["top1_matches"], m["kl_sum"] < 0.01)
    (2, 2, True)
    >>> flat = torch.tensor([[[3.0, 2.995, 0.0]]])  # eager's top two 0.005 apart: a half-precision tie
    >>> measure({"logits": flat}, {"logits": flat[..., [1, 0, 2]]}, ties=(1e-2, 1e-2))["top1_ties"]
    1
    >>> text_only = measure({"logits": logits}, {"logits": logits.flip(-1)}, rows=torch.tensor([[False, True]]))
    >>> (text_only["positions"], text_only["top1_matches"], text_only["media_positions"])  # row 0 an image's
    (1, 0, 1)
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.upstream import leaf_tensors

HIDDEN_STATES = ("last_hidden_state", "pooler_output", "encoder_last_hidden_state")
# (budget key, metric, at least (True) or at most (False), words)
RULES = (
    ("min_greedy_match", "greedy_match", True, "greedy tokens matching eager"),
    ("min_top1_agreement", "top1_agreement", True, "top-1 agreement"),
    ("max_kl", "kl", False, "next-token KL"),
    ("min_cosine", "cosine", True, "hidden-state cosine"),
)


def measure(reference: Any, actual: Any, ties: tuple[float, float] | None = None,
            rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Quality metrics of one probe: `positions`, `top1_matches`, `top1_ties`, `kl_sum`, `kl_max` over logits,
    `cosine` (the lowest cosine of any one hidden-state vector), and `problems` (a missing, misshapen or non-finite
    output: never a pass). `ties`: the `(atol, rtol)` within which eager's scores of its own top-1 and the artifact's
    make a differing argmax a tie ([`top1_ties`]); None counts every differing argmax as a disagreement. `rows`: the
    positions judged (bool, the judged outputs' leading `[batch, seq]`), the others counted in `media_positions`;
    None judges every position."""
    want, got = leaf_tensors(reference), leaf_tensors(actual)
    logits = [name for name in want if name.rsplit(".", 1)[-1].endswith("logits")]
    hidden = [name for name in want if name.rsplit(".", 1)[-1] in HIDDEN_STATES]
    judged = logits or hidden or [name for name, tensor in want.items() if tensor.is_floating_point()]
    result: dict[str, Any] = {"positions": 0, "top1_matches": 0, "top1_ties": 0, "kl_sum": 0.0, "kl_max": 0.0,
                              "cosine": None, "media_positions": 0, "problems": []}
    for name in judged:
        value = got.get(name)
        if value is None:
            result["problems"].append(f"'{name}' is missing from the artifact's outputs")
            continue
        ref = want[name].detach().cpu().float()
        val = value.detach().cpu().float()
        if tuple(ref.shape) != tuple(val.shape):
            result["problems"].append(f"'{name}' has shape {list(val.shape)}, eager {list(ref.shape)}")
            continue
        if not torch.isfinite(val).all():
            result["problems"].append(f"'{name}' holds NaN or inf")
            continue
        if ref.numel() == 0:
            continue
        if rows is not None and (name in logits or ref.dim() > 1):
            ref, val = _judged(name, ref, rows), _judged(name, val, rows)
            result["media_positions"] += int((~rows).sum())
            if ref.numel() == 0:
                continue
        if name in logits:
            ref2, val2 = ref.reshape(-1, ref.shape[-1]), val.reshape(-1, val.shape[-1])
            log_p, log_q = torch.log_softmax(ref2, -1), torch.log_softmax(val2, -1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0)
            result["positions"] += int(ref2.shape[0])
            eager_top, artifact_top = ref2.argmax(-1), val2.argmax(-1)
            result["top1_matches"] += int((eager_top == artifact_top).sum())
            if ties is not None:
                result["top1_ties"] += top1_ties(ref2, eager_top, artifact_top, ties)
            result["kl_sum"] += float(kl.sum())
            result["kl_max"] = max(result["kl_max"], float(kl.max()))
        else:
            vectors = ref.reshape(-1, ref.shape[-1]) if ref.dim() > 1 else ref.reshape(1, -1)
            others = val.reshape(vectors.shape)
            # the lowest per vector, as the budget promises: a mean would hide one reversed vector among hundreds
            per_vector = torch.nn.functional.cosine_similarity(vectors, others, dim=-1, eps=1e-12)
            zero = (vectors.norm(dim=-1) == 0) & (others.norm(dim=-1) == 0)  # both zero: the same vector
            cosine = float(torch.where(zero, torch.ones_like(per_vector), per_vector).min())
            result["cosine"] = cosine if result["cosine"] is None else min(result["cosine"], cosine)
    return result


def _judged(name: str, values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The `[judged rows, width]` of an output whose leading dims are the probe's `[batch, seq]` (`rows`' shape)."""
    if tuple(values.shape[:-1]) != tuple(rows.shape):
        raise ValueError(f"'{name}' of shape {list(values.shape)} does not lead with the judged rows' "
                         f"{list(rows.shape)}")
    return values[rows.to(torch.bool)]


def top1_ties(eager: torch.Tensor, eager_top: torch.Tensor, artifact_top: torch.Tensor,
              tolerance: tuple[float, float]) -> int:
    """Positions (rows of eager's `[positions, vocab]` scores) whose argmax differs between eager and the artifact
    only as a tie: eager scores its own top-1 at most `2 atol + rtol (|s_eager| + |s_artifact|)` above the artifact's
    top-1, each score allowed to move by `atol + rtol |score|` (generation parity's near-tie rule,
    `exporters.validate.greedy.is_near_tie`).

    Example:
        >>> scores = torch.tensor([[3.0, 2.995, 0.0], [3.0, 0.0, 2.0]])
        >>> top1_ties(scores, torch.tensor([0, 0]), torch.tensor([1, 2]), (1e-2, 1e-2))  # 0.005 a tie, 1.0 not
        1
    """
    atol, rtol = tolerance
    rows = torch.arange(eager.shape[0])
    mine, theirs = eager[rows, eager_top], eager[rows, artifact_top]
    allowance = 2 * atol + rtol * (mine.abs() + theirs.abs())
    tie = (eager_top != artifact_top) & torch.isfinite(mine) & torch.isfinite(theirs) & (mine - theirs <= allowance)
    return int(tie.sum())


def greedy_match(generation: dict[str, Any] | Any) -> tuple[int, int] | None:
    """`(matched, available)`: greedy tokens equal to eager's before the first divergence (the fewest over the
    batch), and how many eager produced; None when generation did not run."""
    get = generation.get if isinstance(generation, dict) else lambda key: getattr(generation, key, None)
    eager, exported = get("eager_tokens"), get("exported_tokens")
    if not eager or exported is None:
        return None
    matched, available = None, None
    for row, want in enumerate(eager):
        have = exported[row] if row < len(exported) else []
        count = 0
        for a, b in zip(want, have):
            if a != b:
                break
            count += 1
        matched = count if matched is None else min(matched, count)
        available = len(want) if available is None else min(available, len(want))
    return matched or 0, available or 0


def judge_generation(generation: Any, budget: dict[str, Any]) -> None:
    """Judge a quantized target's generation by `min_greedy_match` instead of token-for-token identity: sets
    `matched_tokens`, `required_tokens` and the status on the report."""
    if generation is None or generation.status == "skipped" or generation.reason:
        return
    counts = greedy_match(generation)
    if counts is None:
        return
    matched, available = counts
    required = min(int(budget.get("min_greedy_match", 0)), available)
    generation.matched_tokens, generation.required_tokens = matched, required
    generation.status = "passed" if matched >= required else "failed"
    for other in getattr(generation, "other_prompts", None) or []:  # a stepped prompt's other lengths, alike
        counts = greedy_match(other) if other["status"] != "skipped" and not other.get("reason") else None
        if counts is None:  # it did not run (unverified), or it raised (failed)
            generation.status = other["status"] if generation.status == "passed" else generation.status
            continue
        other["matched_tokens"], other["required_tokens"] = counts[0], min(required, counts[1])
        other["status"] = "passed" if counts[0] >= other["required_tokens"] else "failed"
        generation.status = "failed" if other["status"] == "failed" else generation.status


def judge(kind: str, budget: dict[str, Any], probes: list[tuple[str, str, dict[str, Any]]],
          generation: Any) -> dict[str, Any]:
    """The target's quality verdict from its probes (`(component, probe, measure(...))`) and generation report:
    `{kind, judged_by, budget, metrics, passed, decided_by}`; `passed` is None when no metric could be measured."""
    positions = sum(q["positions"] for _, _, q in probes)
    cosines = [(q["cosine"], f"{c} at {p}") for c, p, q in probes if q["cosine"] is not None]
    metrics: dict[str, Any] = {
        "probes": len(probes),
        "positions": positions,
        # a tie (eager's own top two within the dtype's tolerance) is no disagreement: see the module
        "top1_agreement": (sum(q["top1_matches"] + q.get("top1_ties", 0) for _, _, q in probes) / positions
                           if positions else None),
        "top1_ties": sum(q.get("top1_ties", 0) for _, _, q in probes) if positions else None,
        "kl": sum(q["kl_sum"] for _, _, q in probes) / positions if positions else None,
        "kl_max": max((q["kl_max"] for _, _, q in probes), default=None) if positions else None,
        "cosine": min(cosines)[0] if cosines else None,
    }
    media = sum(q.get("media_positions", 0) for _, _, q in probes)
    if media:  # an image's (audio's) rows: no runtime reads their logits (exporters.validate.judged_rows)
        metrics["media_positions"] = media
    if generation is not None and getattr(generation, "matched_tokens", None) is not None:
        metrics["greedy_match"] = generation.matched_tokens
        metrics["greedy_required"] = generation.required_tokens
    verdict = {"kind": kind, "judged_by": "metrics", "budget": dict(budget), "metrics": metrics}
    problems = [f"{c} at {p}: {problem}" for c, p, q in probes for problem in q["problems"]]
    if problems:
        return {**verdict, "passed": False, "decided_by": f"broken outputs: {problems[0]}"}
    if generation is not None and generation.status == "failed" and getattr(generation, "reason", None):
        return {**verdict, "passed": False, "decided_by": f"generation could not run: {generation.reason[:200]}"}
    outcomes = []
    for key, metric, at_least, words in RULES:
        value = metrics.get(metric)
        if value is None or key not in budget:
            continue
        limit = metrics["greedy_required"] if metric == "greedy_match" else budget[key]
        ok = value >= limit if at_least else value <= limit
        margin = (value - limit if at_least else limit - value) / (abs(limit) or 1.0)
        outcomes.append((ok, margin, _describe(metric, value, limit, at_least, ok, words, key)))
    if not outcomes:
        return {**verdict, "passed": None, "decided_by": "no quality metric could be measured"}
    failing = [text for ok, _, text in outcomes if not ok]
    if failing:
        return {**verdict, "passed": False, "decided_by": failing[0]}
    tightest = min(outcomes, key=lambda outcome: outcome[1])[2]
    return {**verdict, "passed": True, "decided_by": tightest}


def _describe(metric: str, value: float, limit: float, at_least: bool, ok: bool, words: str, key: str) -> str:
    def fmt(number: float) -> str:
        if metric == "top1_agreement":  # two decimals where one would show 97.96% as the 98.0% it missed
            return f"{number:.1%}" if round(number, 3) == round(number, 4) else f"{number:.2%}"
        if metric == "greedy_match":
            return f"{int(number)}"
        return f"{number:.3g}"

    sign = (">=" if ok else "<") if at_least else ("<=" if ok else ">")
    return f"{words} {fmt(value)} {sign} {fmt(limit)} ({key})"


def tolerance_verdict(components: list[dict[str, Any]], generation: dict[str, Any] | None,
                      status: str) -> dict[str, Any]:
    """A float32 target's verdict line: the worst difference against its atol/rtol, and greedy identity
    (`passed`: None when the target is unverified)."""
    worst = None
    for component in components:
        for check in component.get("checks", []):
            for output in check.get("outputs") or []:
                diff = output.get("max_abs_diff")
                if diff is None:
                    continue
                # how close to failing: abs diff against atol + rtol * |ref| is not stored, so compare to atol
                candidate = (not output["passed"], diff / (output["atol"] or 1e-30), component["name"],
                             check["probe"], output)
                if worst is None or candidate[:2] > worst[:2]:
                    worst = candidate
    metrics: dict[str, Any] = {"max_abs_diff": worst[4]["max_abs_diff"] if worst else None}
    counts = greedy_match(generation) if generation else None
    if counts is not None:
        metrics["greedy_match"], metrics["greedy_required"] = counts[0], counts[1]
    if worst is None:
        decided = "no output comparison ran"
    else:
        _, _, component, probe, output = worst
        relation = "within" if output["passed"] else "beyond"
        decided = (f"worst |Δ| {output['max_abs_diff']:.2e} at {component} {probe}, {relation} atol "
                   f"{output['atol']:g} / rtol {output['rtol']:g}")
    if generation and generation.get("status") == "failed":
        decided = f"greedy tokens differ from eager at step {(generation.get('first_divergence') or {}).get('step')}"
    passed = {"passed": True, "unverified": None}.get(status, False)
    return {"kind": "fp32", "judged_by": "tolerance", "metrics": metrics, "passed": passed, "decided_by": decided}

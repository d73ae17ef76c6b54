"""The ExecuTorch LLM runner's layout: which targets get it, and its one component.

A decoder-only ExecuTorch generation target is, by default (`layout` unset or `"runner"`), one program in the contract
of executorch's LLM runner (`TextLLMRunner`, the runner behind its iOS/Android apps) and optimum-executorch:
`forward(tokens int64[1, seq], cache_position int64[seq]) -> logits`, the KV cache (static, `max_cache_len`
positions) held in the program as mutable buffers, `seq` dynamic so the prompt goes in one call, constant metadata
methods beside it (`exporters.upstream.llm_runner`). `layout: "methods"` keeps the program with a method per
component (prefill + decode taking and returning the cache), for callers that manage the cache themselves;
encoder-decoder and vision-language targets always have that layout.

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
    >>> wants_runner(target, "text", "static", batch_size=1)
    True
    >>> wants_runner(target, "seq2seq", "static", batch_size=1)
    False
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.merged import MERGED
from exporters.capture.probes import DimBinding
from exporters.capture.families import a_model_of
from exporters.errors import TargetPlanError
from exporters.upstream import llm_runner

RUNNER, METHODS = "runner", "methods"
# What loads a `methods` program (said in the report: neither LLM runtime does; docs/recipe.md)
METHODS_NOTE = ("model.pte holds a method per component ({methods}), its generation steps taking and returning the "
                "cache: it runs in ExecuTorch's runtime (Python `executorch.runtime`, C++ `Module`) with your own "
                "loop feeding the cache, as validation ran it; ExecuTorch's LLM runner and optimum-executorch do not "
                "load it (they need `forward(tokens, cache_position)` with the cache inside the program{hint})")
# A program past this size cannot hold its weights inside (flatbuffer offsets are 32-bit).
PTE_WEIGHTS_LIMIT = 2 * 1024**3


def layout_of(target: Any) -> str | None:
    """The target's ExecuTorch layout as the recipe says it (None: the default for its model)."""
    return getattr(target, "layout", None) if target.export_format == "executorch" else None


STATE_LAYERS = ("the model's cache has state-space layers ({kinds}): the runner program runs the whole prompt in "
                "one call through their scan, which torch.export fixes at the traced length, and its static cache "
                "holds key-value buffers only (docs/upstream-gaps.md #27)")


def wants_runner(target: Any, family: str, cache_implementation: str, batch_size: int = 1,
                 sliding_window: int | None = None, max_cache_len: int | None = None,
                 state_layers: list[str] | None = None) -> bool:
    """Whether an ExecuTorch target is exported in the runner's layout: asked (`layout: "runner"`), or by default
    for a decoder-only generation target with a static cache at batch 1 and no component settings of the methods
    layout. A model with sliding-window layers shorter than its cache gets them in ring buffers of ExecuTorch's LLM
    custom ops (as optimum-executorch does), so it keeps the methods layout where the target turns those ops off
    ([`refused`] checks the model's default), and so does a model whose cache has state-space layers
    (`state_layers`: [`exporters.capture.cache_settings.state_space_layers`]). Raises [`TargetPlanError`] when `"runner"` is asked
    for what it cannot hold."""
    if target.export_format != "executorch" or target.mode != "generation":
        return False
    layout = layout_of(target)
    if layout == METHODS:
        return False
    reasons = [f"this is {a_model_of(family)} (the runner runs decoder-only text models)"] if family != "text" else []
    reasons += program_reasons(target, cache_implementation, batch_size)
    if set(target.components) - {MERGED} or target.dynamic_shapes or target.merged is False:
        reasons.append("the target sets per-component settings or dynamic_shapes of the methods layout")
    if windowed(sliding_window, max_cache_len) and getattr(target, "custom_ops", None) is False:
        reasons.append(WINDOW_WITHOUT_CUSTOM_OPS.format(window=sliding_window))
    if state_layers:
        reasons.append(STATE_LAYERS.format(kinds=", ".join(state_layers)))
    if not reasons:
        return True
    if layout == RUNNER:
        raise TargetPlanError(f"layout 'runner' cannot be exported: {'; '.join(reasons)}; use layout 'methods'",
                              option="layout")
    return False


def windowed(sliding_window: int | None, max_cache_len: int | None) -> bool:
    """Whether the model has sliding-window layers shorter than the cache (the runner program holds them in a ring
    buffer: `exporters.upstream.llm_runner.ring_windows`)."""
    return sliding_window is not None and (max_cache_len is None or sliding_window < max_cache_len)


# the ring buffer of a sliding-window layer is written and read by ExecuTorch's LLM custom ops
WINDOW_WITHOUT_CUSTOM_OPS = ("the model has sliding-window layers (window {window}, shorter than the cache), which the "
                             "runner program holds in a ring buffer through ExecuTorch's LLM custom ops, and the "
                             "program does not use them")


FED_IN_CHUNKS = "the runner feeds a longer prompt in chunks of it"


def ring_note(window: int | None, max_cache_len: int | None, fed: str = FED_IN_CHUNKS) -> str | None:
    """What the report says of a runner program whose sliding-window layers are shorter than its cache (`fed`: how
    the runner keeps a call within the window).

    Example:
        >>> ring_note(512, 2048)[:87]
        'the sliding-window layers (window 512) are held in ring buffers of 1024 slots, not 2048'
    """
    if not windowed(window, max_cache_len):
        return None
    return (f"the sliding-window layers (window {window}) are held in ring buffers of {2 * window} slots, not "
            f"{max_cache_len} (ExecuTorch's CustomRingKVCache, as optimum-executorch exports them): one call takes "
            f"at most {window} tokens (get_max_seq_len), and {fed}")


def program_reasons(target: Any, cache_implementation: str, batch_size: int) -> list[str]:
    """Why a target cannot be one program of an ExecuTorch runner (the LLM, multimodal and ASR runners alike): each
    holds a static cache, runs batch 1 and is lowered for XNNPACK.

    Example:
        >>> from types import SimpleNamespace
        >>> program_reasons(SimpleNamespace(backend="xnnpack"), "static", batch_size=2)
        ['inputs.batch_size is 2 (the runner runs batch 1)']
    """
    reasons = []
    if cache_implementation != "static":
        reasons.append("the recipe's generation.cache_implementation is 'dynamic' (the runner's program holds a static "
                       "cache)")
    if batch_size != 1:
        reasons.append(f"inputs.batch_size is {batch_size} (the runner runs batch 1)")
    if target.backend != "xnnpack":
        reasons.append(f"backend {target.backend!r} (the runner layout is lowered for XNNPACK)")
    return reasons


def methods_note(target: Any, state_layers: list[str]) -> list[str]:
    """What the report says when an ExecuTorch generation target whose recipe leaves `layout` unset gets the methods
    layout because the model's cache has state-space layers (nothing otherwise)."""
    if target.export_format != "executorch" or target.mode != "generation" or layout_of(target) or not state_layers:
        return []
    return ["the ExecuTorch program has a method per component (layout 'methods'), not the LLM runner's layout: "
            + STATE_LAYERS.format(kinds=", ".join(state_layers))]


def custom_ops_of(target: Any, model: Any) -> bool:
    """Whether the runner program uses executorch's LLM custom ops (`custom_ops`). By default, where the model's
    attention is dispatched through transformers' attention interface (where `llama::custom_sdpa` takes its place)
    and does not cap its scores: a model that computes attention in its own code (an ALiBi bias added to the scores:
    BLOOM, Falcon) would read the custom cache's buffers through that code, which computes something else
    (measured: BLOOM's logits off by 0.5), and `llama::custom_sdpa` has no soft cap (Gemma 2's
    `attn_logit_softcapping`), so those get the standard ops."""
    value = getattr(target, "custom_ops", None)
    return attention_dispatched(model) and not softcapped(model) if value is None else bool(value)


def attention_dispatched(model: Any) -> bool:
    """Whether the model's attention layers call transformers' attention interface (its implementation can be set)."""
    return bool(type(model)._can_set_attn_implementation())


def softcapped(model: Any) -> bool:
    """Whether the model caps its attention scores (`attn_logit_softcapping`: Gemma 2), which `llama::custom_sdpa`
    cannot.

    Example:
        >>> from transformers import Gemma2Config, Gemma3TextConfig
        >>> [softcapped(type("M", (), {"config": c})()) for c in (Gemma2Config(), Gemma3TextConfig())]
        [True, False]
    """
    return getattr(model.config.get_text_config(), "attn_logit_softcapping", None) is not None


def custom_ops_off(model: Any) -> str:
    """What the report says when the runner program gets the standard ops by default ([`custom_ops_of`])."""
    why = (f"{type(model).__name__} caps its attention scores (attn_logit_softcapping), which llama::custom_sdpa "
           "does not" if softcapped(model) else
           f"{type(model).__name__} computes attention in its own code, not through transformers' attention "
           "interface, where llama::custom_sdpa would take its place")
    return f"the runner program uses standard attention and cache ops, not ExecuTorch's LLM custom ops: {why}"


def capture(model: Any, generate_inputs: dict[str, Any], max_cache_len: int) -> dict[str, tuple[Any, dict]]:
    """`{"model": (runner program, inputs)}`: transformers' static-cache wrapper (through the upstream adapter) and the
    prompt at position 0, which the export traces and validation replays (a prompt of at least 2 tokens keeps the
    sequence axis dynamic)."""
    ids = generate_inputs["input_ids"]
    if ids.shape[0] != 1:
        raise TargetPlanError(f"the runner layout runs batch 1; the prompt has batch {ids.shape[0]}", option="layout")
    if ids.shape[1] < 2:
        ids = torch.cat([ids, ids], dim=1)
    if ids.shape[1] >= max_cache_len:
        raise TargetPlanError(f"the prompt ({ids.shape[1]} tokens) does not fit the static cache of {max_cache_len} "
                              "positions: raise generation.max_cache_len", option="layout")
    module = llm_runner.runner_module(model, max_cache_len)
    ids = ids[:, :module.max_seq_len]  # a ring-buffer layer's window: the runner feeds a longer prompt in chunks
    return {MERGED: (module, {"input_ids": ids.clone(), "cache_position": torch.arange(ids.shape[1])})}


def refused(target: Any, model: Any, generate_inputs: dict[str, Any], max_cache_len: int | None = None) -> str | None:
    """Why the model cannot run as a runner program, as the report says it when the layout was the default (None
    when it can): transformers' static-cache wrapper run once, eagerly, on the prompt's first two tokens with a cache
    just long enough (a fresh, small program: the one exported keeps its empty cache). A model whose layers write
    keys of another shape than the static cache allocates from its config (Falcon's multi-query attention: one key
    head, a cache of `num_kv_heads`) fails here as it would at export. Raises [`TargetPlanError`] when the recipe
    asked for `layout: "runner"`. A model with sliding-window layers shorter than `max_cache_len` needs the custom
    ops (their ring buffers: [`window_refused`])."""
    window = window_refused(target, model, max_cache_len)
    if window is not None:
        return window
    ids = generate_inputs["input_ids"][:1, :2]
    try:
        module = llm_runner.runner_module(model, ids.shape[1] + 1)
        with torch.no_grad():
            module(input_ids=ids, cache_position=torch.arange(ids.shape[1]))
        return None
    except Exception as err:  # the model's own code refused the static cache: the runner layout cannot hold it
        problem = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    if layout_of(target) == RUNNER:
        raise TargetPlanError(f"layout 'runner' cannot be exported: {type(model).__name__} does not run with the "
                              f"runner program's static cache ({problem}); use layout 'methods'", option="layout")
    return NOT_RUNNER.format(why=f"{type(model).__name__} does not run with the runner program's static cache "
                                 f"({problem})")


def methods_reason(refused: str | None) -> str:
    """Why a text generation target keeps the methods layout, for a message that says the layout already: the
    model's reason (`refused`, without [`NOT_RUNNER`]'s words), else its own settings.

    Example:
        >>> methods_reason(NOT_RUNNER.format(why="its attention is soft-capped")), methods_reason(None)[:21]
        ('its attention is soft-capped', 'its settings give it ')
    """
    # the LLM, multimodal and ASR runners' words alike: "the ExecuTorch program has a method per component ..."
    kept = refused is not None and refused.startswith(NOT_RUNNER.split(" (layout")[0]) and ": " in refused
    return (refused.split(": ", 1)[1] if kept else refused) or "its settings give it a method per component"


def window_refused(target: Any, model: Any, max_cache_len: int | None) -> str | None:
    """Why a model with sliding-window layers shorter than `max_cache_len` cannot be a runner program (None when it
    can, or has none): their ring buffers need the custom ops, which the target turns off or the model's soft-capped
    attention does ([`custom_ops_of`]). Raises [`TargetPlanError`] when the recipe asked for `layout: "runner"`."""
    window = llm_runner.ring_windows(model, max_cache_len)
    if not window or custom_ops_of(target, model):
        return None
    problem = WINDOW_WITHOUT_CUSTOM_OPS.format(window=min(window.values()))
    problem += f" ({custom_ops_off(model).split(': ', 1)[1]})" if getattr(target, "custom_ops", None) is None else ""
    if layout_of(target) == RUNNER:
        raise TargetPlanError(f"layout 'runner' cannot be exported: {problem}; use layout 'methods'", option="layout")
    return NOT_RUNNER.format(why=problem)


def prompt_bindings(target: Any, name: str, module: Any, inputs: dict[str, Any]) -> list[DimBinding]:
    """The runner program's prompt axis (`seq`: `input_ids`' axis 1 with `cache_position`'s axis 0, dynamic in the
    export up to the static cache), which validation probes at lengths the program was not traced with, as for
    `dynamic: true` (2, a middle length and twice the traced one plus 3, within the cache): the traced prompt alone
    would vouch for no other length (issue #50). Empty for any other component.

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> target = parse_recipe('{"export_format": "executorch", "layout": "runner"}').exports[0]
        >>> inputs = {"input_ids": torch.ones(1, 8, dtype=torch.long), "cache_position": torch.arange(8)}
        >>> [(b.axes, b.traced, b.high) for b in prompt_bindings(target, "model", None, inputs)]
        [([('input_ids', 1), ('cache_position', 0)], 8, None)]
    """
    if layout_of(target) != RUNNER or name != MERGED or "cache_position" not in inputs:
        return []
    traced = int(inputs["input_ids"].shape[1])
    longest = getattr(module, "max_seq_len", None) or (getattr(module, "max_cache_len", None) or 0) - 1
    high = longest if 0 < longest < traced * 2 + 3 else None  # else the `dynamic: true` top
    return [DimBinding("prompt (the runner's seq)", None, high, [("input_ids", 1), ("cache_position", 0)], traced,
                       declared=False)]


NOT_RUNNER = "the ExecuTorch program has a method per component (layout 'methods'), not the LLM runner's layout: {why}"
PROMPT_KEPT = ("the methods program keeps the prompt axis dynamic, as the runner program would have (the target is "
               "exported as with `dynamic: true`; set `dynamic: false` for a prompt fixed at the traced length)")


def prompt_kept_dynamic(target: Any) -> str | None:
    """Give a default ExecuTorch generation target that gets the methods layout in place of the runner's program (the
    model refused its static cache or its export: [`refused`], [`export_refused`]) the dynamic prompt that program
    had: the target is exported as with `dynamic: true`, unless the recipe chose its shapes (`Target.chose_shapes`).
    Returns the report's note, or None when nothing changed (issue #50: DeepSeek-V3's program took 8-token prompts).

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> plain = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
        >>> prompt_kept_dynamic(plain) == PROMPT_KEPT, plain.dynamic
        (True, True)
        >>> fixed = parse_recipe('{"export_format": "executorch", "mode": "generation", "dynamic": false}').exports[0]
        >>> prompt_kept_dynamic(fixed), fixed.dynamic
        (None, False)
    """
    if target.chose_shapes():
        return None
    target.dynamic = True
    return PROMPT_KEPT


# export.json's record of a methods-layout ExecuTorch generation program's prompt axis: true when it was exported
# dynamic; a folder without it (older product versions) holds a program whose prompt is fixed at the traced length
DYNAMIC_PROMPT = "dynamic_prompt"


def prompt_as_recorded(target: Any, manifest: dict[str, Any]) -> None:
    """Re-validating a saved methods-layout program: a target whose recipe leaves `dynamic` unset is validated with
    the prompt its program was exported with, as its export.json records it ([`DYNAMIC_PROMPT`]), not with today's
    default ([`prompt_kept_dynamic`]): a program recorded with a fixed prompt, or saved before the record existed,
    is validated at its traced prompt. A recorded dynamic prompt leaves the target to today's rule (the same).

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> older = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
        >>> prompt_as_recorded(older, {"layout": None}); prompt_kept_dynamic(older), older.dynamic
        (None, False)
    """
    if target.export_format != "executorch" or target.mode != "generation":
        return
    if target.chose_shapes() or manifest.get(DYNAMIC_PROMPT):
        return
    target.dynamic = False  # set, so that today's default no longer applies


def export_refused(error: dict[str, Any] | None) -> str:
    """What the report says of a default runner program whose export failed where eager ran it (OPT: its positions
    read a value of the mask with `.item()`, which torch.export cannot trace), the target exported again with the
    methods layout: the failure as the export child reported it."""
    error = error or {}
    lines = str(error.get("message") or "").strip().splitlines()  # its first line: torch appends the traceback
    problem = " ".join((lines[0] if lines else "").split())[:300]
    return NOT_RUNNER.format(why=f"the runner program's export failed ({error.get('type') or 'Error'}: {problem}); "
                                 "exported again with layout 'methods'")

"""The token-selection rules generation parity holds both sides to.

Eager `generate()` picks each token as `argmax(processors(sequence, logits))`, where `processors` are the logits
processors it builds from the generation config (suppressed tokens, a forced EOS at the last step, a repetition
penalty, ...), some of them taken from the model's config when the generation config leaves them unset. Parity runs
eager `generate()` once, greedy (`do_sample=False`, `num_beams=1`), records the very processor list it built, and
applies a fresh copy of that list to the exported logits: both sides select tokens by the same rules, so only the
graphs' numbers can make them differ.

A divergence is a near tie when the exported token's eager score is within the component's tolerance of eager's
chosen token's score (both could move by that much in a passing artifact): it is reported, and decoding continues
with eager's token. Any other divergence fails.

Example:
    >>> tolerance = Tolerances(first=(1e-5, 1e-4), step=(1e-5, 1e-4))
    >>> is_near_tie(torch.tensor([2.0, 1.99999]), eager=0, exported=1, tolerance=tolerance.step)
    True
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from exporters.capture.generation_settings import greedy
from exporters.capture.steps import CACHE_INPUTS, output_cache, step_inputs
from exporters.upstream import recording_logits_processors, run_component
from exporters.upstream.idefics_image import eager_cache


@dataclass(frozen=True)
class Tolerances:
    """`(atol, rtol)` of the component producing the first token's logits, and of the decode step."""

    first: tuple[float, float]
    step: tuple[float, float]


@dataclass
class EagerReference:
    """What eager `generate()` produced: the generated tokens (no prompt), the processed scores of every step, and
    the processors it built (a fresh copy, never run)."""

    tokens: torch.Tensor
    scores: list[torch.Tensor]
    processors: Any
    processor_names: list[str]
    prompt: torch.Tensor | None = None  # what the sequences held before the first generated token


@dataclass
class Greedy:
    """Greedy decoding as `generate()` does it: processors, argmax, EOS, padding of finished rows."""

    steps: int
    eos: set[int]
    pad: int
    reference: EagerReference
    tolerances: Tolerances
    near_ties: list[dict[str, Any]] = field(default_factory=list)
    divergence: dict[str, Any] | None = None

    @staticmethod
    def special_tokens(generation_config) -> tuple[set[int], int]:
        """EOS ids, and the padding of finished rows (the first EOS when there is no pad token, as `generate()`)."""
        eos = generation_config.eos_token_id
        eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
        pad = generation_config.pad_token_id
        if pad is None:
            pad = eos_list[0] if eos_list else 0
        return set(eos_list), int(pad)

    def select(self, step: int, sequence: torch.Tensor, logits: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
        """The token of every row at `step`, from the exported `logits` of the last position.

        Applies the eager processors to `sequence` (every token so far, prompt included), takes the argmax, pads
        finished rows; where an unfinished row differs from eager's token, a near tie takes eager's token and any
        other difference is recorded in `divergence` (the caller stops).
        """
        scores = self.reference.processors(sequence, logits.to(dtype=torch.float32, copy=True))
        chosen = scores.argmax(-1)
        chosen = torch.where(finished, torch.full_like(chosen, self.pad), chosen)
        if step >= self.reference.tokens.shape[1]:
            return chosen  # eager stopped before: `_compare` reports the extra tokens
        expected = self.reference.tokens[:, step].to(chosen.device)
        tolerance = self.tolerances.first if step == 0 else self.tolerances.step
        for row in ((chosen != expected) & ~finished).nonzero().flatten().tolist():
            eager_scores = self.reference.scores[step][row]
            got, want = int(chosen[row]), int(expected[row])
            gap = _gap(eager_scores, want, got)
            entry = {"batch": row, "step": step, "eager": want, "exported": got,
                     # JSON has no infinity: a token eager's processors excluded has no finite gap
                     "eager_score_gap": gap if math.isfinite(gap) else None}
            if not is_near_tie(eager_scores, want, got, tolerance):
                self.divergence = entry
                return chosen
            self.near_ties.append({**entry, "tolerance": _allowance(eager_scores, want, got, tolerance)})
            chosen[row] = want
        return chosen


def _allowance(scores: torch.Tensor, eager: int, exported: int, tolerance: tuple[float, float]) -> float:
    atol, rtol = tolerance
    return float(2 * atol + rtol * (scores[eager].abs() + scores[exported].abs()))


def _gap(scores: torch.Tensor, eager: int, exported: int) -> float:
    return float(scores[eager] - scores[exported])


def is_near_tie(scores: torch.Tensor, eager: int, exported: int, tolerance: tuple[float, float]) -> bool:
    """Whether eager's scores for the two tokens are so close that a passing artifact may order them either way:
    each may move by `atol + rtol * |score|`."""
    if not bool(torch.isfinite(scores[[eager, exported]]).all()):
        return False
    return _gap(scores, eager, exported) <= _allowance(scores, eager, exported, tolerance)


def greedy_config(generation_config, steps: int):
    """The generation config eager runs with: the model's own (processors included), greedy, `steps` new tokens."""
    config = greedy(generation_config, max_new_tokens=steps)
    if getattr(config, "guidance_scale", None) not in (None, 1, 1.0):
        config.guidance_scale = 1.0  # classifier-free guidance runs the eager model inside a processor
    return config


def eager_reference(model, generate_inputs: dict[str, Any], generation_config, steps: int) -> EagerReference:
    """Run eager `generate()` greedily for up to `steps` tokens; its tokens, processed scores and processors."""
    config = eager_cache(model, greedy_config(generation_config, steps))  # Idefics3: its dynamic cache (upstream)
    recorded: list = []
    with torch.no_grad(), recording_logits_processors(model, recorded):
        output = model.generate(**copy.deepcopy(generate_inputs), generation_config=config,
                                return_dict_in_generate=True, output_scores=True)
    if not recorded:
        raise RuntimeError(f"{type(model).__name__}.generate() built no logits processors through "
                           "_get_logits_processor: the processors eager applies cannot be reproduced")
    scores = [s.detach().float().cpu() for s in output.scores]
    # Decoder-only models return the prompt first, encoder-decoders the decoder's start tokens (Whisper may strip
    # them): the generated tokens are the last `len(scores)` ones either way.
    tokens = output.sequences[:, output.sequences.shape[1] - len(scores):].cpu()
    processors = recorded[-1]
    prompt = output.sequences[:, :output.sequences.shape[1] - len(scores)].cpu()
    return EagerReference(tokens, scores, processors, [type(p).__name__ for p in processors], prompt)


def _traced_position(template: dict[str, Any]) -> int:
    """How many tokens the decode template's cache held when it was captured."""
    for key in CACHE_INPUTS:
        cache = template.get(key)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    if isinstance(template.get("cache_position"), torch.Tensor):
        return int(template["cache_position"].reshape(-1)[0])
    raise KeyError("the decode template holds no cache to read its position from")


class DecodeStepper:
    """Feeds an exported decode graph one token at a time, like the captured `template` ([`step_inputs`]).

    Positions are the step's own by default. With `follow_template`, positions (1-D cache positions, 2-D position
    ids, Qwen2-VL's 3-D M-RoPE ids) advance by one per token from the template's, which `generate()` itself
    computed: the family's own position rules (PaliGemma counts from 1, M-RoPE adds the image's offset) are kept.
    """

    def __init__(self, runner: Any, template: dict[str, Any], sliding_window: int | None = None,
                 follow_template: bool = False):
        self.runner = runner
        self.template = template
        self.sliding_window = sliding_window
        self.traced = _traced_position(template) if follow_template else None

    def __call__(self, token: torch.Tensor, position: int, cache: Any, extra: dict[str, Any] | None = None) -> Any:
        inputs = step_inputs(self.template, token[:, None], position, cache, self.sliding_window)
        if self.traced is not None:
            offset = position - self.traced
            for key in ("position_ids", "cache_position"):
                value = self.template.get(key)
                if isinstance(value, torch.Tensor) and not value.is_floating_point():
                    inputs[key] = value + offset
        inputs.update(extra or {})
        return run_component(self.runner, inputs)


def decode_loop(first_logits: torch.Tensor, cache: Any, sequence: torch.Tensor, greedy: Greedy, stepper: DecodeStepper,
                 tokens: list[torch.Tensor], extra: dict[str, Any] | None = None) -> None:
    """Select, feed back, until `steps` tokens, every row at EOS (finished rows then emit padding) or a divergence.

    `sequence` holds every token the model has seen (the prompt, or the decoder's start tokens): the processors
    read it, and its length is the next position.
    """
    logits = first_logits
    finished = torch.zeros(first_logits.shape[0], dtype=torch.bool)
    eos = torch.tensor(sorted(greedy.eos), dtype=torch.long)
    for step in range(greedy.steps):
        token = greedy.select(step, sequence, logits[:, -1].cpu(), finished).cpu()
        tokens.append(token)
        if greedy.divergence is not None:
            return
        sequence = torch.cat([sequence.cpu(), token[:, None].to(sequence.dtype)], dim=1)
        finished |= torch.isin(token, eos)
        if step == greedy.steps - 1 or bool(finished.all()):
            return
        out = stepper(token, sequence.shape[1] - 1, cache, extra)
        logits, cache = out["logits"], output_cache(out)

"""The eager side of validation: everything a target's checks take from the eager model, computed before the
artifact is read.

Every probe's eager output ([`EagerCache`], shared by the targets of a run), the greedy reference generation parity
compares with, and each deployment runtime's reference ([`EagerSide`], [`eager_side`]). None of it reads the target
folder, so a run computes it while the target's export is still running in its child (`exporters.run.pipeline`),
and the artifact phase (`exporters.validate.checks.validate_target`) only loads and compares.

Example:
    >>> subject = EagerModel(model, "text", inputs, EagerCache())  # doctest: +SKIP
    >>> side = eager_side(target=target, recipe=recipe, components=components, subject=subject)  # doctest: +SKIP
    >>> validate_target(..., precomputed=side)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from exporters.capture.inputs import vocab_size
from exporters.errors import recoverable
from exporters.capture.image_text import (DECODER as IMAGE_TEXT_DECODER, embeds_inputs, frames_bindings,
                                         prompt_embeddings, prompt_windows)
from exporters.capture.llm_runner import prompt_bindings
from exporters.capture.merged import MERGED, empty_cache, prompt_inputs, with_consistent_mask, \
    with_counted_positions
from exporters.capture.multimodal_runner import TEXT_DECODER, runner_prompt_embeddings
from exporters.capture.probes import dim_bindings, make_probes
from exporters.capture.stepped import STEPPED
from exporters.recipe.model import Recipe
from exporters.upstream import leaf_tensors, prepare_traced_inputs
from exporters.validate.arbitration import Arbiter
from exporters.validate.judged_rows import decoder_media_rows, judged_rows
from exporters.validate.parity import other_references, reference_for
from exporters.validate.runtimes import RuntimeCheck, RuntimeContext, checks_possible, references_for
from exporters.validate.subject import EagerModel


def _fingerprint(inputs: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(leaf_tensors(inputs).items()):
        digest.update(name.encode())
        digest.update(f"{tuple(tensor.shape)} {tensor.dtype}".encode())
        # the bytes through uint8: numpy has no bfloat16
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    for name, value in sorted(inputs.items()):
        if not isinstance(value, torch.Tensor) and isinstance(value, (bool, int, float, str, type(None))):
            digest.update(f"{name}={value!r}".encode())
    return digest.hexdigest()


class EagerCache:
    """Eager outputs by (module, inputs, torch's thread count): computed once per run, shared by every target that
    probes the same thing at the same thread count. A target validated at another count (validation takes the cores
    the running exports leave, `exporters.run.resources.threads_left`) gets references computed at its own: CPU
    kernels split reductions by thread, and a torch program must be compared with eager under the same split (a
    deep convolution net's outputs of magnitude 1e3 differ by 1e-3 between 1 and 2 threads, in eager alone)."""

    def __init__(self) -> None:
        self._outputs: dict[tuple[int, str, int], Any] = {}
        self.hits = 0
        self.misses = 0

    def forget(self) -> None:
        """Drop every kept output (the model changed dtype); the counts stay."""
        self._outputs.clear()

    def run(self, module: torch.nn.Module, inputs: dict[str, Any]) -> Any:
        key = (id(module), _fingerprint(inputs), torch.get_num_threads())
        if key in self._outputs:
            self.hits += 1
            return self._outputs[key]
        self.misses += 1
        with torch.no_grad():
            outputs = module(**copy.deepcopy(inputs))
        self._outputs[key] = outputs
        return outputs


def with_precomputed_inputs(module: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """A copy of `inputs` with the data-dependent tensors upstream's export traced with (`cu_seqlens`, vision
    position ids, ...) precomputed, as a runtime does before calling such a graph."""

    prepared = copy.copy(inputs)
    prepare_traced_inputs(module, prepared)
    return prepared


def eager_references(module: Any, probes: list, eager: EagerCache) -> list[Any]:
    """The eager output of every probe (None for a probe that does not run, the exception when eager fails), computed
    before any artifact is loaded."""
    references: list[Any] = []
    for _, probe, _ in probes:
        try:
            references.append(None if probe is None else eager.run(module, probe))
        except BaseException as err:
            if not recoverable(err):
                raise
            references.append(err)
    return references


@dataclass
class EagerSide:
    """What a target's validation takes from the eager model: per component its probes (as the graph takes them)
    with their references and the dims they bind, the greedy reference of a generation target, and each runtime
    check that may apply with its reference. `threads`: torch's thread count it was computed at."""

    planned: list[tuple[str, list, list[Any]]] = field(default_factory=list)
    bindings: dict[str, Any] = field(default_factory=dict)
    greedy: Any = None
    other_greedy: list[tuple[dict[str, Any], Any]] | None = None  # a stepped prompt's other lengths, with eager's runs
    runtimes: list[tuple[RuntimeCheck, Any]] = field(default_factory=list)
    threads: int = 0
    # per component: its module and probes as eager takes them, for a failed check's float64 reference
    arbiters: dict[str, Arbiter] = field(default_factory=dict)
    # per decoder fed an image's (audio's) features: each probe's rows a quality budget judges (None: every row)
    judged_rows: dict[str, list[torch.Tensor | None]] = field(default_factory=dict)

    def usable_for(self, target) -> bool:
        """A torch program is compared with eager at its own thread count ([`EagerCache`]); ONNX Runtime and
        ExecuTorch run their own kernels, so their references may come from any count."""
        return target.export_format != "dynamo" or self.threads == torch.get_num_threads()


def eager_side(*, target, recipe: Recipe, components, subject: EagerModel, expected_components: list[str] | None = None,
               runtime_checks: list[RuntimeCheck] | None = None) -> EagerSide:
    """Every eager reference the target's checks need from `subject` (the eager model and what comes with it), for
    the components it is to have (`expected_components`, by default all of `components`) and the runtime checks that
    apply (`runtime_checks`; by default every check that may apply to the target before its folder exists). Nothing
    here reads the target's folder."""
    model, family, generate_inputs, eager = subject.model, subject.family, subject.generate_inputs, subject.eager
    generation_config, source_dir = subject.generation_config, subject.source_dir
    expected = list(expected_components if expected_components is not None else components)
    max_positions = getattr(getattr(model.config, "text_config", None) or model.config, "max_position_embeddings", None)
    logits_per_token = vocab_size(model.config) if target.mode == "generation" else 0
    side = EagerSide(threads=torch.get_num_threads())
    for name, (module, inputs) in components.items():
        if name not in expected:
            continue
        spec = target.shape_spec(name)
        override = target.components.get(name)
        dynamic = override.dynamic if override is not None and override.dynamic is not None else target.dynamic
        bindings = dim_bindings(spec, inputs, dynamic, family) or prompt_bindings(target, name, module, inputs) \
            or frames_bindings(target, name, module, inputs) if recipe.validation.probe_unseen_shapes else []
        side.bindings[name] = bindings
        # the dims probed together ([`make_probes`]), or one at a time (`subject.probe_dims_apart`: init reads which
        # dim fails at which size from the probe ids)
        probes = [("traced", inputs, None)] + [
            probe for group in ([[b] for b in bindings] if subject.probe_dims_apart else [bindings])
            for probe in make_probes(inputs, group, model.config, recipe.validation.max_probe_elements, max_positions,
                                     recipe.inputs.seed, logits_per_token,
                                     model_sized="max_probe_elements" not in recipe.validation.model_fields_set)[1:]]
        prompt = None
        if target.mode == "generation" and name in (MERGED, IMAGE_TEXT_DECODER):
            probes = [(probe_id, None if probe is None else with_consistent_mask(probe), skip)
                      for probe_id, probe, skip in probes]
            if getattr(target, "unpadded", False):  # the calls the graph takes: positions from the past's length
                probes = [(probe_id, None if probe is None else with_counted_positions(probe), skip)
                          for probe_id, probe, skip in probes]
            if name == MERGED and "input_ids" in generate_inputs:
                # the runner program takes at most `max_seq_len` tokens a call (a ring-buffer layer's window)
                prompt = generate_inputs["input_ids"][:, :getattr(module, "max_seq_len", None)]
                probes.append(("prompt (past=0)", prompt_inputs(inputs, prompt), None))
            elif name == IMAGE_TEXT_DECODER:  # transformers.js's prompt: the image's features in its embeddings
                prompt = prompt_embeddings(model, components, generate_inputs)
                embeds = inputs["inputs_embeds"] if prompt is None else prompt
                if prompt is not None:  # every probe of the shapes made of the prompt (capture/image_text.py)
                    probes = prompt_windows(module, inputs, probes, prompt)
                probes.append(("prompt (past=0)", embeds_inputs(embeds, 0, empty_cache(
                    inputs["past_key_values"], embeds.shape[0]), mrope=inputs["position_ids"].dim() == 3), None))
        elif target.mode == "generation" and name == TEXT_DECODER and "inputs_embeds" in inputs:
            # MultimodalRunner's text_decoder: the whole prompt as the runner feeds it (the image's features in
            # place), at most a call's `max_seq_len` rows; its traced rows are the prompt's first (the image's, for
            # LLaVA), which the quality budget does not judge
            prompt = runner_prompt_embeddings(model, components, generate_inputs)
            if prompt is not None:
                fed = prompt[:, :getattr(module, "max_seq_len", None) or prompt.shape[1]].contiguous()
                probes.append(("prompt (past=0)", {"inputs_embeds": fed, "cache_position": torch.arange(
                    fed.shape[1])}, None))
        media = decoder_media_rows(name, components, model, generate_inputs, prompt) \
            if target.mode == "generation" else None
        if media is not None:
            side.judged_rows[name] = [judged_rows(probe, media) for _, probe, _ in probes]
        references = eager_references(module, probes, eager)
        # what the graph takes, computed while the eager module still holds its weights
        fed = [(probe_id, None if probe is None else with_precomputed_inputs(module, probe), skip)
               for probe_id, probe, skip in probes]
        side.planned.append((name, fed, references))
        side.arbiters[name] = Arbiter(module, probes)
    if target.mode == "generation":
        side.greedy = reference_for(model, generate_inputs, generation_config, recipe.generation.max_new_tokens)
    if target.mode == "generation" and family == "text" and set(components) == set(STEPPED):
        side.other_greedy = other_references(model, generate_inputs, generation_config,
                                             recipe.generation.max_new_tokens)
    context = RuntimeContext(target, recipe, family, generate_inputs, generation_config, source_dir)
    checks = checks_possible(target, expected) if runtime_checks is None else runtime_checks
    side.runtimes = references_for(checks, model, context)
    return side

"""The workbench of a run: the model loaded once, its sample inputs, and what targets share.

Captures (`decompose`) are made once per generation layout and cache setting (the cache is chosen per target:
`exporters.capture.cache_settings`) and shared; each target then gets its own copy fitted to its shape contract
([`exporters.capture.probes.fit_to_contract`]), so a declared dynamic range is traced at a size torch.export keeps dynamic. Eager reference outputs are computed once per run (`EagerCache`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exporters.capture import (asr_runner, image_text, image_text_models, llm_runner, merged, multimodal_runner,
                               stepped)
from exporters.capture.cache_settings import (check_second_step, default_decode_contract, max_positions,
                                              sliding_window_of, state_space_layers)
from exporters.capture.components import cache_setting_for, decompose, generation_config_for, minimum_components
from exporters.capture.families import MULTIMODAL_GENERATORS, detect_family
from exporters.capture.inputs import SampleInputs, default_mode, in_model_dtype, make_sample_inputs
from exporters.capture.probes import dim_bindings, fit_batch, fit_encoder_decoder, fit_to_contract
from exporters.capture.loading import load_model
from exporters.capture.source import load_tokenizer
from exporters.capture.token_ids import decoder_start_id
from exporters.errors import ShapeSpecError, TargetPlanError, error_record, recoverable
from exporters.export.footprint import ModelWeights
from exporters.export.quantize import calibration_samples, layout_refusal
from exporters.layouts import waveform_kept_dynamic
from exporters.recipe.model import Recipe, Target
from exporters.recipe.variants import dtype_files_refusal, keeps_variants
from exporters.run.context import RunContext, RunOptions
from exporters.run.isolation import error_text, log_error
from exporters.upstream import move_to
from exporters.validate.eager_side import EagerCache, EagerSide, eager_side
from exporters.validate.subject import EagerModel


@dataclass
class Workbench:
    """The loaded model, its sample inputs, and what is shared across targets: decompositions, eager outputs."""

    model: torch.nn.Module | None  # None once validation released the eager weights
    sample: SampleInputs | None  # None when the model's sample inputs could not be made (`unprepared`)
    eager: EagerCache
    weights: ModelWeights  # read at load (validation may free the weights later)
    tokenizer: Any = None  # the folder's, for calibration prompts
    decompositions: dict[tuple, Any] = field(default_factory=dict)
    fitted: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)
    unprepared: dict[str, Any] | None = None  # why no sample inputs could be made: then every target fails with it
    unprepared_text: str = ""  # that error's whole message and traceback, for each target's log
    stepped: set[str] = field(default_factory=set)  # targets whose prompt is stepped through `decode` alone
    # targets planned again with the methods layout after their default runner program failed, and why
    not_runner: dict[str, str] = field(default_factory=dict)
    recipe_layouts: dict[str, str | None] = field(default_factory=dict)  # `layout` as each recipe target says it

    @classmethod
    def load(cls, context: RunContext, options: RunOptions, targets: list[Target] | None = None,
             dtype: str | None = None) -> Workbench:
        """Load the model once, in `dtype` (None: the checkpoint's own): the dtype the first targets' eager
        references are computed in (`exporters.capture.dtypes.reference_groups`; [`convert`] changes it between
        groups), each export converting its own.
        A model whose sample inputs cannot be made is kept with the reason (`unprepared`): every target fails with
        it, never a traceback."""

        started = time.time()
        model = load_model(context.source, trust_remote_code=options.trust_remote_code, dtype=dtype)
        context.model_dtype = str(model.dtype).removeprefix("torch.")
        context.eager_cache = EagerCache()
        weights = ModelWeights.of(model)
        tokenizer = load_tokenizer(context.source.folder)
        try:
            sample = make_sample_inputs(model, context.recipe.inputs, tokenizer, folder=context.source.folder)
        except BaseException as err:  # an unsupported model fails its targets with the reason, never a traceback
            if not recoverable(err):  # a tokenizer's native panic included
                raise
            context.family, context.load_s = detect_family(model), round(time.time() - started, 3)
            prefix = "sample inputs could not be made: "
            return cls(model, None, context.eager_cache, weights, tokenizer,
                       unprepared=error_record(err, prefix=prefix), unprepared_text=error_text(err, prefix))
        sample = in_model_dtype(sample, model)  # a half model's float inputs in its dtype, as `convert` holds them
        context.family, context.load_s = sample.family, round(time.time() - started, 3)
        context.warnings.extend(sample.notes)
        return cls(model, sample, context.eager_cache, weights, tokenizer)

    def convert(self, dtype: str) -> None:
        """Hold the eager model (and the sample inputs' floating tensors) in `dtype` from now on, converted in place
        (lossless between a half-precision checkpoint's own dtype and float32); what was captured or computed in the
        old dtype is dropped."""
        torch_dtype = getattr(torch, dtype)
        self.model.to(torch_dtype)
        if self.sample is not None:
            self.sample.forward = move_to(self.sample.forward, "cpu", torch_dtype)
            self.sample.generate = move_to(self.sample.generate, "cpu", torch_dtype)
        self.decompositions.clear()
        self.fitted.clear()
        self.eager.forget()

    def expected(self, target: Target, components: Any) -> list[str]:
        """The recipe's `expected_components`, else the family's minimum complete set (from the model's
        structure)."""

        if target.expected_components is not None:
            return list(target.expected_components)
        if llm_runner.layout_of(target) == llm_runner.RUNNER:
            return list(asr_runner.COMPONENTS) if self.sample.family == "speech-seq2seq" else [merged.MERGED]
        if llm_runner.layout_of(target) == multimodal_runner.MULTIMODAL_RUNNER:
            return multimodal_runner.components_of(self.sample.family)
        if target.name in self.stepped:
            return list(stepped.STEPPED)
        layout = image_text.components_for(self.sample.family)
        if image_text_models.wants_image_text(target, self.sample.family) and set(components) == set(layout):
            return layout
        return minimum_components(self.sample.family, target.mode, list(components), self.model,
                                  merged=bool(getattr(target, "merged", False)))

    def calibration(self, targets: list[Target], recipe: Recipe) -> list[Any]:
        """The recipe's calibration samples when a target quantizes with a static method (none otherwise)."""
        if self.sample is None or not any(t.quantize is not None and t.quantize.needs_calibration for t in targets):
            return []

        return calibration_samples(self.model, recipe, self.tokenizer, self.sample.family)

    def plan(self, target: Target) -> Any:
        """The target with its mode decided (the recipe's, else from the model)."""

        target = target.model_copy(deep=True)
        target.mode = target.mode or default_mode(self.model)
        self.recipe_layouts[target.name] = llm_runner.layout_of(target)
        return target

    def unprepared_in(self, log: Path) -> dict[str, Any]:
        """Why no sample inputs could be made, for a target's report, its whole message and traceback written to
        the target's `log`."""
        log_error(log, self.unprepared_text or str((self.unprepared or {}).get("message")), fresh=True)
        return dict(self.unprepared or {})

    def components(self, target: Target, recipe: Recipe) -> Any:
        """The target's `{component: (module, forward inputs)}`: captured once per mode, decode layout and cache
        setting, then fitted to the target's shape contract (every declared dim at a size torch.export keeps
        dynamic). `DecodeStepError` when its decode could not run a second step; `TargetPlanError` when its
        quantization or variants cannot take the layout it was planned in (`exporters.export.quantize.
        layout_refusal`, `exporters.recipe.variants.dtype_files_refusal`), before any export."""
        fitted = self._planned(target, recipe)
        refusal = layout_refusal(target, self.sample.family) or dtype_files_refusal(target, self.sample.family)
        if refusal is not None:
            self.fitted.pop(target.name, None)
            raise TargetPlanError(refusal, option="variants")
        return fitted

    def _planned(self, target: Target, recipe: Recipe) -> Any:
        if target.name not in self.fitted:
            setting = self.cache_setting(target, recipe)
            if self._multimodal_runner(target, recipe, setting) or self._image_text(target, recipe, setting):
                return self.fitted[target.name][0]
            speech = self._speech_program(target, recipe, setting)
            if speech is not None and not isinstance(speech, str):
                return speech
            state_layers = state_space_layers(self.model.config)
            runner = llm_runner.wants_runner(target, self.sample.family, setting.implementation,
                                             recipe.inputs.batch_size, sliding_window_of(self.model.config),
                                             setting.max_cache_len, state_layers)
            refused = self.not_runner.get(target.name) if runner else None
            # a sliding-window model without the ring buffers' custom ops keeps the methods program as it was
            window = llm_runner.window_refused(target, self.model, setting.max_cache_len) if runner else None
            refused = speech or refused or window or (llm_runner.refused(target, self.model, self.sample.generate,
                                                                         setting.max_cache_len) if runner else None)
            if runner and refused is None:
                target.layout = llm_runner.RUNNER  # one program in the runner's contract: no decomposition
                key = (llm_runner.RUNNER, setting)
                if key not in self.decompositions:
                    self.decompositions[key] = llm_runner.capture(self.model, self.sample.generate,
                                                                  setting.max_cache_len)
                self.fitted[target.name] = (self.decompositions[key], self._cache_notes(target, setting, llm_runner.FED_IN_CHUNKS))
                return self.fitted[target.name][0]
            # said before the capture below: torchao's 8da4w quantizes the runner's program only (issue #51's sweep)
            why = (refused if runner else None) or self.not_runner.get(target.name)  # a runner's export failed too
            if (refusal := layout_refusal(target, self.sample.family, llm_runner.methods_reason(why))) is not None:
                raise TargetPlanError(refusal, option="quantize")
            kept = llm_runner.prompt_kept_dynamic(target) if runner and refused and not window else None
            kept = kept or waveform_kept_dynamic(target, self.model.config)  # Moonshine: any audio length
            asked = target.merged
            target.merged = merged.planned_merged(target, self.sample.family, setting.implementation,
                                                   self.model.config)
            captured = self._captured(target, recipe, setting)
            if llm_runner.methods_note(target, state_layers) and (
                    merged.scans(captured) or stepped.can_step(target, self.sample.family, captured)):
                # the default program of a model with state-space layers (#50): the prompt of any length the
                # runner's program would have taken, stepped through the decode (LFM2's conv-only cache too)
                kept = llm_runner.prompt_kept_dynamic(target)
            if self.sample.family in MULTIMODAL_GENERATORS:  # not the multimodal runner's layout: why
                refused = self.not_runner.get(target.name)
            layout_notes = llm_runner.methods_note(target, state_layers) + [n for n in (refused, kept) if n]
            dropped: list[str] = []
            if target.merged and asked is None and (not merged.takes_cache(captured) or merged.scans(captured)):
                dropped = [merged.default_dropped(captured)]  # a default it cannot have
                target.merged = False
                captured = self._captured(target, recipe, setting)
            if target.merged:  # one graph: upstream's multi-token decode, with its contract
                captured = merged.plan(target, captured)
            elif stepped.wants_stepped(target, self.sample.family, captured):  # a prefill that cannot be dynamic
                dropped = [stepped.note(captured)]  # says it all (the kept prompt too)
                layout_notes = [n for n in layout_notes if n != llm_runner.PROMPT_KEPT]
                self.stepped.add(target.name)
                captured = stepped.plan(target, captured)
            grown = default_decode_contract(target, captured, setting)  # the plainest recipe still generates
            fitted, notes = self._fit(target, captured, recipe)
            notes = layout_notes + dropped + ([grown] if grown else []) + notes
            check_second_step(target, fitted, setting)
            self.fitted[target.name] = (fitted, notes + self._cache_notes(target, setting))
        return self.fitted[target.name][0]

    def _multimodal_runner(self, target: Target, recipe: Recipe, setting: Any) -> bool:
        """Plan a vision-language target in ExecuTorch MultimodalRunner's layout where it applies
        (`exporters.capture.multimodal_runner`); False (the methods layout, the reason in its notes) otherwise."""
        if not multimodal_runner.wants_multimodal_runner(target, self.sample.family, setting.implementation,
                                                         recipe.inputs.batch_size):
            kept = multimodal_runner.settings_refused(target, self.sample.family, setting.implementation,
                                                      recipe.inputs.batch_size)
            if kept is not None:  # the default kept the methods layout for the target's settings: said why
                self.not_runner.setdefault(target.name, kept)
            return False
        refused = self.not_runner.get(target.name) or multimodal_runner.refused(
            target, self.model, self.sample.generate, setting.max_cache_len)
        if refused is not None:
            self.not_runner.setdefault(target.name, refused)
            return False
        target.layout = multimodal_runner.MULTIMODAL_RUNNER
        key = (multimodal_runner.MULTIMODAL_RUNNER, setting)
        if key not in self.decompositions:
            self.decompositions[key] = multimodal_runner.capture(self.model, self.sample.generate,
                                                                 setting.max_cache_len)
        self.fitted[target.name] = (self.decompositions[key],
                                    self._cache_notes(target, setting, multimodal_runner.FED_AS_INPUTS))
        return True

    def _image_text(self, target: Target, recipe: Recipe, setting: Any) -> bool:
        """Plan a vision- or audio-language ONNX target in transformers.js's layout where the model fits it
        (`exporters.capture.image_text_models`, `image_text`); False (the model's components, the reason in the notes) otherwise."""
        if not image_text_models.wants_image_text(target, self.sample.family):
            return False
        refused = self.not_runner.get(target.name) or image_text_models.refused(
            target, self.model, self.sample.generate, setting.implementation)
        if refused is not None and keeps_variants(target):  # its dtype files would be silently dropped
            raise TargetPlanError(f"variants {list(target.variants)} are dtype files of layout 'transformers.js', "
                                  f"which this export cannot take: {refused}; drop `variants`, or `layout` (a target "
                                  "per variant)",
                                  option="variants")
        if refused is not None:
            self.not_runner.setdefault(target.name, refused)
            return False
        fitted, notes = self._fit(target, image_text.capture(target, self.model, self.sample.generate), recipe)
        self.fitted[target.name] = (fitted, notes + self._cache_notes(target, setting))
        return True

    def _speech_program(self, target: Target, recipe: Recipe, setting: Any) -> Any:
        """A speech encoder-decoder's ExecuTorch program in the ASR runner's layout (`exporters.capture.asr_runner`):
        its fitted components where the target has it, why not where its default layout was refused (a str, said in
        the findings), else None."""
        if not asr_runner.wants_asr(target, self.sample.family, self.sample.generate, setting.implementation,
                                    recipe.inputs.batch_size):
            return None
        start = decoder_start_id(self.model)
        refused = self.not_runner.get(target.name) or asr_runner.refused(target, self.model, self.sample.generate,
                                                                         start)
        if refused is not None:
            return refused
        target.layout = llm_runner.RUNNER  # the runner's layout for this family: encoder + text_decoder
        key = ("asr", setting)
        if key not in self.decompositions:
            self.decompositions[key] = asr_runner.capture(self.model, self.sample.generate, setting.max_cache_len,
                                                          start)
        self.fitted[target.name] = (self.decompositions[key], self._cache_notes(target, setting))
        return self.fitted[target.name][0]

    def plan_methods_layout(self, target: Target, reason: str) -> bool:
        """Plan an ExecuTorch generation target with the methods layout from now on, `reason` said in its findings
        where the runner layout would have been its default (the recipe left `layout` unset): after an export of the
        runner program that failed where eager ran it ([`llm_runner.export_refused`]), or for a folder whose program
        has the methods layout. False (nothing changed) when the recipe set the layout, or it was planned already."""
        if target.export_format != "executorch" or target.mode != "generation" or target.name in self.not_runner:
            return False
        if self.recipe_layouts.get(target.name) is not None:
            return False
        self.not_runner[target.name] = reason
        if target.layout in (llm_runner.RUNNER, multimodal_runner.MULTIMODAL_RUNNER):
            target.layout = None
        self.fitted.pop(target.name, None)
        return True

    def cache_setting(self, target: Target, recipe: Recipe) -> Any:
        """The cache the target is captured, exported and checked with (`exporters.capture.cache_settings`)."""
        return cache_setting_for(self.model, target, recipe)

    def generation_config(self, target: Target, recipe: Recipe) -> Any:
        """The generation config of a generation target (its cache setting applied), else None."""
        if target.mode != "generation":
            return None
        return generation_config_for(self.model, self.cache_setting(target, recipe))

    def eager_side(self, target: Target, context: RunContext, components: Any,
                   expected: list[str] | None) -> EagerSide:
        """The eager side of the target's validation (`exporters.validate.eager_side`), before its folder exists:
        what a run computes while the target exports."""
        return eager_side(target=target, recipe=context.recipe, components=components,
                          subject=self.subject(target, context), expected_components=expected)

    def subject(self, target: Target, context: RunContext) -> EagerModel:
        """What `target` is compared with: the model loaded once, its sample, the run's eager outputs, the target's
        generation config, the folder the model came from, how the dims are probed
        (`exporters.validate.subject.EagerModel`)."""
        return EagerModel(self.model, self.sample.family, self.sample.generate, self.eager,
                          self.generation_config(target, context.recipe), context.source.folder,
                          probe_dims_apart=context.probe_dims_apart)

    def _cache_notes(self, target: Target, setting: Any, fed: str | None = None) -> list[str]:
        """The cache's findings; `fed`: a runner program's (its sliding-window layers in ring buffers), how its
        runner keeps a call within the window."""
        if target.mode != "generation":
            return []
        window = sliding_window_of(self.model.config)
        findings = [setting.finding(target.name, max_positions(self.model.config)),
                    llm_runner.ring_note(window, setting.max_cache_len, fed) if fed else setting.sliding_finding(window),
                    setting.window_finding(getattr(self.model.config.get_text_config(), "sliding_window", None))]
        return [finding for finding in findings if finding]

    def contract_notes(self, target: Target) -> list[str]:
        """What fitting the sample inputs to the target's contract changed."""
        return self.fitted.get(target.name, ({}, []))[1]

    def _captured(self, target: Target, recipe: Recipe, setting: Any) -> Any:
        multi_token = bool(target.multi_token_decode or target.merged)
        key = (target.mode, multi_token, setting if target.mode == "generation" else None)
        if key not in self.decompositions:
            self.decompositions[key] = decompose(
                self.model, target.mode, self.sample.forward, self.sample.generate, setting=setting,
                multi_token_decode=multi_token, family=self.sample.family)
        return self.decompositions[key]

    def _batches_encoder_decoder(self, target: Target, recipe: Recipe) -> bool:
        """Whether `target` is an encoder-decoder generation export whose `dynamic: true` keeps the batch and the
        decoder prompt dynamic (`fit_encoder_decoder`): ONNX (optimum's and transformers.js's Seq2Seq files), dynamo
        (`.pt2`), and ExecuTorch's methods layout on a dynamic cache (its methods take and return the cache)."""
        if target.mode != "generation" or self.sample.family not in merged.ENCODER_DECODER_FAMILIES:
            return False
        if target.export_format == "executorch":
            return self.cache_setting(target, recipe).implementation == "dynamic"
        return target.export_format in ("onnx", "dynamo")

    def _fit(self, target: Target, captured: Any, recipe: Recipe) -> tuple[Any, list[str]]:
        fitted, notes = {}, []
        for name, (module, inputs) in captured.items():
            spec = target.shape_spec(name)
            try:
                bindings = dim_bindings(spec, inputs, False, self.sample.family) if spec else []
            except ShapeSpecError:  # the export reports it, with the recipe line
                bindings = []
            new_inputs, changed = fit_to_contract(inputs, bindings, self.model.config, recipe.inputs.seed)
            override = target.components.get(name)
            dynamic = override.dynamic if override is not None and override.dynamic is not None else target.dynamic
            if dynamic and not spec and target.mode == "model":  # `dynamic: true` keeps the batch dynamic too
                new_inputs, batch_notes = fit_batch(new_inputs, self.model.config, recipe.inputs.seed)
                changed += batch_notes
            elif dynamic and not spec and self._batches_encoder_decoder(target, recipe):  # batch and decoder prompt too
                new_inputs, batch_notes = fit_encoder_decoder(name, new_inputs, self.model.config, recipe.inputs.seed)
                changed += batch_notes
            fitted[name] = (module, new_inputs)
            notes += [f"{name}: {note}" for note in changed]
        return fitted, notes

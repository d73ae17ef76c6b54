"""The workbench of a run: the model loaded once, its sample inputs, and what targets share.

Captures (`decompose`) are made once per generation layout and cache setting (the cache is chosen per target:
`exporters.cache_settings`) and shared; each target then gets its own copy fitted to its shape contract
([`exporters.probes.fit_to_contract`]), so a declared dynamic range is traced at a size torch.export keeps dynamic. Eager reference outputs are computed once per run (`EagerCache`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .context import RunContext, RunOptions


@dataclass
class Workbench:
    """The loaded model, its sample inputs, and what is shared across targets: decompositions, eager outputs."""

    model: Any
    sample: Any
    eager: Any
    tokenizer: Any = None
    decompositions: dict[tuple, Any] = field(default_factory=dict)
    fitted: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)

    @classmethod
    def load(cls, context: RunContext, options: RunOptions) -> Workbench:
        from .inputs import make_sample_inputs
        from .source import load_model, load_tokenizer
        from .validate import EagerCache

        started = time.time()
        model = load_model(context.source, trust_remote_code=options.trust_remote_code)
        tokenizer = load_tokenizer(context.source.folder)
        sample = make_sample_inputs(model, context.recipe.inputs, tokenizer)
        context.family, context.load_s = sample.family, round(time.time() - started, 3)
        context.eager_cache = EagerCache()
        return cls(model, sample, context.eager_cache, tokenizer)

    def calibration(self, targets: list[Any], recipe: Any) -> list[Any]:
        """The recipe's calibration samples when a target quantizes with a static method (none otherwise)."""
        if not any(t.quantize is not None and t.quantize.needs_calibration for t in targets):
            return []
        from .quantize import calibration_samples

        return calibration_samples(self.model, recipe, self.tokenizer, self.sample.family)

    def plan(self, target: Any) -> Any:
        """The target with its mode decided (the recipe's, else from the model)."""
        from .inputs import default_mode

        target = target.model_copy(deep=True)
        target.mode = target.mode or default_mode(self.model)
        return target

    def components(self, target: Any, recipe: Any) -> Any:
        """The target's `{component: (module, forward inputs)}`: captured once per mode, decode layout and cache
        setting, then fitted to the target's shape contract (every declared dim at a size torch.export keeps
        dynamic). `DecodeStepError` when its decode could not run a second step."""
        from .cache_settings import check_second_step

        if target.name not in self.fitted:
            setting = self.cache_setting(target, recipe)
            fitted, notes = self._fit(target, self._captured(target, recipe, setting), recipe)
            check_second_step(target, fitted, setting)
            self.fitted[target.name] = (fitted, notes + self._cache_notes(target, setting))
        return self.fitted[target.name][0]

    def cache_setting(self, target: Any, recipe: Any) -> Any:
        """The cache the target is captured, exported and checked with (`exporters.cache_settings`)."""
        from . import engine

        return engine.cache_setting_for(self.model, target, recipe)

    def generation_config(self, target: Any, recipe: Any) -> Any:
        """The generation config of a generation target (its cache setting applied), else None."""
        from . import engine

        if target.mode != "generation":
            return None
        return engine.generation_config_for(self.model, self.cache_setting(target, recipe))

    def _cache_notes(self, target: Any, setting: Any) -> list[str]:
        from .cache_settings import max_positions

        finding = setting.finding(target.name, max_positions(self.model.config)) if target.mode == "generation" \
            else None
        return [finding] if finding else []

    def contract_notes(self, target: Any) -> list[str]:
        """What fitting the sample inputs to the target's contract changed."""
        return self.fitted.get(target.name, ({}, []))[1]

    def _captured(self, target: Any, recipe: Any, setting: Any) -> Any:
        from . import engine

        key = (target.mode, target.multi_token_decode, setting if target.mode == "generation" else None)
        if key not in self.decompositions:
            self.decompositions[key] = engine.decompose(
                self.model, target.mode, self.sample.forward, self.sample.generate, setting=setting,
                multi_token_decode=target.multi_token_decode, family=self.sample.family)
        return self.decompositions[key]

    def _fit(self, target: Any, captured: Any, recipe: Any) -> tuple[Any, list[str]]:
        from .engine import component_shape_spec
        from .errors import ShapeSpecError
        from .probes import dim_bindings, fit_to_contract

        fitted, notes = {}, []
        for name, (module, inputs) in captured.items():
            spec = component_shape_spec(target, name)
            try:
                bindings = dim_bindings(spec, inputs, False, self.sample.family) if spec else []
            except ShapeSpecError:  # the export reports it, with the recipe line
                bindings = []
            new_inputs, changed = fit_to_contract(inputs, bindings, self.model.config, recipe.inputs.seed)
            fitted[name] = (module, new_inputs)
            notes += [f"{name}: {note}" for note in changed]
        return fitted, notes

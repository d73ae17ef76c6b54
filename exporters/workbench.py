"""The workbench of a run: the model loaded once, its sample inputs, and what targets share.

Captures (`decompose`) are made once per generation layout and shared; each target then gets its own copy fitted to
its shape contract ([`exporters.probes.fit_to_contract`]), so a declared dynamic range is traced at a size
torch.export keeps dynamic. Eager reference outputs are computed once per run (`EagerCache`).
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
    decompositions: dict[tuple, Any] = field(default_factory=dict)
    fitted: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)

    @classmethod
    def load(cls, context: RunContext, options: RunOptions) -> Workbench:
        from .inputs import make_sample_inputs
        from .source import load_model, load_tokenizer
        from .validate import EagerCache

        started = time.time()
        model = load_model(context.source, trust_remote_code=options.trust_remote_code)
        sample = make_sample_inputs(model, context.recipe.inputs, load_tokenizer(context.source.folder))
        context.family, context.load_s = sample.family, round(time.time() - started, 3)
        context.eager_cache = EagerCache()
        return cls(model, sample, context.eager_cache)

    def plan(self, target: Any) -> Any:
        """The target with its mode decided (the recipe's, else from the model)."""
        from .inputs import default_mode

        target = target.model_copy(deep=True)
        target.mode = target.mode or default_mode(self.model)
        return target

    def components(self, target: Any, recipe: Any) -> Any:
        """The target's `{component: (module, forward inputs)}`: captured once per mode and decode layout, then
        fitted to the target's shape contract (every declared dim at a size torch.export keeps dynamic)."""
        if target.name not in self.fitted:
            self.fitted[target.name] = self._fit(target, self._captured(target, recipe), recipe)
        return self.fitted[target.name][0]

    def contract_notes(self, target: Any) -> list[str]:
        """What fitting the sample inputs to the target's contract changed."""
        return self.fitted.get(target.name, ({}, []))[1]

    def _captured(self, target: Any, recipe: Any) -> Any:
        from . import engine

        key = (target.mode, target.multi_token_decode)
        if key not in self.decompositions:
            self.decompositions[key] = engine.decompose(
                self.model, target.mode, self.sample.forward, self.sample.generate, recipe=recipe,
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

"""Generation parity for vision-language models: the model's own forward, with every stage that holds weights
replaced by its exported graph.

```
image + prompt ──► model.forward (the model's Python: feature selection, token merge, masks, rope index)
                     ├─ image_encoder / projector / embed_tokens / language_model / lm_head ─► exported graphs
                     ├─ weights the forward reads itself (LLaVA-NeXT's image_newline) ─► the folder's glue file
                     └─ any other module with weights ─► refused (the check fails, naming it)
logits, cache ──► argmax ──► exported decode × N ──► tokens, compared with eager generate()
```

The stages were captured from the same forward call (`exporters.capture.components`), so each graph receives the
structure it was traced with. Running the family's own forward is what makes one driver serve LLaVA, Idefics3 /
SmolVLM, PaliGemma, Gemma 3 and Qwen2-VL alike: only the glue the model's forward does in Python runs outside
the graphs, and a guard on every other weighted module proves it (a forward that computed anything with eager
weights would make the comparison meaningless).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from exporters.capture.cache_settings import sliding_window_of
from exporters.capture.components import prefill_cache_kwargs
from exporters.errors import EagerStageError
from exporters.upstream import prepare_traced_inputs, run_component
from exporters.validate.greedy import DecodeStepper, decode_loop

DECODE = "decode"


def call_graph(module: torch.nn.Module, signature: inspect.Signature, runner: Any, args: tuple,
               kwargs: dict[str, Any]) -> Any:
    """Call `runner` (an exported stage of `module`, whose forward has `signature`) the way `module(*args,
    **kwargs)` was called: arguments bound to names, upstream's data-dependent inputs precomputed, untraced flags
    dropped."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    inputs: dict[str, Any] = {}
    for name, value in bound.items():
        kind = signature.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            inputs.update(value)
        elif kind != inspect.Parameter.VAR_POSITIONAL:
            inputs[name] = value
    prepare_traced_inputs(module, inputs)
    return run_component(runner, inputs)


@contextlib.contextmanager
def stages_as_graphs(model: torch.nn.Module, stages: dict[str, torch.nn.Module], runners: dict[str, Any],
                     glue: dict[str, torch.Tensor] | None = None) -> Iterator[None]:
    """While active, calling each stage module runs its exported graph; the parameters named in `glue` (the target
    folder's glue file, `exporters.capture.components.GLUE_FILE`) hold the folder's values; calling any other module
    of `model` that holds weights of its own raises `EagerStageError`. Restores the model on exit."""
    stage_ids = {id(module) for module in stages.values()}
    glue = glue or {}
    guards = []

    def refuse(name: str):
        def hook(_module, _args):
            raise EagerStageError(f"the model's forward ran '{name}' ({type(_module).__name__}) with eager weights: "
                                 "it is not one of the exported stages")
        return hook

    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    for name, module in model.named_modules():
        own = [(f"{name}.{key}" if name else key, p) for key, p in module.named_parameters(recurse=False)]
        if id(module) in stage_ids or not own:
            continue
        if all(key in glue for key, _ in own):
            swapped += [(p, p.data) for _, p in own]
            for key, parameter in own:
                parameter.data = glue[key].to(parameter.device, parameter.dtype)
            continue
        guards.append(module.register_forward_pre_hook(refuse(name or type(model).__name__)))
    patched = []
    try:
        for name, module in stages.items():
            graph = _graph_call(module, inspect.signature(module.forward), runners[name])
            module.forward = graph
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward
        for guard in guards:
            guard.remove()
        for parameter, data in swapped:
            parameter.data = data


def _graph_call(module: torch.nn.Module, signature: inspect.Signature, runner: Any):
    def forward(*args: Any, **kwargs: Any) -> Any:
        return call_graph(module, signature, runner, args, kwargs)
    return forward


def _output(value: Any, *names: str) -> Any:
    for name in names:
        found = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if found is not None:
            return found
    raise KeyError(f"the model's output has none of {list(names)}")


def vision_language_prefill(model, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]], runners,
                            generate_inputs: dict[str, Any],
                            glue: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, Any]:
    """The prompt's logits and cache, computed by the model's forward with every stage replaced by its graph (and
    the weights it reads itself taken from `glue`, the target folder's)."""
    stages = {name: module for name, (module, _) in components.items() if name != DECODE}
    missing = sorted(set(stages) - set(runners))
    if missing:
        raise KeyError(f"no exported graph for stage(s) {missing}")
    with stages_as_graphs(model, stages, runners, glue), torch.no_grad():
        output = model(**copy.deepcopy(generate_inputs), **prefill_cache_kwargs(components.get(DECODE)))
    return _output(output, "logits"), _output(output, "cache", "past_key_values")


def vision_language(model, components, runners, generate_inputs: dict[str, Any], greedy, tokens: list,
                    glue: dict[str, torch.Tensor] | None = None) -> int:
    """Parity driver (see `exporters.validate.parity`): image + prompt → graphs (and the folder's `glue` weights) →
    greedy tokens appended to `tokens`; returns the prompt length."""
    logits, cache = vision_language_prefill(model, components, runners, generate_inputs, glue)
    stepper = DecodeStepper(runners[DECODE], components[DECODE][1], sliding_window_of(model.config),
                            follow_template=True)
    ids = generate_inputs["input_ids"]
    decode_loop(logits, cache, ids, greedy, stepper, tokens)
    return int(ids.shape[1])

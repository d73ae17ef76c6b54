"""How to run a published target, per runtime it was proven in: the model card's snippets.

A target records the deployment runtimes that ran it from its folder alone (`target["runtimes"]`: `{runtime,
status, detail}`, `exporters.validate.runtimes`). The card shows a snippet for each runtime whose proof `passed`,
written by the runtime's layout (`exporters.layouts`: `Layout.snippet`), and, for the formats upstream's loader reads (`.pt2`, one `.pte`
per component), the `ExportedModel.from_pretrained` snippet. A runtime that did not pass gets no snippet: no text
claims more than what ran.

Every snippet is built from the templates here: a report's values (a merged matrix leg's are data from another
machine) enter code only as a checked identifier, an int or `json.dumps`/`repr`, never as written. A snippet that
loads code or a pickle (`needs_pin`: a `.pt2` through `trust_remote_code`, ONNX Runtime GenAI's folder, whose
`genai_config.json` may name a library) pins `revision` to the commit that holds the files (`revision`: the card is
rewritten once that commit exists, `exporters.publish.run`), so it loads what was validated, not what a later
commit put there.

Example:
    >>> target = {"name": "onnx", "export_format": "onnx", "mode": "generation", "expected_components": ["model"],
    ...           "runtimes": [{"runtime": "optimum", "status": "passed", "detail": "batch 2"},
    ...                        {"runtime": "ONNX Runtime GenAI", "status": "failed", "detail": "no genai_config"}]}
    >>> [runtime for runtime, _, _ in target_snippets("org/model", target)]
    ['optimum', 'transformers.exporters']
"""

from __future__ import annotations

import json
from typing import Any

from exporters.layouts import (EXAMPLE_IDS, LAYOUTS, NO_TOKENIZER, PIN_COMMENT, PROMPT, PROMPT_LINE, ExecutorchLlm,
                               file_names, has_tokenizer, identifier, subfolder)

__all__ = ["PROMPT_LINE", "component_inputs", "exported_model_snippet", "needs_pin", "proven_runtimes",
           "target_snippets", "traced_inputs"]

# Formats whose programs are pickled (torch.export .pt2): loading them runs code, so it needs trust_remote_code.
NEEDS_TRUST = ("dynamo",)
# optimum's files for an encoder-decoder's decode step (two decoders, or the merged one): the folder's graphs have
# optimum's input names
OPTIMUM_DECODERS = ("decoder_with_past_model.onnx", "decoder_model_merged.onnx")
# Runtimes whose snippet loads code from the folder: those that execute a config in it (GenAI loads any
# `custom_ops_library` its genai_config.json names).
LOADS_CODE = tuple(layout.runtime for layout in LAYOUTS if layout.executes)
UPSTREAM = "transformers.exporters"
# the stage a vision- or audio-language decomposition holds (exporters.capture.components.VLM_TEXT_STAGES): the
# language model on the embeddings the model's own Python merged
MULTIMODAL_STAGE = "language_model"



def needs_pin(runtime: str, target: dict[str, Any]) -> bool:
    """Whether the snippet of `runtime` loads code or a pickle, so it must pin the commit that holds the files."""
    return runtime in LOADS_CODE or (runtime == UPSTREAM and target.get("export_format") in NEEDS_TRUST)


def proven_runtimes(target: dict[str, Any]) -> list[dict[str, Any]]:
    """The runtimes that ran the target from its folder and passed (`target["runtimes"]`)."""
    return [p for p in target.get("runtimes") or [] if isinstance(p, dict) and p.get("status") == "passed"]


def upstream_loads(target: dict[str, Any]) -> bool:
    """Whether upstream's `ExportedModel.from_pretrained` reads the target's folder: `.pt2` programs, ONNX graphs
    in upstream's layout, or one `.pte` per component (not one program with a method per component, nor the ExecuTorch
    LLM runner's program, whose `forward` takes tokens and positions and holds the cache)."""
    names = file_names(target)
    components = target.get("expected_components") or []
    if target.get("mode") == "generation" and components == ["decode"]:
        return False  # a state-space model's stepped prompt (decode alone, from zeroed states): no snippet written yet
    if target.get("mode") == "generation" and MULTIMODAL_STAGE in components:
        # a vision- or audio-language model's stages, joined by the model's own Python (the image's features in
        # place of its tokens): no snippet written yet (the text decoder's reads sizes its config does not have)
        return False
    if target.get("export_format") == "dynamo":
        return True
    if target.get("export_format") == "onnx":  # not the transformers.js layout (graphs renamed, under onnx/)
        # nor an encoder-decoder in optimum's files and names (exporters.export.seq2seq_names): upstream binds by its
        # own leaf names
        return not any(name.startswith("onnx/") or name.endswith(OPTIMUM_DECODERS) for name in names)
    if target.get("export_format") != "executorch":
        return False
    if any(p.get("runtime") == ExecutorchLlm.runtime for p in target.get("runtimes") or [] if isinstance(p, dict)):
        return False  # the runner's `forward(tokens, input_pos)`, the cache inside: its own snippet says how to run it
    return bool(components) and all(f"{c}.pte" in names for c in components)


# What a single graph's traced inputs are fed from: a tokenizer's outputs, or an image processor's.
TOKENIZER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
IMAGE_INPUTS = ("pixel_values",)


def traced_inputs(target: dict[str, Any]) -> list[str]:
    """The input names the target's first component was traced and checked with (its report's probe shapes), in
    the traced order; empty when the report holds none."""
    for component in target.get("components") or []:
        for check in component.get("checks") or [] if isinstance(component, dict) else []:
            if isinstance(check, dict) and isinstance(check.get("shapes"), dict) and check["shapes"]:
                return [str(name) for name in check["shapes"]]
    return []


def component_inputs(target: dict[str, Any], name: str) -> dict[str, list[int]]:
    """`{input: traced shape}` of one component's traced probe (top-level names: `encoder_outputs`, not its
    leaves); empty when the report holds none."""
    for component in target.get("components") or []:
        if isinstance(component, dict) and component.get("name") == name:
            for check in component.get("checks") or []:
                if isinstance(check, dict) and check.get("probe") == "traced" and isinstance(check.get("shapes"), dict):
                    return {str(key).split(".")[0]: list(shape) for key, shape in check["shapes"].items()}
    return {}


AUDIO_SOURCES = ("input_features", "input_values")


def _encoder_decoder_snippet(where: str, trust: str, target: dict[str, Any]) -> str:
    """An encoder-decoder's generation loop: the encoder once on the folder's feature extractor (or tokenizer)
    output, the prefill on the decoder start token with an empty `EncoderDecoderCache` (one layer per decoder layer,
    as traced), then the decode a token at a time on the cache it returns."""
    encoder = {name: shape for name, shape in component_inputs(target, "encoder").items() if identifier(name)}
    prefill = component_inputs(target, "prefill")
    audio = [name for name in encoder if name in AUDIO_SOURCES]
    imports = ["import torch", "from transformers import DynamicCache, EncoderDecoderCache"]
    if audio:
        imports[:0] = ["import numpy as np"]
        imports.append("from transformers import AutoFeatureExtractor")
        prepare = [f"extractor = AutoFeatureExtractor.from_pretrained({where})",
                   "waveform = np.zeros(extractor.sampling_rate, dtype=np.float32)  # your audio, at this rate",
                   'inputs = extractor(waveform, sampling_rate=extractor.sampling_rate, return_tensors="pt")']
    else:
        imports.append("from transformers import AutoTokenizer")
        shape = encoder.get("input_ids") or [1, 0]
        length = shape[-1] if isinstance(shape[-1], int) and not isinstance(shape[-1], bool) else 0
        dynamic = any(c.get("probe") != "traced" and c.get("verdict") == "passed"
                      for component in target.get("components") or [] if component.get("name") == "encoder"
                      for c in component.get("checks") or [])
        # the comment after the call's parenthesis: inside it, it would comment the parenthesis out
        padding = ("", "") if dynamic or length <= 0 else (
            f', padding="max_length", max_length={int(length)}, truncation=True', "  # as traced")
        prepare = [f"tokenizer = AutoTokenizer.from_pretrained({where})",
                   f'inputs = tokenizer([{json.dumps(PROMPT)}], return_tensors="pt"{padding[0]}){padding[1]}']
    feed = ", ".join(f"{name}=inputs[{name!r}]" for name in encoder)
    mask = ', attention_mask=inputs["attention_mask"]' if "attention_mask" in prefill else ""
    return "\n".join([
        *imports, "from transformers.exporters import ExportedModel", "",
        f"model = ExportedModel.from_pretrained({where}{trust})", "config = model.config", *prepare,
        f'encoded = model.runners["encoder"]({feed})',
        "# a self-attention and a cross-attention cache, one layer per decoder layer: not a bare DynamicCache()",
        "cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))",
        "token = torch.tensor([[config.decoder_start_token_id]])",
        f'step = model.runners["prefill"](decoder_input_ids=token, encoder_outputs=encoded{mask}, cache=cache)',
        "tokens = []",
        "for _ in range(16):",
        "    token = step.logits[:, -1:].argmax(-1)",
        "    tokens.append(token.item())",
        f'    step = model.runners["decode"](decoder_input_ids=token, encoder_outputs=encoded{mask}, '
        "cache=step.cache)",
        "print(tokens)"])


def _single_graph_snippet(where: str, trust: str, names: list[str]) -> str:
    """A non-generation graph called with exactly the inputs it was traced with (an ONNX graph refuses a call that
    lacks one: BERT's `token_type_ids`), prepared by the folder's own tokenizer or image processor."""
    head = ["from transformers.exporters import ExportedModel", "",
            f"model = ExportedModel.from_pretrained({where}{trust})"]
    if names and all(name in TOKENIZER_INPUTS for name in names):
        return "\n".join(["from transformers import AutoTokenizer", *head,
                          f"tokenizer = AutoTokenizer.from_pretrained({where})",
                          f'inputs = tokenizer([{json.dumps(PROMPT)}], return_tensors="pt")',
                          f"outputs = model(**{{name: inputs[name] for name in {names!r}}})"])
    if names and all(name in IMAGE_INPUTS for name in names):
        return "\n".join(["from PIL import Image", "from transformers import AutoImageProcessor", *head,
                          f"processor = AutoImageProcessor.from_pretrained({where})",
                          'image = Image.new("RGB", (224, 224))  # your image',
                          'outputs = model(pixel_values=processor(image, return_tensors="pt").pixel_values)'])
    names = [name for name in names if identifier(name)]  # a comment line: nothing a report holds may end it
    traced = ", ".join(names) if names else "the inputs in the folder's export.json"
    return "\n".join([*head, f"# call model(...) with the traced inputs: {traced}"])


def exported_model_snippet(repo_id: str, target: dict[str, Any], revision: str | None = None) -> str:
    """Python that loads a target with upstream `ExportedModel.from_pretrained` and runs the prompt through it.

    A generation target is called with a cache holding one layer per model layer: `DynamicCache(config=...)`, never
    a plain `DynamicCache()`, which has no layers and fails the program's input spec ("Trying to flatten user inputs
    with exported input tree spec"; docs/upstream-gaps.md)."""
    arguments = [json.dumps(repo_id)]
    if revision:
        arguments.append(f"revision={json.dumps(revision)}")
    arguments.append(f"subfolder={json.dumps(subfolder(target))}")
    where = ", ".join(arguments)
    # the snippet loads what this run exported and validated
    trust = ", trust_remote_code=True" if target.get("export_format") in NEEDS_TRUST else ""  # own artifact
    why = PIN_COMMENT.format(what="a .pt2 is a pickle: trust_remote_code") + "\n" if revision and trust else ""
    return why + _loading_snippet(where, trust, target)


def _loading_snippet(where: str, trust: str, target: dict[str, Any]) -> str:
    components = target.get("expected_components") or []
    if target.get("mode") != "generation":
        return _single_graph_snippet(where, trust, traced_inputs(target))
    if "encoder" in components and "prefill" in components:
        return _encoder_decoder_snippet(where, trust, target)
    lines = ["import torch", "from transformers import AutoTokenizer, DynamicCache",
             "from transformers.exporters import ExportedModel", "",
             f"model = ExportedModel.from_pretrained({where}{trust})"]
    if has_tokenizer(target):
        lines += [f"tokenizer = AutoTokenizer.from_pretrained({where})",
                  PROMPT_LINE, 'input_ids = tokenizer(prompt, return_tensors="pt").input_ids']
    else:
        lines += [f"input_ids = torch.tensor({EXAMPLE_IDS})  {NO_TOKENIZER}"]
    positions = "position_ids=torch.arange(input_ids.shape[1])[None]"
    one_layer_each = "# one cache layer per model layer, as traced: DynamicCache(config=model.config), not DynamicCache()"
    if "prefill" in components:
        lines += [one_layer_each, "outputs = model.runners[\"prefill\"](input_ids=input_ids, "
                  f"{positions}, cache=DynamicCache(config=model.config))",
                  "next_token = outputs.logits[:, -1:].argmax(-1)",
                  "step = model.runners[\"decode\"](input_ids=next_token, "
                  "position_ids=torch.tensor([[input_ids.shape[1]]]), cache=outputs.cache)"]
        return "\n".join(lines)
    lines += ["config = model.config",
              "head_dim = getattr(config, \"head_dim\", None) or config.hidden_size // config.num_attention_heads",
              "empty = torch.zeros(1, config.num_key_value_heads, 0, head_dim)  # past length 0"]
    if target.get("export_format") == "onnx":  # the merged graph, under the names ONNX runtimes feed
        lines += ["# the graph's inputs are named as ONNX runtimes feed them (exporters.export.onnx_names)",
                  "past = {f\"past_key_values.{layer}.{kind}\": empty",
                  "        for layer in range(config.num_hidden_layers) for kind in (\"key\", \"value\")}",
                  "# the graph's runner binds inputs by those names (the model's own call keeps its traced names)",
                  'outputs = model.runners["model"](input_ids=input_ids, attention_mask=torch.ones_like(input_ids), '
                  f"{positions}, **past)"]
        return "\n".join(lines)
    lines += [one_layer_each, "cache = DynamicCache(config=config)",
              "for layer in range(config.num_hidden_layers):",
              "    cache.update(empty, empty, layer)",
              f"outputs = model(input_ids=input_ids, {positions}, cache=cache)"]
    return "\n".join(lines)


def target_snippets(repo_id: str, target: dict[str, Any], revision: str | None = None) -> list[tuple[str, str, str]]:
    """`(runtime, language, code)` for each runtime the target was proven in, then upstream's loader where it reads
    the folder; each downloads the files at `revision` (the commit that holds them) when given."""
    snippets, seen = [], set()
    for proof in proven_runtimes(target):  # a proof only picks one of our layouts and its template, once
        layout = next((layout for layout in LAYOUTS if layout.runtime == proof.get("runtime")), None)
        snippet = layout.snippet(repo_id, target, revision) if layout is not None else None
        if snippet is not None and layout.runtime not in seen:
            seen.add(layout.runtime)
            snippets.append((layout.runtime, *snippet))
    if upstream_loads(target):
        snippets.append((UPSTREAM, "python", exported_model_snippet(repo_id, target, revision)))
    return snippets

"""Deployment layouts: each runtime people deploy with is one package, registered once, here (`LAYOUTS`).

```
exporters/layouts/
  base.py            Layout: may_apply / applies / declines (plan), write_files, reference + prove, snippet
  child.py           how every proof's runtime runs: a child held short (allow-listed env, RLIMIT_DATA, timeout)
  card.py            what every card snippet is built from (download lines, the prompt line, checked identifiers)
  executorch_llm/    the ExecuTorch LLM runner (TextLLMRunner): model.pte in the runner's contract
  executorch_multimodal/  ExecuTorch's MultimodalRunner: a vision-language model.pte (token_embedding, vision_encoder,
                     text_decoder), or an audio-language one's (audio_encoder in place of vision_encoder)
  executorch_speech/ the ExecuTorch ASR runner's layout: model.pte with methods encoder + text_decoder (Whisper,
                     Speech2Text; Moonshine and SpeechT5 on a waveform)
  genai/             ONNX Runtime GenAI: a merged decoder graph and genai_config.json
  transformers_js/   transformers.js on Node.js: onnx/model.onnx and transformers.js_config (Whisper's encoder and
                     merged decoder; a LLaVA's vision_encoder, embed_tokens and decoder_model_merged; a Voxtral's
                     audio_encoder in place of vision_encoder)
  optimum/           optimum's ORTModelForCausalLM, in its side environment: the merged decoder under its names
  sentence_transformers/  SentenceTransformer(folder, backend="onnx"), in the same side environment: an encoder's graph
                     beside the repo's modules and pooling config
  greedy.py          the eager side of the batch proofs (GenAI, optimum): two left-padded prompts, greedy
  ort_greedy.py      a quantized target's batch proofs: the runtime against ONNX Runtime's own greedy of the graph,
                     eager by the variant's budget
```

The stages see only this face: a run's export child asks each layout for its files once the graphs are written
(`write_layout_files`, from `exporters.run.pipeline`), validation runs each
applying layout's proof in its own runtime (`exporters.validate.runtimes`), the card shows the snippet of each that
passed (`exporters.publish.snippets`), and the workbench gives a transformers.js Moonshine target the dynamic waveform
the layout needs (`waveform_kept_dynamic`; `hf-export validate` reads it as exported: `waveform_as_recorded`). A new
layout is one package and one line in `LAYOUTS`.

Example:
    >>> [layout.runtime for layout in LAYOUTS]
    ['ExecuTorch LLM runner', 'ExecuTorch MultimodalRunner', 'ExecuTorch ASR runner layout', 'transformers.js',
     'ONNX Runtime GenAI', 'optimum', 'sentence-transformers']
    >>> layout_named("transformers.js").install.startswith("install Node.js")
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.layouts.base import Layout, components_in
from exporters.layouts.card import (EXAMPLE_IDS, NO_TOKENIZER, PIN_COMMENT, PROMPT, PROMPT_LINE, file_names,
                                    has_tokenizer, identifier, subfolder)
from exporters.layouts.child import (CHILD_ENV, CHILD_TIMEOUT_S, MEMORY_FLOOR_BYTES, MEMORY_PER_FOLDER_BYTE,
                                     ProofStatus, RuntimeContext, RuntimeProof, child_environment, child_message,
                                     child_timeout, kill_child_of, memory_limit, run_in_child, run_script)
from exporters.layouts.executorch_llm import ExecutorchLlm
from exporters.layouts.executorch_multimodal import ExecutorchMultimodal
from exporters.layouts.executorch_speech import ExecutorchSpeech
from exporters.layouts.genai import Genai
from exporters.layouts.optimum import Optimum
from exporters.layouts.sentence_transformers import SentenceTransformers
from exporters.layouts.transformers_js import TransformersJs
from exporters.layouts.transformers_js.speech import waveform_as_recorded, waveform_kept_dynamic

__all__ = ["CHILD_ENV", "CHILD_TIMEOUT_S", "EXAMPLE_IDS", "ExecutorchLlm", "ExecutorchMultimodal", "ExecutorchSpeech",
           "Genai", "LAYOUTS", "NO_TOKENIZER", "Optimum", "PIN_COMMENT", "PROMPT", "PROMPT_LINE", "SentenceTransformers",
           "TransformersJs", "file_names", "has_tokenizer", "identifier",
           "subfolder", "MEMORY_FLOOR_BYTES", "MEMORY_PER_FOLDER_BYTE", "Layout",
           "ProofStatus", "RuntimeContext", "RuntimeProof", "child_environment", "child_message", "child_timeout",
           "components_in", "kill_child_of", "layout_named", "memory_limit", "run_in_child", "run_script",
           "waveform_as_recorded", "waveform_kept_dynamic", "write_layout_files"]

# Every deployment layout, once. Order matters only for the files: transformers.js moves the graph under onnx/
# before GenAI's genai_config.json names its file.
LAYOUTS: tuple[Layout, ...] = (ExecutorchLlm(), ExecutorchMultimodal(), ExecutorchSpeech(), TransformersJs(), Genai(),
                               Optimum(), SentenceTransformers())


def layout_named(runtime: str) -> Layout | None:
    """The registered layout whose runtime is `runtime` (a report's "runs in" name), else None."""
    return next((layout for layout in LAYOUTS if layout.runtime == runtime), None)


def write_layout_files(directory: Path, target: Any, model: Any, notes: list[str], written: list[str]) -> list[str]:
    """Every layout's files beside the exported graphs in `directory` (each decides whether it applies); returns
    `written` (the files the export wrote, relative to `directory`) less those a layout moved away, plus those it
    wrote: what this run wrote, all a runtime proof may read besides the copied files."""
    before = _files(directory)
    for layout in LAYOUTS:
        layout.write_files(directory, target, model, notes)
    after = _files(directory)
    return [name for name in written if name in after] + sorted(after - before)


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file() and not p.is_symlink()}

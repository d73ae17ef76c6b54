"""The ExecuTorch speech layout: one `model.pte` with the methods ExecuTorch's ASR runner (extension/asr/runner,
`Seq2SeqRunner`) and optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq` load, `encoder` (the spectrogram in,
or a raw waveform as `[1, 1, samples]` at the traced length: Moonshine, SpeechT5) and `text_decoder` (one token,
the encoder's states, its cache position; the self-attention cache inside), with their constant metadata methods
(`decoder_start_token_id`, `get_eos_id`, `get_max_seq_len`, ...).

| module      | what it holds                                                                                   |
|-------------|-------------------------------------------------------------------------------------------------|
| `__init__`  | [`ExecutorchSpeech`]: when it applies, the transcription loop its proof runs and its card shows (`TRANSCRIBE`; the card prints the text, `CARD_TEXT`) |
| `proof.py`  | `TRANSCRIBE` on the folder alone in ExecuTorch's Python runtime, token for token against eager `generate()` |

The program itself is the export's (`exporters.capture.asr_runner`, lowered with the methods of
`exporters.upstream.asr_runner`): this package owns what a runtime needs of the folder. The ASR runner has no
Python binding in the pinned executorch, so the proof runs optimum-executorch's loop (encoder once, then
`text_decoder` one token per call, argmax) in `executorch.runtime`, as the card shows it.

Example:
    >>> ExecutorchSpeech().may_apply(type("T", (), {"export_format": "executorch", "layout": "runner"})(),
    ...                              ["encoder", "text_decoder"])
    True
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template
from typing import Any

from exporters.layouts.base import Layout, components_in
from exporters.layouts.card import download, file_names, has_processor, has_tokenizer

# The runner's method names (extension/asr/runner/seq2seq_runner.cpp; exporters.upstream.asr_runner)
METHODS = ("encoder", "text_decoder")
# optimum-executorch's generation loop (`ExecuTorchModelForSpeechSeq2Seq.generate`) on the folder alone: the proof
# runs it, the card shows it. `prompt`: the decoder's first tokens (the start token, then a language and task where
# the model's generate() forces them). Values enter only through json.dumps or as our ints and lines.
TRANSCRIBE = Template("""import torch
from executorch.runtime import Runtime
$setup
program = Runtime.get().load_program($program$data)
def constant(name):
    return program.load_method(name).execute([])[0]
encoder, decoder = program.load_method("encoder"), program.load_method("text_decoder")
$features
states = encoder.execute([features])[0]
prompt = $prompt$comment
eos = constant("get_eos_id")
new = []
for position in range(len(prompt) - 1 + min($steps, constant("get_max_seq_len") - len(prompt) + 1)):
    token = prompt[position] if position < len(prompt) else new[-1]
    logits = decoder.execute([torch.tensor([[token]]), states, torch.tensor([position])])[0]
    if position >= len(prompt) - 1:
        new.append(int(logits[0, -1].argmax()))
        if new[-1] == eos:
            break
$emit
""")
# The card's decoder prompt, as `generate()` builds it from the folder's generation_config.json: the start token, a
# multilingual Whisper's language and task, and `<|notimestamps|>` where the config names it (what the proof's eager
# reference fed: `<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`); a config without those keys (Moonshine,
# Speech2Text, SpeechT5) adds nothing
FIRST_TOKEN = '[constant("decoder_start_token_id")]'
CARD_GENERATION = """import json
import os

generation = {}
if os.path.exists(f"{folder}/generation_config.json"):
    with open(f"{folder}/generation_config.json") as handle:
        generation = json.load(handle)
multilingual = generation.get("is_multilingual") and "<|en|>" in generation.get("lang_to_id", {})
"""
CARD_PROMPT_TAIL = (' + ([generation["lang_to_id"]["<|en|>"], generation["task_to_id"]["transcribe"]] if multilingual '
                    'else []) + [generation[name] for name in ["no_timestamps_token_id"] if name in generation]')
CARD_PROMPT_COMMENT = "  # the decoder's first tokens: your language and task"
QUANTIZED_IMPORT = "import executorch.kernels.quantized  # noqa: F401  (a quantized embedding table's kernels)\n"
# The card's features: the folder's own feature extractor on your audio (here one second of a 440 Hz tone)
CARD_AUDIO = """import numpy
from transformers import AutoFeatureExtractor

extractor = AutoFeatureExtractor.from_pretrained(folder)
seconds = numpy.arange(extractor.sampling_rate) / extractor.sampling_rate
audio = 0.5 * numpy.sin(2 * numpy.pi * 440 * seconds)  # your audio, at extractor.sampling_rate
"""
CARD_FEATURES = CARD_AUDIO + (
    """features = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features""")
# What the card prints: the transcription, the new ids decoded by the folder's own tokenizer (special tokens skipped);
# a folder without a tokenizer (the repo ships none): the ids
CARD_TEXT = """from transformers import AutoTokenizer

print(AutoTokenizer.from_pretrained(folder).decode(new, skip_special_tokens=True))  # the transcription"""
CARD_IDS = "print(new)  # the folder has no tokenizer: the new token ids"
# A waveform model's encoder (Moonshine, SpeechT5) takes the waveform at the length it was traced with, as
# [1, 1, samples]: the audio padded with silence or cut to that length (read from the program)
CARD_WAVEFORM = CARD_AUDIO + """samples = encoder.metadata.input_tensor_meta(0).sizes()[-1]  # the traced length
features = extractor(audio, sampling_rate=extractor.sampling_rate, padding="max_length", max_length=samples,
                     truncation=True, return_tensors="pt").input_values[:, None, :]"""


def transcribe_script(program: str, data: str, features: str, prompt: list[int] | None, steps: int, emit: str,
                      comment: str = "", setup: str = "") -> str:
    """`TRANSCRIBE` filled: `program` and `data` the `load_program` arguments (Python expressions of our own),
    `features` the lines that make `features` (after the methods are loaded), `prompt` the decoder's first ids
    (None: the program's `decoder_start_token_id`), `setup` lines before the program is loaded, the rest our ints
    and lines.

    Example:
        >>> "prompt = [1]" in transcribe_script('"model.pte"', "", "features = None", [1], 4, "print(new)")
        True
    """
    first = '[constant("decoder_start_token_id")]' if prompt is None else json.dumps([int(t) for t in prompt])
    return TRANSCRIBE.substitute(program=program, data=data, features=features, prompt=first, steps=int(steps),
                                 emit=emit, comment=comment, setup=setup)


def takes_waveform(target: dict[str, Any]) -> bool:
    """Whether a reported target's `encoder` was checked on a waveform `input_values` (Moonshine, SpeechT5), read
    from the shapes its checks ran on.

    Example:
        >>> takes_waveform({"components": [{"name": "encoder", "checks": [{"shapes": {"input_values": [1, 1, 8]}}]}]})
        True
    """
    return any("input_values" in (check.get("shapes") or {}) for component in target.get("components") or []
               if component.get("name") == "encoder" for check in component.get("checks") or [])


class ExecutorchSpeech(Layout):
    """ExecuTorch's runtime running a speech program in the ASR runner's layout, as optimum-executorch does."""

    runtime = "ExecuTorch ASR runner layout"
    install = "pip install executorch (the pinned version: `make venv`, the image)"

    def may_apply(self, target: Any, components: list[str]) -> bool:
        return target.export_format == "executorch" and getattr(target, "layout", None) == "runner" \
            and set(components) == set(METHODS)

    def applies(self, target: Any, directory: Path) -> bool:
        components = components_in(directory)
        return self.may_apply(target, list(components)) and all(
            components[name].get("method") == name for name in METHODS)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str] | None:
        if not has_processor(target):  # the snippet runs the folder's feature extractor: none to run as written
            return None
        data = ', data_path=f"{folder}/model.ptd"' if "model.ptd" in file_names(target) else ""
        features = CARD_WAVEFORM if takes_waveform(target) else CARD_FEATURES
        kernels = QUANTIZED_IMPORT if target.get("quantization") else ""  # an 8-bit table's kernels
        return "python", download(repo_id, target, revision) + "\n" + kernels + transcribe_script(
            'f"{folder}/model.pte"', data, features, None, 32, CARD_TEXT if has_tokenizer(target) else CARD_IDS,
            CARD_PROMPT_COMMENT,
            setup=CARD_GENERATION).replace(FIRST_TOKEN, FIRST_TOKEN + CARD_PROMPT_TAIL, 1)

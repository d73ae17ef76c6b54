"""The files ONNX Runtime GenAI reads beside a merged decoder graph: the graph's past/present buffer shared where it
is a `GroupQueryAttention` graph (`buffer.py`), then `genai_config.json` (`config.py`) naming the graph's file; beside
a Whisper export, GenAI's encoder and decoder graphs derived from it (`whisper.py`) and their `genai_config.json`.

Written after the export (and after the transformers.js layout moved the graph, whose file the manifest then names);
a graph with an input GenAI does not feed (its name kept upstream's: `exporters.export.onnx_names`) gets none.

Example:
    >>> from exporters.layouts.genai.config import GENAI_CONFIG
    >>> GENAI_CONFIG
    'genai_config.json'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from exporters import fsutil
from exporters.errors import TargetPlanError
from exporters.export.onnx_names import is_renamed
from exporters.layouts.genai.buffer import SHARED_BUFFER_NOTE, share_past_present_in_file
from exporters.layouts.genai.config import GENAI_CONFIG, write_genai_config
from exporters.layouts.genai.unpadded import UNPADDED_NOTE, write_for_unpadded_calls_in_file
from exporters.layouts.genai.whisper import AUDIO_PROCESSOR, audio_processor_config, whisper_genai_config, \
    write_graphs
from exporters.upstream import read_manifest


def write_files(directory: Path, model: Any, notes: list[str], unpadded: bool = False) -> None:
    """The buffer rewrite and `genai_config.json` for the merged graph in `directory` (see the module); first, where
    the recipe asks for it (`unpadded`), the graph written for GenAI's unpadded calls (`unpadded.py`)."""
    entry = read_manifest(directory)["components"]["model"]
    if not is_renamed(entry):  # an input the runtimes have no name for: the export's note says so
        return
    if unpadded:
        write_for_unpadded_calls_in_file(directory / entry["file"], model)
        notes.append(UNPADDED_NOTE)
    shared = share_past_present_in_file(directory / entry["file"])
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    write_genai_config(directory, model.config, generation_config, entry["file"], share_buffer=shared)
    if shared:
        notes.append(SHARED_BUFFER_NOTE)


def write_whisper_files(directory: Path, model: Any, notes: list[str]) -> None:
    """GenAI's two Whisper graphs (`whisper.py`) beside the encoder and the merged decoder in `directory`, then their
    `genai_config.json`; a folder whose graphs do not have the shape the derivation reads gets none (a note says
    why, and the "runs in" column declines)."""
    components = read_manifest(directory)["components"]
    files = {name: entry.get("file") for name, entry in components.items()}
    if files.get("prefill") != files.get("decode") or not files.get("encoder"):  # two decoder graphs, not merged
        notes.append("ONNX Runtime GenAI: no Whisper graphs written: the decoders are not merged into one graph")
        return
    try:
        encoder, decoder = write_graphs(directory, files["encoder"], files["prefill"])
    except TargetPlanError as error:
        notes.append(f"ONNX Runtime GenAI: no Whisper graphs written: {error}")
        return
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    content = whisper_genai_config(model.config, generation_config, encoder, decoder)
    fsutil.write_file(directory / GENAI_CONFIG, json.dumps(content, indent=4) + "\n")
    extractor = directory / "preprocessor_config.json"
    processor = audio_processor_config(json.loads(extractor.read_text(encoding="utf-8")) if extractor.is_file()
                                       else {}, int(model.config.num_mel_bins))
    if isinstance(processor, str):
        notes.append(f"ONNX Runtime GenAI: no {AUDIO_PROCESSOR} written (its processor cannot make this model's "
                     f"features; feed audio_features yourself): {processor}")
    else:
        fsutil.write_file(directory / AUDIO_PROCESSOR, json.dumps(processor, indent=4) + "\n")

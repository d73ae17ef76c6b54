"""The files ONNX Runtime GenAI reads beside a merged decoder graph: the graph's past/present buffer shared where it
is a `GroupQueryAttention` graph (`buffer.py`), then `genai_config.json` (`config.py`) naming the graph's file.

Written after the export (and after the transformers.js layout moved the graph, whose file the manifest then names);
a graph with an input GenAI does not feed (its name kept upstream's: `exporters.export.onnx_names`) gets none.

Example:
    >>> from exporters.layouts.genai.config import GENAI_CONFIG
    >>> GENAI_CONFIG
    'genai_config.json'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from exporters.export.onnx_names import is_renamed
from exporters.layouts.genai.buffer import SHARED_BUFFER_NOTE, share_past_present_in_file
from exporters.layouts.genai.config import write_genai_config
from exporters.upstream import read_manifest


def write_files(directory: Path, model: Any, notes: list[str]) -> None:
    """The buffer rewrite and `genai_config.json` for the merged graph in `directory` (see the module)."""
    entry = read_manifest(directory)["components"]["model"]
    if not is_renamed(entry):  # an input the runtimes have no name for: the export's note says so
        return
    shared = share_past_present_in_file(directory / entry["file"])
    generation_config = (GenerationConfig.from_pretrained(directory)
                         if (directory / "generation_config.json").is_file() else None)
    write_genai_config(directory, model.config, generation_config, entry["file"], share_buffer=shared)
    if shared:
        notes.append(SHARED_BUFFER_NOTE)

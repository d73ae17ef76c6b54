"""transformers.js's layout: `onnx/model{suffix}.onnx` (or an encoder-decoder's `onnx/encoder_model` and
`onnx/decoder_model_merged`) with `transformers.js_config` in `config.json`, loaded by transformers.js on Node.js.

| module       | what it holds                                                                                    |
|--------------|--------------------------------------------------------------------------------------------------|
| `__init__`   | [`TransformersJs`]: when it applies (`"layout": "transformers.js"`), where the runtime is installed, the generation script its proof runs and its card shows (`GENERATE`, one template) |
| `files.py`   | the folder rewritten to the layout transformers.js loads                                          |
| `proof.py`   | Node.js runs `GENERATE` on the folder alone, token for token against eager greedy                 |
| `speech.py`  | a speech encoder-decoder (Whisper): `TRANSCRIBE`, the card's script and the proof's               |
| `speech_proof.py` | Node.js runs `TRANSCRIBE` on the folder alone, token for token against eager `generate()`    |

The pinned transformers.js is looked up in `HF_EXPORT_TRANSFORMERS_JS` (a folder holding
`node_modules/@huggingface/transformers`), else the project's `.cache/transformers-js` (`make test-deps` installs it).

Example:
    >>> print(generate_script('"model/exports"', '"tjs"', [1, 2, 3], 4, "console.log(ids);")[-40:])
    do_sample: false });
    console.log(ids);
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from string import Template
from typing import Any

from exporters.files import EXPORTS_DIR
from exporters.layouts.base import Layout
from exporters.layouts.card import file_names
from exporters.layouts.transformers_js.speech import CARD_FEATURES, transcribe_script
from exporters.recipe.layout import TRANSFORMERS_JS

LAYOUT = TRANSFORMERS_JS  # the recipe's `layout` value
VERSION = "4.3.2"  # the pinned @huggingface/transformers (Makefile's TJS_VERSION)
HOME_SETTING = "HF_EXPORT_TRANSFORMERS_JS"
DEFAULT_HOME = Path(__file__).resolve().parents[3] / ".cache" / "transformers-js"
# Greedy generation from a folder: the proof runs it on the target folder with eager's prompt, the card shows it
# with the published folder. Values enter only through json.dumps.
GENERATE = Template("""import { env, AutoModelForCausalLM, Tensor } from '@huggingface/transformers';

env.allowRemoteModels = false;
env.localModelPath = $root;
const model = await AutoModelForCausalLM.from_pretrained($name, { device: 'cpu' });
const ids = $ids;$comment
const input_ids = new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]);
const attention_mask = new Tensor('int64', BigInt64Array.from(ids.map(() => 1n)), [1, ids.length]);
const output = await model.generate({ input_ids, attention_mask, max_new_tokens: $steps, min_new_tokens: $steps, do_sample: false });
$emit
""")


def generate_script(root: str, name: str, ids: list[int], steps: int, emit: str, comment: str = "") -> str:
    """`GENERATE` filled: `root` and `name` already JSON strings, `ids` and `steps` our ints, `emit` our line."""
    return GENERATE.substitute(root=root, name=name, ids=json.dumps([int(i) for i in ids]), steps=int(steps),
                               emit=emit, comment=comment)


def home() -> Path:
    """Where the pinned transformers.js is installed: `HF_EXPORT_TRANSFORMERS_JS`, else `.cache/transformers-js`."""
    return Path(os.environ.get(HOME_SETTING) or DEFAULT_HOME)


class TransformersJs(Layout):
    """transformers.js generating from a folder in its layout, on Node.js."""

    runtime = "transformers.js"  # the runtime's name (the recipe's layout value is the same word)
    install = (f"install Node.js and @huggingface/transformers {VERSION} (`make test-deps` puts it in "
               f".cache/transformers-js; or set {HOME_SETTING} to a folder holding node_modules/@huggingface/"
               "transformers)")

    def may_apply(self, target: Any, components: list[str]) -> bool:
        return target.export_format == "onnx" and getattr(target, "layout", None) == LAYOUT

    def write_files(self, directory: Path, target: Any, model: Any, notes: list[str]) -> None:
        if self.may_apply(target, []):
            self.part("files").write_transformers_js(directory, target, model)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        sub = f"{EXPORTS_DIR}/{target['name']}"
        pinned = f" --revision {json.dumps(revision)}" if revision else ""
        download = f"// after: hf download {json.dumps(repo_id)}{pinned} --include {json.dumps(sub + '/*')} --local-dir model\n"
        if {"onnx/encoder_model.onnx", "preprocessor_config.json"} <= file_names(target):  # Whisper: speech.py
            return "js", download + transcribe_script(json.dumps(f"model/{EXPORTS_DIR}"),
                                                      json.dumps(str(target["name"])), CARD_FEATURES, 32,
                                                      "console.log(JSON.stringify(Array.from(output.data, Number)));")
        return "js", download + generate_script(json.dumps(f"model/{EXPORTS_DIR}"), json.dumps(str(target["name"])),
                                                [1, 2, 3], 32, "console.log(Array.from(output.data, Number));",
                                                "  // your prompt's token ids")

"""sentence-transformers' layout: an encoder's ONNX graph (`model.onnx`) beside the repo's `modules.json`,
`sentence_bert_config.json` and pooling folder (`1_Pooling/config.json`), loaded by
`SentenceTransformer(folder, backend="onnx")`.

| module      | what it holds                                                                                   |
|-------------|-------------------------------------------------------------------------------------------------|
| `__init__`  | [`SentenceTransformers`]: when it applies, which modules it takes, the side environment it runs in, the encoding script its proof runs and its card shows (`ENCODE`, one template) |
| `proof.py`  | the side environment's Python runs `ENCODE` on the folder alone, against the eager model's pooled embeddings |

sentence-transformers' ONNX backend loads `model.onnx` from the folder (else `onnx/model.onnx`; its own export
writes the latter, its loader reads the former first: `sentence_transformers.backend.utils.backend_should_export`),
so the graph stays where upstream's manifest, optimum and `ExportedModel` find it. The module files are copied from
the repo (`exporters.export.folder_files`); `modules.json` names the classes sentence-transformers imports, so the
proof runs only where every module is one of sentence-transformers' own that it computes (`MODULES`) and no config
asks for the repo's code (`declines`). It needs transformers 4.x: it runs in the side environment optimum runs in
(`HF_EXPORT_OPTIMUM_PYTHON`, else `.cache/optimum-venv`, which `make test-deps` creates from
tests/optimum/constraints.txt), never the product's.

Example:
    >>> print(encode_script("folder", ["a", "b"], "print(embeddings.shape)").splitlines()[2])
    model = SentenceTransformer(folder, backend="onnx")
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template
from typing import Any

from google.protobuf.message import DecodeError

from exporters.layouts.base import Layout, components_in, read_json
from exporters.layouts.card import download
from exporters.recipe.layout import TRANSFORMERS_JS

MODEL = "model"  # the one component of an encoder export
MODULES_FILE = "modules.json"
# The sentence-transformers modules the proof computes on the eager side (by their class's last name, in a
# `sentence_transformers.` class path), the first the model itself at the folder's root
MODULES = ("Transformer", "Pooling", "Normalize")
# Pooling modes the eager side computes (sentence-transformers' names, legacy `pooling_mode_*` keys mapped to them
# in its own order: `sentence_transformers.sentence_transformer.modules.pooling`)
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
COMPUTED_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
CONFIGS = ("sentence_bert_config.json", "config_sentence_transformers.json")
SENTENCES = ["The cat sat on the mat.", "A small model encodes two sentences of different lengths."]
# Encoding sentences: the proof runs it on the target folder with its sentences, the card shows it with the published
# folder. Values enter only through json.dumps or as our lines.
ENCODE = Template("""${download}from sentence_transformers import SentenceTransformer

model = SentenceTransformer(folder, backend="onnx"$options)
sentences = $sentences$comment
embeddings = model.encode(sentences)
$emit
""")


def encode_script(where: str, sentences: list[str], emit: str, options: str = "", download_lines: str = "",
                  comment: str = "") -> str:
    """`ENCODE` filled: `where` is a Python expression naming the folder (`folder = ...` is written first unless it
    is `folder`), `sentences` enter through json.dumps, the rest are our lines."""
    prefix = download_lines if where == "folder" else f"folder = {where}\n"
    return ENCODE.substitute(download=prefix, options=options, sentences=json.dumps([str(s) for s in sentences]),
                             emit=emit, comment=comment)


def pooling_modes(config: dict[str, Any]) -> list[str]:
    """The pooling modes of a `1_Pooling/config.json`, in the order sentence-transformers concatenates them.

    Example:
        >>> pooling_modes({"pooling_mode_cls_token": True}), pooling_modes({"pooling_mode": ["mean", "max"]})
        (['cls'], ['mean', 'max'])
    """
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in POOLING_MODES.items() if config.get(key)]
        return modes or ["mean"]  # sentence-transformers' own default
    return [mode] if isinstance(mode, str) else [str(m) for m in mode] if isinstance(mode, list) else [repr(mode)]


def modules_in(directory: Path) -> list[dict[str, Any]]:
    """The entries of the folder's `modules.json` (none where it is missing or unreadable)."""
    try:
        modules = json.loads((Path(directory) / MODULES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def fixed_shape(directory: Path) -> str | None:
    """Why the folder's graph cannot encode a batch of sentences padded to the longest (an input whose batch or
    sequence axis was exported fixed: the plainest recipe's `dynamic: false`), else None."""
    import onnx  # deferred: the heavy stack, read only when a folder is judged

    graph = components_in(directory).get(MODEL, {}).get("file")
    try:
        inputs = onnx.load(str(Path(directory) / str(graph)), load_external_data=False).graph.input
    except (OSError, ValueError, DecodeError):
        return None  # an unreadable graph fails our own checks, which say why
    for value in inputs:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        if any(isinstance(d, int) for d in dims[:2]):
            return (f"the graph's input {value.name!r} has the fixed shape {dims}, and sentence-transformers encodes "
                    f"a batch of sentences padded to the longest: export it with `dynamic: true`")
    return None


def unsupported(directory: Path) -> str | None:
    """Why the sentence-transformers model in `directory` is not one this layout proves: a module outside `MODULES`
    (a class path that is not sentence-transformers' own would import code), a pooling mode the eager side does not
    compute, or a config asking for the repo's code; None when it is.

    Example:
        >>> unsupported(Path("/nonexistent"))
        'modules.json names no modules'
    """
    modules = modules_in(directory)
    if not modules:
        return f"{MODULES_FILE} names no modules"
    kinds = [str(m.get("type", "")) for m in modules]
    for kind in kinds:
        if not kind.startswith("sentence_transformers.") or kind.rsplit(".", 1)[-1] not in MODULES:
            return (f"{MODULES_FILE} names the module {kind!r}: the proof computes sentence-transformers' own "
                    f"{', '.join(MODULES)} only")
    if kinds[0].rsplit(".", 1)[-1] != "Transformer" or str(modules[0].get("path", "")) not in ("", "."):
        return f"{MODULES_FILE}'s first module is not the Transformer at the folder's root (where the graph is)"
    if not any(kind.endswith(".Pooling") for kind in kinds):
        return f"{MODULES_FILE} lists no Pooling module (the proof compares sentence embeddings)"
    for entry in modules[1:]:
        path = str(entry.get("path", ""))
        if str(entry.get("type", "")).endswith(".Pooling"):
            if ".." in Path(path).parts or Path(path).is_absolute():
                return f"{MODULES_FILE}'s pooling path {path!r} leaves the folder"
            modes = pooling_modes(read_json(Path(directory) / path / "config.json"))
            others = [m for m in modes if m not in COMPUTED_MODES]
            if others:
                return f"its pooling mode {others[0]!r} is not one the proof computes ({', '.join(COMPUTED_MODES)})"
    for name in CONFIGS:
        if "trust_remote_code" in json.dumps(read_json(Path(directory) / name)):
            return f"{name} asks for the repo's own code (trust_remote_code), which nothing here runs"
    return None


class SentenceTransformers(Layout):
    """`SentenceTransformer(folder, backend="onnx")` encoding sentences from an encoder's ONNX folder, in the side
    environment."""

    runtime = "sentence-transformers"
    install = ("create the side environment with sentence-transformers (`make test-deps`: .cache/optimum-venv, pinned "
               "by tests/optimum/constraints.txt), or set HF_EXPORT_OPTIMUM_PYTHON to a python that has "
               "sentence-transformers and optimum-onnx")

    def may_apply(self, target: Any, components: list[str]) -> bool:
        return target.export_format == "onnx" and target.mode != "generation" \
            and list(components) == [MODEL] and getattr(target, "layout", None) != TRANSFORMERS_JS

    def applies(self, target: Any, directory: Path) -> bool:
        # a repo that ships sentence-transformers' modules, exported as one graph
        return (directory / MODULES_FILE).is_file() and list(components_in(directory)) == [MODEL] \
            and self.may_apply(target, [MODEL])

    def declines(self, target: Any, directory: Path) -> str | None:
        if not (directory / MODULES_FILE).is_file():
            return None
        return unsupported(directory) or fixed_shape(directory)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        return "python", encode_script("folder", SENTENCES, "print(embeddings.shape)",
                                       download_lines=download(repo_id, target, revision) + "\n",
                                       comment="  # your sentences")

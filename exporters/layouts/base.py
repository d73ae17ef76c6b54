"""What every deployment layout is to the stages: one small interface ([`Layout`]).

```
plan      may_apply(target, components) / applies(target, directory) / declines(target, directory)
files     write_files(directory, target, model, notes)     the files it writes beside the graphs (after the export)
proof     reference(model, context) -> prove(directory, reference, context) -> RuntimeProof
card      snippet(repo_id, target, revision) -> (language, code)
```

A layout's class (its package's `__init__`) holds the light part: its name, when it applies, how its runtime is
installed, its card snippet; the stages without torch (publish, report) read only these. Its heavy parts are
modules of its own package loaded on first use by name (`files.py`, `proof.py`: each loads torch or ONNX): a
package's own modules, never a stage's, so the stages still import only `exporters.layouts`.

Example:
    >>> class Plain(Layout):
    ...     runtime = "plain"
    >>> Plain().may_apply(None, []), Plain().snippet("org/model", {}, None)
    (False, None)
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from exporters.layouts.child import RuntimeContext, RuntimeProof


MANIFEST = "export.json"  # upstream's manifest of a saved export (exporters.upstream's MANIFEST_FILE)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from the folder (a config or tokenizer file, read as data), {} where it is missing or not one.

    Example:
        >>> read_json(Path("/nonexistent.json"))
        {}
    """
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def latent_cache(directory: Path) -> str | None:
    """Why a runtime that holds a key/value cache per head cannot take the model in `directory`: its attention keeps
    a latent (compressed) cache (DeepSeek-V2/V3's multi-head latent attention, `kv_lora_rank`), else None.

    Example:
        >>> latent_cache(Path("/nonexistent")) is None
        True
    """
    config = read_json(Path(directory) / "config.json")
    config = config.get("text_config") or config
    if not config.get("kv_lora_rank"):
        return None
    return (f"its attention keeps a latent (compressed) cache (kv_lora_rank {config['kv_lora_rank']}, model type "
            f"{config.get('model_type')!r}), where the runtime holds a key/value cache per head")


# A decoder-only generation export without its merged graph: prefill + decode, or the decode alone (a state-space
# model's prompt stepped through it: `exporters.capture.stepped`)
SEPARATE_DECODERS = ({"prefill", "decode"}, {"decode"})


def may_feed(target: Any, components: list[str]) -> bool:
    """Whether a runtime that runs one merged decoder graph (ONNX Runtime GenAI, optimum) is asked about an ONNX
    generation folder of these components: the merged graph (`model`), or a decoder-only export without it
    ([`SEPARATE_DECODERS`]), which [`not_fed`] declines with the reason."""
    return target.export_format == "onnx" and target.mode == "generation" \
        and (list(components) == ["model"] or set(components) in SEPARATE_DECODERS)


def not_fed(directory: Path) -> str | None:
    """Why a runtime that runs one merged decoder graph (ONNX Runtime GenAI, optimum) cannot take a decoder-only
    ONNX generation folder: its export is `prefill` and `decode` (or `decode` alone) with no merged graph, or its
    merged graph takes an input the runtimes do not feed (the graph kept upstream's names:
    `exporters.export.onnx_names.unnamed_inputs`); None for a merged graph under the runtimes' names, or another
    folder.

    Example:
        >>> not_fed(Path("/nonexistent")) is None
        True
    """
    components = components_in(directory)
    if set(components) in SEPARATE_DECODERS:
        files = " and ".join(f"{name}.onnx" for name in ("prefill", "decode") if name in components)
        return (f"its generation export is {files} with no merged decoder graph (the findings say why), where the "
                "runtime runs one graph (model.onnx) fed past_key_values for the prompt on an empty past and every step")
    if list(components) == ["model"] and not isinstance(components["model"].get("inputs"), dict):
        return ("its merged graph takes an input the runtime does not feed (upstream's name kept: the findings name "
                "it), beside input_ids, attention_mask, position_ids and past_key_values")
    return None


def components_in(directory: Path) -> dict[str, dict[str, Any]]:
    """The components a written folder's manifest names, with their entries (none where it is unreadable: our own
    checks say why).

    Example:
        >>> components_in(Path("/nonexistent"))
        {}
    """
    try:
        components = json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8"))["components"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return components if isinstance(components, dict) else {}


class Layout:
    """A deployment layout: the files one runtime loads, when they apply, its proof and its card snippet."""

    runtime: str = ""  # the name in the report's "runs in" column and the card's snippets
    install: str = ""  # how to install the runtime where it is missing (the report says it: `not run here`)
    executes: tuple[str, ...] = ()  # configs in the folder the runtime executes from (`folder_trust.may_read`)

    def may_apply(self, target: Any, components: list[str]) -> bool:
        """Before the folder exists: whether the target, with these components, has this layout (True wherever
        `applies` can be, so the eager references computed ahead of the artifact cover every proof)."""
        return False

    def applies(self, target: Any, directory: Path) -> bool:
        """Whether the written folder `directory` is in this layout (its runtime's proof runs)."""
        return self.may_apply(target, [])

    def may_decline(self, target: Any, components: list[str]) -> bool:
        """Whether a written folder of these components is asked [`declines`]: wherever the layout may apply, and
        where it cannot though the target is of the runtime's kind (its "runs in" cell then says why, never empty)."""
        return self.may_apply(target, components)

    def declines(self, target: Any, directory: Path) -> str | None:
        """Why this runtime cannot take the model in `directory` (a family, cache kind or tokenizer kind it does not
        hold, read from the folder's own files), else None: the layout is then not written (or its proof not run),
        the "runs in" column shows ✗ with the reason, and the artifact's own verdict stands."""
        return None

    def write_files(self, directory: Path, target: Any, model: Any, notes: list[str]) -> None:
        """Write the files the runtime reads beside the exported graphs in `directory` (a no-op by default)."""

    def reference(self, model: Any, context: RuntimeContext) -> Any:
        """The eager side of the proof (computed before the model is released): the package's `proof.reference`."""
        return self.part("proof").reference(self, model, context)

    def prove(self, directory: Path, reference: Any, context: RuntimeContext) -> RuntimeProof:
        """Load `directory` alone in the runtime's own code, run it, compare with `reference`: `proof.prove`."""
        return self.part("proof").prove(self, directory, reference, context)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str] | None:
        """`(language, code)` for the card, where the runtime's proof passed: how to run the published folder."""
        return None

    def not_here(self) -> RuntimeProof:
        """The proof where the runtime is not installed: `unverified`, saying how to install it (never a pass)."""
        return RuntimeProof(self.runtime, "unverified", f"not run here: {self.install}")

    def part(self, name: str) -> ModuleType:
        """The module `name` of this layout's own package (`proof`, `files`), imported on first use: each loads
        torch or ONNX, which the light stages (publish, report) never pay for."""
        package = type(self).__module__
        return importlib.import_module(f"{package}.{name}")

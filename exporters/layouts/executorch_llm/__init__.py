"""The ExecuTorch LLM runner's layout: one `model.pte` in the runner's contract (`forward(tokens, input_pos)`, the
cache inside, constant metadata methods) and `tokenizer.json` beside it, run by executorch's `TextLLMRunner`.

| module      | what it holds                                                                                   |
|-------------|-------------------------------------------------------------------------------------------------|
| `__init__`  | [`ExecutorchLlm`]: when it applies (an ExecuTorch target with `layout: runner`), its card snippet |
| `proof.py`  | `TextLLMRunner` generating from the folder alone, token for token against eager greedy          |

The program itself is the export's (`exporters.export.llm_runner`, `exporters.capture.llm_runner`, lowered by
`exporters.upstream.llm_runner`): this package owns what a runtime needs of the folder.

Example:
    >>> ExecutorchLlm().runtime
    'ExecuTorch LLM runner'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.capture.chat_prompt import TEXT_PROMPT as CHAT_PROMPT
from exporters.layouts.base import Layout, components_in, read_json
from exporters.layouts.card import PROMPT_LINE, download, file_names

# ExecuTorch's custom kernels (llama::sdpa_with_kv_cache, update_cache), registered on import: a program exported
# with the custom SDPA fails to load without them. The proof's child and the card's snippet start with these lines.
# What the runner's C++ tokenizer (pytorch-labs/tokenizers' HF tokenizer) cannot load: a word-level vocabulary, a
# whitespace pre-tokenizer (it refuses the file; the program itself is correct)
UNREAD_MODELS = frozenset({"WordLevel"})
UNREAD_PRE_TOKENIZERS = frozenset({"Whitespace", "WhitespaceSplit"})
RUNNER_IMPORTS = ("import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the llama:: kernels)\n"
                  "import executorch.kernels.quantized  # noqa: F401  (a quantized embedding table's kernels)\n"
                  "from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner\n")
# The kernel libraries RUNNER_IMPORTS' first two lines load (`llama::` and the quantized kernels, which register
# themselves with ExecuTorch's runtime as they load), loaded by a proof's child as executorch's own modules load them
# (`torch.ops.load_library`; the custom ops required, the quantized ones where installed) but without the Python
# around them: that imports torch._inductor's lowerings and executorch.exir for exporting, 3.4 of the child's 5.2 CPU
# seconds (benchmarks/RESULTS.md). The card's snippet keeps RUNNER_IMPORTS (tests run it as written).
CUSTOM_OPS_KERNELS = r"""import glob, importlib.util, os
import torch
_executorch = importlib.util.find_spec("executorch").submodule_search_locations[0]
_custom_ops = glob.glob(os.path.join(_executorch, "extension/llm/custom_ops/**/*custom_ops_aot_lib.*"), recursive=True)
if len(_custom_ops) != 1:  # as executorch's custom_ops.py asserts
    raise ImportError(f"expected one custom_ops_aot_lib in the installed executorch ({_executorch}), found "
                      f"{len(_custom_ops)}: reinstall the pinned executorch")
torch.ops.load_library(_custom_ops[0])
"""
# `executorch.runtime` (its pybindings, `portable_lib`) imports one decorator from `executorch.exir._warnings`, which
# runs the compiler's whole package first (`executorch.exir`: ~3 of a multimodal or speech proof child's ~5 CPU
# seconds, benchmarks/RESULTS.md). A proof's child loads the pybindings with that one module read from a package
# that runs nothing, then forgets both: a later `import executorch.exir` is the real package. A pybindings that
# needs more of the compiler fails to import here (the proof fails; it never passes on less).
RUNTIME_WITHOUT_COMPILER = r"""import importlib.util as _spec, os as _os, sys as _sys, types as _types
_exir = _types.ModuleType("executorch.exir")
_exir.__path__ = [_os.path.join(_spec.find_spec("executorch").submodule_search_locations[0], "exir")]
_sys.modules["executorch.exir"] = _exir
try:
    from executorch.extension.pybindings import portable_lib  # noqa: F401
finally:
    for _name in ("executorch.exir", "executorch.exir._warnings"):
        _sys.modules.pop(_name, None)
"""
QUANTIZED_KERNELS = r"""try:  # as executorch.kernels.quantized: a library not installed is not loaded
    [_quantized] = glob.glob(os.path.join(_executorch, "kernels/quantized/**/*quantized_ops_aot_lib.*"), recursive=True)
    torch.ops.load_library(_quantized)
except Exception:
    pass
"""


def runner_child_imports(runner: str, quantized: bool = True) -> str:
    """The lines a runner proof's child starts with: the kernel libraries its card's imports load
    ([`CUSTOM_OPS_KERNELS`], and [`QUANTIZED_KERNELS`] where `quantized`), then `runner` (the pybinding's class) with
    `GenerationConfig`.

    Example:
        >>> runner_child_imports("TextLLMRunner").splitlines()[-1]
        'from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner'
    """
    kernels = CUSTOM_OPS_KERNELS + (QUANTIZED_KERNELS if quantized else "")
    return kernels + f"from executorch.extension.llm.runner import GenerationConfig, {runner}\n"


class ExecutorchLlm(Layout):
    """`TextLLMRunner` on an ExecuTorch target in the runner layout."""

    runtime = "ExecuTorch LLM runner"
    install = "pip install executorch (the pinned version, with its LLM runner pybinding: `make venv`, the image)"

    def may_apply(self, target: Any, components: list[str]) -> bool:
        # a speech program in the ASR runner's layout is `executorch_speech`'s
        return target.export_format == "executorch" and getattr(target, "layout", None) == "runner" \
            and "text_decoder" not in components

    def applies(self, target: Any, directory: Path) -> bool:
        return self.may_apply(target, list(components_in(directory)))

    def declines(self, target: Any, directory: Path) -> str | None:
        tokenizer = read_json(directory / "tokenizer.json")
        model = (tokenizer.get("model") or {}).get("type")
        pre = tokenizer.get("pre_tokenizer") or {}
        kinds = {p.get("type") for p in [pre, *pre.get("pretokenizers", [])] if isinstance(p, dict)}
        refused = sorted(({model} & UNREAD_MODELS) | (kinds & UNREAD_PRE_TOKENIZERS))
        if refused:
            return f"the runner's C++ tokenizer cannot load a tokenizer.json with {' and '.join(refused)}"
        return None

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        data = ', f"{folder}/model.ptd"' if "model.ptd" in file_names(target) else ""  # positional, as the proof
        return "python", (
            download(repo_id, target, revision)
            + RUNNER_IMPORTS + "from transformers import AutoTokenizer\n\n"
            f'runner = TextLLMRunner(f"{{folder}}/model.pte", f"{{folder}}/tokenizer.json"{data})\n'
            + PROMPT_LINE + "\n"
            "tokenizer = AutoTokenizer.from_pretrained(folder)\n"
            + CHAT_PROMPT  # the repo's chat template, as the proof's prompt (exporters.capture.chat_prompt)
            # the runner prints each piece itself (a callback that printed would print it twice), then its stats line
            + "runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=32, temperature=0))"
            "  # the runner prints the text as it generates")

"""What every layout's card snippet is built from: the download lines, the prompt line, a checked identifier.

Every snippet is built from templates: a report's values (a merged matrix leg's are data from another machine) enter
code only as a checked identifier, an int or `json.dumps`/`repr`, never as written. A snippet that loads code pins
`revision` to the commit that holds the files (`PIN_COMMENT`).

Example:
    >>> subfolder({"name": "onnx"}), identifier("input_ids"), identifier("import")
    ('exports/onnx', 'input_ids', None)
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from exporters.files import EXPORTS_DIR

PROMPT = "Hello"
# The one line a user edits: the prompt (tests that run the snippets as written put their tokenizer's words here).
PROMPT_LINE = f"prompt = {json.dumps(PROMPT)}  # your prompt"
PIN_COMMENT = "# revision: the commit that holds the validated files ({what})"


def identifier(name: Any) -> str | None:
    """`name` when it is a Python identifier (a keyword argument a snippet may write), else None."""
    return name if isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) else None


def subfolder(target: dict[str, Any]) -> str:
    """The target's folder in the model repo (`exports/<name>`)."""
    return f"{EXPORTS_DIR}/{target['name']}"


def revision_argument(revision: str | None) -> str:
    """`, revision="<sha>"` for a pinned call, else nothing."""
    return f", revision={json.dumps(revision)}" if revision else ""


def download(repo_id: str, target: dict[str, Any], revision: str | None = None, loads: str = "") -> str:
    """Python lines that download one target folder (at `revision`, with why it is pinned) and name it `folder`."""
    sub = subfolder(target)
    why = PIN_COMMENT.format(what=loads) + "\n" if revision and loads else ""
    return ("from huggingface_hub import snapshot_download\n\n" + why
            + f"folder = snapshot_download({json.dumps(repo_id)}{revision_argument(revision)}, "
            f"allow_patterns=[{json.dumps(sub + '/*')}]) + {json.dumps('/' + sub)}\n")


def file_names(target: dict[str, Any]) -> set[str]:
    """The target's files (the report's list), relative to its folder."""
    prefix = f"{target['name']}/"
    return {str(f.get("path", "")).removeprefix(prefix) for f in target.get("files") or [] if isinstance(f, dict)}


# A folder without a tokenizer (the model repo ships none): the snippets feed token ids, as the proofs do.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")
EXAMPLE_IDS = [[1, 2, 3]]
NO_TOKENIZER = "# the folder has no tokenizer: your prompt's token ids"


# The files a processor or feature extractor loads from (transformers 5 keeps the image processor inside
# processor_config.json): a snippet that calls `AutoProcessor` / `AutoFeatureExtractor` on the folder needs one
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def has_processor(target: dict[str, Any]) -> bool:
    """Whether the target folder holds a processor or feature extractor (a repo may ship none): a snippet that runs
    the folder's processor is shown only then, since it would not run as written.

    Example:
        >>> has_processor({"name": "et", "files": [{"path": "et/model.pte"}, {"path": "et/processor_config.json"}]})
        True
        >>> has_processor({"name": "et", "files": [{"path": "et/model.pte"}]})
        False
    """
    return bool(file_names(target) & set(PROCESSOR_FILES))


def has_tokenizer(target: dict[str, Any]) -> bool:
    """Whether the target folder holds a tokenizer (the snippets tokenize the prompt, else feed token ids)."""
    return bool(file_names(target) & set(TOKENIZER_FILES))

"""Where the model comes from: a local folder or a Hub repo, its files, and its tokenizer (the model itself is
loaded by `exporters.capture.loading`, which imports the adapter to upstream: a process that only reads a folder
does not)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2  # huggingface_hub's HTTP client: what it raises when the Hub cannot be reached at all
from huggingface_hub import HfApi, scan_cache_dir, snapshot_download
from huggingface_hub.errors import (CacheNotFound, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from transformers import AutoTokenizer

from exporters import fsutil
from exporters.errors import ModelSourceError, RemoteCodeError
from exporters.files import RECIPE_SOURCES

REPO_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# What a run needs from a repo: never the previous exports, which can be large.
# Files of a model folder whose content reaches an artifact (configs rewritten beside the program, the tokenizer
# and processor files copied into every target folder, `exporters.export.folder_files`): in a local folder none may
# be a link.
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model",
                "added_tokens.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                "processor_config.json", "video_preprocessor_config.json")
# A sentence-transformers model's own files (its modules, pooling and normalization): copied beside COPIED_FILES. Of
# each module folder `modules.json` names (one folder of the model folder: `1_Pooling`, `2_Dense`; the Transformer
# module at "" is the root, whose files are COPIED_FILES), only the inert data files a module holds: its config, a
# Dense module's weights (a safetensors file; `pytorch_model.bin` is a pickle: code when loaded).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
MODULE_FILES = ("config.json", "model.safetensors")
MODULE_FOLDER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# Files a runtime executes from (ONNX Runtime GenAI's `genai_config.json` names libraries and session entries it
# loads): an export writes them, they are never copied from a model folder.
RUNTIME_CONFIGS = ("genai_config.json",)
DOWNLOAD_IGNORE = ["exports/*", "*.onnx", "*.onnx.data", "*.pte", "*.pt2", "*.msgpack", "*.h5", "*.ot", "*.bin.index.json"]


def copyable(name: str) -> bool:
    """Whether the model folder's file `name` (a path relative to it) is one a target folder may get a copy of:
    `COPIED_FILES`, `SENTENCE_TRANSFORMERS_FILES`, or a module folder's `MODULE_FILES`; never a `RUNTIME_CONFIGS`.

    Example:
        >>> copyable("tokenizer.json"), copyable("1_Pooling/config.json"), copyable("genai_config.json")
        (True, True, False)
        >>> copyable("./planted.so"), copyable("st/.docker/config.json"), copyable("2_Dense/pytorch_model.bin")
        (False, False, False)
    """
    if name in COPIED_FILES or name in SENTENCE_TRANSFORMERS_FILES:
        return True
    folder, _, file = name.partition("/")
    return bool(MODULE_FOLDER.match(folder)) and file in MODULE_FILES


@dataclass(kw_only=True)
class SourceOptions:
    """Where a model comes from and what of it may run: the options every run, `validate` and `init` take.

    Example:
        >>> SourceOptions(revision="main").trust_remote_code
        False
    """

    revision: str | None = None  # a Hub revision (branch, tag or commit)
    token: str | None = field(default=None, repr=False)  # a Hub token: never in a repr, a log or a report
    endpoint: str | None = None  # a Hub endpoint URL
    trust_remote_code: bool = False  # the repo's own code may run (`auto_map`), and pickled programs may load

    def resolve(self, model: str) -> ModelSource:
        """The model's files, ready to load ([`resolve_source`])."""
        return resolve_source(model, revision=self.revision, token=self.token, endpoint=self.endpoint)


@dataclass
class ModelSource:
    """A model ready to load: `folder` holds its files; `revision` is the resolved commit for Hub repos."""

    model_id: str
    folder: Path
    revision: str | None = None
    is_hub: bool = False

    @property
    def display(self) -> str:
        return f"{self.model_id}@{self.revision[:8]}" if self.revision else self.model_id


def resolve_source(
    model: str, *, revision: str | None = None, token: str | None = None, endpoint: str | None = None,
    recipe_only: bool = False,
) -> ModelSource:
    """A local folder as is; a Hub repo id downloaded (its weights, configs, tokenizer and recipe; with
    `recipe_only`, just `export_config.json` and `config.json`).

    A local folder whose configs or tokenizer files (`COPIED_FILES`) are links is refused (`ModelSourceError`): what
    they point to would be copied into the artifacts (`exporters.fsutil.model_file`).

    Example:
        >>> resolve_source("examples/demo-model").folder.name  # doctest: +SKIP
        'demo-model'
    """
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{path} has no config.json: point at a folder written by save_pretrained")
        for name in COPIED_FILES:
            fsutil.model_file(path, name)
        return ModelSource(model_id=str(path), folder=path.resolve())
    if path.exists():
        raise ModelSourceError(f"{model} is a file; pass the model's folder or a Hub repo id")
    if not REPO_ID_PATTERN.match(model):
        raise ModelSourceError(f"no folder {model!r} here, and it is not a Hub repo id like 'org/name'")

    api = HfApi(endpoint=endpoint, token=token)
    patterns = {"allow_patterns": list(RECIPE_SOURCES)} if recipe_only else {"ignore_patterns": DOWNLOAD_IGNORE}
    try:
        info = api.model_info(model, revision=revision)
        folder = snapshot_download(model, revision=info.sha, token=token, endpoint=endpoint, **patterns)
    except OfflineModeIsEnabled:
        return _cached_source(model, revision, patterns)
    except httpx2.TransportError as err:
        raise ModelSourceError(f"could not reach the Hub at {api.endpoint} for {model!r} ({err.__class__.__name__}): "
                               "check the network or HF_ENDPOINT, or pass the model's folder") from None
    except RepositoryNotFoundError:
        raise ModelSourceError(f"Hub repo {model!r} not found (or private: give a `token` that can read it)",
                               option="token") from None
    except RevisionNotFoundError:
        raise ModelSourceError(f"`revision` {revision!r} not found in {model!r}", option="revision") from None
    except HfHubHTTPError as err:
        raise ModelSourceError(f"could not read {model!r} from the Hub: {err.__class__.__name__}") from None
    return ModelSource(model_id=model, folder=Path(folder), revision=info.sha, is_hub=True)


def _cached_source(model: str, revision: str | None, patterns: dict[str, Any]) -> ModelSource:
    """With `HF_HUB_OFFLINE` set, the repo's snapshot already in the local Hub cache (huggingface_hub's offline
    mode), its commit read from the snapshot's folder; without a `revision`, the newest cached commit (a run pins
    the commit it downloads, so the cache holds no `main` ref for it); a clear error when none is there."""
    try:
        folder = Path(snapshot_download(model, revision=revision or _newest_cached_commit(model),
                                        local_files_only=True, **patterns))
    except (LocalEntryNotFoundError, FileNotFoundError, OfflineModeIsEnabled):
        at = f" at revision {revision!r}" if revision else ""
        raise ModelSourceError(f"HF_HUB_OFFLINE is set and {model!r}{at} is not in the local Hub cache: download it "
                               "first, unset HF_HUB_OFFLINE, or pass the model's folder") from None
    return ModelSource(model_id=model, folder=folder, revision=folder.name, is_hub=True)


def _newest_cached_commit(model: str) -> str | None:
    """The commit of `model`'s most recently written snapshot in the local Hub cache, None when there is none."""
    try:
        cached = [repo for repo in scan_cache_dir().repos if repo.repo_type == "model" and repo.repo_id == model]
    except CacheNotFound:
        return None
    revisions = [revision for repo in cached for revision in repo.revisions]
    return max(revisions, key=lambda revision: revision.last_modified).commit_hash if revisions else None


def read_config(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelSourceError(f"cannot read {folder / 'config.json'}: {err}") from None


def needs_remote_code(config: dict[str, Any]) -> bool:
    """Whether loading the model would run code from its repo (an `auto_map` in config.json)."""
    return bool(config.get("auto_map"))


def check_remote_code(source: ModelSource, config: dict[str, Any], trust_remote_code: bool) -> None:
    if needs_remote_code(config) and not trust_remote_code:
        raise RemoteCodeError(
            f"{source.model_id} needs code from its repo (config.json has auto_map: "
            f"{sorted(config['auto_map'])}); this is refused unless the operator allows it with "
            "`trust_remote_code`", option="trust_remote_code"
        )


def load_tokenizer(folder: Path):
    """The repo's tokenizer, or None when it has none."""
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception:  # a broken tokenizer falls back to synthesized ids; the run log says so
        return None

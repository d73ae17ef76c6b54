"""The Hub calls a worker makes before running a job: what is at the new head, and does it need an export?

`inspect_repo` reads the repo's file list at one commit (no weights are downloaded), fetches the recipe files
(`export_config.json`, and `config.json` for its `export_config` field), parses the recipe with the same code as
the CLI and returns a `RepoState`:

- `recipe_sha256`: `Recipe.sha256()` of the normalised recipe (None without a recipe, or when it is invalid);
- `weights_key`: a hash of the names and content ids (LFS sha256 or git blob id) of the top-level weight and config
  files, from the Hub's metadata: the same files `exporters.hashing.weights_fingerprint` hashes, without downloading;
- `recipe_problem`: an invalid recipe as the library's `Problem` (every JSON path and line), to tell the repo;
- `opted_out`: the repo holds the opt-out file (`bot.texts.OPT_OUT_FILE`).

Example:
    >>> state = inspect_repo("acme/tiny", "main", token=None, endpoint="http://127.0.0.1:8000")  # doctest: +SKIP
    >>> state.recipe_sha256 is not None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from exporters.errors import RecipeError
from exporters.files import RECIPE_SOURCES
from exporters.hashing import is_weight_file  # the files whose content makes an export's inputs
from exporters.publish.problem import Problem, problem_from_error
from exporters.recipe.load import find_recipe

from .texts import OPT_OUT_FILE


class HubCheckError(Exception):
    """The Hub could not be read. `permanent`: retrying will not help (repo gone, commit gone, no access);
    `hidden`: the bot cannot see the repo at all (treated as private: its name is not shown)."""

    def __init__(self, message: str, *, permanent: bool, hidden: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.hidden = hidden


@dataclass
class RepoState:
    """A repo at one commit, as far as the bot cares."""

    repo_id: str
    head_sha: str
    recipe_file: str | None = None
    recipe_sha256: str | None = None
    recipe_error: str | None = None
    recipe_problem: Problem | None = None
    opted_out: bool = False
    target_names: list[str] = field(default_factory=list)
    # (format, dtype or None, device) per target, variants expanded: what sizes a machine (`bot.backends.hf_jobs`)
    target_specs: list[tuple[str, str | None, str]] = field(default_factory=list)
    weights_key: str = ""
    head_authors: list[str] = field(default_factory=list)
    private: bool | None = None  # as the Hub says now (the webhook payload's flag may be stale)

    @property
    def has_recipe(self) -> bool:
        return self.recipe_file is not None


def weights_key(files: dict[str, str]) -> str:
    """Hash of `{top-level file name: content id}` over weights and configs (not the recipe, not exports/).

    Example:
        >>> weights_key({"model.safetensors": "ab", "export_config.json": "x"}) == weights_key({"model.safetensors": "ab"})
        True
    """
    digest = hashlib.sha256()
    for name in sorted(files):
        if not is_weight_file(name):
            continue
        digest.update(f"{name}\0{files[name]}\n".encode())
    return digest.hexdigest()


def inspect_repo(repo_id: str, revision: str, *, token: str | None, endpoint: str | None,
                 with_authors: bool = False) -> RepoState:
    """Read `repo_id` at `revision` (a commit id, or `main`); raises `HubCheckError`."""
    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, revision=revision or "main", files_metadata=True)
        ids = {}
        for sibling in info.siblings or []:
            lfs = getattr(sibling, "lfs", None)
            ids[sibling.rfilename] = (lfs.sha256 if lfs else None) or sibling.blob_id or ""
        state = RepoState(repo_id=repo_id, head_sha=info.sha or revision, weights_key=weights_key(ids),
                          private=bool(info.private) if info.private is not None else None,
                          opted_out=OPT_OUT_FILE in ids)
        present = [name for name in RECIPE_SOURCES if name in ids]
        if present:
            with tempfile.TemporaryDirectory(prefix="export-bot-recipe-") as tmp:
                for name in present:
                    hf_hub_download(repo_id, name, revision=state.head_sha, token=token, endpoint=endpoint,
                                    local_dir=tmp)
                try:
                    found = find_recipe(Path(tmp))
                except RecipeError as err:
                    state.recipe_problem = problem_from_error(err)
                    state.recipe_file = (state.recipe_problem.file if state.recipe_problem else None) or present[0]
                    state.recipe_error = "\n".join(problem.render() for problem in err.problems)
                else:
                    if found is not None:
                        recipe, path, _ = found
                        state.recipe_file = path.name
                        state.recipe_sha256 = recipe.sha256()
                        state.target_names = [t.name for t in recipe.exports]
                        state.target_specs = [(t.export_format, t.dtype, t.device) for t in recipe.select([])]
        if with_authors:
            state.head_authors = _head_authors(api.endpoint, repo_id, state.head_sha, token)
    except RepositoryNotFoundError:
        raise HubCheckError(f"repo {repo_id} not found, or not readable with the bot's token", permanent=True,
                            hidden=True) from None
    except GatedRepoError:
        raise HubCheckError(f"repo {repo_id} is gated and the bot's user has no access", permanent=True) from None
    except RevisionNotFoundError:
        raise HubCheckError(f"commit {revision} no longer exists in {repo_id}", permanent=True) from None
    except EntryNotFoundError as err:
        raise HubCheckError(f"a file vanished while reading {repo_id}: {type(err).__name__}", permanent=False) from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        raise HubCheckError(f"the Hub answered HTTP {status} while reading {repo_id}", permanent=False) from None
    except OSError as err:  # connection refused, DNS, disk
        raise HubCheckError(f"could not reach the Hub: {type(err).__name__}: {err}", permanent=False) from None
    return state


def _head_authors(endpoint: str, repo_id: str, commit: str, token: str | None) -> list[str]:
    """Authors of one commit: the first page of its history only (`list_repo_commits` would read all of it)."""
    response = get_session().get(f"{endpoint}/api/models/{repo_id}/commits/{quote(commit, safe='')}",
                                 headers=build_hf_headers(token=token))
    hf_raise_for_status(response)
    items = response.json()
    return [str(author.get("user")) for author in items[0].get("authors", [])] if items else []


def whoami_id(*, token: str | None, endpoint: str | None) -> tuple[str, str] | None:
    """`(user id, user name)` of the bot's token, or None without a token. `HubCheckError` (not permanent) when the
    Hub cannot say: the caller asks again later rather than going on without knowing who it is."""
    if not token:
        return None
    try:
        data = HfApi(endpoint=endpoint, token=token).whoami()
    except (HfHubHTTPError, OSError) as err:
        raise HubCheckError(f"could not identify the bot's token: {type(err).__name__}", permanent=False) from None
    return str(data.get("id", "")), str(data.get("name", ""))

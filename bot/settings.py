"""Bot configuration: defaults, then a TOML file (`--config bot.toml`), then environment variables.

Every field can be set in the TOML file under its own name (top level, or in a `[bot]` table) and from the
environment variable listed in `ENV_NAMES` (`EXPORT_BOT_<FIELD>` unless a conventional name exists, e.g.
`WEBHOOK_SECRET`, `HF_TOKEN`). Environment variables win over the file. List fields take comma-separated values
in the environment.

Secrets (`webhook_secret`, `hf_token`, `github_token`) are `pydantic.SecretStr`: they print as `**********` and
are only unwrapped where they are used (the secret check, the subprocess environment, the GitHub client). Each can
also be read from a file named by `<VARIABLE>_FILE` (`WEBHOOK_SECRET_FILE=/run/secrets/webhook`, as container
secrets are mounted); once read, the bot removes them from its environment (`bot.secrecy`).

Example:
    >>> settings = load_settings(env={"WEBHOOK_SECRET": "s3cret", "EXPORT_BOT_ALLOWED": "acme, alice/tiny"})
    >>> settings.allowed
    ['acme', 'alice/tiny']
    >>> settings.webhook_secret
    SecretStr('**********')
    >>> settings.is_allowed("acme/llama"), settings.is_allowed("bob/llama")
    (True, False)
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from exporters.publish.destination import parse_size

from .backends.flavors import flavor
from .store import Limits

# Field name -> environment variable, where it is not simply EXPORT_BOT_<FIELD>.
ENV_NAMES: dict[str, str] = {
    "webhook_secret": "WEBHOOK_SECRET",
    "hf_token": "HF_TOKEN",
    "hf_endpoint": "HF_ENDPOINT",
    "db_path": "EXPORT_BOT_DB",
    "bot_name": "EXPORT_BOT_NAME",
    "trust_remote_code_repos": "TRUST_REMOTE_CODE_REPOS",
}

# An image by digest (a tag could be moved): what `hf_jobs_image` must be
_DIGEST = re.compile(r"[a-z0-9][a-z0-9._-]*(?::\d+)?(?:/[a-z0-9][a-z0-9._-]*)+@sha256:[0-9a-f]{64}")
SECRET_FIELDS = ("webhook_secret", "hf_token", "github_token")
# Every variable that may hold one of the bot's secrets (read by `load_settings`, then removed: `bot.secrecy`)
SECRET_ENV = frozenset({"WEBHOOK_SECRET", "HF_TOKEN", "EXPORT_BOT_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN",
                        "HUGGING_FACE_HUB_TOKEN"})


class SettingsError(ValueError):
    """The configuration is invalid; the message names the setting and where it came from."""


class BotSettings(BaseModel):
    """Everything the bot reads from its configuration.

    Example:
        >>> BotSettings(webhook_secret="x", allowed=["acme"]).backend
        'local'
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Intake
    webhook_secret: SecretStr | None = Field(
        default=None, description="Shared secret the Hub sends in X-Webhook-Secret (required to serve).")
    bot_name: str = Field(default="export-bot", description="Hub user of the bot: `@<bot_name> export` re-queues.")
    allowed: list[str] = Field(
        default_factory=list,
        description="Repos (`org/name`) and orgs/users (`org` or `org/*`) that opted in; `*` allows every repo. "
                    "Empty: act on nothing.")
    daily_limit: int = Field(
        default=20, ge=0, description="Push jobs per repo per rolling 24 h; above it a push is stored and delayed "
                                      "until the window has room, never dropped (0: no limit).")
    comment_daily_limit: int = Field(
        default=5, ge=0, description="`@bot export` requests per repo per rolling 24 h; above it they are refused "
                                     "(0: no limit).")
    requester_daily_limit: int = Field(
        default=10, ge=0, description="`@bot export` requests per person per rolling 24 h, across repos (0: no "
                                      "limit).")
    membership_cache_seconds: float = Field(
        default=300.0, ge=0, description="How long the Hub's answer to 'is the commenter the repo's owner or a "
                                         "member of its org?' is kept.")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Largest webhook body accepted (413 above).")
    # Hub
    hf_token: SecretStr | None = Field(default=None, description="Token of the bot's Hub user (reads and PRs).")
    hf_endpoint: str | None = Field(default=None, description="Hub URL (default: huggingface_hub's).")
    # Store and workers
    db_path: Path = Field(default=Path("export-bot.db"), description="SQLite job store.")
    work_dir: Path = Field(default=Path("export-bot-work"), description="Per-job output folders and logs.")
    backend: Literal["local", "github", "hf-jobs", "dry"] = Field(default="local", description="Where jobs run.")
    concurrency: int = Field(default=1, ge=1, le=64, description="Jobs run at once per worker process.")
    lease_seconds: float = Field(default=120.0, gt=0, description="A running job's lease; renewed by heartbeats.")
    max_attempts: int = Field(default=3, ge=1, description="Tries per job (crashes, Hub errors) before failing.")
    retry_backoff_seconds: float = Field(default=30.0, ge=0, description="First retry delay; doubles each try.")
    poll_seconds: float = Field(default=1.0, gt=0, description="How often an idle worker looks for jobs.")
    # Local backend
    job_timeout_seconds: float = Field(default=3600.0, gt=0, description="Wall-clock limit of one export run.")
    memory_limit_mb: int = Field(default=16384, ge=0, description="RLIMIT_AS of the export subprocess (0: none).")
    publish_failed: bool = Field(
        default=False, description="`--publish-failed`: open the PR with the passing targets even when others "
                                   "failed (a failed run always posts its report as a discussion).")
    publish_unverified: bool = Field(
        default=False, description="`--publish-unverified`: also publish unverified targets (some check did not "
                                   "run); the PR and the model card name the checks that did not run.")
    benchmark: bool = Field(
        default=True, description="Time every passing artifact (size, load, latency) for the PR; false passes "
                                  "`--no-bench` and saves those minutes (the table says \"not measured\").")
    max_upload_size: str = Field(
        default="20GB", description="`--max-upload-size`: a PR that would upload more is refused (0: no limit).")
    trust_remote_code_repos: list[str] = Field(
        default_factory=list, description="Repos (or orgs) whose own code may run (`--trust-remote-code`).")
    propose_recipes: bool = Field(
        default=False, description="For opted-in repos without a recipe: run `hf-export init --push` (a PR "
                                   "proposing a probed export_config.json) instead of skipping them (local backend).")
    python: str | None = Field(default=None,
                               description="Interpreter for the export run, `python -m bot.export_run` (default: ours).")
    # GitHub backend
    github_token: SecretStr | None = Field(default=None, description="Token allowed to dispatch the workflow.")
    github_api_url: str = Field(default="https://api.github.com", description="GitHub REST API base URL.")
    github_repo: str | None = Field(default=None, description="`owner/name` holding the export workflow.")
    github_workflow: str = Field(default="export.yml", description="Workflow file (or id) to dispatch.")
    github_ref: str = Field(default="main", description="Branch or tag the workflow runs from.")
    github_targets: str = Field(default="", description="`targets` input: comma-separated names, empty for all.")
    github_private_repos: bool = Field(
        default=False, description="Send private Hub repos to the GitHub backend too (their name and commit go into "
                                   "the workflow inputs, their weights onto GitHub's runners; only to a private "
                                   "`github_repo`). Off: their jobs are skipped.")
    github_poll_seconds: float = Field(
        default=30.0, gt=0, description="How often the dispatched workflow run is polled until it concludes (the job "
                                        "succeeds only when the run concludes `success`).")
    # Hugging Face Jobs backend
    hf_jobs_image: str | None = Field(
        default=None, description="The released image the job runs, by digest (`ghcr.io/hf/export-action@sha256:...`).")
    hf_jobs_cuda_image: str | None = Field(
        default=None, description="The released CUDA image, by digest, for recipes with a `cuda` target (none: "
                                  "their jobs are skipped).")
    hf_jobs_namespace: str | None = Field(
        default=None, description="Namespace the jobs of public repos run and are billed in (default: the bot's user).")
    hf_jobs_flavors: list[str] = Field(
        default_factory=list, description="Flavors a job may get (empty: every flavor of the bot's table).")
    hf_jobs_max_flavor: str | None = Field(
        default=None, description="Ceiling: no flavor dearer than this one (none: no such ceiling).")
    hf_jobs_max_usd_per_hour: float = Field(
        default=2.0, ge=0, description="Ceiling: no flavor dearer than this many USD per hour (0: none).")
    hf_jobs_private_namespaces: list[str] = Field(
        default_factory=list, description="Owners whose private repos are exported as jobs in the owner's own "
                                          "namespace (billed to it); other private repos are skipped.")
    hf_jobs_poll_seconds: float = Field(default=30.0, gt=0, description="How often a running job is inspected.")
    hf_jobs_timeout_margin_seconds: float = Field(
        default=600.0, ge=0, description="How long past the job's own timeout (`job_timeout_seconds`, counted from "
                                         "its start) the bot waits for it before cancelling it.")
    # Status page
    show_private: bool = Field(default=False, description="Show private repos' names on the status page and API.")

    @field_validator("allowed", "trust_remote_code_repos", "hf_jobs_flavors", "hf_jobs_private_namespaces",
                     mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("max_upload_size")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)  # ValueError: pydantic reports it with the setting's name
        return value

    @field_validator("github_repo")
    @classmethod
    def _owner_name(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise ValueError(f"must be 'owner/name', got {value!r}")
        return value

    @field_validator("hf_jobs_image", "hf_jobs_cuda_image")
    @classmethod
    def _by_digest(cls, value: str | None) -> str | None:
        if value is not None and not _DIGEST.fullmatch(value):
            raise ValueError(f"must name the image by digest, REGISTRY/NAME@sha256:<64 hex digits>, got {value!r}")
        return value

    @field_validator("hf_jobs_flavors")
    @classmethod
    def _flavors(cls, value: list[str]) -> list[str]:
        for name in value:
            flavor(name)  # ValueError naming the known ones
        return value

    @field_validator("hf_jobs_max_flavor")
    @classmethod
    def _flavor(cls, value: str | None) -> str | None:
        if value is not None:
            flavor(value)
        return value

    def is_allowed(self, repo_id: str) -> bool:
        """Whether `repo_id` opted in: listed itself, its namespace listed, or `*`."""
        return _matches(repo_id, self.allowed)

    def limits(self):
        """The job store's daily limits."""
        return Limits(push=self.daily_limit, comment=self.comment_daily_limit, requester=self.requester_daily_limit)

    def trusts_remote_code(self, repo_id: str) -> bool:
        """Whether the export of `repo_id` may run the repo's own Python code."""
        return _matches(repo_id, self.trust_remote_code_repos)

    def secrets(self) -> list[str]:
        """The secret values in use (to scrub them from anything the bot records)."""
        values = [s.get_secret_value() for s in (self.webhook_secret, self.hf_token, self.github_token) if s]
        return [v for v in values if v]


def _matches(repo_id: str, patterns: list[str]) -> bool:
    namespace = repo_id.split("/", 1)[0]
    for pattern in patterns:
        if pattern == "*" or pattern == repo_id or pattern in (namespace, f"{namespace}/*"):
            return True
    return False


def env_name(field: str) -> str:
    """The environment variable for a settings field.

    Example:
        >>> env_name("concurrency"), env_name("hf_token")
        ('EXPORT_BOT_CONCURRENCY', 'HF_TOKEN')
    """
    return ENV_NAMES.get(field, f"EXPORT_BOT_{field.upper()}")


def _read_secret(path: str, source: str) -> str:
    """A secret from the file `path` names (its text, without the trailing newline)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"{source}: cannot read the secret file {path}: {type(err).__name__}") from None


def load_settings(config: str | Path | None = None, *, env: Mapping[str, str] | None = None,
                  **overrides: Any) -> BotSettings:
    """Build the settings: defaults < TOML file `config` < environment `env` (default `os.environ`) < `overrides`.

    Raises `SettingsError` naming each bad setting and its source.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config is not None:
        path = Path(config)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as err:
            raise SettingsError(f"{path} is not valid TOML: {err}") from None
        data = {**{k: v for k, v in data.items() if k != "bot"}, **data.get("bot", {})}
        unknown = sorted(set(data) - set(BotSettings.model_fields))
        if unknown:
            raise SettingsError(f"{path}: unknown setting(s) {unknown}; known: {sorted(BotSettings.model_fields)}")
        values.update(data)
        sources.update({k: str(path) for k in data})
    for field in BotSettings.model_fields:
        name = env_name(field)
        if env.get(name) not in (None, ""):
            values[field] = env[name]
            sources[field] = f"${name}"
    if env.get("GITHUB_TOKEN") and "github_token" not in values:
        values["github_token"], sources["github_token"] = env["GITHUB_TOKEN"], "$GITHUB_TOKEN"
    for field in SECRET_FIELDS:
        for name in (env_name(field), "GITHUB_TOKEN")[: 2 if field == "github_token" else 1]:
            if env.get(f"{name}_FILE") and field not in values:
                values[field], sources[field] = _read_secret(env[f"{name}_FILE"], f"${name}_FILE"), f"${name}_FILE"
    values.update(overrides)
    try:
        return BotSettings(**values)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            # never echo the input: it may be a secret
            problems.append(f"  {field} (from {sources.get(field, 'arguments')}): {error['msg']}")
        raise SettingsError("invalid bot settings:\n" + "\n".join(problems)) from None

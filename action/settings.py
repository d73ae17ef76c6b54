"""The Action's settings: its inputs (`INPUT_*` env vars) and the GitHub runner's context (`GITHUB_*`).

The runner passes each input of `action.yml` to a Docker action as `INPUT_<NAME>`, upper-cased with spaces turned
into `_` and hyphens kept (`hf-token` → `INPUT_HF-TOKEN`). `docker run -e INPUT_HF-TOKEN=...` sets such a name too;
only shells cannot (`export INPUT_HF-TOKEN=...` is a syntax error, and `sh -c` drops such names from what it passes
on), which is why the image's entrypoint is exec form (`["/usr/local/bin/python", "-m", "action"]`, no shell in
between) and must stay so. The underscored form (`INPUT_HF_TOKEN`) is accepted too, for people typing inputs in a
shell. The runner does not enforce `required: true`: [`Settings.from_env`] does, and raises [`SettingsError`]
listing every problem at once.

Example:
    >>> env = {"INPUT_MODEL": "org/name", "INPUT_TARGETS": "onnx, dynamo", "GITHUB_WORKSPACE": "/tmp"}
    >>> settings = Settings.from_env(env)
    >>> settings.model, settings.targets, settings.open_pr
    ('org/name', ['onnx', 'dynamo'], True)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporters.errors import PublishError
from exporters.publish.destination import parse_size, publish_destination

MODES = ("run", "list-targets", "aggregate", "init")
FORMATS = ("dynamo", "onnx", "executorch")
DEFAULT_MAX_SECONDS = 1800.0
DEVICES = ("cpu", "cuda", "auto")
TRUE_WORDS = {"true", "yes", "on", "1"}
FALSE_WORDS = {"false", "no", "off", "0"}
DEFAULT_OUTPUT_DIR = "export-out"
DEFAULT_PARTS_DIR = "export-parts"
DEFAULT_API_URL = "https://api.github.com"
DEFAULT_SERVER_URL = "https://github.com"
PR_EVENTS = ("pull_request", "pull_request_target")


class SettingsError(Exception):
    """One or more inputs are missing or invalid; `problems` lists them as `(input, message)`."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{name}: {message}" for name, message in problems))


def read_input(env: Mapping[str, str], name: str) -> str:
    """The raw value of input `name` ('' when unset), from `INPUT_NAME-WITH-HYPHENS` or `INPUT_NAME_WITH_UNDERSCORES`."""
    upper = name.upper().replace(" ", "_")
    for key in (f"INPUT_{upper}", f"INPUT_{upper.replace('-', '_')}"):
        value = env.get(key)
        if value is not None and value.strip():
            return value.strip()
    return ""


def parse_bool(value: str, name: str, default: bool, problems: list[tuple[str, str]]) -> bool:
    if not value:
        return default
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    problems.append((name, f"expected true or false, got {value!r}"))
    return default


def parse_targets(value: str) -> list[str]:
    """Target names from a JSON list (`["a", "b"]`, what `list-targets` outputs) or a comma/space/newline list."""
    value = value.strip()
    if not value:
        return []
    if value.startswith("["):
        try:
            data = json.loads(value)
        except ValueError:
            data = None
        if isinstance(data, list) and all(isinstance(item, str) for item in data):
            return [item.strip() for item in data if item.strip()]
    names = [part for part in re.split(r"[\s,]+", value) if part]
    return list(dict.fromkeys(names))


@dataclass
class GitHubContext:
    """What the runner tells about the run: event, repository, workspace, files for outputs and summary."""

    event_name: str = ""
    event: dict[str, Any] = field(default_factory=dict)
    repository: str = ""
    workspace: Path = Path(".")
    api_url: str = DEFAULT_API_URL
    server_url: str = DEFAULT_SERVER_URL
    run_id: str = ""
    sha: str = ""
    output_file: Path | None = None
    summary_file: Path | None = None

    @property
    def pr_number(self) -> int | None:
        """The pull request this run is for (pull_request / pull_request_target events), else None."""
        if self.event_name not in PR_EVENTS:
            return None
        pull = self.event.get("pull_request") or {}
        number = pull.get("number", self.event.get("number"))
        return int(number) if isinstance(number, int) or (isinstance(number, str) and number.isdigit()) else None

    @property
    def run_url(self) -> str | None:
        if not (self.repository and self.run_id):
            return None
        return f"{self.server_url.rstrip('/')}/{self.repository}/actions/runs/{self.run_id}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GitHubContext:
        event: dict[str, Any] = {}
        event_path = env.get("GITHUB_EVENT_PATH")
        if event_path:
            try:
                loaded = json.loads(Path(event_path).read_text(encoding="utf-8"))
                event = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                event = {}
        workspace = Path(env.get("GITHUB_WORKSPACE") or os.getcwd())
        return cls(
            event_name=env.get("GITHUB_EVENT_NAME", ""),
            event=event,
            repository=env.get("GITHUB_REPOSITORY", ""),
            workspace=workspace,
            api_url=env.get("GITHUB_API_URL") or DEFAULT_API_URL,
            server_url=env.get("GITHUB_SERVER_URL") or DEFAULT_SERVER_URL,
            run_id=env.get("GITHUB_RUN_ID", ""),
            sha=env.get("GITHUB_SHA", ""),
            output_file=Path(env["GITHUB_OUTPUT"]) if env.get("GITHUB_OUTPUT") else None,
            summary_file=Path(env["GITHUB_STEP_SUMMARY"]) if env.get("GITHUB_STEP_SUMMARY") else None,
        )


@dataclass
class Settings:
    """Every input of `action.yml`, parsed and checked, plus the runner's context."""

    model: str
    mode: str = "run"
    revision: str | None = None
    config: Path | None = None
    targets: list[str] = field(default_factory=list)
    device: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    github_token: str | None = field(default=None, repr=False)
    open_pr: bool = True
    comment: bool = True
    fail_on_error: bool = True
    output_dir: Path = Path(DEFAULT_OUTPUT_DIR)
    parts_dir: Path = Path(DEFAULT_PARTS_DIR)
    dry_run: bool = False
    hf_endpoint: str | None = None
    trust_remote_code: bool = False
    publish_unverified: bool = False
    max_upload_bytes: int = 20 * 1024 ** 3
    formats: list[str] = field(default_factory=lambda: list(FORMATS))  # init mode
    max_seconds: float = DEFAULT_MAX_SECONDS  # init mode
    jobs: int | None = None  # exports at once; None: chosen from cores and memory
    benchmark: bool = True  # time every passing artifact (size, load, latency) for the report
    github: GitHubContext = field(default_factory=GitHubContext)

    @property
    def model_path(self) -> Path | None:
        """The model's folder when `model` names a folder in the workspace (or an absolute one), else None."""
        candidate = Path(self.model)
        if not candidate.is_absolute():
            candidate = self.github.workspace / candidate
        return candidate if candidate.is_dir() else None

    @property
    def model_arg(self) -> str:
        """What the library gets: the folder's absolute path, or the Hub repo id."""
        path = self.model_path
        return str(path) if path is not None else self.model

    @property
    def hub_repo_id(self) -> str | None:
        """The Hub repo to publish to (the library decides: `model` when it is a Hub repo id, not a local folder)."""
        return self.destination.repo_id if self.destination is not None else None

    @property
    def destination(self):
        """Where the Hub PR goes (`exporters.publish.publish_destination`): the repo, and the branch from `revision`
        (`main` when `revision` is a commit); None for a local model folder or a name that is no repo id."""
        try:
            return publish_destination(self.model_arg, revision=self.revision)
        except PublishError:
            return None

    def workspace_path(self, value: str | Path) -> Path:
        path = Path(value)
        return path if path.is_absolute() else self.github.workspace / path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build the settings from `INPUT_*` and `GITHUB_*` variables; `SettingsError` lists every problem."""
        env = os.environ if env is None else env
        problems: list[tuple[str, str]] = []
        github = GitHubContext.from_env(env)

        def get(name: str) -> str:
            return read_input(env, name)

        mode = get("mode") or "run"
        if mode not in MODES:
            problems.append(("mode", f"expected one of {', '.join(MODES)}, got {mode!r}"))
        model = get("model")
        if not model:
            problems.append(("model", "required: a Hub repo id (org/name) or a model folder in the workspace"))
        device = get("device") or None
        if device is not None and device not in DEVICES:
            problems.append(("device", f"expected one of {', '.join(DEVICES)} (or empty for the recipe's), "
                                       f"got {device!r}"))
        targets = parse_targets(get("targets"))
        bad = [t for t in targets if not re.match(r"^[a-z0-9][a-z0-9._-]*$", t)]
        if bad:
            problems.append(("targets", f"not target names: {bad}; give names from the recipe, comma-separated "
                                        "or as a JSON list"))
        max_upload = 20 * 1024 ** 3
        if get("max-upload-size"):
            try:
                max_upload = parse_size(get("max-upload-size"))
            except ValueError as err:
                problems.append(("max-upload-size", str(err)))
        endpoint = get("hf-endpoint") or None
        if endpoint is not None and not re.match(r"^https?://", endpoint):
            problems.append(("hf-endpoint", f"expected an http(s) URL, got {endpoint!r}"))
        formats = parse_targets(get("formats")) or list(FORMATS)
        unknown = [f for f in formats if f not in FORMATS]
        if unknown:
            problems.append(("formats", f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}"))
        jobs = None
        if get("jobs") and get("jobs") != "auto":
            if get("jobs").isdigit() and int(get("jobs")) >= 1:
                jobs = int(get("jobs"))
            else:
                problems.append(("jobs", f"expected a positive number or auto, got {get('jobs')!r}"))
        max_seconds = DEFAULT_MAX_SECONDS
        if get("max-seconds"):
            try:
                max_seconds = float(get("max-seconds"))
                if not max_seconds > 0:
                    raise ValueError
            except ValueError:
                problems.append(("max-seconds", f"expected a positive number of seconds, got {get('max-seconds')!r}"))
        settings = cls(
            model=model,
            mode=mode,
            revision=get("revision") or None,
            config=Path(get("config")) if get("config") else None,
            targets=targets,
            device=device,
            hf_token=get("hf-token") or None,
            github_token=get("github-token") or None,
            open_pr=parse_bool(get("open-pr"), "open-pr", True, problems),
            comment=parse_bool(get("comment"), "comment", True, problems),
            fail_on_error=parse_bool(get("fail-on-error"), "fail-on-error", True, problems),
            output_dir=Path(get("output-dir") or DEFAULT_OUTPUT_DIR),
            parts_dir=Path(get("parts-dir") or DEFAULT_PARTS_DIR),
            dry_run=parse_bool(get("dry-run"), "dry-run", False, problems),
            hf_endpoint=endpoint.rstrip("/") if endpoint else None,
            trust_remote_code=parse_bool(get("trust-remote-code"), "trust-remote-code", False, problems),
            publish_unverified=parse_bool(get("publish-unverified"), "publish-unverified", False, problems),
            max_upload_bytes=max_upload,
            formats=formats,
            max_seconds=max_seconds,
            jobs=jobs,
            benchmark=parse_bool(get("benchmark"), "benchmark", True, problems),
            github=github,
        )
        if settings.config is not None:
            config = settings.workspace_path(settings.config)
            if not config.is_file():
                problems.append(("config", f"no file {settings.config} in the workspace ({github.workspace}); "
                                           "check out the repo first (actions/checkout) or fix the path"))
            settings.config = config
        settings.output_dir = settings.workspace_path(settings.output_dir)
        settings.parts_dir = settings.workspace_path(settings.parts_dir)
        if problems:
            raise SettingsError(problems)
        return settings

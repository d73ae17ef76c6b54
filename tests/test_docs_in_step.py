"""The docs say what the code does: their tables are checked against `action.yml` and the bot's settings, and
docs/bot.md's *Try the bot locally* is run as written (its emulator command, its upload snippet, its bot settings,
its webhook body and its curl headers, posted to the real app over HTTP)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from bot.settings import BotSettings, env_name, load_settings
from tests.conftest import ROOT
from tests.test_bot import start_bot, wait_for  # noqa: F401  (start_bot is a fixture)

ACTION_DOC = ROOT / "docs" / "action.md"
BOT_DOC = ROOT / "docs" / "bot.md"


def table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first Markdown table after the line `heading`, header and rule left out."""
    lines = text.split("\n")
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            break
        elif re.match(r"#{2,} ", line):  # the next section (a code block's `# comment` is not one)
            raise AssertionError(f"no table under {heading!r}")
    return rows[2:]


def names(cell: str) -> list[str]:
    """The backticked names of a table's first cell (`cpu-targets`, `gpu-targets` -> two)."""
    return re.findall(r"`([^`]+)`", cell)


def unquote(cell: str) -> str:
    """A default cell's value: `` `x` `` -> x; an empty cell -> ''."""
    return cell[1:-1] if len(cell) >= 2 and cell[0] == cell[-1] == "`" else cell


def action_yml() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))


def test_action_inputs_table_matches_action_yml():
    """Every input of action.yml is documented once, with action.yml's own default ('(required)' for a required
    input), and the docs list no input action.yml lacks: `revision` once said `main` there while action.yml said ''."""
    inputs = action_yml()["inputs"]
    documented: dict[str, str] = {}
    for row in table(ACTION_DOC.read_text(encoding="utf-8"), "## Inputs"):
        (name,) = names(row[0])
        assert name not in documented, f"input {name} documented twice"
        documented[name] = row[1]
    assert sorted(documented) == sorted(inputs), "docs/action.md's inputs table and action.yml's inputs differ"
    for name, spec in inputs.items():
        if spec.get("required"):
            assert "default" not in spec and documented[name] == "(required)", name
        else:
            assert str(spec.get("default", "")) == unquote(documented[name]), (
                f"input {name}: action.yml's default is {spec.get('default')!r}, docs/action.md says "
                f"{documented[name]!r}")


def test_action_outputs_table_matches_action_yml():
    """Every output of action.yml is documented, and nothing else."""
    outputs = action_yml()["outputs"]
    documented = [name for row in table(ACTION_DOC.read_text(encoding="utf-8"), "## Outputs") for name in names(row[0])]
    assert len(documented) == len(set(documented)), "an output is documented twice"
    assert sorted(documented) == sorted(outputs), "docs/action.md's outputs table and action.yml's outputs differ"


def shown_default(field: str) -> str:
    """How docs/bot.md writes a setting's default: '—' for none, 'empty' for an empty list or text, numbers plain."""
    info = BotSettings.model_fields[field]
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if value in ([], ""):
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_bot_settings_table_matches_the_settings():
    """docs/bot.md's settings table has one row per `BotSettings` field, with its environment variable and its
    default, and no row for a setting that does not exist."""
    rows = table(BOT_DOC.read_text(encoding="utf-8"), "## Configuration")
    documented = {}
    for row in rows:
        (name,) = names(row[0])
        assert name not in documented, f"setting {name} documented twice"
        documented[name] = row
    assert sorted(documented) == sorted(BotSettings.model_fields), "docs/bot.md's settings and BotSettings differ"
    for field, (_, env, default, _meaning) in documented.items():
        assert names(env)[0] == env_name(field), f"{field}: the docs name {env}, the bot reads ${env_name(field)}"
        assert unquote(default) == shown_default(field), f"{field}: the docs say {default}, the default is " \
                                                          f"{shown_default(field)}"


# ─────────────────────────────────────── Try the bot locally ───────────────────────────────────────


def marked_block(text: str, marker: str, language: str) -> str:
    """The fenced ```language block right after the line `<!-- marker -->`."""
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```{language}\n(.*?)\n```\n", text, re.DOTALL)
    assert match, f"docs/bot.md has no ```{language} block marked <!-- {marker} -->"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_try_the_bot_locally_as_written(tmp_path, start_bot):  # noqa: F811  (the fixture)
    """The section's commands, run as written where a test can: the emulator by its command line, the upload by the
    snippet's own Python, the bot with the settings the section exports, the webhook body and curl headers of the
    docs, posted to the real app: answered as the docs say, a job queued for the repo at the uploaded head, shown on
    the status page; the same body again is a duplicate. The demo model is not built (the dry backend never reads
    it): its recipe and a config stand in for it."""
    text = BOT_DOC.read_text(encoding="utf-8")
    commands = marked_block(text, "try-locally:commands", "bash")
    body = marked_block(text, "try-locally:webhook", "json")

    # 1. the Hub emulator, by the command the docs give (on a free port)
    hub_command = re.search(r"^python -m (tests\.servers\.hub) --port (\d+) &$", commands, re.MULTILINE)
    assert hub_command, "step 1 starts the emulator with `python -m tests.servers.hub --port N &`"
    documented_port, port = hub_command.group(2), free_port()
    endpoint_line = re.search(r"^export HF_ENDPOINT=(\S+) (HF_HUB_DISABLE_XET=1)", commands, re.MULTILINE)
    assert endpoint_line and endpoint_line.group(1) == f"http://127.0.0.1:{documented_port}"
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(ROOT)}
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(name, None)
    hub = subprocess.Popen([sys.executable, "-m", hub_command.group(1), "--port", str(port)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def hub_up() -> bool:
            assert hub.poll() is None, hub.communicate()[0]
            try:
                return httpx.get(f"{endpoint}/api/whoami-v2", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        wait_for(hub_up, 60, "the Hub emulator to serve")

        # 2. the repo, uploaded by the docs' own snippet (from a folder shaped like examples/demo-model)
        snippet = re.search(r"HEAD=\$\(python -c '(.*?)'\)", commands, re.DOTALL)
        assert snippet, "step 2 uploads with HEAD=$(python -c '...')"
        folder = tmp_path / "checkout" / "examples" / "demo-model"
        folder.mkdir(parents=True)
        shutil.copy(ROOT / "examples" / "demo-model" / "export_config.json", folder)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        upload = subprocess.run([sys.executable, "-c", snippet.group(1)], cwd=folder.parent.parent, env=env,
                                capture_output=True, text=True, timeout=120)
        assert upload.returncode == 0, upload.stderr
        head = upload.stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{40}", head), upload.stdout
        model = httpx.get(f"{endpoint}/api/models/alice/tiny-llama", timeout=10).json()
        assert model["sha"] == head

        # 3. the bot, with the settings the docs export
        exports = re.search(r"^export (WEBHOOK_SECRET=.*)$", commands, re.MULTILINE)
        assert exports, "step 3 exports the bot's settings"
        bot_env = dict(item.split("=", 1) for item in exports.group(1).split())
        assert bot_env.get("EXPORT_BOT_BACKEND") == "dry" and re.search(r"^hf-export-bot serve --port (\d+) &$",
                                                                          commands, re.MULTILINE)
        settings = load_settings(env={**bot_env, "HF_ENDPOINT": endpoint}, db_path=tmp_path / "bot.db",
                                 work_dir=tmp_path / "work", poll_seconds=0.1)
        bot = start_bot(settings)

        # 4. the body, the placeholder filled in as the docs' sed does, with the curl command's headers
        curl = re.search(r'^sed "s/(\w+)/\$HEAD/g" webhook\.json \| curl -s (\S+) \\\n(.*?)\n# (\{.*\})$',
                         commands, re.MULTILINE | re.DOTALL)
        assert curl, "step 4 posts webhook.json with sed | curl"
        placeholder, url, header_line, shown_answer = curl.groups()
        assert url == "http://127.0.0.1:8080/webhooks/hub" and placeholder in body
        headers = dict(h.split(": ", 1) for h in re.findall(r'-H "([^"]+)"', header_line))
        headers = {k: v.replace("$WEBHOOK_SECRET", bot_env["WEBHOOK_SECRET"]) for k, v in headers.items()}
        delivery = body.replace(placeholder, head)
        answer = httpx.post(f"{bot.url}/webhooks/hub", content=delivery.encode(), headers=headers, timeout=30)
        assert answer.status_code == 202, answer.text
        assert answer.json() == json.loads(shown_answer) == {"status": "queued", "job": 1}
        job = bot.store.get(1)
        assert (job.repo, job.head_sha, job.trigger) == ("alice/tiny-llama", head, "push")

        # what the docs say next: the job ends (dry), the status page shows it, the same body is a duplicate
        wait_for(lambda: httpx.get(f"{bot.url}/jobs/1", timeout=10).json()["status"] == "succeeded", 30,
                 "the dry job to end")
        assert "alice/tiny-llama" in httpx.get(f"{bot.url}/", timeout=10).text
        again = httpx.post(f"{bot.url}/webhooks/hub", content=delivery.encode(), headers=headers, timeout=30)
        assert again.json() == {"status": "duplicate", "job": 1}
    finally:
        hub.terminate()
        try:
            hub.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.communicate()


# ─────────────────────────────────────── Maps that stay true ───────────────────────────────────────

MAPPED = ("exporters", "action", "bot")  # every package under these, and every module in them, is on the maps


def _packages() -> list[Path]:
    return sorted(init.parent for top in MAPPED for init in (ROOT / top).rglob("__init__.py"))


def _rooms(package: Path) -> list[str]:
    """What a package holds: its modules (by stem) and its sub-packages (by name)."""
    modules = [path.stem for path in package.glob("*.py") if path.name != "__init__.py"]
    return sorted(modules + [child.name for child in package.iterdir() if (child / "__init__.py").is_file()])


def _named(text: str, name: str) -> bool:
    """`name` (or `name.py`, or `name/`) as a word of `text`; `__main__` is named by `python -m`."""
    if name == "__main__":
        return "python -m" in text
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?:\.py|/)?(?![\w-])", text) is not None


def _docstring(package: Path) -> str:
    import ast

    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def _readme_map() -> dict[str, str]:
    """README's *Layout* section, split by its entries: 'exporters' (the front doors and the foundation, named with
    `.py`), and 'exporters/capture', 'action', 'bot', ... (the text from a line starting `name/` to the next entry)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    entries: dict[str, str] = {"exporters": ""}
    current = "exporters"
    for line in section.splitlines():
        start = re.match(r"^([a-z_]+)/\s", line)
        if start:
            name = start.group(1)
            current = name if name in MAPPED or not (ROOT / "exporters" / name).is_dir() else f"exporters/{name}"
            entries[current] = ""
        elif line and not line.startswith(" ") and not line.startswith("`"):
            current = "exporters" if re.match(r"^[a-z_]+\.py\b", line) else "prose"
            entries.setdefault(current, "")
        entries[current] += line + "\n"
    return entries


def test_every_module_is_on_its_packages_map():
    """Each package's `__init__` docstring names every module and sub-package it holds (a new module, or a new
    layout package, is added to its map or this fails)."""
    missing = [f"{package.relative_to(ROOT)}: {name}" for package in _packages() for name in _rooms(package)
               if not _named(_docstring(package), name)]
    assert not missing, "name these in their package's __init__ docstring:\n" + "\n".join(missing)


def test_every_module_is_on_the_readme_map():
    """README's *Layout* names every module of the library, the Action and the bot under its package's entry (a
    nested package's modules under its top package's entry: `exporters/layouts/genai/proof.py` under `layouts/`)."""
    entries = _readme_map()
    missing = []
    for package in _packages():
        relative = package.relative_to(ROOT).parts
        entry = "/".join(relative[:2]) if relative[0] == "exporters" and len(relative) > 1 else relative[0]
        text = entries.get(entry)
        if text is None:
            missing.append(f"{entry}/ (no entry)")
            continue
        if entry == "exporters":  # the front doors and the foundation (the stages have entries of their own)
            names = [f"{name}.py" for name in _rooms(package) if not (package / name).is_dir()]
        else:
            names = [name for name in _rooms(package) if name != "__main__"]
        missing += [f"{'/'.join(relative)}/{name}" for name in names if not _named(text, name)]
    assert not missing, "name these in README's Layout (under their package's entry):\n" + "\n".join(missing)

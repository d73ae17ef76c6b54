"""The bot's secrets are out of reach of what it starts: an export (a repo's own code, when allowed, runs as the bot's
user) reading `/proc/<pid>/environ` and `/proc/<pid>/cmdline` of itself and of every ancestor, the worker among
them, finds neither the webhook secret nor the GitHub token, and the Hub token only in the export's own chain."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bot.settings import SettingsError, load_settings
from tests.servers.github_fixtures import GITHUB_BOT_TOKEN
from tests.servers.hub_fixtures import BOT_TOKEN
from tests.test_bot import SECRET, bot_settings, job_done, main_update, start_bot, wait_for  # noqa: F401
from tests.test_bot_safety import _recipe_repo, workers  # noqa: F401  (workers is a fixture)

# Stands in for the export's Python: what a repo's code could do from inside the export
PROC_READER = """#!{python}
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
seen, pid = [], os.getpid()
while pid > 1:
    entry = {{"pid": pid}}
    for name in ("environ", "cmdline"):
        try:
            entry[name] = pathlib.Path(f"/proc/{{pid}}/{{name}}").read_bytes().decode(errors="replace")
        except OSError as err:
            entry[name] = None
            entry[name + "_error"] = type(err).__name__
    seen.append(entry)
    status = pathlib.Path(f"/proc/{{pid}}/status").read_text()
    pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
(out / "proc.json").write_text(json.dumps(seen))
"""


def test_an_export_finds_no_bot_secret_in_proc(hf_env, tmp_path, start_bot, workers):  # noqa: F811
    hub = hf_env
    _recipe_repo(hub, tmp_path)
    reader = tmp_path / "python-standin"
    reader.write_text(PROC_READER.format(python=sys.executable))
    reader.chmod(0o755)
    settings = bot_settings(hub, tmp_path, python=str(reader))
    bot = start_bot(settings, embedded_worker=False)
    pool = workers(settings, tmp_path)
    secret_file = tmp_path / "webhook-secret"
    secret_file.write_text(SECRET + "\n")
    pool.env.pop("WEBHOOK_SECRET")
    pool.env["WEBHOOK_SECRET_FILE"] = str(secret_file)  # one secret from a file, the others from the environment
    job_id = bot.post(main_update(hub)).json()["job"]
    worker = pool.start()
    job = wait_for(job_done(bot.store, job_id), 120, "the job to end")
    assert job.status == "succeeded", (job.reason, job.error, pool.output())
    chain = json.loads((Path(job.log_path).parent / "out" / "proc.json").read_text())
    pids = [entry["pid"] for entry in chain]
    assert worker.pid in pids, "the worker is an ancestor of the export"
    for entry in chain:
        text = json.dumps(entry)
        assert SECRET not in text and GITHUB_BOT_TOKEN not in text, entry["pid"]
        assert str(secret_file) not in text  # the names may stay (wiped values): never a value
    below_worker = pids[:pids.index(worker.pid)]  # the export and its reaper: they hold the Hub token they need
    for entry in chain[pids.index(worker.pid):]:
        assert BOT_TOKEN not in json.dumps(entry), entry["pid"]
    assert BOT_TOKEN in (chain[0]["environ"] or "") and len(below_worker) == 2


def test_secrets_are_read_from_files(tmp_path):
    (tmp_path / "hf").write_text("hf_fromafile0123456789\n")
    (tmp_path / "gh").write_text("ghs_fromafile0123456789")
    settings = load_settings(env={"HF_TOKEN_FILE": str(tmp_path / "hf"), "GITHUB_TOKEN_FILE": str(tmp_path / "gh"),
                                  "WEBHOOK_SECRET": "s3cret"})
    assert settings.hf_token.get_secret_value() == "hf_fromafile0123456789"
    assert settings.github_token.get_secret_value() == "ghs_fromafile0123456789"
    try:
        load_settings(env={"WEBHOOK_SECRET_FILE": str(tmp_path / "missing")})
    except SettingsError as err:
        assert "$WEBHOOK_SECRET_FILE" in str(err) and "missing" in str(err)
    else:
        raise AssertionError("a missing secret file is a settings error")

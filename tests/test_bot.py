"""The Hub webhook bot end to end: the real app on a loopback port (uvicorn), the Hub emulator, real exports.

Webhook payloads are the emulator's own `hub.events()` (what the Hub would deliver for the same state changes);
models are uploaded with the real `huggingface_hub` client; the `local` backend runs the real `hf-export run --push`
in a subprocess. Exports are the tiny Llama with a one-graph dynamo recipe (about 20 s each on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from bot.app import create_app
from bot.settings import BotSettings, load_settings
from bot.store import JobStore
from tests.conftest import ROOT
from tests.servers.github_fixtures import GITHUB_BOT_TOKEN, WORKFLOW_FILE
from tests.servers.github_fixtures import REPO as GH_REPO
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN

SECRET = "whsec_test_0123456789abcdef"
MODEL_RECIPE = {"export_format": "dynamo", "mode": "model"}  # one graph: the tiny Llama passes it
REPO = "alice/tiny-llama"


# ───────────────────────────────────────────── helpers ─────────────────────────────────────────────


class BotServer:
    """The bot's FastAPI app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, settings: BotSettings, *, embedded_worker: bool) -> None:
        self.settings = settings
        self.app = create_app(settings, embedded_worker=embedded_worker)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "bot server failed to start"
            time.sleep(0.01)
        self.store = JobStore(settings.db_path)

    def post(self, payload: Any = None, *, secret: str | None = SECRET, content: bytes | None = None,
             content_type: str = "application/json", headers: dict[str, str] | None = None) -> httpx.Response:
        """POST /webhooks/hub as the Hub does."""
        all_headers = {"content-type": content_type, **(headers or {})}
        if secret is not None:
            all_headers["x-webhook-secret"] = secret
        body = content if content is not None else json.dumps(payload).encode()
        return httpx.post(f"{self.url}/webhooks/hub", content=body, headers=all_headers, timeout=30)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


@pytest.fixture
def start_bot(tmp_path: Path) -> Iterator[Callable[..., BotServer]]:
    servers: list[BotServer] = []

    def start(settings: BotSettings, *, embedded_worker: bool = True) -> BotServer:
        server = BotServer(settings, embedded_worker=embedded_worker)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def bot_settings(hub, tmp_path: Path, **overrides: Any) -> BotSettings:
    values: dict[str, Any] = dict(
        webhook_secret=SECRET, hf_token=BOT_TOKEN, hf_endpoint=hub.url, db_path=tmp_path / "bot.db",
        work_dir=tmp_path / "work", allowed=["alice"], bot_name=BOT_USER, poll_seconds=0.1, lease_seconds=30,
        retry_backoff_seconds=1, job_timeout_seconds=300, benchmark=False,  # timings: tests/test_variants.py
    )
    values.update(overrides)
    return BotSettings(**values)


def upload_model(hub, folder: Path, repo_id: str = REPO) -> str:
    """Create `repo_id` as alice and upload `folder` to main with the real client; the new head commit."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    api.create_repo(repo_id, exist_ok=True)
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload model").oid


def main_update(hub, repo_id: str = REPO) -> dict[str, Any]:
    """The latest webhook payload that moved refs/heads/main of `repo_id`."""
    for event in reversed(hub.events()):
        refs = [r["ref"] for r in event.get("updatedRefs") or []]
        if event["repo"]["name"] == repo_id and event["event"]["scope"] == "repo.content" and "refs/heads/main" in refs:
            return event
    raise AssertionError(f"no main update of {repo_id} in the Hub's events")


def payload(repo: str = "alice/x", *, scope: str = "repo.content", action: str = "update",
            refs: list[dict[str, Any]] | None = None, repo_type: str = "model", **extra: Any) -> dict[str, Any]:
    """A webhook payload built by hand, shaped as in hub-api.md."""
    data = {
        "event": {"action": action, "scope": scope},
        "repo": {"type": repo_type, "name": repo, "id": "0" * 24, "private": False,
                 "url": {"web": f"https://hf.co/{repo}"}, "owner": {"id": "1" * 24}},
        "webhook": {"id": "2" * 24, "version": 3},
        **extra,
    }
    if refs is not None:
        data["updatedRefs"] = refs
    return data


def sha(n: int) -> str:
    return f"{n:040x}"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def job_done(store: JobStore, job_id: int) -> Callable[[], Any]:
    def done():
        job = store.get(job_id)
        return job if job is not None and job.status in ("succeeded", "failed", "skipped") else None
    return done


def pull_requests(hub, repo_id: str = REPO) -> list[dict[str, Any]]:
    return [d for d in hub.discussions(repo_id) if d["isPullRequest"]]


def everything_recorded(db_path: Path) -> str:
    """Every row of every table, and the raw database + WAL bytes."""
    conn = sqlite3.connect(db_path)
    rows = []
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        rows += [repr(r) for r in conn.execute(f"SELECT * FROM {table}")]
    conn.close()
    raw = b"".join(Path(f"{db_path}{s}").read_bytes() for s in ("", "-wal") if Path(f"{db_path}{s}").exists())
    return "\n".join(rows) + raw.decode("latin-1")


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in (SECRET, BOT_TOKEN, TEST_TOKEN, GITHUB_BOT_TOKEN):
            assert secret not in text, f"a secret leaked into: {text[:200]}..."


# ───────────────────────────────────────────── intake ─────────────────────────────────────────────


def test_secret_is_required_and_checked(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry"), embedded_worker=False)
    event = payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}])
    missing = bot.post(event, secret=None)
    assert missing.status_code == 401 and "x-webhook-secret" in missing.json()["error"]
    wrong = bot.post(event, secret=SECRET[:-1] + "X")
    assert wrong.status_code == 403
    assert bot.post(event, secret="").status_code == 403
    assert bot.store.list() == []
    assert bot.post(event).status_code == 202
    assert len(bot.store.list()) == 1


def test_junk_payload_wrong_content_type_and_oversized_body(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", max_body_bytes=4096), embedded_worker=False)
    for junk in (b"{not json", b"\xff\xfe\x00", b"[]", json.dumps({"event": {"action": "update"}}).encode(),
                 json.dumps(payload(refs=[]) | {"webhook": {"id": "x", "version": 2}}).encode()):
        answer = bot.post(content=junk)
        assert answer.status_code == 400, junk
        assert "not a Hub webhook payload" in answer.json()["error"]
    good = payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}])
    assert bot.post(good, content_type="text/plain").status_code == 415
    assert bot.post(good, content_type="application/x-www-form-urlencoded").status_code == 415
    assert bot.post(good, content_type="application/json; charset=utf-8").status_code == 202
    big = payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(3)}]) | {"pad": "x" * 5000}
    assert bot.post(big).status_code == 413  # Content-Length says so

    def chunks() -> Iterator[bytes]:  # no Content-Length: the bytes read are counted
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]

    streamed = httpx.post(f"{bot.url}/webhooks/hub", content=chunks(), timeout=30,
                          headers={"content-type": "application/json", "x-webhook-secret": SECRET})
    assert streamed.status_code == 413
    assert [j.head_sha for j in bot.store.list()] == [sha(2)]


def test_intake_filters_events(hub, tmp_path, start_bot):
    """Only main updates of opted-in model repos (and mentions of the bot) are queued; the rest is answered 202."""
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", comment_daily_limit=1), embedded_worker=False)
    main = [{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}]
    cases = {
        "pr ref": payload(refs=[{"ref": "refs/pr/3", "oldSha": sha(1), "newSha": sha(2)}]),
        "other branch": payload(refs=[{"ref": "refs/heads/dev", "oldSha": None, "newSha": sha(2)}]),
        "main deleted": payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": None}]),
        "dataset": payload(refs=main, repo_type="dataset"),
        "not opted in": payload("bob/model", refs=main),
        "repo created": payload(scope="repo", action="create"),
        "comment without mention": payload(
            scope="discussion.comment", action="create",
            comment={"id": "c1", "author": {"id": "u1"}, "hidden": False, "content": "nice model",
                     "url": {"web": "https://hf.co/alice/x/discussions/1#c1"}}),
    }
    for name, event in cases.items():
        answer = bot.post(event)
        assert answer.status_code == 202 and answer.json()["status"] == "ignored", name
    assert bot.store.list() == []
    # a mention of the bot by the repo's owner re-queues (forced), deduplicated on the comment id
    owner = hub.user_id("alice")
    mention = payload(scope="discussion.comment", action="create",
                      comment={"id": "c2", "author": {"id": owner}, "hidden": False,
                               "content": f"please @{BOT_USER} export again",
                               "url": {"web": "https://hf.co/alice/x/discussions/1#c2"}})
    mention["repo"]["headSha"] = sha(9)
    first, replay = bot.post(mention).json(), bot.post(mention).json()
    assert first["status"] == "queued" and replay == {"status": "duplicate", "job": first["job"]}
    job = bot.store.get(first["job"])
    assert (job.trigger, job.force, job.head_sha, job.deliveries) == ("comment", True, sha(9), 2)
    # per-repo daily limit of requests: a second comment is refused; pushes have their own limit
    again = json.loads(json.dumps(mention).replace('"c2"', '"c3"'))
    limited = bot.post(again).json()
    assert limited["status"] == "rate_limited" and "limit 1" in limited["reason"]
    assert bot.post(payload(refs=main)).json()["status"] == "queued"
    assert bot.post(payload(refs=main)).json()["status"] == "duplicate"  # duplicates are never limited


# ───────────────────────────────────────────── jobs on the Hub ─────────────────────────────────────


def test_update_without_recipe_is_skipped(hf_env, tmp_path, start_bot):
    hub = hf_env
    folder = tmp_path / "no-recipe"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    head = upload_model(hub, folder)
    bot = start_bot(bot_settings(hub, tmp_path))
    answer = bot.post(main_update(hub))
    assert answer.status_code == 202 and answer.json()["status"] == "queued"
    job = wait_for(job_done(bot.store, answer.json()["job"]), 30, "the job to end")
    assert job.status == "skipped" and "no export recipe" in job.reason and job.head_sha == head
    assert job.exit_code is None and hub.discussions(REPO) == []
    assert not (Path(bot.settings.work_dir) / f"job-{job.id}").exists()  # nothing was exported


def test_main_update_opens_one_pr_despite_50_concurrent_duplicates(hf_env, tmp_path, start_bot, caplog):
    """One main update with a recipe, delivered 50 times at once -> one job, one export, one PR. Then the bot's
    own push to refs/pr/N is ignored, and merging the PR (main moves, same recipe and weights) exports nothing."""
    from tests.models import tiny_llama

    caplog.set_level("DEBUG")
    hub = hf_env
    # one layer: the job, the PR and the skipped merge read no depth (#48)
    head = upload_model(hub, tiny_llama(tmp_path / "model", recipe=MODEL_RECIPE, layers=1))
    bot = start_bot(bot_settings(hub, tmp_path))
    event = main_update(hub)
    barrier = threading.Barrier(50)

    def deliver(_: int) -> httpx.Response:
        barrier.wait()
        return bot.post(event)

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(deliver, range(50)))
    assert {a.status_code for a in answers} == {202}
    statuses = sorted(a.json()["status"] for a in answers)
    assert statuses == ["duplicate"] * 49 + ["queued"]
    assert len({a.json()["job"] for a in answers}) == 1
    [job] = bot.store.list()
    assert job.deliveries == 50 and job.head_sha == head

    job = wait_for(job_done(bot.store, job.id), 150, "the export job to end")
    assert job.status == "succeeded", (job.reason, job.error)
    assert job.exit_code == 0 and job.operation == "created" and job.attempts == 1
    [pr] = pull_requests(hub)
    assert pr["author"] == BOT_USER and job.pr_url.endswith(f"/{REPO}/discussions/{pr['num']}")
    assert any(p.startswith("exports/dynamo/") for p in hub.files(REPO, pr["ref"]))
    assert job.recipe_sha256 and job.weights_key and Path(job.report_path).is_file()

    # the bot's own push (refs/pr/N) and the PR's discussion events do not re-trigger
    after_pr = [e for e in hub.events() if e["repo"]["name"] == REPO][-5:]
    assert any(r["ref"] == pr["ref"] for e in after_pr for r in e.get("updatedRefs") or [])
    for later in after_pr:
        assert bot.post(later).json()["status"] in ("ignored", "duplicate")
    assert len(bot.store.list()) == 1

    # merging moves main: a new job, skipped because this recipe + these weights were exported already
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url, token=TEST_TOKEN).merge_pull_request(REPO, pr["num"])
    merged = bot.post(main_update(hub)).json()
    assert merged["status"] == "queued"
    skipped = wait_for(job_done(bot.store, merged["job"]), 30, "the merge job to end")
    assert skipped.status == "skipped" and f"already exported by job #{job.id}" in skipped.reason
    assert len(pull_requests(hub)) == 1

    # secrets: never in the store, the API, the status page, the run log or the bot's logs
    api_texts = [bot.get(p).text for p in ("/jobs", f"/jobs/{job.id}", f"/jobs/{job.id}/log",
                                           f"/jobs/{job.id}/report", "/", "/healthz")]
    assert "dynamo" in api_texts[3]  # the report is served
    assert_no_secrets(everything_recorded(bot.settings.db_path), *api_texts, caplog.text,
                      Path(job.log_path).read_text())


def _export_processes(marker: str) -> list[int]:
    """PIDs whose command line mentions `marker` (the job's folder): read-only look at /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_worker_killed_mid_job_is_recovered_after_the_lease_expires(hf_env, tmp_path, start_bot):
    from tests.models import tiny_llama

    hub = hf_env
    # one layer: the recovery reads the job, its attempts and the pushes, not the model's depth (#48)
    upload_model(hub, tiny_llama(tmp_path / "model", recipe=MODEL_RECIPE, layers=1))
    settings = bot_settings(hub, tmp_path, lease_seconds=3)
    bot = start_bot(settings, embedded_worker=False)  # the web process only
    config = tmp_path / "bot.toml"
    config.write_text(
        f'[bot]\nhf_endpoint = "{hub.url}"\ndb_path = "{settings.db_path}"\nwork_dir = "{settings.work_dir}"\n'
        f'allowed = ["alice"]\nlease_seconds = 3\npoll_seconds = 0.2\nretry_backoff_seconds = 1\n'
        f'bot_name = "{BOT_USER}"\n')
    env = {**os.environ, "HF_TOKEN": BOT_TOKEN, "WEBHOOK_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
    logs = tmp_path / "worker-logs"
    logs.mkdir()

    def start_worker(n: int) -> subprocess.Popen:
        with (logs / f"worker-{n}.log").open("wb") as log:
            return subprocess.Popen([sys.executable, "-m", "bot.cli", "worker", "--config", str(config)], env=env,
                                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    job_id = bot.post(main_update(hub)).json()["job"]
    first = start_worker(1)
    try:
        job_dir = settings.work_dir / f"job-{job_id}"
        wait_for(lambda: list(job_dir.glob("attempt-*/run.log")) and _export_processes(str(job_dir)), 60,
                 "the export subprocess to start")
        assert bot.store.get(job_id).status == "running"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # the export run dies with its worker (bot.reaper): no orphan pushes behind the next attempt
        wait_for(lambda: not _export_processes(str(job_dir)), 10, "the orphaned export to die")
        stale = bot.store.get(job_id)
        assert stale.status == "running" and stale.attempts == 1  # nobody knows yet: the lease has to expire
    finally:
        if first.poll() is None:
            first.kill()
    second = start_worker(2)
    try:
        job = wait_for(job_done(bot.store, job_id), 150, "the recovered job to end")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert job.status == "succeeded", (job.reason, job.error)
    assert job.attempts == 2 and "expired: recovered by" in job.notes
    assert len(bot.store.list()) == 1
    [pr] = pull_requests(hub)
    pushes = [c for c in hub.commits(REPO, pr["ref"]) if c["author"] == BOT_USER]
    # completed once: one commit of files, then the card pinned to it (a .pt2's snippet loads a pickle, #45 §7)
    pins = [c for c in pushes if c["title"].startswith("Model card: snippets pinned to ")]
    assert len(pushes) == 2 and len(pins) == 1 and pushes[0] == pins[0], pushes
    worker_logs = "".join(p.read_text() for p in logs.iterdir())
    assert f"job {job_id}: succeeded" in worker_logs
    assert_no_secrets(worker_logs, everything_recorded(settings.db_path), Path(job.log_path).read_text())


def test_github_backend_dispatches_the_workflow(hf_env, tmp_path, start_bot, github_server):
    hub = hf_env
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "export_config.json").write_text(json.dumps({"export_format": "onnx"}))
    head = upload_model(hub, folder)
    bot = start_bot(bot_settings(
        hub, tmp_path, backend="github", github_token=GITHUB_BOT_TOKEN, github_api_url=github_server.url,
        github_repo=GH_REPO, github_workflow=WORKFLOW_FILE, github_ref="main", github_targets="onnx",
        github_poll_seconds=0.1))
    github_server.run_conclusion = "success"  # every dispatched run succeeds at once (a failed one: test_bot_safety)
    job = wait_for(job_done(bot.store, bot.post(main_update(hub)).json()["job"]), 30, "the dispatch")
    assert job.status == "succeeded" and job.operation == "dispatched", (job.reason, job.error)
    [dispatch] = github_server.dispatches(GH_REPO)
    assert (dispatch.kind, dispatch.workflow, dispatch.ref) == ("workflow", WORKFLOW_FILE, "main")
    assert dispatch.inputs == {"model": REPO, "revision": head, "targets": "onnx",
                               "dispatch_id": job.dispatch["dispatch_id"]}
    assert job.dispatch["dispatch_id"].startswith(f"job-{job.id}-") and job.dispatch["state"] == "dispatched"
    assert job.dispatch["inputs"] == dispatch.inputs and job.dispatch["run_url"].startswith(github_server.url)

    # a comment of the repo's owner asking the bot re-runs it even though nothing changed; the bot's own mention
    # (not the owner, not a member of an org owning the repo) makes no job
    from huggingface_hub import HfApi

    alice = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    discussion = alice.create_discussion(REPO, "Exports?", description="hi")
    alice.comment_discussion(REPO, discussion.num, f"@{BOT_USER} export")
    rerun = wait_for(job_done(bot.store, bot.post(hub.events()[-1]).json()["job"]), 30, "the re-run")
    assert rerun.status == "succeeded" and rerun.trigger == "comment"
    HfApi(endpoint=hub.url, token=BOT_TOKEN).comment_discussion(REPO, discussion.num, f"@{BOT_USER} export")
    own = bot.post(hub.events()[-1]).json()
    assert own["status"] == "ignored" and "neither alice nor a member" in own["reason"]
    assert len(github_server.dispatches(GH_REPO)) == 2 and len(bot.store.list()) == 2
    assert_no_secrets(everything_recorded(bot.settings.db_path), bot.get("/jobs").text)


# ───────────────────────────────────────────── status page ─────────────────────────────────────────


def chromium_dom(url: str, tmp_path: Path) -> str:
    """The DOM of `url` as headless Chromium renders it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "headless Chromium is needed: `make test-deps` installs Debian's chromium"
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         f"--user-data-dir={profile}", "--virtual-time-budget=2000", "--dump-dom", url],
        capture_output=True, text=True, timeout=60).stdout


def test_status_page_in_headless_chromium(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry"))
    ids = [bot.post(payload(f"alice/model-{n}", refs=[{"ref": "refs/heads/main", "oldSha": sha(1),
                                                       "newSha": sha(n + 10)}])).json()["job"] for n in range(3)]
    for job_id in ids:
        wait_for(job_done(bot.store, job_id), 10, "dry jobs")
    dom = chromium_dom(f"{bot.url}/", tmp_path)
    assert "<h1>export-action bot</h1>" in dom
    for n, job_id in enumerate(ids):
        assert f'data-job-id="{job_id}" data-status="succeeded"' in dom
        assert f"alice/model-{n}" in dom
    assert "succeeded: 3" in dom


# ───────────────────────────────────────────── store ─────────────────────────────────────────────


def test_store_leases_retries_and_dedupe(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    job_id = store.enqueue("acme/m", sha(1), max_attempts=2, now=100).job_id
    job = store.claim("w1", lease_seconds=10, now=100)
    assert job.id == job_id and store.claim("w2", lease_seconds=10, now=105) is None  # leased
    recovered = store.claim("w2", lease_seconds=10, now=111)  # w1's lease expired
    assert recovered.id == job_id and recovered.attempts == 2 and "recovered by w2" in recovered.notes
    assert not store.finish(job_id, "w1", "succeeded")  # the stale worker cannot record anything
    assert store.retry_later(job_id, "w2", "boom", backoff_seconds=5, now=112) == "failed"  # no attempts left
    other = store.enqueue("acme/m", sha(2), now=200).job_id
    store.claim("w1", lease_seconds=10, now=200)
    assert store.retry_later(other, "w1", "hub down", backoff_seconds=5, now=201) == "queued"
    assert store.claim("w1", lease_seconds=10, now=205) is None  # backoff: due at 206
    assert store.claim("w1", lease_seconds=10, now=206).id == other
    store.record(other, "w1", recipe_sha256="r", weights_key="w")
    assert store.finish(other, "w1", "succeeded", exit_code=0)
    assert store.find_exported("acme/m", "r", "w").id == other and store.find_exported("acme/m", "r", "x") is None
    # expired on its last attempt: failed, not claimed again
    last = store.enqueue("acme/m", sha(3), max_attempts=1, now=300).job_id
    store.claim("w1", lease_seconds=1, now=300)
    assert store.claim("w2", lease_seconds=1, now=302) is None and store.get(last).status == "failed"


def test_settings_from_toml_and_env(tmp_path):
    config = tmp_path / "bot.toml"
    config.write_text('backend = "github"\n[bot]\nallowed = ["acme", "bob/one"]\nconcurrency = 2\n'
                      'github_repo = "acme/exports"\n')
    settings = load_settings(config, env={"EXPORT_BOT_CONCURRENCY": "3", "WEBHOOK_SECRET": SECRET,
                                          "TRUST_REMOTE_CODE_REPOS": "acme/custom"})
    assert (settings.backend, settings.concurrency, settings.allowed) == ("github", 3, ["acme", "bob/one"])
    assert settings.trusts_remote_code("acme/custom") and not settings.trusts_remote_code("acme/other")
    assert SECRET not in repr(settings) and SECRET not in settings.model_dump_json()
    from bot.settings import SettingsError

    config.write_text("concurency = 2\n")
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings(config, env={})
    with pytest.raises(SettingsError, match="concurrency .from .EXPORT_BOT_CONCURRENCY"):
        load_settings(env={"EXPORT_BOT_CONCURRENCY": "lots"})


# ───────────────────────────────────────────── local backend ─────────────────────────────────────


def test_local_backend_command_environment_and_limits(tmp_path, monkeypatch):
    from bot.backends.local import LocalBackend, make_preexec

    monkeypatch.setenv("WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", GITHUB_BOT_TOKEN)
    backend = LocalBackend(BotSettings(hf_token=BOT_TOKEN, trust_remote_code_repos=["acme/custom"]))
    argv = backend.command("acme/custom", sha(1), tmp_path)
    assert argv[1:4] == ["-m", "bot.export_run", "run"] and "--push" in argv and "--trust-remote-code" in argv
    assert "--trust-remote-code" not in backend.command("acme/other", sha(1), tmp_path)
    assert "--no-bench" not in argv  # benchmarked by default
    quick = LocalBackend(BotSettings(hf_token=BOT_TOKEN, benchmark=False))
    assert "--no-bench" in quick.command("acme/other", sha(1), tmp_path)
    env = backend.environment()
    assert env["HF_TOKEN"] == BOT_TOKEN and "WEBHOOK_SECRET" not in env and "GITHUB_TOKEN" not in env
    assert_no_secrets(" ".join(argv))
    # RLIMIT_AS: a 100 MiB address space cannot hold a 300 MiB buffer
    limited = subprocess.run([sys.executable, "-c", "bytearray(300 * 1024 * 1024)"], preexec_fn=make_preexec(100),
                             capture_output=True, text=True, timeout=30)
    assert limited.returncode != 0 and "MemoryError" in limited.stderr


def test_local_backend_timeout_fails_the_job(hf_env, tmp_path, start_bot):
    hub = hf_env
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "export_config.json").write_text(json.dumps(MODEL_RECIPE))
    upload_model(hub, folder)
    bot = start_bot(bot_settings(hub, tmp_path, job_timeout_seconds=1))
    job = wait_for(job_done(bot.store, bot.post(main_update(hub)).json()["job"]), 30, "the timeout")
    assert job.status == "failed" and job.reason == "timed out after 1s" and job.exit_code == -signal.SIGKILL
    assert hub.discussions(REPO) == []


def test_serve_command(tmp_path):
    """`hf-export-bot serve` as an operator runs it: refuses to start without a secret; serves; stops on SIGTERM."""
    base_env = {**os.environ, "EXPORT_BOT_DB": str(tmp_path / "bot.db"), "EXPORT_BOT_WORK_DIR": str(tmp_path),
                "EXPORT_BOT_BACKEND": "dry", "EXPORT_BOT_ALLOWED": "alice", "HF_TOKEN": BOT_TOKEN}
    base_env.pop("WEBHOOK_SECRET", None)
    command = [sys.executable, "-m", "bot.cli", "serve", "--port", "0"]
    refused = subprocess.run(command, env=base_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "WEBHOOK_SECRET" in refused.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command[-1] = str(port)
    server = subprocess.Popen(command, env={**base_env, "WEBHOOK_SECRET": SECRET}, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 30, "the bot to serve")
        answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/hub", timeout=10,
                            content=json.dumps(payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1),
                                                              "newSha": sha(2)}])),
                            headers={"content-type": "application/json", "x-webhook-secret": SECRET})
        assert answer.json()["status"] == "queued"
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/jobs/1").json()["status"] == "succeeded", 10,
                 "the embedded worker")
    finally:
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    # a graceful stop; uvicorn then re-raises the signal it caught, so the exit status can say SIGTERM
    assert server.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output
    assert "job 1 queued" in output and "job 1: succeeded" in output
    assert_no_secrets(output)

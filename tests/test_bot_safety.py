"""The bot acts only for people entitled to ask, never drops a push, and counts only real exports (#13 §3).

The real app on a loopback port and the Hub emulator (webhook payloads are the emulator's own events), the GitHub
emulator for workflow runs, and the job store itself for its rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from bot.settings import BotSettings
from bot.store import DAY_SECONDS, Delivery, JobStore
from bot.worker import Worker
from tests.conftest import ROOT, process_alive
from tests.servers.github_fixtures import GITHUB_BOT_TOKEN, WORKFLOW_FILE
from tests.servers.github_fixtures import REPO as GH_REPO
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN
from tests.test_bot import (  # noqa: F401  (start_bot is a fixture)
    SECRET,
    bot_settings,
    job_done,
    main_update,
    payload,
    pull_requests,
    sha,
    start_bot,
    upload_model,
    wait_for,
)

MALLORY_TOKEN, BOB_TOKEN = "hf_mallory_token", "hf_bob_token"
DISPATCH_WORKFLOW = ROOT / "examples" / "workflows" / "bot-dispatch.yml"
WORKER_FIELDS = ("hf_endpoint", "db_path", "work_dir", "allowed", "bot_name", "backend", "lease_seconds",
                 "poll_seconds", "retry_backoff_seconds", "job_timeout_seconds", "benchmark", "python",
                 "github_api_url", "github_repo", "github_workflow", "github_ref", "github_poll_seconds",
                 "github_private_repos")


class WorkerProcesses:
    """`hf-export-bot worker` processes on `settings` (a TOML file; secrets in the environment), as an operator
    runs them; each one's output in `logs/worker-N.log`."""

    def __init__(self, settings: BotSettings, folder: Path) -> None:
        self.config, self.logs = folder / "bot.toml", folder / "worker-logs"
        self.logs.mkdir()
        lines = ["[bot]"]
        for name in WORKER_FIELDS:
            value = getattr(settings, name, None)
            if value is not None:
                lines.append(f"{name} = {json.dumps(str(value) if isinstance(value, Path) else value)}")
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "HF_TOKEN": BOT_TOKEN, "WEBHOOK_SECRET": SECRET, "PYTHONUNBUFFERED": "1",
                    "EXPORT_BOT_GITHUB_TOKEN": GITHUB_BOT_TOKEN}
        self.started: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        with (self.logs / f"worker-{len(self.started) + 1}.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "bot.cli", "worker", "--config", str(self.config)],
                                       env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(process)
        return process

    def output(self) -> str:
        return "".join(p.read_text() for p in sorted(self.logs.iterdir()))

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture
def workers():
    made: list[WorkerProcesses] = []

    def make(settings: BotSettings, folder: Path) -> WorkerProcesses:
        made.append(WorkerProcesses(settings, folder))
        return made[-1]

    yield make
    for group in made:
        group.stop()


def _example_dispatch_workflow(github_server) -> str:
    """`examples/workflows/bot-dispatch.yml` (its run-name and declared inputs) in the GitHub emulator."""
    workflow = yaml.safe_load(DISPATCH_WORKFLOW.read_text())
    inputs = (workflow[True] if True in workflow else workflow["on"])["workflow_dispatch"]["inputs"]
    github_server.add_workflow(GH_REPO, file=DISPATCH_WORKFLOW.name, name=workflow["name"],
                               run_name=workflow["run-name"], inputs=list(inputs),
                               required_inputs=[k for k, v in inputs.items() if v.get("required")])
    return DISPATCH_WORKFLOW.name


def _recipe_repo(hub, tmp_path: Path, repo_id: str = "alice/tiny-llama") -> str:
    folder = tmp_path / repo_id.replace("/", "--")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "export_config.json").write_text(json.dumps({"export_format": "onnx"}))
    return upload_model(hub, folder, repo_id)


def _comment(hub, repo_id: str, token: str, text: str = f"@{BOT_USER} export") -> dict:
    """Post a comment on the repo's first discussion as the token's user; the webhook payload the Hub sends."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=token)
    discussions = hub.discussions(repo_id)
    num = discussions[0]["num"] if discussions else api.create_discussion(repo_id, "Exports?", description="hi").num
    api.comment_discussion(repo_id, num, text)
    return hub.events()[-1]


def _small_repo(hub, tmp_path: Path, repo_id: str) -> None:
    folder = tmp_path / repo_id.replace("/", "--")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    hub.create_model_repo(repo_id, {"config.json": (folder / "config.json").read_bytes()},
                          author=repo_id.split("/")[0])


# ── who may ask ───────────────────────────────────────────────────────────────


def test_trigger_comments_count_only_from_the_owner_or_org_members(hf_env, tmp_path, start_bot):
    hub = hf_env
    hub.add_token(MALLORY_TOKEN, "mallory")
    hub.add_token(BOB_TOKEN, "bob")
    hub.add_org_member("acme", "bob")
    _small_repo(hub, tmp_path, "alice/tiny")
    _small_repo(hub, tmp_path, "acme/widget")
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", allowed=["alice", "acme"]), embedded_worker=False)

    def deliver(repo_id: str, token: str) -> dict:
        answer = bot.post(_comment(hub, repo_id, token))
        assert answer.status_code == 202
        return answer.json()

    stranger = deliver("alice/tiny", MALLORY_TOKEN)
    assert stranger["status"] == "ignored" and "neither alice nor a member" in stranger["reason"]
    assert deliver("acme/widget", MALLORY_TOKEN)["status"] == "ignored"
    assert deliver("acme/widget", TEST_TOKEN)["status"] == "ignored"  # alice owns alice/, not acme/
    assert bot.store.list() == []  # no job for any of them
    owner = deliver("alice/tiny", TEST_TOKEN)
    member = deliver("acme/widget", BOB_TOKEN)
    assert owner["status"] == member["status"] == "queued"
    assert sorted(j.repo for j in bot.store.list()) == ["acme/widget", "alice/tiny"]


def test_membership_is_cached_briefly(hf_env):
    from bot.members import Members

    hub = hf_env
    hub.add_org_member("acme", "bob")
    cached = Members(token=BOT_TOKEN, endpoint=hub.url, ttl=300)
    fresh = Members(token=BOT_TOKEN, endpoint=hub.url, ttl=0)
    carol = hub.user_id("carol")
    assert not cached.entitled("acme/x", carol) and not fresh.entitled("acme/x", carol)
    hub.add_org_member("acme", "carol")
    assert not cached.entitled("acme/x", carol)  # the cached answer, for up to `ttl` seconds
    assert fresh.entitled("acme/x", carol)


# ── limits ────────────────────────────────────────────────────────────────────


def test_a_push_over_the_daily_limit_is_stored_and_delayed(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", daily_limit=1), embedded_worker=False)
    first = bot.post(payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}])).json()
    second = bot.post(payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(2), "newSha": sha(3)}])).json()
    assert first["status"] == "queued"
    assert second["status"] == "delayed" and second["job"] and "runs after" in second["reason"]
    delayed = bot.store.get(second["job"])
    assert delayed.status == "queued" and delayed.head_sha == sha(3)  # stored, not dropped
    assert delayed.next_attempt_at >= bot.store.get(first["job"]).created_at + DAY_SECONDS - 1
    claimed = bot.store.claim("w", lease_seconds=60)
    assert claimed.id == first["job"]
    bot.store.finish(claimed.id, "w", "succeeded")
    assert bot.store.claim("w", lease_seconds=60) is None  # due once the day's window has room
    assert bot.store.claim("w", lease_seconds=60, now=time.time() + DAY_SECONDS + 1).id == second["job"]


def test_comment_limits_are_per_repo_and_per_requester(tmp_path):
    from bot.store import Limits

    store = JobStore(tmp_path / "jobs.db")
    limits = Limits(push=1, comment=2, requester=3)
    for n in range(2):
        assert store.enqueue("acme/a", sha(1), Delivery("comment", f"comment:{n}", requested_by="u1"),
                             limits=limits).outcome == "queued"
    refused = store.enqueue("acme/a", sha(1), Delivery("comment", "comment:9", requested_by="u2"),
                            limits=limits)
    assert refused.outcome == "rate_limited" and "acme/a" in refused.detail
    assert store.enqueue("acme/b", sha(1), Delivery("comment", "comment:3", requested_by="u1"),
                         limits=limits).outcome == "queued"
    assert store.enqueue("acme/c", sha(1), Delivery("comment", "comment:4", requested_by="u1"),
                         limits=limits).outcome == "rate_limited"  # u1 asked three times today
    assert store.enqueue("acme/a", sha(5), limits=limits).outcome == "queued"  # comments never use up pushes


# ── the store and the worker ──────────────────────────────────────────────────


def test_one_job_per_repo_runs_at_a_time(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    a1 = store.enqueue("acme/a", sha(1), now=100).job_id
    a2 = store.enqueue("acme/a", sha(2), Delivery("comment", "comment:1"), now=101).job_id
    b1 = store.enqueue("acme/b", sha(3), now=102).job_id
    assert store.claim("w1", lease_seconds=60, now=110).id == a1
    assert store.claim("w2", lease_seconds=60, now=110).id == b1  # acme/a is busy: its second job waits
    assert store.claim("w3", lease_seconds=60, now=110) is None
    store.finish(a1, "w1", "succeeded")
    assert store.claim("w3", lease_seconds=60, now=111).id == a2
    assert store.claim("w4", lease_seconds=60, now=170.5).id == b1  # a dead worker's lease still expires


def test_an_older_push_is_superseded_by_a_newer_one(tmp_path):
    from bot.settings import BotSettings

    store = JobStore(tmp_path / "jobs.db")
    old = store.enqueue("acme/a", sha(1)).job_id
    new = store.enqueue("acme/a", sha(2)).job_id
    worker = Worker(BotSettings(backend="dry", db_path=tmp_path / "jobs.db"), store)
    assert worker.run_once().id == old
    job = store.get(old)
    assert job.status == "skipped" and f"superseded by job #{new}" in job.reason and job.operation == "superseded"
    worker.run_once()
    assert store.get(new).status == "succeeded"


def test_a_failed_whoami_is_asked_again(hf_env, tmp_path, monkeypatch):
    import bot.worker
    from bot.settings import BotSettings

    hub = hf_env
    monkeypatch.setattr(bot.worker, "IDENTITY_RETRY_SECONDS", 0.0, raising=False)
    settings = BotSettings(backend="dry", hf_token="hf_not_known_yet", hf_endpoint=hub.url,
                           db_path=tmp_path / "jobs.db")
    worker = Worker(settings, JobStore(settings.db_path))
    assert worker._bot_identity() is None  # the Hub refused the token
    hub.add_token("hf_not_known_yet", BOT_USER)
    assert worker._bot_identity() == (hub.user_id(BOT_USER), BOT_USER)


# ── bodies, privacy ───────────────────────────────────────────────────────────


def test_a_deeply_nested_body_is_400_not_500(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry"), embedded_worker=False)
    deep = b'{"event": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    answer = bot.post(content=deep)
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["error"]
    assert bot.get("/healthz").status_code == 200 and bot.store.list() == []


def test_repo_names_that_are_not_hub_ids_are_refused_before_anything_is_stored(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", allowed=["*"], max_body_bytes=4 << 20),
                    embedded_worker=False)
    main = [{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}]
    owner = hub.user_id("alice")
    for name in ("", "noslash", "../../etc/passwd", "alice/../../x", "a/b/c", "alice/" + "x" * 900_000):
        push = payload(name, refs=main)
        comment = payload(name, scope="discussion.comment", action="create", comment={
            "id": "c1", "author": {"id": owner}, "hidden": False, "content": f"@{BOT_USER} export",
            "url": {"web": "https://hf.co/x/discussions/1#c1"}})
        for event in (push, comment):
            answer = bot.post(event)
            assert answer.status_code == 400, (name[:40], answer.text[:200])
            assert "is not a Hub repo id" in answer.json()["error"] or "no namespace" in answer.json()["error"]
            assert len(answer.text) < 500  # the name is not echoed whole
    assert bot.store.list() == [] and bot.store.counts()["deliveries"] == 0
    assert bot.post(payload("alice/x", refs=main)).json()["status"] == "queued"  # a real id still is


def test_jobs_api_never_confirms_that_a_private_repo_exists(hub, tmp_path, start_bot):
    bot = start_bot(bot_settings(hub, tmp_path, backend="dry"), embedded_worker=False)
    bot.store.enqueue("alice/secret", sha(1), Delivery(private=True))
    bot.store.enqueue("alice/public", sha(2))
    assert httpx.get(f"{bot.url}/jobs", params={"repo": "alice/secret"}).json()["jobs"] == []
    assert httpx.get(f"{bot.url}/jobs", params={"repo": "alice/nothing"}).json()["jobs"] == []  # the same answer
    assert [j["repo"] for j in httpx.get(f"{bot.url}/jobs", params={"repo": "alice/public"}).json()["jobs"]] == [
        "alice/public"]
    assert "alice/secret" not in bot.get("/jobs").text and "alice/secret" not in bot.get("/").text


def test_the_private_flag_comes_from_the_hub_not_the_payload(hf_env, tmp_path, start_bot):
    from huggingface_hub import HfApi

    hub = hf_env
    hub.add_org_member("acme", "alice")
    hub.add_org_member("acme", BOT_USER)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))  # no recipe: skipped after the check
    upload_model(hub, folder, "acme/secret")
    event = main_update(hub, "acme/secret")
    assert event["repo"]["private"] is False
    HfApi(endpoint=hub.url, token=TEST_TOKEN).update_repo_settings("acme/secret", private=True)
    bot = start_bot(bot_settings(hub, tmp_path, allowed=["acme"]))
    job = wait_for(job_done(bot.store, bot.post(event).json()["job"]), 30, "the job to end")
    assert job.status == "skipped" and job.private  # refreshed from the Hub
    assert httpx.get(f"{bot.url}/jobs", params={"repo": "acme/secret"}).json()["jobs"] == []
    assert httpx.get(f"{bot.url}/jobs/{job.id}").json()["repo"] == "(private repo)"


def test_a_repo_that_turns_private_hides_all_its_old_jobs(hf_env, tmp_path, start_bot):
    """Privacy is the repo's current state: jobs that ran while it was public are hidden once it turns private,
    whether the Hub says so in a `repo.config` delivery or a worker finds out at the next push."""
    from huggingface_hub import HfApi

    hub = hf_env
    repos = ("alice/turns", "alice/quiet")
    for repo_id in repos:
        folder = tmp_path / repo_id.replace("/", "--")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (folder / "export_config.json").write_text(json.dumps({"export_format": "dynamo", "mode": "model"}))
        upload_model(hub, folder, repo_id)
    bot = start_bot(bot_settings(hub, tmp_path, job_timeout_seconds=1))  # each run is stopped at once: a log, fast
    old = {r: wait_for(job_done(bot.store, bot.post(main_update(hub, r)).json()["job"]), 60, f"{r}'s job")
           for r in repos}
    for repo_id, job in old.items():  # public: shown, log served
        assert not job.private and job.log_path and bot.get(f"/jobs/{job.id}/log").status_code == 200
        assert repo_id in bot.get("/").text and httpx.get(f"{bot.url}/jobs", params={"repo": repo_id}).json()["jobs"]
    alice = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    alice.update_repo_settings("alice/turns", private=True)  # the Hub tells the bot: repo.config update
    config = hub.events()[-1]
    assert config["event"]["scope"] == "repo.config" and config["repo"]["private"] is True
    assert bot.post(config).status_code == 202
    alice.update_repo_settings("alice/quiet", private=True)  # not delivered: the next push's worker finds out
    alice.upload_file(path_or_fileobj=b"usage", path_in_repo="USAGE.md", repo_id="alice/quiet")
    newer = wait_for(job_done(bot.store, bot.post(main_update(hub, "alice/quiet")).json()["job"]), 60, "the push")
    assert newer.private
    page, listing = bot.get("/").text, bot.get("/jobs").text
    for repo_id, job in old.items():
        assert httpx.get(f"{bot.url}/jobs", params={"repo": repo_id}).json()["jobs"] == [], repo_id
        assert bot.get(f"/jobs/{job.id}/log").status_code == 404, repo_id
        shown = bot.get(f"/jobs/{job.id}").json()
        assert shown["repo"] == "(private repo)" and shown["error"] is None and shown["links"] == {}, repo_id
        assert repo_id not in page and repo_id not in listing
    # a new delivery for a repo known to be private is hidden from the start, whatever its payload says
    public_claim = main_update(hub, "alice/quiet") | {"repo": {**config["repo"], "name": "alice/quiet",
                                                              "private": False}}
    public_claim["updatedRefs"] = [{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}]
    queued = bot.store.get(bot.post(public_claim).json()["job"])
    assert queued.private


# ── what counts as exported ───────────────────────────────────────────────────


def test_a_failed_workflow_run_is_not_already_exported(hf_env, tmp_path, start_bot, github_server):
    from huggingface_hub import HfApi

    hub = hf_env
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "export_config.json").write_text(json.dumps({"export_format": "onnx"}))
    upload_model(hub, folder)
    bot = start_bot(bot_settings(
        hub, tmp_path, backend="github", github_token=GITHUB_BOT_TOKEN, github_api_url=github_server.url,
        github_repo=GH_REPO, github_workflow=WORKFLOW_FILE, github_ref="main", github_poll_seconds=0.1))
    alice = HfApi(endpoint=hub.url, token=TEST_TOKEN)

    def push_and_run(note: str, conclusion: str | None):
        alice.upload_file(path_or_fileobj=note.encode(), path_in_repo="USAGE.md", repo_id="alice/tiny-llama",
                          commit_message=note)  # same weights and recipe, a new commit
        job_id = bot.post(main_update(hub)).json()["job"]
        if conclusion is not None:
            run = wait_for(lambda: [r for r in github_server.runs(GH_REPO) if r.status == "queued"], 30, "a run")[0]
            github_server.complete_run(GH_REPO, run.id, conclusion)
        return wait_for(job_done(bot.store, job_id), 30, f"the job after {note!r}")

    failed = push_and_run("one", "failure")
    assert failed.status == "failed" and "concluded failure" in failed.reason, (failed.reason, failed.error)
    assert failed.dispatch["conclusion"] == "failure" and failed.dispatch["run_id"]
    retried = push_and_run("two", "success")  # not skipped: the failed run exported nothing
    assert retried.status == "succeeded" and retried.dispatch["conclusion"] == "success"
    skipped = push_and_run("three", None)
    assert skipped.status == "skipped" and f"already exported by job #{retried.id}" in skipped.reason
    assert len(github_server.dispatches(GH_REPO)) == 2


@pytest.mark.parametrize("killed_while", ["following", "dispatching"])
def test_a_killed_worker_never_makes_the_github_backend_dispatch_twice(hf_env, tmp_path, start_bot, github_server,
                                                                      workers, killed_while):
    """Two attempts of one job, the first one's worker killed (SIGKILL) while it follows its run, or while GitHub's
    answer to its dispatch is in flight: the second attempt follows the same run (found by the dispatch id in the
    run's name, as the example workflow sets it), and there is one workflow run."""
    hub = hf_env
    _recipe_repo(hub, tmp_path)
    settings = bot_settings(hub, tmp_path, backend="github", github_token=GITHUB_BOT_TOKEN, lease_seconds=3,
                            github_api_url=github_server.url, github_repo=GH_REPO, poll_seconds=0.2,
                            github_workflow=_example_dispatch_workflow(github_server), github_poll_seconds=0.2)
    bot = start_bot(settings, embedded_worker=False)
    pool = workers(settings, tmp_path)
    job_id = bot.post(main_update(hub)).json()["job"]
    if killed_while == "dispatching":
        github_server.hold_dispatch_answers = threading.Event()
    first = pool.start()
    [run] = wait_for(lambda: github_server.runs(GH_REPO), 60, "the dispatched run")
    if killed_while == "following":
        wait_for(lambda: [r for r in github_server.requests if r.path.endswith(f"/actions/runs/{run.id}")], 30,
                 "the first worker to follow the run")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    if github_server.hold_dispatch_answers is not None:
        github_server.hold_dispatch_answers.set()
    assert bot.store.get(job_id).status == "running" and bot.store.get(job_id).attempts == 1
    mark = len(github_server.requests)
    pool.start()
    wait_for(lambda: len(github_server.dispatches(GH_REPO)) > 1 or [
        r for r in github_server.requests[mark:] if r.path.endswith(f"/actions/runs/{run.id}")], 60,
        "the second attempt to follow a run")
    assert len(github_server.dispatches(GH_REPO)) == 1, "dispatched twice"
    github_server.complete_run(GH_REPO, run.id, "success")
    job = wait_for(job_done(bot.store, job_id), 60, "the job to end")
    assert job.status == "succeeded" and job.attempts == 2, (job.reason, job.error, pool.output())
    assert job.dispatch["run_id"] == run.id and job.dispatch["dispatch_id"] in run.display_title
    assert len(github_server.dispatches(GH_REPO)) == len(github_server.runs(GH_REPO)) == 1


def test_a_private_repo_is_not_sent_to_github_unless_the_operator_opts_in(hf_env, tmp_path, start_bot,
                                                                         github_server):
    from huggingface_hub import HfApi

    hub = hf_env
    hub.add_org_member("acme", "alice")
    hub.add_org_member("acme", BOT_USER)  # the bot can read the private repo
    _recipe_repo(hub, tmp_path, "acme/secret")
    HfApi(endpoint=hub.url, token=TEST_TOKEN).update_repo_settings("acme/secret", private=True)
    github_server.run_conclusion = "success"
    workflow = _example_dispatch_workflow(github_server)

    def deliver(name: str, **overrides) -> object:
        settings = bot_settings(hub, tmp_path / name, backend="github", github_token=GITHUB_BOT_TOKEN,
                                github_api_url=github_server.url, github_repo=GH_REPO, github_workflow=workflow,
                                github_poll_seconds=0.1, allowed=["acme"], **overrides)
        bot = start_bot(settings)
        job = wait_for(job_done(bot.store, bot.post(main_update(hub, "acme/secret")).json()["job"]), 30, name)
        bot.stop()
        return job

    refused = deliver("default")
    assert refused.status == "skipped" and refused.private and "github_private_repos" in refused.reason
    assert github_server.dispatches(GH_REPO) == []  # nothing about the repo reached GitHub
    public_github = deliver("opted-in, public github repo", github_private_repos=True)
    assert public_github.status == "skipped" and f"{GH_REPO}, which is public" in public_github.reason
    assert github_server.dispatches(GH_REPO) == []
    github_server.reset()
    github_server.create_repo(GH_REPO, default_branch="main", private=True)
    workflow = _example_dispatch_workflow(github_server)
    github_server.run_conclusion = "success"
    sent = deliver("opted-in, private github repo", github_private_repos=True)
    assert sent.status == "succeeded", (sent.reason, sent.error)
    [run] = github_server.runs(GH_REPO)
    assert "acme" not in run.display_title and sent.dispatch["dispatch_id"] in run.display_title


# Stands in for `python -m bot.export_run run ... --out OUT` (the `python` setting): forks what a real run forks (a
# target export, as exporters.run.isolation does, and a process that even leaves the process group), each writing into
# OUT, then waits as a long export does; with "done" in the mode file it ends at once, as a passing run.
STANDIN = """#!{python}
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
if pathlib.Path({mode!r}).read_text() == "done":
    sys.exit(0)
for name in ("target", "escaped"):
    if os.fork() == 0:
        if name == "escaped":
            os.setsid()
        while True:
            (out / (name + ".pid")).write_text(str(os.getpid()))
            time.sleep(0.05)
time.sleep(600)
"""


def test_a_killed_local_worker_takes_its_whole_export_tree_with_it(hf_env, tmp_path, start_bot, workers):
    """The worker is SIGKILLed while its export runs: the export and everything it forked die with it (nothing keeps
    writing into the job's output folder), and the next attempt gets a folder of its own."""
    hub = hf_env
    _recipe_repo(hub, tmp_path)
    mode = tmp_path / "mode"
    mode.write_text("hang")
    standin = tmp_path / "python-standin"
    standin.write_text(STANDIN.format(python=sys.executable, mode=str(mode)))
    standin.chmod(0o755)
    settings = bot_settings(hub, tmp_path, lease_seconds=3, python=str(standin))
    bot = start_bot(settings, embedded_worker=False)
    pool = workers(settings, tmp_path)
    job_id = bot.post(main_update(hub)).json()["job"]
    first = pool.start()
    job_dir = settings.work_dir / f"job-{job_id}"

    def forked() -> list[int]:
        files = [p for n in ("target", "escaped") for p in job_dir.glob(f"**/out/{n}.pid")]
        try:
            return [int(p.read_text()) for p in files] if len(files) == 2 else []
        except ValueError:  # read while being written
            return []

    pids = wait_for(forked, 60, "the export and its forked children to run")
    [first_out] = {p.parent for p in job_dir.glob("**/out/target.pid")}
    try:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: not [p for p in pids if process_alive(p)], 10, "the export's whole tree to die with its worker")
        written = {p: p.stat().st_mtime_ns for p in first_out.iterdir()}
        time.sleep(0.3)
        assert {p: p.stat().st_mtime_ns for p in first_out.iterdir()} == written  # nothing writes there any more
    finally:
        for pid in pids:  # only if the test failed: the processes this test made
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
    mode.write_text("done")
    pool.start()
    job = wait_for(job_done(bot.store, job_id), 60, "the second attempt")
    assert job.status == "succeeded" and job.attempts == 2, (job.reason, job.error, pool.output())
    second = Path(job.log_path).parent
    assert second != first_out.parent and (second / "out").is_dir() and not list((second / "out").iterdir())


def test_the_recipe_proposal_is_closed_once_main_has_a_recipe_of_its_own(hf_env, tmp_path, start_bot):
    from huggingface_hub import HfApi

    from exporters.init.push import recipe_marker
    from exporters.publish import Proposal, publish_files

    hub = hf_env
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    upload_model(hub, folder)  # no recipe
    proposed = {"export_format": "onnx"}
    opened = publish_files(  # the PR `hf-export init --push` opens for the bot (the same library call and slot)
        "alice/tiny-llama", {"export_config.json": json.dumps(proposed).encode()},
        Proposal(marker=recipe_marker(proposed), title="Add an export recipe (export_config.json): onnx",
                 description=lambda _num: "A proposed recipe.", commit_message="Propose export_config.json"),
        token=BOT_TOKEN, endpoint=hub.url)
    assert opened.operation == "created"
    [proposal] = pull_requests(hub)
    mode = tmp_path / "mode"
    mode.write_text("done")
    standin = tmp_path / "python-standin"
    standin.write_text(STANDIN.format(python=sys.executable, mode=str(mode)))
    standin.chmod(0o755)
    bot = start_bot(bot_settings(hub, tmp_path, propose_recipes=True, python=str(standin)))
    alice = HfApi(endpoint=hub.url, token=TEST_TOKEN)
    alice.upload_file(path_or_fileobj=json.dumps({"export_format": "dynamo", "mode": "model"}).encode(),
                      path_in_repo="export_config.json", repo_id="alice/tiny-llama", commit_message="Our own recipe")
    job = wait_for(job_done(bot.store, bot.post(main_update(hub)).json()["job"]), 60, "the job")
    assert job.status == "succeeded", (job.reason, job.error)
    [closed] = pull_requests(hub)
    assert closed["num"] == proposal["num"] and closed["status"] == "closed"
    details = alice.get_discussion_details("alice/tiny-llama", proposal["num"])
    said = [e.content for e in details.events if e.type == "comment" and e.author == BOT_USER][-1]
    assert "`main` now has a recipe of its own (`export_config.json`" in said and "no longer needed" in said
    assert f"closed recipe proposal #{proposal['num']}" in job.notes


def test_a_permanent_publish_failure_is_not_retried(hf_env, tmp_path, start_bot):
    from tests.models import tiny_bert

    hub = hf_env
    upload_model(hub, tiny_bert(tmp_path / "model", {"export_format": "dynamo", "mode": "model"}))
    bot = start_bot(bot_settings(hub, tmp_path, max_upload_size="1KB", retry_backoff_seconds=0))
    job = wait_for(job_done(bot.store, bot.post(main_update(hub)).json()["job"]), 200, "the export")
    assert job.status == "failed" and job.attempts == 1 and job.exit_code == 3, (job.reason, job.error)
    assert "more than the limit of 1.0 KB" in job.reason and job.operation == "failed"
    assert hub.discussions("alice/tiny-llama") == []  # refused before anything was sent

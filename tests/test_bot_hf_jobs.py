"""The `hf-jobs` backend (#53) through the real `huggingface_hub` client, against the Hub emulator and the Jobs API
emulator served on it (`tests.servers.jobs`).

One test exports for real (a Hugging Face job running `python -m bot.export_run` as a local subprocess, which
exports the tiny Llama, validates it and opens the PR on the Hub emulator); the others let the emulator's jobs run no
command (`run_commands = False`: they stay `RUNNING` until the test ends them) and check what the bot sent, when it
cancels, that it never launches twice, and where the token goes. Checkpoints to size are safetensors headers alone
(the Hub answers their byte ranges; no weight is read), so a "7B" repo costs a few hundred bytes.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from bot.settings import BotSettings
from bot.store import Delivery, JobStore
from bot.worker import Worker
from tests.conftest import ROOT
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN
from tests.servers.jobs_fixtures import CUDA_IMAGE, IMAGE, jobs, jobs_server  # noqa: F401  (fixtures)
from tests.test_bot import (  # noqa: F401  (start_bot is a fixture)
    MODEL_RECIPE,
    REPO,
    SECRET,
    assert_no_secrets,
    bot_settings,
    everything_recorded,
    job_done,
    main_update,
    pull_requests,
    start_bot,
    upload_model,
    wait_for,
)


def jobs_settings(hub, tmp_path: Path, **overrides: Any) -> BotSettings:
    values: dict[str, Any] = dict(backend="hf-jobs", hf_jobs_image=IMAGE, hf_jobs_cuda_image=CUDA_IMAGE,
                                  hf_jobs_poll_seconds=0.1, max_attempts=2)
    values.update(overrides)
    return bot_settings(hub, tmp_path, **values)


def safetensors_header_only(parameters: int, dtype: str = "F32") -> bytes:
    """A safetensors file that declares one tensor of `parameters` elements and holds none of its bytes: what the
    Hub's byte ranges show of a large checkpoint."""
    width = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "weight": {"dtype": dtype, "shape": [parameters], "data_offsets": [0, parameters * width]}})
    return struct.pack("<Q", len(header)) + header.encode()


def sized_repo(hub, repo_id: str, parameters: int, recipe: Any, *, private: bool = False) -> str:
    """A repo whose checkpoint declares `parameters` float32 weights, with `recipe`; its head commit."""
    files = {"config.json": json.dumps({"model_type": "llama"}).encode(),
             "export_config.json": json.dumps(recipe).encode(),
             "model.safetensors": safetensors_header_only(parameters)}
    return hub.create_model_repo(repo_id, files, private=private, author=repo_id.split("/")[0])


def in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run_once, daemon=True)
    thread.start()
    return thread


def only_job(jobs) -> Any:
    [job] = wait_for(lambda: jobs.jobs(), 30, "the bot to launch a job")
    return job


# ───────────────────────────────────────────── end to end ─────────────────────────────────────────────


def test_a_webhook_ends_with_a_pr_from_a_hugging_face_job(hf_env, jobs, tmp_path, start_bot, caplog):  # noqa: F811
    """A push with a recipe: the bot sizes the work from the Hub (a tiny model: cpu-basic), launches one job running
    the released image's export run with the repo, the commit and the recipe hash, the token as a job secret only;
    the job exports, validates and opens the PR; the bot records it from the job's log."""
    from huggingface_hub import HfApi

    from tests.models import tiny_llama

    caplog.set_level("INFO")
    hub = hf_env
    # one layer: what was launched, exported and published reads no depth (#48)
    head = upload_model(hub, tiny_llama(tmp_path / "model", recipe=MODEL_RECIPE, layers=1))
    bot = start_bot(jobs_settings(hub, tmp_path))
    job = wait_for(job_done(bot.store, bot.post(main_update(hub)).json()["job"]), 300, "the export job to end")
    [remote] = jobs.jobs()
    assert job.status == "succeeded", (job.reason, job.error, [e["data"] for e in remote.events][-20:])
    assert job.operation == "created" and job.backend == "hf-jobs" and job.attempts == 1
    [pr] = pull_requests(hub)
    assert pr["author"] == BOT_USER and job.pr_url.endswith(f"/{REPO}/discussions/{pr['num']}")
    assert any(p.startswith("exports/dynamo/") for p in hub.files(REPO, pr["ref"]))

    # what was launched: the released image by digest, on the flavor the work needs, the token as a secret only
    [spec] = jobs.received
    assert spec["dockerImage"] == IMAGE and spec["flavor"] == "cpu-basic" and remote.namespace == BOT_USER
    command = spec["command"]
    assert command[:5] == ["python", "-m", "bot.export_run", "run", REPO]
    assert command[command.index("--revision") + 1] == head
    assert command[command.index("--recipe-sha256") + 1] == job.recipe_sha256
    assert spec["secrets"] == {"HF_TOKEN": BOT_TOKEN}
    assert BOT_TOKEN not in json.dumps({k: v for k, v in spec.items() if k != "secrets"})
    assert spec["timeoutSeconds"] == int(bot.settings.job_timeout_seconds)
    seen = HfApi(endpoint=hub.url, token=BOT_TOKEN).inspect_job(job_id=remote.id, namespace=BOT_USER)
    assert seen.status.stage == "COMPLETED" and BOT_TOKEN not in json.dumps(seen.secrets)
    assert job.dispatch["job_id"] == remote.id and job.dispatch["flavor"] == "cpu-basic"
    assert job.dispatch["secrets"] == ["HF_TOKEN"] and job.dispatch["worst_cost_usd"] >= 0

    # the job's log is the status page's, scrubbed; nothing secret anywhere the bot writes
    log_text = bot.get(f"/jobs/{job.id}/log").text
    assert "export-bot-outcome: " in log_text and "created" in log_text
    assert_no_secrets(everything_recorded(bot.settings.db_path), log_text, caplog.text, bot.get("/jobs").text,
                      Path(job.log_path).read_text())


def test_an_image_that_reads_the_recipe_differently_exports_nothing(hf_env, tmp_path):
    """`bot.export_run --recipe-sha256`: the recipe at the commit, read with this code, must hash as the bot read it;
    otherwise exit 2 before anything is loaded, the outcome line saying why."""
    hub = hf_env
    head = sized_repo(hub, "alice/sized", 1_000, {"export_format": "onnx"})
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": BOT_TOKEN, "HF_HUB_DISABLE_XET": "1",
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "bot.export_run", "run", "alice/sized", "--revision", head,
                          "--recipe-sha256", "0" * 64, "--out", str(tmp_path / "out"), "--push", "--outcome-line"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("export-bot-outcome: ")]
    assert "hashes to" in json.loads(line.split(": ", 1)[1])["stopped"] and not (tmp_path / "out").exists()
    assert hub.discussions("alice/sized") == [] and BOT_TOKEN not in run.stdout + run.stderr


# ───────────────────────────────────────────── flavors ─────────────────────────────────────────────


@pytest.mark.parametrize(("parameters", "recipe", "overrides", "flavor"), [
    (1_000_000, {"export_format": "onnx"}, {}, "cpu-basic"),
    # 12 GB of float32 weights: about 20 GB with ONNX's working set, more than cpu-basic's 16 GB
    (3_000_000_000, {"export_format": "onnx"}, {}, "cpu-upgrade"),
    (1_000_000, {"export_format": "dynamo", "device": "cuda", "dtype": "float16"}, {}, "t4-small"),
    (1_000_000, {"export_format": "onnx"}, {"hf_jobs_flavors": ["cpu-performance", "cpu-xl"]}, "cpu-xl"),
])
def test_the_flavor_comes_from_the_recipe_and_the_checkpoint(hf_env, jobs, tmp_path, parameters, recipe, overrides,
                                                             flavor):
    hub = hf_env
    jobs.run_commands = False
    head = sized_repo(hub, "alice/sized", parameters, recipe)
    store = JobStore(tmp_path / "bot.db")
    job_id = store.enqueue("alice/sized", head).job_id
    thread = in_thread(Worker(jobs_settings(hub, tmp_path, **overrides), store))
    remote = only_job(jobs)
    assert remote.spec["flavor"] == flavor
    assert remote.spec["dockerImage"] == (CUDA_IMAGE if flavor == "t4-small" else IMAGE)
    jobs.finish(remote.id, "COMPLETED")
    thread.join(30)
    job = store.get(job_id)
    assert job.status == "succeeded" and job.dispatch["flavor"] == flavor, (job.reason, job.error)
    assert flavor in job.dispatch["flavor_reason"]


def test_the_choice_for_large_checkpoints():
    """A 7B-parameter bfloat16 checkpoint (14 GB): ONNX in float32 on the CPU needs about 45 GB (cpu-xl); the same
    export on CUDA in bfloat16, about 24 GB on one GPU (the cheapest GPU holding it: an L40S, not two A10Gs); the
    operator's largest flavor, or the allow-list, leaves it nowhere to run, and the reason names what it needs."""
    from bot.backends.flavors import Work, choose
    from exporters.run.memory_plan import WeightCounts, estimate

    counts = WeightCounts(floating=7_000_000_000, other_bytes=0, stored_dtype="bfloat16")
    cpu = Work(estimate(counts, [("onnx", "float32")], "bfloat16", 1), None, cuda=False)
    gpu = Work(estimate(counts, [("dynamo", "bfloat16")], "bfloat16", 1), None, cuda=True)
    assert 40e9 < cpu.memory_bytes < 50e9 and 20e9 < gpu.memory_bytes < 30e9
    assert choose(cpu).flavor.name == "cpu-xl" and choose(gpu).flavor.name == "l40sx1"
    capped = choose(cpu, max_flavor="cpu-upgrade")
    assert capped.flavor is None and capped.needed.name == "cpu-xl"
    assert "cpu-xl (16 vCPU, 124 GB, $1.00/h)" in capped.reason and "no dearer than cpu-upgrade" in capped.reason
    assert choose(gpu, allowed=["t4-small", "a10g-largex2"]).flavor is None
    huge = choose(Work(5 * 10**12, None, cuda=False))
    assert huge.flavor is None and huge.needed is None and "more than any" in huge.reason
    assert choose(cpu).worst_cost_usd(3600 + 600) == pytest.approx(1.00 * 4200 / 3600)


def test_a_job_over_the_ceiling_is_skipped_and_the_repo_told_what_it_needs(hf_env, jobs, tmp_path):
    hub = hf_env
    head = sized_repo(hub, "alice/big", 3_000_000_000, {"export_format": "onnx"})
    store = JobStore(tmp_path / "bot.db")
    job_id = store.enqueue("alice/big", head).job_id
    Worker(jobs_settings(hub, tmp_path, hf_jobs_max_usd_per_hour=0.02), store).run_once()
    job = store.get(job_id)
    assert job.status == "skipped" and "cpu-upgrade" in job.reason and "$0.02/h" in job.reason, job.reason
    assert jobs.received == []  # nothing launched
    [thread] = hub.discussions("alice/big")
    text = thread["events"][0]["data"]["latest"]["raw"]
    assert "larger machine" in thread["title"] and "cpu-upgrade (8 vCPU, 32 GB" in text and "GB of memory" in text


# ───────────────────────────────────────────── following ─────────────────────────────────────────────


def _start_worker(settings: BotSettings, folder: Path, n: int) -> subprocess.Popen:
    """`hf-export-bot worker` on `settings` (a TOML file; the token in the environment), as an operator runs it."""
    config = folder / "bot.toml"
    fields = ("hf_endpoint", "db_path", "work_dir", "allowed", "bot_name", "backend", "lease_seconds", "poll_seconds",
              "retry_backoff_seconds", "hf_jobs_image", "hf_jobs_poll_seconds", "max_attempts")
    values = {name: getattr(settings, name) for name in fields}
    config.write_text("[bot]\n" + "".join(f"{name} = {json.dumps(str(v) if isinstance(v, Path) else v)}\n"
                                          for name, v in values.items()))
    env = {**os.environ, "HF_TOKEN": BOT_TOKEN, "WEBHOOK_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
    with (folder / f"worker-{n}.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "bot.cli", "worker", "--config", str(config)], env=env,
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _inspected(jobs, job_id: str, since: int = 0) -> bool:
    return ("GET", f"/api/jobs/{BOT_USER}/{job_id}") in jobs.requests[since:]


@pytest.mark.parametrize("lost_while", ["launching", "following", "stalled"])
def test_a_lost_worker_never_makes_a_second_job(hf_env, jobs, tmp_path, lost_while):
    """Two workers on one job. The first is killed while the Hub's answer to its launch is in flight (it never
    learns the job's id), or killed while following, or stalled (SIGSTOP) past its lease while following and then
    woken: the second finds the job (by its launch label, or its recorded id) and follows it; there is one job, and
    the woken first worker neither cancels it nor launches another."""
    hub = hf_env
    jobs.run_commands = False
    head = sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    settings = jobs_settings(hub, tmp_path, lease_seconds=3, poll_seconds=0.2, hf_jobs_poll_seconds=0.2)
    job_id = JobStore(settings.db_path).enqueue("alice/sized", head).job_id
    if lost_while == "launching":
        jobs.hold_launch_answers = threading.Event()
    first = _start_worker(settings, tmp_path, 1)
    second = None
    try:
        remote = only_job(jobs)
        if lost_while != "launching":
            wait_for(lambda: _inspected(jobs, remote.id), 30, "the first worker to follow the job")
        first.send_signal(signal.SIGSTOP if lost_while == "stalled" else signal.SIGKILL)
        if jobs.hold_launch_answers is not None:
            jobs.hold_launch_answers.set()
        mark = len(jobs.requests)
        second = _start_worker(settings, tmp_path, 2)
        wait_for(lambda: _inspected(jobs, remote.id, mark), 60, "the second worker to follow the job")
        if lost_while == "stalled":
            first.send_signal(signal.SIGCONT)
            wait_for(lambda: "lease lost" in (tmp_path / "worker-1.log").read_text(), 30, "the first to see its loss")
        assert len(jobs.jobs()) == 1 and remote.stage == "RUNNING", "launched twice, or cancelled"
        jobs.finish(remote.id, "COMPLETED")
        store = JobStore(settings.db_path)
        job = wait_for(job_done(store, job_id), 60, "the job to end")
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    logs = "".join(p.read_text() for p in tmp_path.glob("worker-*.log"))
    assert job.status == "succeeded" and job.attempts == 2, (job.reason, job.error, logs)
    assert job.dispatch["job_id"] == remote.id and len(jobs.received) == 1
    if lost_while == "launching":
        assert "found by its label" in job.dispatch["found"]
    assert ("POST", f"/api/jobs/{BOT_USER}/{remote.id}/cancel") not in jobs.requests
    assert_no_secrets(logs, everything_recorded(settings.db_path))


def test_a_newer_push_cancels_the_running_job(hf_env, jobs, tmp_path, start_bot):  # noqa: F811
    from huggingface_hub import HfApi

    hub = hf_env
    jobs.run_commands = False
    sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    bot = start_bot(jobs_settings(hub, tmp_path))
    older = bot.post(main_update(hub, "alice/sized")).json()["job"]
    first = only_job(jobs)
    wait_for(lambda: _inspected(jobs, first.id), 30, "the bot to follow the first job")
    HfApi(endpoint=hub.url, token=TEST_TOKEN).upload_file(path_or_fileobj=b"# new\n", path_in_repo="README.md",
                                                          repo_id="alice/sized")
    newer = bot.post(main_update(hub, "alice/sized")).json()["job"]
    superseded = wait_for(job_done(bot.store, older), 30, "the older job to end")
    assert superseded.status == "skipped" and superseded.operation == "superseded", superseded.reason
    assert f"superseded by job #{newer}" in superseded.reason and f"job {first.id} cancelled" in superseded.reason
    assert first.stage == "CANCELED" and ("POST", f"/api/jobs/{BOT_USER}/{first.id}/cancel") in jobs.requests
    second = wait_for(lambda: [j for j in jobs.jobs() if j.id != first.id], 30, "the newer job's launch")[0]
    jobs.finish(second.id, "COMPLETED")
    assert wait_for(job_done(bot.store, newer), 30, "the newer job").status == "succeeded"


def test_a_retry_superseded_before_it_starts_cancels_the_earlier_attempts_job(hf_env, jobs, tmp_path):
    """The worker stops (its job given back, the Hugging Face job still running); a newer push arrives; the next
    claim ends the older job as superseded and cancels the job its first attempt launched."""
    hub = hf_env
    jobs.run_commands = False
    head = sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    store = JobStore(tmp_path / "bot.db")
    older = store.enqueue("alice/sized", head).job_id
    settings = jobs_settings(hub, tmp_path)
    stop = threading.Event()
    worker = threading.Thread(target=Worker(settings, store).run, args=(stop,), daemon=True)
    worker.start()
    remote = only_job(jobs)
    wait_for(lambda: _inspected(jobs, remote.id), 30, "the worker to follow the job")
    stop.set()
    worker.join(30)
    assert store.get(older).status == "queued" and remote.stage == "RUNNING"  # given back; the job goes on
    newer = store.enqueue("alice/sized", "b" * 40).job_id
    Worker(settings, store).run_once()
    job = store.get(older)
    assert job.status == "skipped" and f"superseded by job #{newer}" in job.reason, job.reason
    assert f"Hugging Face job {remote.id} cancelled" in job.reason and remote.stage == "CANCELED"


def test_an_overdue_job_is_cancelled(hf_env, jobs, tmp_path):
    """The job's own timeout plus the margin, from its start: then the bot cancels it and fails the job."""
    hub = hf_env
    jobs.run_commands = False
    head = sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    store = JobStore(tmp_path / "bot.db")
    job_id = store.enqueue("alice/sized", head).job_id
    Worker(jobs_settings(hub, tmp_path, job_timeout_seconds=1, hf_jobs_timeout_margin_seconds=1), store).run_once()
    job = store.get(job_id)
    [remote] = jobs.jobs()
    assert job.status == "failed" and "did not end within 2s" in job.reason and remote.stage == "CANCELED"
    assert jobs.received[0]["timeoutSeconds"] == 1


@pytest.mark.parametrize(("outcome", "expected"), [
    ({"problem": {"kind": "model", "message": "no config.json in acme/x"}}, "the model cannot be loaded"),
    ({"status": "failed", "failed": [{"name": "onnx", "status": "failed",
                                      "error": {"type": "ValueError", "message": "bad `top_p`"}}]},
     "target(s) did not pass: onnx (failed)"),
])
def test_the_jobs_outcome_line_decides_how_it_failed(hf_env, jobs, tmp_path, outcome, expected):
    """An `ERROR` job: its last log line (`bot.export_run --outcome-line`) says why; a problem is told to the repo
    in its failure discussion, as the local backend's exit 2 is."""
    hub = hf_env
    jobs.run_commands = False
    head = sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    store = JobStore(tmp_path / "bot.db")
    job_id = store.enqueue("alice/sized", head).job_id
    thread = in_thread(Worker(jobs_settings(hub, tmp_path), store))
    remote = only_job(jobs)
    jobs.log(remote.id, "export-bot-outcome: " + json.dumps(outcome))
    jobs.finish(remote.id, "ERROR", "exit code 2")
    thread.join(30)
    job = store.get(job_id)
    assert job.status == "failed" and job.attempts == 1 and expected in job.reason, (job.reason, job.error)
    told = hub.discussions("alice/sized")
    assert len(told) == (1 if "problem" in outcome else 0)
    if told:
        assert "no config.json in acme/x" in told[0]["events"][0]["data"]["latest"]["raw"]
    else:
        assert "onnx: ValueError: bad `top_p`" in job.error


# ───────────────────────────────────────────── secrets and privacy ─────────────────────────────────────────────


def test_the_token_never_leaves_the_job_secret(hf_env, jobs, tmp_path, start_bot, caplog):  # noqa: F811
    """A job whose log prints the token (a crash dumping its environment): the status page, the job's error and the
    log the bot keeps show it scrubbed."""
    hub = hf_env
    jobs.run_commands = False
    sized_repo(hub, "alice/sized", 1_000_000, {"export_format": "onnx"})
    bot = start_bot(jobs_settings(hub, tmp_path, max_attempts=1))
    job_id = bot.post(main_update(hub, "alice/sized")).json()["job"]
    remote = only_job(jobs)
    jobs.log(remote.id, f"HF_TOKEN={BOT_TOKEN}")
    jobs.log(remote.id, f"requests: Authorization: Bearer {BOT_TOKEN} refused")
    jobs.finish(remote.id, "ERROR", "exit code 137")
    job = wait_for(job_done(bot.store, job_id), 30, "the job to end")
    assert job.status == "failed" and "without an outcome (exit code 137)" in job.error, (job.reason, job.error)
    log_text = bot.get(f"/jobs/{job_id}/log").text
    assert "HF_TOKEN=***" in log_text and "Bearer *** refused" in log_text
    assert jobs.received[0]["secrets"] == {"HF_TOKEN": BOT_TOKEN}
    assert_no_secrets(log_text, job.error, everything_recorded(bot.settings.db_path), bot.get(f"/jobs/{job_id}").text,
                      caplog.text)


def test_a_private_repo_runs_only_in_its_owners_namespace_when_configured(hf_env, jobs, tmp_path):
    hub = hf_env
    jobs.run_commands = False
    hub.add_org_member("acme", BOT_USER)  # the bot reads acme's private repos, and may run jobs there
    head = sized_repo(hub, "acme/secret", 1_000_000, {"export_format": "onnx"}, private=True)
    store = JobStore(tmp_path / "bot.db")
    skipped = store.enqueue("acme/secret", head).job_id
    Worker(jobs_settings(hub, tmp_path, allowed=["acme"]), store).run_once()
    job = store.get(skipped)
    assert job.status == "skipped" and "hf_jobs_private_namespaces" in job.reason and job.private
    assert jobs.received == []
    sent = store.enqueue("acme/secret", head, Delivery("manual", "again")).job_id
    thread = in_thread(Worker(jobs_settings(hub, tmp_path, allowed=["acme"], hf_jobs_private_namespaces=["acme"]),
                              store))
    remote = only_job(jobs)
    assert remote.namespace == "acme"
    jobs.finish(remote.id, "COMPLETED")
    thread.join(30)
    assert store.get(sent).status == "succeeded" and store.get(sent).dispatch["namespace"] == "acme"

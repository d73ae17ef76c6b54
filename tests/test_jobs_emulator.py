"""Contract tests: the real `huggingface_hub` Jobs client (`run_job`, `inspect_job`, `list_jobs`, `fetch_job_logs`,
`cancel_job`, `wait_for_job`) against the Jobs API emulator on the Hub emulator, over HTTP."""

from __future__ import annotations

import time

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN, TEST_USER
from tests.servers.jobs_fixtures import IMAGE, jobs, jobs_server  # noqa: F401  (fixtures)

SLOW_PRINT = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.4)\n"


def test_a_job_queues_runs_streams_its_log_and_completes(hf_env, jobs):  # noqa: F811
    """Queued (`SCHEDULING`), then `RUNNING` its command; `follow=True` streams the lines as they are printed and
    ends with the job; its secrets reach the process and are never answered."""
    jobs.queue_seconds = 0.5
    # The Hub's stream stays open until the job ends; an early end (the emulator's idle close) makes a following
    # client sleep 2 s and stop unread when the job ended meanwhile: under load that lost every line.
    jobs.log_idle_close_seconds = None
    api = HfApi(endpoint=hf_env.url, token=TEST_TOKEN)
    info = api.run_job(image=IMAGE, command=["python", "-c", "import os; print(os.environ['SECRET_X'])\n" + SLOW_PRINT],
                       secrets={"SECRET_X": "s3cret-value"}, env={"PLAIN": "1"}, flavor="cpu-upgrade", timeout=60,
                       labels={"kind": "demo"}, namespace=TEST_USER)
    assert info.status.stage == "SCHEDULING" and info.flavor == "cpu-upgrade" and info.owner.name == TEST_USER
    assert info.secrets == {"SECRET_X": None} and info.environment == {"PLAIN": "1"}
    started = time.monotonic()
    lines = list(api.fetch_job_logs(job_id=info.id, namespace=TEST_USER, follow=True))
    assert lines == ["s3cret-value", "line 0", "line 1", "line 2"] and time.monotonic() - started > 1.0
    done = api.inspect_job(job_id=info.id, namespace=TEST_USER)
    assert done.status.stage == "COMPLETED" and done.started_at and done.finished_at
    assert [j.id for j in api.list_jobs(labels={"kind": "demo"}, namespace=TEST_USER)] == [info.id]
    assert list(api.list_jobs(labels={"kind": "other"}, namespace=TEST_USER)) == []
    assert [j.id for j in api.list_jobs(status="COMPLETED", namespace=TEST_USER)] == [info.id]


def test_failure_timeout_cancellation_and_refusals(hf_env, jobs):  # noqa: F811
    api = HfApi(endpoint=hf_env.url, token=TEST_TOKEN)
    failed = api.run_job(image=IMAGE, command=["python", "-c", "raise SystemExit(3)"], namespace=TEST_USER)
    assert api.wait_for_job(failed.id, namespace=TEST_USER, poll_interval=0.1).status.message == "exit code 3"
    slow = api.run_job(image=IMAGE, command=["python", "-c", "import time; time.sleep(60)"], timeout=1,
                       namespace=TEST_USER)
    timed_out = api.wait_for_job(slow.id, namespace=TEST_USER, poll_interval=0.1, timeout=30)
    assert (timed_out.status.stage, timed_out.status.message) == ("ERROR", "Job timeout")
    running = api.run_job(image=IMAGE, command=["python", "-c", "import time; time.sleep(60)"], namespace=TEST_USER)
    api.cancel_job(job_id=running.id, namespace=TEST_USER)
    assert api.inspect_job(job_id=running.id, namespace=TEST_USER).status.stage == "CANCELED"
    unknown = api.run_job(image="ghcr.io/x/unknown@sha256:" + "3" * 64, command=["true"], namespace=TEST_USER)
    assert api.wait_for_job(unknown.id, namespace=TEST_USER, poll_interval=0.1).status.stage == "ERROR"
    with pytest.raises(HfHubHTTPError) as refused:  # the bot's user is not alice
        HfApi(endpoint=hf_env.url, token=BOT_TOKEN).run_job(image=IMAGE, command=["true"], namespace=TEST_USER)
    assert refused.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as unknown_flavor:
        api.run_job(image=IMAGE, command=["true"], flavor="tpu-huge", namespace=TEST_USER)
    assert unknown_flavor.value.response.status_code == 400
    with pytest.raises(HfHubHTTPError) as missing:
        api.inspect_job(job_id=failed.id, namespace=BOT_USER, token=BOT_TOKEN)
    assert missing.value.response.status_code == 404

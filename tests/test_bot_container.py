"""The bot's container (docker/bot.Dockerfile) started as Docker starts it, without Docker: its ENTRYPOINT with its
ENV, a fresh empty folder as the `/data` volume, the secrets as `docker run -e` passes them; then its HEALTHCHECK
command, run as Docker runs it, against the served app over real HTTP on 127.0.0.1.

What differs from the image, and only that: `/usr/local/bin/python` is this interpreter, `/data` and `HOME` are
fresh temporary folders, the host is 127.0.0.1 (the image listens on 0.0.0.0) and the port is a free one (the image
says 7860: Docker maps it); the `dry` backend runs the job, so the test exports nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.test_bot import SECRET, assert_no_secrets, payload, sha, wait_for
from tests.test_static_checks import dockerfile_env, parse_dockerfile

ROOT = Path(__file__).resolve().parents[1]
IMAGE_PYTHON = "/usr/local/bin/python"
HF_TOKEN = "hf_container_token_0123456789"


def _container(tmp_path: Path) -> tuple[dict[str, str], list[str], list[str], Path]:
    """(environment, entrypoint, health check command, data folder) of the image, mapped onto this machine."""
    instructions = parse_dockerfile((ROOT / "docker" / "bot.Dockerfile").read_text())
    image_env = dockerfile_env(instructions)
    data, home = tmp_path / "data", tmp_path / "home"
    data.mkdir()
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("EXPORT_BOT_", "HF_", "HUGGING", "WEBHOOK_", "GITHUB_"))}
    for key, value in image_env.items():  # the image's ENV, its /data paths on the fresh volume
        env[key] = str(data / value[len("/data/"):]) if value.startswith("/data/") else value
    env["HOME"] = str(home)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env.update({"EXPORT_BOT_HOST": "127.0.0.1", "EXPORT_BOT_PORT": str(port), "PYTHONPATH": str(ROOT),
                # what an operator passes with `docker run -e` (Space secrets and variables)
                "WEBHOOK_SECRET": SECRET, "HF_TOKEN": HF_TOKEN, "EXPORT_BOT_ALLOWED": "alice",
                "EXPORT_BOT_BACKEND": "dry"})

    def local(command: list[str]) -> list[str]:
        assert command[0] == IMAGE_PYTHON, command
        return [sys.executable, *command[1:]]

    entrypoint = [json.loads(rest) for kind, rest in instructions if kind == "ENTRYPOINT"][-1]
    health = [rest for kind, rest in instructions if kind == "HEALTHCHECK"][-1].partition(" CMD ")[2]
    return env, local(entrypoint), local(json.loads(health)), data


def test_the_bot_container_serves_works_and_reports_its_health(tmp_path):
    env, entrypoint, healthcheck, data = _container(tmp_path)
    port = env["EXPORT_BOT_PORT"]
    home = Path(env["HOME"])

    def health() -> subprocess.CompletedProcess:
        return subprocess.run(healthcheck, env=env, cwd=home, capture_output=True, text=True, timeout=30)

    before = health()  # nothing serves yet: unhealthy, and it says so
    assert before.returncode == 1 and f"http://127.0.0.1:{port}/healthz: unhealthy" in before.stderr

    server = subprocess.Popen(entrypoint, env=env, cwd=home, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: health().returncode == 0, 60, "the container's health check to pass")
        ok = health()
        assert ok.stdout.startswith(f"http://127.0.0.1:{port}/healthz: ok (200 ")
        # the web process and its embedded worker, in the one container: a webhook's job is queued and run
        answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/hub", timeout=10,
                            content=json.dumps(payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1),
                                                              "newSha": sha(2)}])),
                            headers={"content-type": "application/json", "x-webhook-secret": SECRET})
        assert answer.status_code == 202 and answer.json()["status"] == "queued", answer.text
        job = answer.json()["job"]
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/jobs/{job}", timeout=5).json()["status"] == "succeeded",
                 30, "the embedded worker to run the job")
        healthz = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        assert healthz["status"] == "ok" and healthz["backend"] == "dry"
    finally:
        server.send_signal(signal.SIGTERM)  # `docker stop`
        output = server.communicate(timeout=30)[0]
    assert server.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output
    # everything the bot keeps is on the volume: the job store survives the container
    assert (data / "jobs.db").is_file()
    assert sorted(p.name for p in home.iterdir()) == [], "the bot wrote outside its volume"
    after = health()
    assert after.returncode == 1
    assert_no_secrets(output, before.stdout + before.stderr, ok.stdout + ok.stderr, after.stdout + after.stderr)
    assert HF_TOKEN not in output

"""A Hub repo id with `HF_HUB_OFFLINE=1`: the run reads the repo's snapshot from the local Hub cache, as
huggingface_hub's offline mode does, and says clearly what to do when it is not there (it crashed with
`OfflineModeIsEnabled` and exit 1 before); a Hub that cannot be reached at all is said as such."""

from __future__ import annotations

import json
import socket

from tests.conftest import run_cli
from tests.servers.hub import HubEmulator

RECIPE = [{"name": "dynamo-cached", "export_format": "dynamo"}]


def _env(hub_url: str, home, offline: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub_url, "HF_HUB_OFFLINE": offline, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}


def _run(repo: str, out, env: dict[str, str]):
    # `--target nope`: the run stops after reading the repo's recipe, naming the targets it holds
    return run_cli("run", repo, "--out", str(out), "--target", "nope", "--no-bench", "--quiet", env=env)


def test_an_offline_run_reads_the_repo_from_the_cache_or_says_it_is_not_there(tmp_path):
    with HubEmulator() as hub:
        hub.create_model_repo("acme/tiny", {"config.json": json.dumps({"model_type": "bert"}).encode(),
                                            "export_config.json": json.dumps(RECIPE).encode()})
        url = hub.url
        online = _run("acme/tiny", tmp_path / "out-online", _env(url, tmp_path / "home", "0"))
    assert online.returncode == 2 and "dynamo-cached" in online.stderr, online.stderr[-2000:]
    # the Hub is gone now: only the cache filled by the online run can answer
    cached = _run("acme/tiny", tmp_path / "out-cached", _env(url, tmp_path / "home", "1"))
    assert cached.returncode == 2 and "dynamo-cached" in cached.stderr, cached.stderr[-2000:]
    assert "Traceback" not in cached.stderr
    missing = _run("acme/tiny", tmp_path / "out-missing", _env(url, tmp_path / "empty-home", "1"))
    assert missing.returncode == 2, missing.stderr[-2000:]
    assert "HF_HUB_OFFLINE is set and 'acme/tiny' is not in the local Hub cache" in missing.stderr
    assert "Traceback" not in missing.stderr and "OfflineModeIsEnabled" not in missing.stderr


def test_a_hub_that_cannot_be_reached_is_said_as_such(tmp_path):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = {**_env(url, tmp_path / "home", "0"), "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
    done = _run("acme/tiny", tmp_path / "out", env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"could not reach the Hub at {url} for 'acme/tiny' (ConnectError)" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr

"""Hardening (issue #8): fuzzed recipes, secrets, remote code, paths. Crash and timeout isolation is in
test_isolation.py; bad webhooks in test_bot.py (intake tests)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporters.errors import RecipeError
from exporters.recipe.load import parse_recipe
from tests.conftest import ROOT, run_cli
from tests.models import tiny_bert
from tests.test_bot import start_bot  # noqa: F401  (the bot server fixture)

# ── 1. Fuzzed recipes ─────────────────────────────────────────────────────────

KEYS = ["export_format", "name", "dynamic", "strict", "dynamic_shapes", "mode", "components", "opset_version",
        "backend", "output_path", "external_data", "device", "dtype", "validation", "atol", "rtol", "timeout",
        "expected_components", "schema_version", "exports", "inputs", "generation", "batch_size", "prompt",
        "max_cache_len", "cache_implementation", "min", "max", "input_ids", "cache.layers.*.keys", "1", "0",
        "formats", "onnx", "prefill", "decode", "unknown", "opset", "multi_token_decode", "keep_initializers_as_inputs"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10_000), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["onnx", "dynamo", "executorch", "static", "auto", "generation", "model", "cpu", "cuda",
                     "../x.onnx", "/abs.onnx", "a.onnx", "seq", "float16", "xnnpack", "", "é\u2028"]),
    st.text(max_size=8),
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), children,
                                               max_size=5)),
    max_leaves=8,
)
NEAR_VALID = st.builds(
    lambda fmt, extra: {"export_format": fmt, **extra},
    st.sampled_from(["onnx", "dynamo", "executorch", "onxx"]),
    st.dictionaries(st.sampled_from([k for k in KEYS if k != "export_format"]), JSON, max_size=4),
)
DOCUMENTS = st.one_of(
    JSON.map(json.dumps),
    NEAR_VALID.map(json.dumps),
    st.lists(NEAR_VALID, max_size=3).map(json.dumps),
    st.builds(lambda exports, extra: json.dumps({"schema_version": 1, "exports": exports, **extra}),
              st.lists(NEAR_VALID, max_size=3), st.dictionaries(st.sampled_from(KEYS), JSON, max_size=3)),
    NEAR_VALID.map(json.dumps).flatmap(lambda text: st.integers(0, len(text)).map(lambda cut: text[:cut])),
    st.text(max_size=40),
)


@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(DOCUMENTS)
def test_every_input_is_a_recipe_or_a_recipe_error_with_a_path(text):
    try:
        recipe = parse_recipe(text)
    except RecipeError as err:
        assert err.path.startswith("$") and err.message
        assert err.line is None or err.line >= 1
        return
    assert recipe.exports and all(t.name for t in recipe.exports)


def test_pathological_json_is_a_recipe_error():
    for text in ["[" * 100_000, '{"export_format": "onnx", "validation": {"atol": NaN}}',
                 '{"export_format": "onnx", "validation": {"atol": Infinity}}', "\ud800", ""]:
        with pytest.raises(RecipeError):
            parse_recipe(text)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(DOCUMENTS)
def test_cli_check_never_shows_a_traceback(text):
    from typer.testing import CliRunner

    from exporters.cli import app

    path = Path(os.environ.get("PYTEST_TMP", "/tmp")) / f"fuzz-{os.getpid()}.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)


# ── 2. Secrets ────────────────────────────────────────────────────────────────

SECRET_HF = "hf_SECRET_9f8e7d6c5b4a"


@pytest.fixture(scope="module")
def secret_runs(hub_server, tmp_path_factory):
    """A passing and a failing `--push` run with a secret token; everything they wrote, collected."""
    from huggingface_hub import HfApi

    from tests.servers.hub_fixtures import TEST_TOKEN

    hub_server.reset()
    hub_server.add_token(SECRET_HF, "export-bot")
    root = tmp_path_factory.mktemp("secrets")
    env = {"HF_ENDPOINT": hub_server.url, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(root / "home"),
           "HF_TOKEN": SECRET_HF, "GITHUB_TOKEN": "ghs_SECRET_github_1234"}
    api = HfApi(endpoint=hub_server.url, token=TEST_TOKEN)
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        from huggingface_hub import constants

        patch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # read at import time: the emulator speaks no Xet
        _secret_runs(api, hub_server, root, env, seen)
    return seen


def _secret_runs(api, hub_server, root: Path, env: dict[str, str], seen: list[str]) -> None:
    for name, recipe in (("good", {"export_format": "dynamo", "mode": "model"}),
                         ("bad", {"export_format": "dynamo", "mode": "model", "dynamic_shapes": {"nope": ["auto"]}})):
        folder = tiny_bert(root / name, recipe)
        api.create_repo(f"alice/{name}")
        api.upload_folder(repo_id=f"alice/{name}", folder_path=folder)
        out = root / f"out-{name}"
        result = run_cli("run", "--no-bench", f"alice/{name}", "--out", str(out), "--push", "--quiet", env=env)
        seen += [result.stdout, result.stderr]
        seen += [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.stat().st_size < 5e6]
        for discussion in hub_server.discussions(f"alice/{name}"):
            seen.append(json.dumps(discussion))
        for path in hub_server.files(f"alice/{name}", "refs/pr/1") if name == "good" else []:
            if path.endswith((".md", ".json")):
                seen.append(hub_server.file(f"alice/{name}", path, "refs/pr/1").decode(errors="replace"))


def test_tokens_appear_nowhere(secret_runs):
    assert len(secret_runs) > 6
    for text in secret_runs:
        assert SECRET_HF not in text
        assert "ghs_SECRET_github_1234" not in text


def test_the_secret_runs_did_publish_and_fail_as_expected(secret_runs, hub_server):
    assert hub_server.head("alice/good", "refs/pr/1")
    assert any(not d.get("isPullRequest") for d in hub_server.discussions("alice/bad"))


# ── 3. Remote code ────────────────────────────────────────────────────────────

MODELING = '''
from pathlib import Path
Path(__file__).with_name("CODE_RAN").write_text("the repo's code was imported")
from transformers import BertConfig, BertModel


class TinyCustomConfig(BertConfig):
    model_type = "tiny-custom"


class TinyCustomModel(BertModel):
    config_class = TinyCustomConfig
'''


@pytest.fixture
def remote_code_repo(tmp_path):
    folder = tiny_bert(tmp_path / "custom", {"export_format": "dynamo", "mode": "model"})
    config = json.loads((folder / "config.json").read_text())
    config.update({"architectures": ["TinyCustomModel"], "model_type": "tiny-custom",
                   "auto_map": {"AutoConfig": "modeling_custom.TinyCustomConfig",
                                "AutoModel": "modeling_custom.TinyCustomModel"}})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_custom.py").write_text(MODELING)
    return folder


def test_remote_code_is_refused_unless_allowed(remote_code_repo, tmp_path):
    refused = run_cli("run", "--no-bench", str(remote_code_repo), "--out", str(tmp_path / "out"), "--quiet")
    assert refused.returncode == 2
    assert "needs code from its repo" in refused.stderr and "--trust-remote-code" in refused.stderr
    assert not (remote_code_repo / "CODE_RAN").exists(), "no code from the repo may run when refused"
    allowed = run_cli("run", "--no-bench", str(remote_code_repo), "--out", str(tmp_path / "out2"), "--quiet",
                      "--trust-remote-code")
    assert allowed.returncode == 0, allowed.stderr[-2000:]


def test_validate_refuses_pickled_programs_it_did_not_produce(linked_run, tmp_path):
    """On a copy of the link test's finished run (a dynamo target of a tiny BERT: the run itself is not the point
    here, #48)."""
    assert linked_run["result"].returncode == 0, linked_run["result"].stderr[-2000:]
    folder, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(linked_run["folder"], folder)
    shutil.copytree(linked_run["out"], out)
    refused = run_cli("validate", str(folder), str(out))
    assert refused.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert "pickled" in report["targets"][0]["error"]["message"]
    allowed = run_cli("validate", str(folder), str(out), "--trust-remote-code")
    assert allowed.returncode == 0, allowed.stderr[-2000:]


# ── 5. Paths ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("recipe, words", [
    ({"export_format": "onnx", "name": "../escape"}, "pattern"),
    ({"export_format": "onnx", "name": "/abs"}, "pattern"),
    ({"export_format": "onnx", "output_path": "../../x.onnx"}, "no '..'"),
    ({"export_format": "onnx", "output_path": "/etc/x.onnx"}, "not absolute"),
    ({"export_format": "onnx", "output_path": "C:\\\\x.onnx"}, "not absolute"),
])
def test_paths_escaping_the_output_folder_are_rejected(recipe, words):
    with pytest.raises(RecipeError) as caught:
        parse_recipe(json.dumps(recipe))
    assert words in caught.value.message


@pytest.fixture(scope="module")
def linked_run(tmp_path_factory) -> dict:
    """A run of a tiny BERT's dynamo target into an output folder whose target folder is a link to a folder outside."""
    root = tmp_path_factory.mktemp("linked")
    folder = tiny_bert(root / "model", {"export_format": "dynamo", "mode": "model", "name": "target"})
    outside = root / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("untouched")
    out = root / "out"
    out.mkdir()
    (out / "target").symlink_to(outside, target_is_directory=True)
    result = run_cli("run", "--no-bench", str(folder), "--out", str(out), "--quiet")
    return {"folder": folder, "outside": outside, "out": out, "result": result}


def test_a_link_in_the_output_folder_is_replaced_not_followed(linked_run):
    result, out, outside = linked_run["result"], linked_run["out"], linked_run["outside"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (out / "target").is_symlink() and (out / "target" / "export.json").is_file()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


# ── 6. Bad webhooks ───────────────────────────────────────────────────────────


def test_bad_webhooks_are_refused_nothing_queued_server_healthy(hub, tmp_path, start_bot):
    import socket
    from urllib.parse import urlparse

    from tests.test_bot import SECRET, bot_settings, payload, sha

    bot = start_bot(bot_settings(hub, tmp_path, backend="dry", max_body_bytes=4096), embedded_worker=False)
    event = payload(refs=[{"ref": "refs/heads/main", "oldSha": sha(1), "newSha": sha(2)}])
    body = json.dumps(event).encode()

    def healthy() -> None:
        assert bot.get("/healthz").status_code == 200
        assert bot.store.list() == []

    # oversized
    assert bot.post(event | {"pad": "x" * 10_000}).status_code == 413
    healthy()
    # wrong content type
    assert bot.post(event, content_type="text/plain").status_code == 415
    healthy()
    # truncated: Content-Length promises more than arrives, then the sender goes away
    address = urlparse(bot.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as raw:
        raw.sendall(b"POST /webhooks/hub HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"X-Webhook-Secret: {SECRET}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body[: len(body) // 2])
        raw.shutdown(socket.SHUT_WR)
        raw.recv(4096)  # whatever the server answers (or nothing), it must not queue half an event
    healthy()
    # a truncated but complete-looking body (cut JSON) is junk
    assert bot.post(content=body[: len(body) // 2]).status_code == 400
    healthy()
    # the same delivery replayed with a different secret
    assert bot.post(event, secret="whsec_replayed_with_another_secret").status_code == 403
    healthy()
    # and the genuine delivery still goes through afterwards
    assert bot.post(event).status_code == 202
    assert len(bot.store.list()) == 1

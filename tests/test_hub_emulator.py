"""Contract tests for the Hub emulator, driven through the real ``huggingface_hub`` client over HTTP."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    BadRequestError,
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import get_session

from tests.servers.hub import HubEmulator
from tests.servers.hub_fixtures import BOT_TOKEN, BOT_USER, TEST_TOKEN, TEST_USER, hf_env, hub, hub_server  # noqa: F401

REPO = f"{TEST_USER}/tiny-model"
CONFIG = b'{"hidden_size": 8}\n'
WEIGHTS = bytes(range(256)) * 8  # 2 KiB of binary: preupload answers "lfs"


def _api(hub: HubEmulator, token: str | bool = TEST_TOKEN) -> HfApi:
    return HfApi(endpoint=hub.url, token=token)


def _download(hub: HubEmulator, filename: str, revision: str | None = None, repo_id: str = REPO,
              token: str | bool = TEST_TOKEN) -> bytes:
    return Path(hf_hub_download(repo_id, filename, revision=revision, endpoint=hub.url, token=token)).read_bytes()


def _upload_model(hub: HubEmulator, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "weights").mkdir(parents=True)
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "weights" / "model.bin").write_bytes(WEIGHTS)
    api = _api(hub)
    api.create_repo(REPO)
    api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="Add model")


def _open_bot_pr(hub: HubEmulator, path: str = "model.onnx", content: bytes = b"\x00onnx") -> int:
    info = _api(hub, BOT_TOKEN).create_commit(
        REPO, [CommitOperationAdd(path, content)], commit_message="Export to ONNX",
        commit_description="Automated export", create_pr=True)
    assert info.pr_num is not None
    return info.pr_num


def test_whoami_and_create_repo(hf_env: HubEmulator) -> None:
    api = _api(hf_env)
    assert api.whoami()["name"] == TEST_USER
    assert _api(hf_env, BOT_TOKEN).whoami()["name"] == BOT_USER

    url = api.create_repo(REPO)
    assert url.repo_id == REPO and url.startswith(hf_env.url)
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as conflict:
        api.create_repo(REPO)
    assert conflict.value.response.status_code == 409
    with pytest.raises(HfHubHTTPError) as forbidden:
        _api(hf_env, BOT_TOKEN).create_repo(f"{TEST_USER}/not-yours")
    assert forbidden.value.response.status_code == 403
    # A new repo holds the Hub's initial commit with a .gitattributes
    assert api.list_repo_files(REPO) == [".gitattributes"]
    assert api.model_info(REPO).sha == hf_env.head(REPO)


def test_private_repo_is_hidden(hf_env: HubEmulator) -> None:
    _api(hf_env).create_repo(f"{TEST_USER}/secret", private=True)
    assert _api(hf_env).model_info(f"{TEST_USER}/secret").private is True
    for token in (False, BOT_TOKEN):
        with pytest.raises(RepositoryNotFoundError):
            _api(hf_env, token).model_info(f"{TEST_USER}/secret")
    with pytest.raises(RepositoryNotFoundError):
        _download(hf_env, ".gitattributes", repo_id=f"{TEST_USER}/secret", token=BOT_TOKEN)


def test_upload_and_download_regular_and_lfs_files(hf_env: HubEmulator, tmp_path: Path) -> None:
    _upload_model(hf_env, tmp_path)
    assert not hf_env.is_lfs(REPO, "config.json")
    assert hf_env.is_lfs(REPO, "weights/model.bin")

    assert _download(hf_env, "config.json") == CONFIG
    assert _download(hf_env, "weights/model.bin") == WEIGHTS
    snapshot = Path(snapshot_download(REPO, endpoint=hf_env.url, token=TEST_TOKEN))
    assert (snapshot / "config.json").read_bytes() == CONFIG
    assert (snapshot / "weights" / "model.bin").read_bytes() == WEIGHTS
    assert snapshot.name == hf_env.head(REPO)

    api = _api(hf_env)
    assert api.list_repo_files(REPO) == [".gitattributes", "config.json", "weights/model.bin"]
    top = {entry.path: entry for entry in api.list_repo_tree(REPO)}
    assert set(top) == {".gitattributes", "config.json", "weights"}
    assert isinstance(top["weights"], RepoFolder)
    inside = list(api.list_repo_tree(REPO, path_in_repo="weights"))
    assert [(type(e), e.path) for e in inside] == [(RepoFile, "weights/model.bin")]
    lfs_entry = inside[0]
    assert isinstance(lfs_entry, RepoFile) and lfs_entry.lfs is not None
    assert lfs_entry.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest() and lfs_entry.size == len(WEIGHTS)

    siblings = {s.rfilename: s for s in api.model_info(REPO, files_metadata=True).siblings or []}
    assert siblings["config.json"].size == len(CONFIG) and siblings["config.json"].lfs is None
    assert siblings["weights/model.bin"].lfs is not None
    assert siblings["weights/model.bin"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert [c.title for c in api.list_repo_commits(REPO)] == ["Add model", "initial commit"]

    # Re-uploading identical content is a no-op for the client (preupload returns the remote oids)
    before = hf_env.head(REPO)
    api.upload_file(path_or_fileobj=WEIGHTS, path_in_repo="weights/model.bin", repo_id=REPO)
    assert hf_env.head(REPO) == before


def test_tree_listing_follows_link_pagination(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {f"shard-{i}.txt": b"%d" % i for i in range(5)})
    hf_env.tree_page_size = 2
    api = _api(hf_env)
    pages = list(api._iter_repo_tree_pages(REPO, recursive=True))
    assert [len(page) for page, _ in pages] == [2, 2, 2]
    assert sorted(api.list_repo_files(REPO)) == [".gitattributes"] + [f"shard-{i}.txt" for i in range(5)]


def test_pull_request_commits_and_downloads(hf_env: HubEmulator) -> None:
    main_head = hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    bot = _api(hf_env, BOT_TOKEN)

    pr_num = _open_bot_pr(hf_env)
    assert pr_num == 1
    second = bot.create_commit(REPO, [CommitOperationAdd("README.md", b"# Exported\n")],
                               commit_message="Add card", revision="refs/pr/1")
    assert hf_env.head(REPO, "refs/pr/1") == second.oid

    assert _download(hf_env, "model.onnx", revision="refs/pr/1") == b"\x00onnx"
    assert _download(hf_env, "README.md", revision="refs/pr/1") == b"# Exported\n"
    assert _download(hf_env, "config.json", revision="refs/pr/1") == CONFIG
    assert hf_env.head(REPO) == main_head  # main is untouched
    with pytest.raises(EntryNotFoundError):
        _download(hf_env, "model.onnx")
    with pytest.raises(HfHubHTTPError) as forbidden:  # the bot cannot push to alice's main
        bot.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO)
    assert forbidden.value.response.status_code == 403

    details = bot.get_discussion_details(REPO, pr_num)
    assert details.is_pull_request and details.status == "open" and details.author == BOT_USER
    assert details.target_branch == "refs/heads/main" and details.conflicting_files == []
    assert [e.oid for e in details.events if e.type == "commit"] == [c["id"] for c in
                                                                      hf_env.commits(REPO, "refs/pr/1")[:2]][::-1]
    assert "+++ b/README.md" in (details.diff or "") and "b/model.onnx" in (details.diff or "")
    refs = bot.list_repo_refs(REPO, include_pull_requests=True)
    assert [(r.ref, r.target_commit) for r in refs.pull_requests] == [("refs/pr/1", second.oid)]

    _api(hf_env).merge_pull_request(REPO, pr_num)
    assert hf_env.file(REPO, "model.onnx") == b"\x00onnx"
    assert bot.get_discussion_details(REPO, pr_num).status == "merged"


def test_discussions_filter_comment_edit_and_close(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    alice, bot = _api(hf_env), _api(hf_env, BOT_TOKEN)
    pr_num = _open_bot_pr(hf_env)
    question = alice.create_discussion(REPO, "Which opset?", description="Please use opset 18")
    assert (pr_num, question.num) == (1, 2) and not question.is_pull_request

    def nums(**filters: str) -> list[int]:
        return [d.num for d in alice.get_repo_discussions(REPO, **filters)]  # type: ignore[arg-type]

    assert nums() == [2, 1]
    assert nums(author=BOT_USER) == [1]
    assert nums(author=TEST_USER) == [2]
    assert nums(discussion_type="pull_request") == [1]

    comment = bot.comment_discussion(REPO, pr_num, "Export finished: 3 artifacts")
    assert comment.author == BOT_USER and not comment.edited
    edited = bot.edit_discussion_comment(REPO, pr_num, comment.id, "Export finished: 4 artifacts")
    assert edited.id == comment.id and edited.edited and edited.content == "Export finished: 4 artifacts"
    with pytest.raises(HfHubHTTPError) as forbidden:
        alice.edit_discussion_comment(REPO, pr_num, comment.id, "hijacked")
    assert forbidden.value.response.status_code == 403
    events = alice.get_discussion_details(REPO, pr_num).events
    assert [e.content for e in events if e.type == "comment"] == ["Automated export", "Export finished: 4 artifacts"]

    alice.change_discussion_status(REPO, pr_num, "closed", comment="Superseded")
    assert alice.get_discussion_details(REPO, pr_num).status == "closed"
    assert nums(discussion_status="open") == [2]
    with pytest.raises(HfHubHTTPError):  # no pushes to a closed PR
        bot.create_commit(REPO, [CommitOperationAdd("late.txt", b"late")], commit_message="late",
                          revision="refs/pr/1")


def test_stale_parent_commit_is_refused(hf_env: HubEmulator) -> None:
    first = hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    api = _api(hf_env)
    api.upload_file(path_or_fileobj=b"v2", path_in_repo="v.txt", repo_id=REPO, parent_commit=first)
    with pytest.raises(HfHubHTTPError) as stale:
        api.upload_file(path_or_fileobj=b"v3", path_in_repo="v.txt", repo_id=REPO, parent_commit=first)
    assert stale.value.response.status_code == 412
    assert hf_env.file(REPO, "v.txt") == b"v2"
    api.create_commit(REPO, [CommitOperationDelete("v.txt")], commit_message="rm", parent_commit=hf_env.head(REPO))
    assert "v.txt" not in hf_env.files(REPO)


def test_lfs_objects_must_be_uploaded_with_the_right_size(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    api = _api(hf_env)
    never_uploaded = CommitOperationAdd("ghost.bin", WEIGHTS)
    never_uploaded._upload_mode, never_uploaded._is_uploaded = "lfs", True  # a client skipping the upload
    with pytest.raises(BadRequestError, match="never uploaded"):
        api.create_commit(REPO, [never_uploaded], commit_message="ghost")

    wrong_size = CommitOperationAdd("weights.bin", WEIGHTS)
    api.preupload_lfs_files(REPO, [wrong_size], free_memory=False)
    wrong_size.upload_info.size += 1
    with pytest.raises(BadRequestError, match="has size"):
        api.create_commit(REPO, [wrong_size], commit_message="wrong size")
    assert sorted(hf_env.files(REPO)) == [".gitattributes", "config.json"]


def test_missing_file_repo_and_revision(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    with pytest.raises(EntryNotFoundError):
        _download(hf_env, "missing.json")
    with pytest.raises(RevisionNotFoundError):
        _download(hf_env, "config.json", revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        _download(hf_env, "config.json", repo_id=f"{TEST_USER}/nope")
    with pytest.raises(RepositoryNotFoundError):
        _api(hf_env).model_info(f"{TEST_USER}/nope")
    assert not _api(hf_env).file_exists(REPO, "missing.json")


def test_bad_or_missing_token_is_refused_on_write(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    for token in ("hf_not_a_token", False):
        with pytest.raises(HfHubHTTPError) as refused:
            _api(hf_env, token).upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO)
        assert refused.value.response.status_code == 401
    assert "x.txt" not in hf_env.files(REPO)


def test_module_level_functions_use_the_hf_env(hf_env: HubEmulator) -> None:
    import huggingface_hub

    assert huggingface_hub.whoami()["name"] == TEST_USER  # token from HF_TOKEN, endpoint patched
    huggingface_hub.create_repo(REPO)
    huggingface_hub.upload_file(path_or_fileobj=CONFIG, path_in_repo="config.json", repo_id=REPO)
    assert Path(hf_hub_download(REPO, "config.json")).read_bytes() == CONFIG
    assert str(Path(os.environ["HF_HOME"])) in hf_hub_download(REPO, "config.json")


def test_xet_token_routes_are_refused(hf_env: HubEmulator) -> None:
    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    response = get_session().get(f"{hf_env.url}/api/models/{REPO}/xet-read-token/main")
    assert response.status_code == 400 and "HF_HUB_DISABLE_XET" in response.json()["error"]


def test_state_changes_are_logged_as_webhook_payloads(hf_env: HubEmulator) -> None:
    from huggingface_hub import WebhookPayload

    hf_env.create_model_repo(REPO, {"config.json": CONFIG})
    pr_num = _open_bot_pr(hf_env)
    _api(hf_env).comment_discussion(REPO, pr_num, "Thanks!")
    payloads = [WebhookPayload.model_validate(event) for event in hf_env.events()]
    scopes = [(p.event.scope, p.event.action) for p in payloads]
    assert scopes == [("repo", "create"), ("repo.content", "update"), ("discussion", "create"),
                      ("repo.content", "update"), ("discussion.comment", "create")]
    pushed = payloads[3].updatedRefs or []
    assert [(r.ref, r.oldSha, r.newSha) for r in pushed] == [("refs/pr/1", None, hf_env.head(REPO, "refs/pr/1"))]
    assert payloads[4].comment is not None and payloads[4].comment.content == "Thanks!"


def test_command_line_server_answers_whoami() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    process = subprocess.Popen([sys.executable, "-m", "tests.servers.hub", "--port", str(port),
                                "--token", "hf_cli_token=carol"], cwd=root,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        api, deadline = HfApi(endpoint=f"http://127.0.0.1:{port}", token="hf_cli_token"), time.monotonic() + 15
        while True:
            try:
                assert api.whoami()["name"] == "carol"
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=10)

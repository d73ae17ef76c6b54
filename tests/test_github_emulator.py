"""Contract tests: the real PyGithub client against the local GitHub emulator, over HTTP."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from github import Auth, BadCredentialsException, Github, GithubException, UnknownObjectException

from tests.servers.github import GitHubEmulator
from tests.servers.github_fixtures import (  # noqa: F401
    GITHUB_BOT_LOGIN,
    GITHUB_BOT_TOKEN,
    GITHUB_USER_LOGIN,
    GITHUB_USER_TOKEN,
    PR_HEAD_SHA,
    PR_NUMBER,
    REPO,
    WORKFLOW_FILE,
    github_server,
    github_server_session,
)


def client(server: GitHubEmulator, token: str = GITHUB_BOT_TOKEN) -> Github:
    return Github(
        base_url=server.url,
        auth=Auth.Token(token),
        seconds_between_requests=0,
        seconds_between_writes=0,
        retry=None,
    )


def test_repo_and_pull(github_server: GitHubEmulator) -> None:
    repo = client(github_server).get_repo(REPO)
    assert repo.full_name == REPO
    assert repo.default_branch == "main"
    assert repo.url == f"{github_server.url}/repos/{REPO}"

    pull = repo.get_pull(PR_NUMBER)
    assert pull.number == PR_NUMBER
    assert pull.title == "Add export recipe"
    assert pull.state == "open"
    assert pull.head.sha == PR_HEAD_SHA
    assert pull.head.ref == "add-recipe"
    assert pull.base.ref == "main"
    assert pull.user.login == "octocat"
    assert pull.issue_url == f"{github_server.url}/repos/{REPO}/issues/{PR_NUMBER}"
    assert pull.as_issue().pull_request is not None


def test_absolute_urls_follow_the_host_header(github_server: GitHubEmulator) -> None:
    localhost_url = github_server.url.replace("127.0.0.1", "localhost")
    gh = Github(base_url=localhost_url, auth=Auth.Token(GITHUB_BOT_TOKEN), retry=None,
                seconds_between_requests=0, seconds_between_writes=0)
    pull = gh.get_repo(REPO).get_pull(PR_NUMBER)
    assert pull.url.startswith(localhost_url)
    assert pull.create_issue_comment("hi").url.startswith(localhost_url)


def test_authenticated_user(github_server: GitHubEmulator) -> None:
    bot = client(github_server).get_user()
    assert bot.login == GITHUB_BOT_LOGIN
    assert bot.type == "Bot"
    person = client(github_server, GITHUB_USER_TOKEN).get_user()
    assert person.login == GITHUB_USER_LOGIN
    assert person.type == "User"


def test_bot_user_endpoint_can_be_forbidden(github_server: GitHubEmulator) -> None:
    github_server.bot_user_forbidden = True
    with pytest.raises(GithubException) as excinfo:
        _ = client(github_server).get_user().login
    assert excinfo.value.status == 403
    assert client(github_server, GITHUB_USER_TOKEN).get_user().login == GITHUB_USER_LOGIN


def test_comment_create_edit_delete(github_server: GitHubEmulator) -> None:
    pull = client(github_server).get_repo(REPO).get_pull(PR_NUMBER)
    comment = pull.create_issue_comment("Export started")
    assert comment.body == "Export started"
    assert comment.user.login == GITHUB_BOT_LOGIN
    assert comment.user.type == "Bot"
    assert comment.issue_url == pull.issue_url
    assert f"#issuecomment-{comment.id}" in comment.html_url
    assert isinstance(comment.created_at, datetime)

    comment.edit("Export finished")
    assert comment.body == "Export finished"
    [recorded] = github_server.comments(REPO, PR_NUMBER)
    assert (recorded.id, recorded.body, recorded.login) == (comment.id, "Export finished", GITHUB_BOT_LOGIN)
    assert pull.get_issue_comment(comment.id).body == "Export finished"

    comment.delete()
    assert github_server.comments(REPO, PR_NUMBER) == []
    with pytest.raises(UnknownObjectException):
        pull.get_issue_comment(comment.id)


def test_comment_pagination(github_server: GitHubEmulator) -> None:
    for i in range(45):
        github_server.add_comment(REPO, PR_NUMBER, f"seed {i}", "someone")
    pull = client(github_server).get_repo(REPO).get_pull(PR_NUMBER)
    pull.create_issue_comment("newest")

    comments = pull.get_issue_comments()
    bodies = [c.body for c in comments]
    assert bodies == [f"seed {i}" for i in range(45)] + ["newest"]
    assert comments.totalCount == 46

    pages = [r for r in github_server.requests if r.path.endswith(f"/issues/{PR_NUMBER}/comments")
             and r.method == "GET"]
    assert any(r.params.get("page") == "2" for r in pages)
    assert all(r.login == GITHUB_BOT_LOGIN for r in pages)

    gh100 = Github(base_url=github_server.url, auth=Auth.Token(GITHUB_BOT_TOKEN), per_page=100, retry=None,
                   seconds_between_requests=0, seconds_between_writes=0)
    assert len(list(gh100.get_repo(REPO).get_pull(PR_NUMBER).get_issue_comments())) == 46


def test_check_run_create_and_update(github_server: GitHubEmulator) -> None:
    repo = client(github_server).get_repo(REPO)
    run = repo.create_check_run(
        name="export", head_sha=PR_HEAD_SHA, status="in_progress", external_id="job-1",
        output={"title": "Exporting", "summary": "torch.export running"},
    )
    assert (run.name, run.status, run.head_sha) == ("export", "in_progress", PR_HEAD_SHA)
    assert run.conclusion is None
    assert [p.number for p in run.pull_requests] == [PR_NUMBER]

    completed = datetime(2030, 1, 1, tzinfo=timezone.utc)
    run.edit(conclusion="success", completed_at=completed,
             output={"title": "Exported", "summary": "3 artifacts validated"})
    assert (run.status, run.conclusion, run.completed_at) == ("completed", "success", completed)
    assert run.output.title == "Exported"
    assert repo.get_check_run(run.id).conclusion == "success"

    [recorded] = github_server.check_runs(REPO)
    assert recorded.login == GITHUB_BOT_LOGIN
    assert recorded.status == "completed" and recorded.conclusion == "success"
    assert recorded.updates == [{"completed_at": "2030-01-01T00:00:00Z", "conclusion": "success",
                                 "output": {"title": "Exported", "summary": "3 artifacts validated"}}]


def test_check_run_rules(github_server: GitHubEmulator) -> None:
    repo = client(github_server).get_repo(REPO)
    with pytest.raises(GithubException) as unknown_sha:
        repo.create_check_run(name="export", head_sha="f" * 40)
    assert unknown_sha.value.status == 422
    with pytest.raises(GithubException) as no_conclusion:
        repo.create_check_run(name="export", head_sha=PR_HEAD_SHA, status="completed")
    assert no_conclusion.value.status == 422
    with pytest.raises(GithubException) as not_an_app:
        client(github_server, GITHUB_USER_TOKEN).get_repo(REPO).create_check_run(name="x", head_sha=PR_HEAD_SHA)
    assert not_an_app.value.status == 403
    assert github_server.check_runs(REPO) == []


def test_workflow_dispatch(github_server: GitHubEmulator) -> None:
    workflow = client(github_server).get_repo(REPO).get_workflow(WORKFLOW_FILE)
    assert workflow.name == "Export"
    assert workflow.path == f".github/workflows/{WORKFLOW_FILE}"
    assert workflow.create_dispatch("main", {"model_id": "acme/tiny", "pr": "1"}) is True

    [dispatch] = github_server.dispatches(REPO)
    assert dispatch.kind == "workflow"
    assert (dispatch.workflow, dispatch.ref, dispatch.login) == (WORKFLOW_FILE, "main", GITHUB_BOT_LOGIN)
    assert dispatch.inputs == {"model_id": "acme/tiny", "pr": "1"}

    assert workflow.create_dispatch("no-such-branch") is False
    with pytest.raises(GithubException) as excinfo:
        workflow.create_dispatch("no-such-branch", throw=True)
    assert excinfo.value.status == 422
    assert len(github_server.dispatches(REPO)) == 1


def test_workflow_declared_inputs(github_server: GitHubEmulator) -> None:
    github_server.add_workflow(REPO, "strict.yml", inputs=["model_id"], required_inputs=["model_id"])
    workflow = client(github_server).get_repo(REPO).get_workflow("strict.yml")
    assert workflow.create_dispatch("main", {"model_id": "a/b", "extra": "x"}) is False
    assert workflow.create_dispatch("main", {}) is False
    assert workflow.create_dispatch("refs/heads/main", {"model_id": "a/b"}) is True
    assert [d.inputs for d in github_server.dispatches(REPO)] == [{"model_id": "a/b"}]


def test_repository_dispatch(github_server: GitHubEmulator) -> None:
    repo = client(github_server, GITHUB_USER_TOKEN).get_repo(REPO)
    assert repo.create_repository_dispatch("export", {"model_id": "acme/tiny", "revision": "main"}) is True
    [dispatch] = github_server.dispatches(REPO)
    assert (dispatch.kind, dispatch.event_type, dispatch.login) == ("repository", "export", GITHUB_USER_LOGIN)
    assert dispatch.client_payload == {"model_id": "acme/tiny", "revision": "main"}
    too_big = {f"k{i}": i for i in range(11)}
    assert repo.create_repository_dispatch("export", too_big) is False


def test_errors(github_server: GitHubEmulator) -> None:
    with pytest.raises(BadCredentialsException):
        client(github_server, "ghp_wrong").get_repo(REPO)
    with pytest.raises(BadCredentialsException):
        _ = client(github_server, "ghp_wrong").get_user().login
    repo = client(github_server).get_repo(REPO)
    with pytest.raises(UnknownObjectException):
        repo.get_pull(999)
    with pytest.raises(UnknownObjectException):
        client(github_server).get_repo("acme/missing")
    with pytest.raises(UnknownObjectException):
        repo.get_workflow("missing.yml")

    records = github_server.requests
    assert any(r.login is None and r.status == 401 for r in records)
    assert all("ghp_wrong" not in repr(r) and GITHUB_BOT_TOKEN not in repr(r) for r in records)


def test_anonymous_reads_only(github_server: GitHubEmulator) -> None:
    anonymous = Github(base_url=github_server.url, retry=None, seconds_between_requests=0,
                       seconds_between_writes=0)
    pull = anonymous.get_repo(REPO).get_pull(PR_NUMBER)
    assert pull.head.sha == PR_HEAD_SHA
    with pytest.raises(GithubException) as excinfo:
        pull.create_issue_comment("drive-by")
    assert excinfo.value.status == 401


def test_write_bodies_are_validated(github_server: GitHubEmulator) -> None:
    gh = client(github_server)
    issue_comments = f"{github_server.url}/repos/{REPO}/issues/{PR_NUMBER}/comments"
    with pytest.raises(GithubException) as missing_body:
        gh.requester.requestJsonAndCheck("POST", issue_comments, input={})
    assert missing_body.value.status == 422
    assert '"body"' in missing_body.value.data["message"]
    with pytest.raises(GithubException) as wrong_type:
        gh.requester.requestJsonAndCheck("POST", issue_comments, input={"body": 7})
    assert wrong_type.value.status == 422
    with pytest.raises(GithubException) as no_event_type:
        gh.requester.requestJsonAndCheck("POST", f"{github_server.url}/repos/{REPO}/dispatches",
                                         input={"client_payload": {}})
    assert no_event_type.value.status == 422
    with pytest.raises(GithubException) as no_ref:
        gh.requester.requestJsonAndCheck(
            "POST", f"{github_server.url}/repos/{REPO}/actions/workflows/{WORKFLOW_FILE}/dispatches", input={})
    assert no_ref.value.status == 422
    assert github_server.comments(REPO, PR_NUMBER) == [] and github_server.dispatches(REPO) == []


def test_concurrent_writes(github_server: GitHubEmulator) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def post(i: int) -> int:
        return client(github_server).get_repo(REPO).get_pull(PR_NUMBER).create_issue_comment(f"c{i}").id

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(post, range(40)))
    assert len(set(ids)) == 40
    assert sorted(c.id for c in github_server.comments(REPO, PR_NUMBER)) == sorted(ids)

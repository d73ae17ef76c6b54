"""A thin PyGithub client: who am I, and one sticky comment per pull request.

The sticky comment is found by a hidden HTML marker *and* the token's own login, so a comment quoting the marker
(or another bot's) is never taken over. `GET /user` answers 403 for the Actions `GITHUB_TOKEN` (an installation
token); the login is then `github-actions[bot]`, which is who that token comments as.

Example:
    >>> client = GitHubClient("ghs_xxx", api_url="https://api.github.com")  # doctest: +SKIP
    >>> client.upsert_comment("acme/widgets", 1, "<!-- export-action -->", "hello")  # doctest: +SKIP
    StickyComment(operation='created', url='https://github.com/acme/widgets/pull/1#issuecomment-1', id=1)
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters.report.markdown import close_fences

ACTIONS_BOT_LOGIN = "github-actions[bot]"
MAX_COMMENT_CHARS = 65536
TRUNCATED_NOTE = "\n\n_Comment truncated to GitHub's 65,536-character limit; see the job summary._\n"


@dataclass
class StickyComment:
    operation: str  # "created" | "updated" | "unchanged"
    url: str
    id: int


def fit_comment(body: str) -> str:
    """`body` cut to GitHub's comment limit; a code fence the cut leaves open is closed (nothing after it hides)."""
    if len(body) <= MAX_COMMENT_CHARS:
        return body
    room = MAX_COMMENT_CHARS - len(TRUNCATED_NOTE)
    closed = close_fences(body[:room])
    if len(closed) > room:
        closed = close_fences(body[:room - (len(closed) - room) - 1])
    return closed + TRUNCATED_NOTE


class GitHubClient:
    """PyGithub against `api_url` (GITHUB_API_URL), without throttling or retries (one short step)."""

    def __init__(self, token: str, *, api_url: str):
        from github import Auth, Github

        self.gh = Github(base_url=api_url.rstrip("/"), auth=Auth.Token(token), seconds_between_requests=0,
                         seconds_between_writes=0, retry=None)
        self._login: str | None = None

    def login(self) -> str:
        """The token's own login; `github-actions[bot]` when `/user` is refused (the Actions GITHUB_TOKEN)."""
        if self._login is None:
            from github import GithubException

            try:
                self._login = self.gh.get_user().login
            except GithubException as err:
                if err.status not in (401, 403, 404):
                    raise
                self._login = ACTIONS_BOT_LOGIN
        return self._login

    def upsert_comment(self, repository: str, number: int, marker: str, body: str) -> StickyComment:
        """Edit this token's comment carrying `marker` on issue/PR `number`, or create it."""
        body = fit_comment(body if marker in body else f"{marker}\n{body}")
        issue = self.gh.get_repo(repository).get_issue(number)
        me = self.login()
        for existing in issue.get_comments():
            if marker in (existing.body or "") and existing.user is not None and existing.user.login == me:
                if existing.body == body:
                    return StickyComment("unchanged", existing.html_url, existing.id)
                existing.edit(body)
                return StickyComment("updated", existing.html_url, existing.id)
        created = issue.create_comment(body)
        return StickyComment("created", created.html_url, created.id)

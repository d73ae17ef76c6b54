"""Who may ask the bot for an export: the repo's owner (a user namespace) or a member of the org that owns it.

A `@bot export` comment is a request to spend a runner's time and to push to the repo's PR; anyone can post one, so
the intake counts it only when its author is entitled. The answer comes from the Hub API (the org's members with
`GET /api/organizations/{org}/members`, else the user's id with `GET /api/users/{name}/overview`), compared by user
id (what a webhook payload carries), and is cached for `ttl` seconds per namespace, so a flood of comments costs at
most one Hub call per namespace per `ttl`. When the Hub cannot answer, nothing is cached and the delivery is
answered 503 (the Hub delivers it again later).

Example:
    >>> members = Members(token=None, endpoint="http://127.0.0.1:8000", ttl=300)  # doctest: +SKIP
    >>> members.entitled("acme/tiny", "65f1c0ffee0123456789abcd")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import threading
import time
from typing import Any


class MembershipError(Exception):
    """The Hub could not say who owns a namespace (network, 5xx): retry later."""


def _user_id(user: Any) -> str | None:
    value = getattr(user, "_id", None) or getattr(user, "id", None)
    return str(value) if value else None


class Members:
    """Entitlement checks against the Hub, cached per namespace (thread-safe)."""

    def __init__(self, *, token: str | None, endpoint: str | None, ttl: float) -> None:
        from huggingface_hub import HfApi

        self.api = HfApi(endpoint=endpoint, token=token)
        self.ttl = ttl
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def entitled(self, repo_id: str, user_id: str | None) -> bool:
        """Whether the Hub user `user_id` owns `repo_id`'s namespace or belongs to its org."""
        if not user_id:
            return False
        return user_id in self.ids(repo_id.split("/", 1)[0])

    def ids(self, namespace: str) -> frozenset[str]:
        """The user ids entitled in `namespace` (its members for an org, the user for a user namespace)."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(namespace)
            if cached is not None and cached[0] > now:
                return cached[1]
        ids = self._read(namespace)
        with self._lock:
            self._cache[namespace] = (now + self.ttl, ids)
        return ids

    def _read(self, namespace: str) -> frozenset[str]:
        from huggingface_hub.errors import HfHubHTTPError

        try:
            try:
                members = list(self.api.list_organization_members(namespace))
                return frozenset(i for i in map(_user_id, members) if i)
            except HfHubHTTPError as err:
                if err.response is None or err.response.status_code != 404:
                    raise
            try:
                user = self.api.get_user_overview(namespace)
            except HfHubHTTPError as err:
                if err.response is not None and err.response.status_code == 404:
                    return frozenset()  # neither an org nor a user: nobody is entitled
                raise
            found = _user_id(user)
            return frozenset([found] if found else [])
        except (HfHubHTTPError, OSError) as err:
            status = getattr(getattr(err, "response", None), "status_code", None)
            raise MembershipError(f"the Hub could not say who belongs to {namespace!r} "
                                  f"({type(err).__name__}{f' {status}' if status else ''})") from None

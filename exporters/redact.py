"""Keep secrets out of everything written: reports, logs, PR and discussion text, job rows, API answers.

Every writer of text (the pipeline's error records, publishing, the Action, the bot) passes it through [`scrub`].

Example:
    >>> scrub("push failed for hf_abcdefghijklmnop with secret s3cr3t-value", ["s3cr3t-value"])
    'push failed for hf_*** with secret ***'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Token shapes worth hiding even when they are not the bot's own (Hub, GitHub, Authorization headers).
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{8,}"),
    re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{8,}"),
    re.compile(r"(?i)(authorization:\s*(?:bearer|token)\s+)\S+"),
]

# Names of environment variables that hold a secret, whatever else they say (`child_environment`, the bot's exports)
SECRET_NAME = re.compile(r"token|secret|key|passw|credential|auth", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (a token, secret, key, password, credential).

    Example:
        >>> [secret_name(n) for n in ("HF_TOKEN", "WEBHOOK_SECRET", "AWS_SECRET_ACCESS_KEY", "PATH", "OMP_NUM_THREADS")]
        [True, True, True, False, False]
    """
    return SECRET_NAME.search(name) is not None


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret value, and anything shaped like a token, replaced."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else m.group(0)[:3]) + "***", text)
    return text


def tail(text: str, *, lines: int = 40, chars: int = 4000) -> str:
    """The last `lines` lines of `text`, at most `chars` characters.

    Example:
        >>> tail("a\\nb\\nc", lines=2)
        'b\\nc'
    """
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])[-chars:]

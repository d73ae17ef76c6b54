"""Who can read the model: the `model-visibility` output.

The output folder holds the model's exported weights. A workflow that uploads it as an artifact shows those weights
to everyone who can read the workflow's runs (anyone at all, for a public GitHub repository), so the example
workflows upload it only when this says `public`, or when the operator opted in. Anything but a plain answer from the
Hub that the repo is public and not gated reads as not public.

Example:
    >>> VISIBILITIES
    ('public', 'gated', 'private', 'local', 'unknown')
"""

from __future__ import annotations

from .settings import Settings

VISIBILITIES = ("public", "gated", "private", "local", "unknown")


def model_visibility(settings: Settings) -> str:
    """`public`, `gated` (public, but readers must accept its terms), `private`, `local` (a folder in the workspace)
    or `unknown` (no Hub repo id, or the Hub did not answer)."""
    if settings.model_path is not None:
        return "local"
    if settings.hub_repo_id is None:
        return "unknown"
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=settings.hf_endpoint or None, token=settings.hf_token or None).model_info(
            settings.hub_repo_id, revision=settings.revision or None)
    except Exception:  # not found, no access, offline: never read as public
        return "unknown"
    if info.private is not False:
        return "private" if info.private else "unknown"
    return "gated" if info.gated else "public"

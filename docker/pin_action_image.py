"""Point action.yml at a published image: `runs.image: Dockerfile` → `runs.image: docker://IMAGE@sha256:DIGEST`.

The release workflow (.github/workflows/release.yml) runs this on the release commit only: on main, action.yml keeps
`image: Dockerfile` (every change is built and tested as it is), while a release tag runs the image built and pushed
for it, by digest (a tag could be moved; a digest cannot), so a job starts in seconds instead of building ~2 GB.

Usage: python docker/pin_action_image.py ghcr.io/OWNER/NAME@sha256:DIGEST [action.yml]
Exit codes: 0 rewritten, 2 not an image reference by digest, or action.yml does not say `image: Dockerfile`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REFERENCE = re.compile(r"[a-z0-9][a-z0-9._-]*(?::\d+)?(?:/[a-z0-9][a-z0-9._-]*)+@sha256:[0-9a-f]{64}")
IMAGE_LINE = re.compile(r"^(  image: )Dockerfile[ \t]*$", re.M)


def pin(text: str, reference: str) -> str:
    """action.yml's text with its `image: Dockerfile` line pointing at `reference` (an image by digest)."""
    if not REFERENCE.fullmatch(reference):
        raise ValueError(f"expected REGISTRY/OWNER/NAME@sha256:<64 hex digits> (lower case), got {reference!r}")
    pinned, count = IMAGE_LINE.subn(rf"\g<1>docker://{reference}", text)
    if count != 1:
        raise ValueError("action.yml has no `  image: Dockerfile` line under `runs:` to pin (already pinned?)")
    return pinned


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    path = Path(argv[1] if len(argv) == 2 else "action.yml")
    try:
        path.write_text(pin(path.read_text(), argv[0]))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{path}: runs.image is docker://{argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The version of export-action (the package's, recorded in every report) and of the stack it runs on.

Example:
    >>> installed_version("no-such-distribution") is None
    True
"""

import functools
import hashlib
from importlib import metadata
from pathlib import Path

__version__ = "0.1.0"

# Distributions that provide the same import under another name: the CUDA image carries onnxruntime-gpu.
DISTRIBUTIONS = {"onnxruntime": ("onnxruntime", "onnxruntime-gpu")}


def installed_version(package: str) -> str | None:
    """The installed version of `package` (or of the distribution that provides it), None when absent."""
    for name in DISTRIBUTIONS.get(package, (package,)):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of this package's own sources (its `.py` and `.json` files, by path and bytes): part of every target's
    cache key, so a rerun by a changed product (a moved `@v1` tag, a development checkout) never reuses what an
    earlier code exported, even under the same version number.

    Example:
        >>> len(code_fingerprint()), code_fingerprint() == code_fingerprint()
        (16, True)
    """
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]

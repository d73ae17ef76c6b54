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

# The heavy stack's versions the images pin (constraints.txt; onnxruntime-gpu's from constraints-cuda.txt; the
# pins and these are kept in step by tests/test_static_checks.py): the trace shortcuts in exporters/upstream key on
# these releases' internals.
TESTED = {"torch": ("2.13.0",), "transformers": ("5.24.0",), "onnx": ("1.23.2",), "onnxscript": ("0.7.2",),
          "onnxruntime": ("1.32.0", "1.31.1"), "executorch": ("1.5.1",)}

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


def untested_stack(versions: dict[str, str]) -> str | None:
    """A warning when the installed heavy stack is not the one the suite is run with ([`TESTED`]), else None: a
    user who installed without constraints.txt gets another torch, and exports may fail or differ.

    Example:
        >>> pinned = {name: tested[0] for name, tested in TESTED.items()}
        >>> untested_stack({**pinned, "torch": "2.11.0+cu130"})
        'the installed stack is not the tested one: torch 2.11.0+cu130 (tested 2.13.0); exports may fail or differ: install with `-c constraints.txt` (README, Two commands)'
        >>> untested_stack({**pinned, "torch": "2.13.0+cpu", "executorch": "not installed"}) is None
        True
    """
    differ = [f"{name} {versions[name]} (tested {' or '.join(tested)})" for name, tested in TESTED.items()
              if versions.get(name, "not installed") != "not installed" and versions[name].split("+")[0] not in tested]
    if not differ:
        return None
    return (f"the installed stack is not the tested one: {', '.join(differ)}; exports may fail or differ: install "
            "with `-c constraints.txt` (README, Two commands)")


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

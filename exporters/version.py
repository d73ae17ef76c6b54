"""The version of export-action (the package's, recorded in every report) and of the stack it runs on.

Example:
    >>> installed_version("no-such-distribution") is None
    True
"""

from importlib import metadata

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

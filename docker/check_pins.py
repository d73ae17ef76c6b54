"""Fail when an installed distribution is not pinned, exactly, in the constraints file.

`pip install -c constraints.txt` pins only what it is asked to pin: a package missing from the file (a new
dependency, a build tool such as setuptools that a requirement pulls in) is installed at whatever version is newest
that day, and the image drifts. The image's install runs this right after pip, so it fails instead.

Usage: python docker/check_pins.py CONSTRAINTS [--allow NAME]... [--path DIR]...

- CONSTRAINTS: a pip constraints file of `name==version` lines; `-c FILE` / `-r FILE` lines are followed (relative
  to the file that names them), so `constraints-cuda.txt` can add the CUDA image's pins to `constraints.txt`.
- `--allow NAME`: a distribution that need not be pinned (the project itself).
- `--path DIR`: look for distributions there instead of this interpreter's `sys.path`.

A local version label is ignored (`torch 2.13.0+cpu` matches `torch==2.13.0`, as pip's `==` does), and at most one
distribution of a family that installs the same modules may be present (`onnxruntime` or `onnxruntime-gpu`).
Exit codes: 0 every distribution pinned, 1 some are not (each one listed), 2 a bad constraints file.

Example:
    python docker/check_pins.py constraints.txt --allow export-action
    → 118 distributions installed, each pinned in constraints.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

# Distributions that install the same import package: one per environment.
EXCLUSIVE = (("onnxruntime", "onnxruntime-gpu"),)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(?:#.*)?$")
INCLUDE = re.compile(r"^(?:-c|-r|--constraint|--requirement)(?:\s+|=)(\S+)$")


class ConstraintsError(Exception):
    pass


def canonical(name: str) -> str:
    """PEP 503 normalized name: `PyYAML` → `pyyaml`, `typing_extensions` → `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local label (`2.13.0+cpu` → `2.13.0`)."""
    return version.split("+", 1)[0]


def read_pins(path: Path, seen: set[Path] | None = None) -> dict[str, tuple[str, str]]:
    """{canonical name: (version, where it is pinned)} from a constraints file and the files it includes."""
    seen = set() if seen is None else seen
    path = path.resolve()
    if path in seen:
        return {}
    seen.add(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ConstraintsError(f"cannot read {path}: {err.strerror}") from None
    pins: dict[str, tuple[str, str]] = {}

    def add(name: str, version: str, where: str) -> None:
        if name in pins and public(pins[name][0]) != public(version):
            raise ConstraintsError(f"{name} is pinned twice: =={pins[name][0]} ({pins[name][1]}) and =={version} "
                                   f"({where})")
        pins.setdefault(name, (version, where))

    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path.name}:{number}"
        include = INCLUDE.match(line)
        if include:
            for name, (version, origin) in read_pins(path.parent / include.group(1), seen).items():
                add(name, version, origin)
            continue
        pin = PIN.match(line)
        if not pin:
            raise ConstraintsError(f"{where}: expected `name==version`, got {line!r}")
        add(canonical(pin.group(1)), pin.group(2), where)
    return pins


def installed(paths: list[str] | None) -> dict[str, str]:
    """{canonical name: version} of the distributions found (the first of a name on the path wins, as for import)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(**({"path": paths} if paths else {})):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def problems(pins: dict[str, tuple[str, str]], dists: dict[str, str], allowed: set[str]) -> list[str]:
    found = []
    for name, version in sorted(dists.items()):
        if name in allowed:
            continue
        if name not in pins:
            found.append(f"{name} {version} is installed but not pinned")
        elif public(version) != public(pins[name][0]):
            found.append(f"{name} {version} is installed but {pins[name][1]} pins =={pins[name][0]}")
    for family in EXCLUSIVE:
        present = [name for name in family if name in dists]
        if len(present) > 1:
            found.append(f"{' and '.join(present)} are both installed: they install the same modules, keep one")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("constraints", type=Path)
    parser.add_argument("--allow", action="append", default=[], help="a distribution that need not be pinned")
    parser.add_argument("--path", action="append", default=None, help="look for distributions here")
    args = parser.parse_args(argv)
    try:
        pins = read_pins(args.constraints)
    except ConstraintsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    dists = installed(args.path)
    found = problems(pins, dists, {canonical(name) for name in args.allow})
    if found:
        print(f"{len(found)} of {len(dists)} installed distributions are not pinned as {args.constraints.name} says "
              f"(add them with `make lock`, or fix the install):", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{len(dists)} distributions installed, each pinned in {args.constraints.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

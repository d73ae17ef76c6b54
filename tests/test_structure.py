"""The library's shape: one adapter to upstream, one error hierarchy, small rooms, and examples that run."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("exporters", "action", "bot")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        module = importlib.import_module(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{package}.")]
    return sorted(set(names) - {"action.__main__"})


def _imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_only_the_adapter_imports_upstream_exporters():
    importers = sorted(
        str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if any(name == "transformers.exporters" or name.startswith("transformers.exporters.")
               for name in _imports_of(path))
    )
    assert importers and all(name.startswith("exporters/upstream/") for name in importers), importers


def test_every_error_is_in_one_exported_hierarchy():
    import exporters
    from exporters import errors

    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
               if issubclass(obj, Exception) and obj.__module__ == errors.__name__]
    assert len(classes) >= 8
    for cls in classes:
        assert issubclass(cls, errors.ExportActionError), cls
        assert cls.__name__ in errors.__all__ and cls.__name__ in exporters.__all__, cls
        assert getattr(exporters, cls.__name__) is cls
    # no public error class is defined outside errors.py (private ones are internal signals, e.g. to pydantic)
    for package in ("exporters",):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            defined = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and not n.name.startswith("_")
                       and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in n.bases)]
            assert path.name == "errors.py" or not defined, f"{path}: {defined}"


def test_rooms_stay_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    assert sizes["exporters/run/pipeline.py"] < 350
    big = {name: n for name, n in sizes.items() if n > 450}
    assert not big, big


def test_the_library_speaks_no_front_end_language():
    """Library messages name options (`trust_remote_code`), never one front end's flags."""
    flags = ("--trust-remote-code", "--token", "--repo-id", "--config ", "--target ", "pass --")
    offenders = []
    for path in (ROOT / "exporters").rglob("*.py"):
        if path.name in ("cli.py",):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("Error"):
                text = ast.unparse(node)
                offenders += [f"{path.name}: {flag}" for flag in flags if flag in text]
    assert not offenders, offenders


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_run(module):
    imported = importlib.import_module(module)
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0

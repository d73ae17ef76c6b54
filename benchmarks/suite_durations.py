"""Where the test suite's time goes: per test module, from the JUnit XML a run of `make test` writes
(`.cache/suite.xml`), the minutes of every module (its fixtures' exports included: a module runs whole on one
worker, `--dist loadfile`), longest first; and per fixture, the setup seconds tests/conftest.py records on each
test (`fixture_setup` properties) summed over the run, so a module's minutes show which shared export they wait on;
and per test, its body's seconds (its time less the fixture setup recorded on it): the tests whose own exports cost.

    python benchmarks/suite_durations.py                      # the table, from .cache/suite.xml
    python benchmarks/suite_durations.py --write-order        # also tests/module_durations.json (the schedule)

`tests/module_durations.json` orders the modules longest first in the next run (tests/conftest.py), so the two
workers end together.

Example:
    >>> import tempfile
    >>> xml = Path(tempfile.mkdtemp()) / "suite.xml"
    >>> _ = xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="x" time="90"/>'
    ...                    '<testcase classname="tests.test_a.TestB" name="y" time="30"/>'
    ...                    '<testcase classname="tests.test_b" name="z" time="6"/></testsuite></testsuites>')
    >>> module_seconds(xml)
    {'tests/test_a.py': 120.0, 'tests/test_b.py': 6.0}
    >>> _ = xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="x" time="90"><properties>'
    ...                    '<property name="fixture_setup" value="tests/test_a.py::exported=80.5"/>'
    ...                    '<property name="fixture_setup" value="tiny_llama_dir=2.0"/></properties></testcase>'
    ...                    '<testcase classname="tests.test_b" name="z" time="6"><properties>'
    ...                    '<property name="fixture_setup" value="tiny_llama_dir=1.5"/></properties></testcase>'
    ...                    '</testsuite></testsuites>')
    >>> fixture_seconds(xml)
    {'tests/test_a.py::exported': (80.5, 1), 'tiny_llama_dir': (3.5, 2)}
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_XML = ROOT / ".cache" / "suite.xml"
FIXTURE_SETUP = "fixture_setup"  # the property tests/conftest.py's pytest_fixture_setup writes: `name=seconds`
ORDER_FILE = ROOT / "tests" / "module_durations.json"


def _module(classname: str) -> str:
    """`tests.test_x.TestClass` -> `tests/test_x.py`."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def module_seconds(xml: Path) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown of its tests), longest first."""
    totals: dict[str, float] = {}
    for case in ElementTree.parse(xml).iter("testcase"):
        module = _module(case.get("classname", ""))
        totals[module] = totals.get(module, 0.0) + float(case.get("time") or 0.0)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def fixture_seconds(xml: Path) -> dict[str, tuple[float, int]]:
    """Setup seconds per fixture summed over the run, and how many times it was set up, longest first."""
    totals: dict[str, tuple[float, int]] = {}
    for prop in ElementTree.parse(xml).iter("property"):
        if prop.get("name") != FIXTURE_SETUP:
            continue
        name, _, seconds = (prop.get("value") or "").rpartition("=")
        try:
            spent = float(seconds)
        except ValueError:
            continue  # a property some other plugin wrote under the same name
        before, count = totals.get(name, (0.0, 0))
        totals[name] = (before + spent, count + 1)
    return dict(sorted(totals.items(), key=lambda item: -item[1][0]))


def body_seconds(xml: Path) -> dict[str, float]:
    """Seconds of each test's own body (its time less the fixture setup recorded on it), longest first.

    Example:
        >>> import tempfile
        >>> xml = Path(tempfile.mkdtemp()) / "suite.xml"
        >>> _ = xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="x" time="90">'
        ...                    '<properties><property name="fixture_setup" value="tests/test_a.py::run=80.5"/>'
        ...                    '</properties></testcase><testcase classname="tests.test_a.TestB" name="y" time="30"/>'
        ...                    '</testsuite></testsuites>')
        >>> body_seconds(xml)
        {'tests/test_a.py::TestB::y': 30.0, 'tests/test_a.py::x': 9.5}
    """
    totals: dict[str, float] = {}
    for case in ElementTree.parse(xml).iter("testcase"):
        classname = case.get("classname", "")
        module = _module(classname)
        classes = classname.split(".")[len(module.removesuffix(".py").split("/")):]
        setup = 0.0
        for prop in case.iter("property"):
            if prop.get("name") == FIXTURE_SETUP:
                try:
                    setup += float((prop.get("value") or "").rpartition("=")[2])
                except ValueError:
                    continue  # a property some other plugin wrote under the same name
        name = "::".join([module, *classes, case.get("name", "")])
        totals[name] = float(case.get("time") or 0.0) - setup
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def body_table(totals: dict[str, float], top: int = 20) -> str:
    """A Markdown table of the `top` tests with the longest bodies, and the sum of all of them."""
    lines = ["| test | seconds of its body |", "|---|---|"]
    for name, seconds in list(totals.items())[:top]:
        lines.append(f"| `{name}` | {seconds:.1f} |")
    lines.append(f"| all {len(totals)} tests | {sum(totals.values()):.1f} |")
    return "\n".join(lines)


def fixture_table(totals: dict[str, tuple[float, int]], top: int = 20) -> str:
    """A Markdown table of the `top` fixtures with the longest summed setup."""
    lines = ["| fixture | seconds of setup | set up |", "|---|---|---|"]
    for name, (seconds, count) in list(totals.items())[:top]:
        lines.append(f"| `{name}` | {seconds:.1f} | {count}x |")
    whole = sum(seconds for seconds, _ in totals.values())
    lines.append(f"| all {len(totals)} fixtures | {whole:.1f} | |")
    return "\n".join(lines)


def table(totals: dict[str, float], top: int = 20) -> str:
    """A Markdown table of the `top` longest modules, and the sum of all of them."""
    lines = ["| module | minutes | share |", "|---|---|---|"]
    whole = sum(totals.values()) or 1.0
    for module, seconds in list(totals.items())[:top]:
        lines.append(f"| `{module}` | {seconds / 60:.1f} | {seconds / whole:.0%} |")
    lines.append(f"| all {len(totals)} modules (worker-minutes) | {whole / 60:.1f} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", nargs="?", type=Path, default=DEFAULT_XML)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--write-order", action="store_true", help=f"write {ORDER_FILE.relative_to(ROOT)}")
    args = parser.parse_args()
    totals = module_seconds(args.xml)
    print(table(totals, args.top))
    fixtures = fixture_seconds(args.xml)
    if fixtures:  # an XML from before tests/conftest.py recorded fixtures has none
        print()
        print(fixture_table(fixtures, args.top))
    print()
    print(body_table(body_seconds(args.xml), args.top))
    if args.write_order:
        ORDER_FILE.write_text(json.dumps({m: round(s, 1) for m, s in totals.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()

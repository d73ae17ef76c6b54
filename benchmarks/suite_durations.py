"""Where the test suite's time goes: per test module, from the JUnit XML a run of `make test` writes
(`.cache/suite.xml`), the minutes of every module (its fixtures' exports included: a module runs whole on one
worker, `--dist loadfile`), longest first.

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
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_XML = ROOT / ".cache" / "suite.xml"
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
    if args.write_order:
        ORDER_FILE.write_text(json.dumps({m: round(s, 1) for m, s in totals.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()

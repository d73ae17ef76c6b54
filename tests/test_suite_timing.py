"""#48's measuring: a real pytest run through tests/conftest.py writes each fixture's setup seconds into its JUnit
XML, and benchmarks/suite_durations.py sums them per fixture beside the modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.suite_durations import body_seconds, fixture_seconds, module_seconds
from tests.cli_launcher import COLD_ENV

ROOT = Path(__file__).resolve().parents[1]
# The sample modules start no CLI and no runtime proof: without this, each nested run's worker would start and stop
# the proof launchers of tests/conftest.py's `_proofs_warm` (torch, transformers and the runtimes imported twice
# over, most of these tests' cost, #48); the hooks under test do not read it.
NESTED_ENV = {"PYTHONPATH": str(ROOT), COLD_ENV: "1"}

SAMPLE = '''
import time

import pytest


@pytest.fixture(scope="module")
def slow_export():
    time.sleep(1.0)
    return "exported"


@pytest.fixture
def quick(slow_export):
    time.sleep(0.1)
    return slow_export


def test_first(quick):
    assert quick == "exported"


def test_second(slow_export):
    assert slow_export == "exported"
'''


def test_a_real_run_records_each_fixtures_setup_and_the_script_sums_them(tmp_path):
    """Two workers as `make test` runs them: the properties survive xdist, the module-scoped fixture is counted
    once (on the test that paid for it), the function-scoped one without its dependency's time."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    xml = tmp_path / "suite.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "1",
         "--dist", "loadfile", f"--junitxml={xml}", "test_sample.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, **NESTED_ENV})
    assert done.returncode == 0, done.stdout + done.stderr
    fixtures = fixture_seconds(xml)
    slow, slow_count = fixtures["test_sample.py::slow_export"]
    quick, quick_count = fixtures["test_sample.py::quick"]
    assert (slow_count, quick_count) == (1, 1), fixtures
    # quick's own 0.1 s, without the 1.0 s of the fixture it depends on; margins wide enough for a loaded machine
    assert 1.0 <= slow < 10 and 0.1 <= quick < 1.0, fixtures
    assert list(module_seconds(xml)) == ["test_sample.py"]
    table = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_durations.py"), str(xml)],
                           capture_output=True, text=True, check=True).stdout
    assert f"| `test_sample.py::slow_export` | {slow:.1f} | 1x |" in table, table
    assert table.index("slow_export") < table.index("::quick"), table  # longest first
    # each test's own body, its fixtures' setup left out: here nearly nothing, the module fixture's second elsewhere
    bodies = body_seconds(xml)
    assert set(bodies) == {"test_sample.py::test_first", "test_sample.py::test_second"}, bodies
    assert all(0 <= seconds < 1.0 for seconds in bodies.values()), bodies
    assert "| test | seconds of its body |" in table and "| all 2 tests |" in table, table


ORDERED = '''
import json
import os


def test_{index}():
    with open(os.environ["ORDER_LOG"], "a") as log:
        log.write(__name__ + "\\n")
'''


def test_two_workers_take_the_modules_longest_first_whatever_their_number_of_tests(tmp_path):
    """`make test`'s `--dist loadfile` hands out modules in tests/module_durations.json's order (longest first), not
    in pytest-xdist's own (most tests first): a module recorded short with three tests runs after one recorded long
    with a single test."""
    recorded = json.loads((ROOT / "tests" / "module_durations.json").read_text())
    longest, shortest = (Path(name).stem for name in (max(recorded, key=recorded.get),
                                                      min(recorded, key=recorded.get)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the root: node ids are tests/<module>.py, as recorded
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / f"{longest}.py").write_text(ORDERED.format(index=0))
    (tmp_path / "tests" / f"{shortest}.py").write_text("".join(ORDERED.format(index=i) for i in range(3)))
    log = tmp_path / "order.log"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "1",
         "--dist", "loadfile", "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, **NESTED_ENV, "ORDER_LOG": str(log)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().split() == [longest] + 3 * [shortest], log.read_text()

"""#48's measuring: a real pytest run through tests/conftest.py writes each fixture's setup seconds into its JUnit
XML, and benchmarks/suite_durations.py sums them per fixture beside the modules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.suite_durations import fixture_seconds, module_seconds

ROOT = Path(__file__).resolve().parents[1]

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
        env={**os.environ, "PYTHONPATH": str(ROOT)})
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

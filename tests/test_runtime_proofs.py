"""The runtimes' proofs run beside validation's own checks (`ProofsInFlight`): collected when those hold, ended (no
further proof, the running child killed) when they do not. Real child processes, no runtime needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from exporters.layouts import RuntimeProof, run_in_child
from exporters.validate.runtimes import ProofsInFlight
from tests.conftest import teardown_marker

SLEEPER = """import json, os, sys, time
s = json.loads(sys.argv[1])
open(s["pid_file"], "w").write(str(os.getpid()))
time.sleep(s["seconds"])
open(s["result"], "w").write("1")
"""


@dataclass
class SleepingRuntime:
    """A runtime check whose proof is a child that sleeps, then answers; it records the child's pid."""

    runtime: str
    seconds: float
    scratch: Path
    started: list[float] = field(default_factory=list)

    @property
    def pid_file(self) -> Path:
        return self.scratch / f"{self.runtime}.pid"

    def applies(self, target, directory: Path) -> bool:
        return True

    def may_apply(self, target, components: list[str]) -> bool:
        return True

    def reference(self, model, context):
        return None

    def prove(self, directory: Path, reference, context) -> RuntimeProof:
        self.started.append(time.monotonic())
        answer, why = run_in_child(SLEEPER, {"seconds": self.seconds, "pid_file": str(self.pid_file)})
        return RuntimeProof(self.runtime, "passed" if answer == 1 else "failed", why)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_proofs_run_while_the_caller_works_and_are_collected(tmp_path):
    slow, quick = SleepingRuntime("a", 1.0, tmp_path), SleepingRuntime("b", 0.1, tmp_path)
    with ProofsInFlight([(slow, None), (quick, None)], tmp_path, None) as proofs:
        time.sleep(1.0)  # the caller's own checks
        caller_done = time.monotonic()
        got = proofs.result()
    assert [(p.runtime, p.status) for p in got] == [("a", "passed"), ("b", "passed")]
    assert slow.started[0] < caller_done, "the first proof started while the caller worked"


def test_a_cancelled_proof_kills_its_child_and_starts_no_other(tmp_path):
    slow, following = SleepingRuntime("slow", 60, tmp_path), SleepingRuntime("next", 0.1, tmp_path)
    begin = time.monotonic()
    with ProofsInFlight([(slow, None), (following, None)], tmp_path, None):
        deadline = time.monotonic() + 20
        while not slow.pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(slow.pid_file.read_text())
        assert _alive(pid)
    # leaving the block without `result()` (the caller's own checks failed) ends the proofs
    assert time.monotonic() - begin < 30, "the 60 s child was killed, not waited for"
    assert not _alive(pid), "the child is gone (killed and reaped)"
    assert not following.started, "no proof starts after the cancel"


# A child that marks its interpreter's teardown (a global's finalizer, run only when the interpreter frees its
# modules; it writes with what it holds, as builtins may be gone by then) and its exit handlers, then writes its
# answer, whole or into a file it never closes
MARKING = teardown_marker('json.loads(sys.argv[1])["marks"]') + """s = json.loads(sys.argv[1])
if s["closed"]:
    json.dump({"answer": 42}, open(s["result"], "w"))
else:
    unclosed = open(s["result"], "w")
    unclosed.write(json.dumps({"answer": 42}))
"""


def test_a_child_that_answered_whole_skips_the_interpreters_teardown_but_not_its_exit_handlers(tmp_path):
    marks = tmp_path / "marks"
    answer, why = run_in_child(MARKING, {"marks": str(marks), "closed": True})
    assert (answer, why) == ({"answer": 42}, "")
    assert marks.read_text().split() == ["atexit"]


def test_a_child_whose_answer_waits_in_an_unclosed_file_ends_as_the_interpreter_ends_it(tmp_path):
    marks = tmp_path / "marks"
    answer, why = run_in_child(MARKING, {"marks": str(marks), "closed": False})
    assert (answer, why) == ({"answer": 42}, "")  # the teardown flushed it
    assert marks.read_text().split() == ["atexit", "teardown"]


# A tests/optimum script's shape (its answer printed, unflushed: a pipe is block-buffered), ending through
# tests/optimum/ending.py, or raising before its end
SIDE_SCRIPT = teardown_marker("sys.argv[1]") + """from ending import end_without_teardown
print('{"answer": 42}')
if sys.argv[2] == "raises":
    raise ValueError("no answer")
end_without_teardown()
"""


def test_the_tests_side_venv_scripts_end_as_the_proof_children_do(tmp_path):
    """tests/optimum/*.py end through `end_without_teardown` once their answer is printed (#48): the answer comes
    back whole, the exit handlers run, the teardown is skipped; a script that raised ends with its traceback and
    exit code 1, torn down as the interpreter does. (The scripts import it from their own folder.)"""
    script = tmp_path / "script.py"
    script.write_text(SIDE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).with_name("optimum"))}
    env.pop("PYTHONUNBUFFERED", None)
    for ending, code, marked in (("answers", 0, ["atexit"]), ("raises", 1, ["atexit", "teardown"])):
        marks = tmp_path / f"marks-{ending}"
        done = subprocess.run([sys.executable, str(script), str(marks), ending], capture_output=True, text=True,
                              env=env, timeout=60)
        assert (done.returncode, done.stdout) == (code, '{"answer": 42}\n'), done.stderr
        assert marks.read_text().split() == marked
        assert ("ValueError: no answer" in done.stderr) == (ending == "raises"), done.stderr


def test_a_failing_child_still_reports_its_error(tmp_path):
    answer, why = run_in_child("import json, sys; s = json.loads(sys.argv[1]); raise ValueError('no runtime here')", {})
    assert answer is None and "ValueError: no runtime here" in why

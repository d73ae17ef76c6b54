"""CPU seconds of a command and every process it starts, read from a cpuacct cgroup made for it.

On a shared 2-core machine wall time measures the load more than the change; the CPU seconds of the whole process
tree do not (nearly). `rusage` misses processes that are not waited-for children (the benchmark's forkserver, a
proof's grandchildren); a cgroup holds every descendant. Needs root and the cgroup v1 `cpuacct` hierarchy (this
machine's); elsewhere it says so and exits 2.

Usage:
    python benchmarks/cpu_seconds.py -- python -m pytest -q -n 0 tests/test_publish.py
prints, after the command's own output: `cpu_seconds=93.2 wall_seconds=380.9 rc=0 load_before=12.1`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    if not (CPUACCT / "cpuacct.usage").is_file() or not os.access(CPUACCT, os.W_OK):
        print(f"no writable cpuacct cgroup at {CPUACCT}: run as root on a cgroup v1 machine", file=sys.stderr)
        return 2
    group = CPUACCT / f"cpu-seconds-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    try:
        # the child joins the group before it execs, so nothing it starts escapes the count
        process = subprocess.Popen(command, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        rc = process.wait()
        wall = time.monotonic() - started
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        for _ in range(50):  # descendants still exiting keep the group busy for a moment
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    print(f"cpu_seconds={cpu:.1f} wall_seconds={wall:.1f} rc={rc} load_before={load_before:.1f}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

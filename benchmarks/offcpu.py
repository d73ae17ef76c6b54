"""Where a command's wall time goes beyond its CPU: per process of its tree, time on a CPU, time runnable but waiting
for one (the run queue: the machine's load), and the rest (sleeping: a wait on a child, a lock, the disk).

Every 0.5 s it reads each thread's `/proc/PID/task/TID/schedstat` (nanoseconds on a CPU, nanoseconds waiting on a
run queue) and each process's `/proc/PID/io`; at the end it prints one line per process that lived long enough to be
seen, its main thread's split of its life, and the bytes it read from and wrote to storage (`read_bytes`: page-cache
misses only). Linux only; `schedstat` needs a kernel with scheduler statistics (every distribution kernel).

Usage:
    python benchmarks/offcpu.py [--json FILE] -- hf-export run MODEL --out OUT
prints, after the command's own output, e.g.
    pid 24500 466.2 s: main thread on CPU 41.7, run queue 376.6, sleeping 47.9 | all threads on CPU 44.5 | read 10781 MB, wrote 4199 MB | python -m exporters.cli run ...
(the ninth round's 1.1B ONNX run: its off-CPU time was the run queue, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
BOOT = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))


def _stat(pid: int) -> list[str]:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # fields from the state on


def sample(tree: set[int], seen: dict[int, dict]) -> None:
    """Add every process whose parent is in `tree` to it, and record each one's threads and io now."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            fields = _stat(pid)
            if pid not in tree and int(fields[1]) not in tree:
                continue
            tree.add(pid)
            threads = {}
            for tid in os.listdir(f"/proc/{pid}/task"):
                on_cpu, waiting, _ = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                threads[int(tid)] = (int(on_cpu) / 1e9, int(waiting) / 1e9)
            io = dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # it ended between two reads
        entry = seen.setdefault(pid, {"start": BOOT + int(fields[19]) / HZ, "threads": {}})
        entry["threads"].update(threads)  # a thread that ended keeps its last reading
        entry.update(last=time.time(), read_mb=int(io["read_bytes"]) >> 20, written_mb=int(io["write_bytes"]) >> 20,
                     command=command[:100])  # the latest: a launcher that execs shows what it became


def report(seen: dict[int, dict]) -> list[dict]:
    rows = []
    for pid, entry in sorted(seen.items(), key=lambda item: item[1]["start"]):
        life = entry["last"] - entry["start"]
        on_cpu, waiting = entry["threads"].get(pid, (0.0, 0.0))
        rows.append({"pid": pid, "life_s": round(life, 1), "main_on_cpu_s": round(on_cpu, 1),
                     "main_run_queue_s": round(waiting, 1), "main_sleeping_s": round(max(life - on_cpu - waiting, 0), 1),
                     "all_on_cpu_s": round(sum(t[0] for t in entry["threads"].values()), 1),
                     "read_mb": entry["read_mb"], "written_mb": entry["written_mb"], "command": entry["command"]})
    return rows


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    json_file = argv[argv.index("--json") + 1] if "--json" in argv[:argv.index("--")] else None
    process = subprocess.Popen(command)
    tree, seen = {process.pid}, {}
    while process.poll() is None:
        sample(tree, seen)
        time.sleep(0.5)
    rows = report(seen)
    for row in rows:
        print(f"pid {row['pid']} {row['life_s']} s: main thread on CPU {row['main_on_cpu_s']}, run queue "
              f"{row['main_run_queue_s']}, sleeping {row['main_sleeping_s']} | all threads on CPU {row['all_on_cpu_s']} "
              f"| read {row['read_mb']} MB, wrote {row['written_mb']} MB | {row['command']}", file=sys.stderr)
    if json_file:
        with open(json_file, "w") as handle:
            json.dump(rows, handle, indent=1)
    return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

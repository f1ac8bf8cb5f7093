"""Start-up at scale: 1, 2, 4 and 8 children of one node started at once, and what each costs.

`python -m bench.startup` (and a line of `make bench`): for each N, N math_verify children
(jobs=1: the child and its grading forkserver and worker) are started concurrently, as the
replicas of one term are, and as N ranks of a node start theirs. It reports the wall time until
all serve, and per child (its whole process tree) RSS, PSS (shared pages divided among the
processes sharing them: the interpreter and libraries of the one shared, read-only scorer env
count once) and open descriptors, plus the parent's descriptors per child. docs/scale.md
multiplies these out.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

from supervisor import ReplicatedBackend

ROOT = Path(__file__).resolve().parent.parent
COUNTS = (1, 2, 4, 8)


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def measure(count: int) -> dict[str, float]:
    parent_fds = psutil.Process().num_fds()
    began = time.perf_counter()
    backend = ReplicatedBackend(
        {
            "env": "math",
            "scorer": {"name": "math_verify", "params": {"jobs": 1}},
            "process": {"startup_timeout": 300},
            "replicas": {"count": count},
        }
    )
    try:
        wall = time.perf_counter() - began
        time.sleep(0.5)  # let the graders' workers settle before reading memory
        rss, pss, fds, processes, cpu = [], [], [], [], []
        for pid in backend.pids:
            assert pid is not None
            procs = tree(pid)
            infos = [p.memory_full_info() for p in procs]
            rss.append(sum(i.rss for i in infos))
            pss.append(sum(i.pss for i in infos))
            fds.append(sum(p.num_fds() for p in procs))
            processes.append(len(procs))
            cpu.append(sum(sum(p.cpu_times()[:2]) for p in procs))  # user + system of the boot, whole tree
        boots = [r.timings["spawn_to_ready_s"] for r in backend.replicas]
        return {
            "children": count,
            "wall_s": wall,
            "boot_s_median": statistics.median(boots),
            "boot_cpu_s": statistics.mean(cpu),
            "rss_mib": statistics.mean(rss) / 2**20,
            "pss_mib": statistics.mean(pss) / 2**20,
            "fds_per_child": statistics.mean(fds),
            "processes_per_child": statistics.mean(processes),
            "parent_fds_per_child": (psutil.Process().num_fds() - parent_fds) / count,
        }
    finally:
        backend.close()


def run(counts: tuple[int, ...] = COUNTS) -> list[dict[str, float]]:
    return [measure(count) for count in counts]


def render(rows: list[dict[str, float]]) -> str:
    one = rows[0]["wall_s"]
    lines = ["children started at once (math_verify, jobs=1; per child = its process tree)"]
    for row in rows:
        lines.append(
            f"  {row['children']:>2} children: all ready in {row['wall_s']:5.2f} s ({row['wall_s'] / one:4.2f}x one; "
            f"serial would be {row['children']:.0f}x)  RSS {row['rss_mib']:5.1f} MiB  PSS {row['pss_mib']:5.1f} MiB  "
            f"fds {row['fds_per_child']:.0f} (+{row['parent_fds_per_child']:.0f} in the parent)  "
            f"processes {row['processes_per_child']:.0f}  boot CPU {row['boot_cpu_s']:.2f} s"
        )
    return "\n".join(lines)


def main_line(counts: tuple[int, ...] = COUNTS) -> str:
    return render(run(counts))


def main() -> None:
    rows = run()
    print(render(rows))
    if "--json" in sys.argv:
        print(json.dumps({"cores": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()

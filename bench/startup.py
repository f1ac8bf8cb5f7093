"""Start-up at scale: 1, 2, 4 and 8 children of one node started at once, and what each costs.

`python -m bench.startup` (and a line of `make bench`): for each N, N math_verify children
(jobs=1: the child and its grading forkserver, template, worker and spare) are started concurrently,
as the replicas of one term are, and as N ranks of a node start theirs. It reports the wall time
until all say ready, until all have their grading workers up (a math child says ready before they
are), and until each has answered its first 64-item request; the boot CPU by phase; and per child
(its whole process tree) RSS, PSS (shared pages divided among the processes sharing them: the
interpreter and libraries of the one shared, read-only scorer env count once) and open descriptors,
plus the parent's descriptors per child. docs/scale.md multiplies these out.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from bench.workloads import math_items
from supervisor import ReplicatedBackend, RewardItem, RewardRequest

ROOT = Path(__file__).resolve().parent.parent
COUNTS = (1, 2, 4, 8)


# jobs=1: the child, its grading forkserver and resource tracker, the template, worker, spare
PROCESSES_PER_CHILD = 6
FIRST_BATCH = 64


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def descendants(pids: list[int]) -> dict[int, int]:
    """How many processes each pid's tree holds, from one scan of the process table."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc.pid)
    counts = {}
    for pid in pids:
        count, todo = 0, [pid]
        while todo:
            count += 1
            todo.extend(children.get(todo.pop(), []))
        counts[pid] = count
    return counts


def whole_trees(pids: list[int], deadline: float) -> list[list[psutil.Process]]:
    """Each child's tree once its grading workers are up (they start after the child says ready).
    Polled every 50 ms: a scan of 100-odd processes every 10 ms took 17 % of a core from the boots
    being measured (a scan per child every 5 ms, before, took more)."""
    counts = descendants(pids)
    while min(counts.values()) < PROCESSES_PER_CHILD and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = descendants(pids)
    short = {pid: count for pid, count in counts.items() if count < PROCESSES_PER_CHILD}
    if short:
        raise RuntimeError(
            f"children {short}: fewer processes than {PROCESSES_PER_CHILD} after 60 s"
        )
    return [tree(pid) for pid in pids]


def boot_cpu(procs: list[psutil.Process]) -> dict[str, float]:
    """User + system CPU of one child's boot, by phase: the child (its imports, its server), the
    forkserver (math_verify's import and the warm-up), the forks (template, worker, spare), the
    tracker."""
    child, forkserver = (
        procs[0],
        next(p for p in procs[1:] if "forkserver" in " ".join(p.cmdline())),
    )
    phases = {"child": 0.0, "forkserver": 0.0, "forks": 0.0, "tracker": 0.0}
    for proc in procs:
        phase = (
            "child" if proc.pid == child.pid
            else "forkserver" if proc.pid == forkserver.pid
            else "forks" if proc.ppid() != child.pid
            else "tracker"
        )  # fmt: skip
        phases[phase] += sum(proc.cpu_times()[:2])
    return phases


def first_batches(backend: ReplicatedBackend) -> None:
    """One 64-item request to each child at once (each child's first)."""
    request = RewardRequest(items=[RewardItem(**raw) for raw in math_items(FIRST_BATCH)])
    with ThreadPoolExecutor(len(backend.replicas)) as pool:
        for response in pool.map(
            lambda replica: replica.compute_rewards(request), backend.replicas
        ):
            assert len(response.rewards) == FIRST_BATCH


def measure(count: int) -> dict[str, float]:
    parent_fds, parent_cpu = psutil.Process().num_fds(), sum(psutil.Process().cpu_times()[:2])
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
        ready = time.perf_counter() - began
        trees = whole_trees([pid for pid in backend.pids if pid is not None], time.monotonic() + 60)
        up = time.perf_counter() - began
        # its share of the two cores meanwhile
        parent_cpu = sum(psutil.Process().cpu_times()[:2]) - parent_cpu
        cpu = [boot_cpu(procs) for procs in trees]  # before any grading
        first_batches(backend)
        first = time.perf_counter() - began
        time.sleep(0.5)  # let the graders' workers settle before reading memory
        infos = [[p.memory_full_info() for p in procs] for procs in trees]
        boots = [r.timings["spawn_to_ready_s"] for r in backend.replicas]
        return {
            "children": count,
            "wall_s": ready,
            "up_s": up,
            "first_batch_s": first,
            "boot_s_median": statistics.median(boots),
            "boot_cpu_s": statistics.mean(sum(phases.values()) for phases in cpu),
            "parent_cpu_s": parent_cpu,
            **{
                f"cpu_{phase}_s": statistics.mean(phases[phase] for phases in cpu)
                for phase in cpu[0]
            },
            "rss_mib": statistics.mean(sum(i.rss for i in tree_infos) for tree_infos in infos)
            / 2**20,
            "pss_mib": statistics.mean(sum(i.pss for i in tree_infos) for tree_infos in infos)
            / 2**20,
            "fds_per_child": statistics.mean(sum(p.num_fds() for p in procs) for procs in trees),
            "processes_per_child": statistics.mean(len(procs) for procs in trees),
            "parent_fds_per_child": (psutil.Process().num_fds() - parent_fds) / count,
        }
    finally:
        backend.close()


def run(counts: tuple[int, ...] = COUNTS) -> list[dict[str, float]]:
    return [measure(count) for count in counts]


def render(rows: list[dict[str, float]]) -> str:
    one = rows[0]["up_s"]
    lines = [
        "children started at once (math_verify, jobs=1; per child = its process tree; ready: "
        "said so; up: its grading workers too; first: its first 64 rewards back)"
    ]
    for row in rows:
        lines.append(
            f"  {row['children']:>2} children: all ready in {row['wall_s']:5.2f} s, up in "
            f"{row['up_s']:5.2f} s ({row['up_s'] / one:4.2f}x one; serial would be "
            f"{row['children']:.0f}x), first 64 rewards each in {row['first_batch_s']:5.2f} "
            f"s  boot CPU {row['boot_cpu_s']:.2f} s (child {row['cpu_child_s']:.2f}, "
            f"forkserver {row['cpu_forkserver_s']:.2f}, forks {row['cpu_forks_s']:.2f}, "
            f"tracker {row['cpu_tracker_s']:.2f}; the parent {row['parent_cpu_s']:.2f} in "
            f"all)  RSS {row['rss_mib']:5.1f} MiB  PSS {row['pss_mib']:5.1f} MiB  fds "
            f"{row['fds_per_child']:.0f} (+{row['parent_fds_per_child']:.0f} in the parent)  "
            f"processes {row['processes_per_child']:.0f}"
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

"""The escape battery (issue 42): each attempt is contained, and nothing is left behind.

Attempts that do not end their run share one sandbox (`ATTEMPTS`), each asserted on its own;
the others get a run each. docs/reliability.md ("Sandboxed code") records what was observed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from scorers.sandbox import Limits, RunResult, probe, run_sandboxed
from tests.conftest import REPO_ROOT, env_python, eventually, wait_until_gone
from tests.sandbox import programs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def python() -> str:
    path = str(env_python("code"))
    probe(path)
    return path


def marked(marker: str) -> list[int]:
    """Live processes with `marker` in their command line (the sandbox's, seen from the host)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if marker in (proc.info["cmdline"] or []) and proc.info["status"] != "zombie":
            found.append(proc.pid)
    return found


def run(
    python: str,
    source: str,
    marker: str = "",
    *,
    files: dict[str, bytes] | None = None,
    limits: Limits = Limits(),  # noqa: B008 (frozen)
) -> RunResult:
    """`source` run as main.py in a fresh sandbox, MARKER in it replaced by `marker`."""
    given = {"main.py": source.replace("MARKER", marker).encode(), **(files or {})}
    return run_sandboxed([python, "-I", "main.py"], python=python, files=given, limits=limits)


@pytest.fixture
def loopback_server() -> Iterator[int]:
    """A server on the host's loopback that answers anyone who connects."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"host secret")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_one_sandbox_holds_against_every_attempt_that_does_not_end_it(
    python, loopback_server, monkeypatch
):
    token = f"sandbox-token-{uuid.uuid4().hex}"
    planted = Path.home() / f".{token}"
    planted.write_text("trainer secret")
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", f"sk-{token}")
    config = {
        "port": loopback_server,
        "planted": str(planted),
        "home": str(Path.home()),
        "key": f"sk-{token}",
        "venv": str(Path(python).parent.parent),
        "token": token,
        "host_pid": os.getpid(),
    }
    # the server answers on the host: the same attempt outside a sandbox gets through
    with socket.create_connection(("127.0.0.1", loopback_server)) as s:
        assert s.recv(16) == b"host secret"
    limits = Limits(wall_s=60, tmpfs_bytes=8 << 20, file_bytes=2 << 20, open_files=256)
    try:
        result = run(
            python,
            programs.ATTEMPTS,
            files={"config.json": json.dumps(config).encode()},
            limits=limits,
        )
    finally:
        planted.unlink()
    assert result.status == "exited" and result.returncode == 0, result
    seen = json.loads(result.stdout)
    assert seen["loopback"] == ["error", "ECONNREFUSED"]
    assert seen["resolve"][0] == "error" and seen["outside"] == ["error", "ENETUNREACH"]
    assert seen["interfaces"] == ["ok", ["lo"]]
    assert seen["planted"] == ["error", "ENOENT"]
    # the home exists in the sandbox only where the interpreter lives under it (here /root/.pyenv)
    assert seen["home_listing"] in (["ok", [".pyenv"]], ["error", "ENOENT"])
    assert seen["env_has_key"] is False
    assert seen["env_names"] == ["HOME", "LANG", "PATH", "PYTHONHASHSEED", "TMPDIR"]
    assert seen["pid1_environ"] == ["error", "EACCES"]
    assert seen["processes"] == ["ok", [1, 2]]
    assert seen["uid"] == ["ok", [1000, 1000, 1000]]
    assert {seen[f"write_{where}"][1] for where in ("root", "usr", "venv", "dev")} <= {
        "EROFS",
        "EACCES",
    }
    assert seen["write_workdir"] == ["ok", 1] and seen["workdir"] == ["ok", ["/tmp", "/tmp"]]
    assert seen["fsize"] == ["error", "EFBIG"]
    assert seen["fill_workdir"] == ["error", "ENOSPC"] and seen["fill_shm"] == ["error", "ENOSPC"]
    assert seen["open_10000"] == ["error", "EMFILE"] and seen["files_opened"] < 256
    assert seen["ptrace_pid1"] == ["error", "EPERM"]
    assert seen["ptrace_host"][0] == "error"  # the test's pid: none, or one of the sandbox's
    assert seen["signal_pid1"] == ["ok", None]  # accepted, and ignored: the run went on
    assert seen["nested_userns"][0] == "error"
    assert not list(Path("/tmp").glob(f"*{token}*"))


def test_a_fork_bomb_meets_the_process_limit_and_dies_with_the_run(python):
    marker = f"bomb-{uuid.uuid4().hex}"
    source = programs.FORK_BOMB.replace("import os, sys, time", f"import os, sys, time  # {marker}")
    result = run(python, source, limits=Limits(processes=16, wall_s=30))
    assert result.status == "exited" and result.returncode == 0, result
    forked, error = (int(word) for word in result.stdout.split())
    assert forked < 16 and error == 11  # EAGAIN
    assert marked(marker) == []


def test_a_daemon_left_behind_is_gone_when_the_run_ends(python):
    marker = f"daemon-{uuid.uuid4().hex}"
    result = run(python, programs.DAEMON, marker)
    assert result.status == "exited" and result.stdout == b"left a daemon\n", result
    assert eventually(lambda: marked(marker) == [], timeout=5)


def test_sleeping_forever_ignoring_sigterm_is_a_timeout_killed_whole(python):
    marker = f"stubborn-{uuid.uuid4().hex}"
    result = run(python, programs.STUBBORN, marker, limits=Limits(wall_s=2))
    assert result.status == "timeout" and result.signal == signal.SIGKILL, result
    assert result.stdout == b"sleeping\n"
    assert marked(marker) == []


def test_a_memory_bomb_is_memory(python):
    result = run(python, programs.MEMORY_BOMB, limits=Limits(memory_bytes=256 << 20))
    assert result.status == "memory" and result.returncode == 1, result
    assert b"MemoryError" in result.stderr


def test_processes_over_the_memory_cap_only_together_are_killed_as_memory(python):
    result = run(python, programs.MEMORY_TOGETHER, limits=Limits(memory_bytes=256 << 20, wall_s=30))
    assert result.status == "memory" and result.signal == signal.SIGKILL, result
    # each child's 96 MiB is under the cap: they held at least two together (a cgroup stops them
    # at the cap, the launcher's watch just past it)
    assert result.peak_rss_bytes > 192 << 20


def test_spinning_past_the_cpu_limit_is_a_timeout(python):
    result = run(python, programs.SPIN, limits=Limits(cpu_s=1, wall_s=30))
    assert result.status == "timeout" and result.signal == signal.SIGXCPU, result
    assert result.cpu_s >= 0.5  # rusage samples coarser than the limit counts


def test_a_flood_of_output_is_cut_at_the_cap(python):
    result = run(python, programs.FLOOD, limits=Limits(output_bytes=1 << 20, wall_s=30))
    assert result.status == "output_limit" and result.stdout_truncated, result
    assert len(result.stdout) == 1 << 20 and set(result.stdout) == {ord("y")}


def test_killing_the_scorer_kills_its_sandbox(python, tmp_path):
    """The scorer side dies by SIGKILL mid-run (a trainer or child runtime killed -9)."""
    marker = f"orphan-{uuid.uuid4().hex}"
    script = tmp_path / "scorer.py"
    script.write_text(
        "import sys\nfrom scorers.sandbox import Limits, run_sandboxed\n"
        f"run_sandboxed([sys.argv[1], '-c', 'import time; time.sleep(1000)', '{marker}'],"
        " python=sys.argv[1], limits=Limits(wall_s=600))\n"
    )
    scorer = subprocess.Popen(
        [sys.executable, str(script), python], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    )
    try:
        assert eventually(lambda: marked(marker) != [], timeout=30)
        # the bwraps, the launcher and the program, seen from the host
        sandbox = {p.pid: p.create_time() for p in psutil.Process(scorer.pid).children(True)}
        assert len(sandbox) >= 3
        scorer.send_signal(signal.SIGKILL)
        scorer.wait(timeout=10)
        assert wait_until_gone(sandbox, timeout=10) == []
    finally:
        scorer.kill()
        scorer.wait()


def test_sandboxes_at_once_run_as_distinct_host_uids_and_one_bomb_starves_no_other(python):
    """Threads of one scorer (or ranks' children) run sandboxes at once: a root scorer gives each
    its own unnamed host uid, and a fork bomb holding its whole process limit in one sandbox
    leaves another its own."""
    marker = f"together-{uuid.uuid4().hex}"
    sleeper = "import time; time.sleep(1000)"
    holding_bomb = (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        time.sleep(1000)\n"
    )
    results: dict[str, RunResult] = {}

    def in_sandbox(name: str, source: str) -> None:
        limits = Limits(wall_s=30, processes=16)
        results[name] = run_sandboxed([python, "-c", source, marker], python=python, limits=limits)

    threads = [
        threading.Thread(target=in_sandbox, args=(name, source))
        for name, source in (("sleeper", sleeper), ("bomb", holding_bomb))
    ]
    for thread in threads:
        thread.start()
    try:
        # the sleeper, and the bomb near its limit (16 with the launcher, which counts too)
        assert eventually(lambda: len(marked(marker)) >= 14, timeout=30)
        uids = {psutil.Process(pid).uids().real for pid in marked(marker)}
        fair = run(python, "import os\nfor _ in range(8):\n    os.fork() or os._exit(0)\n")
    finally:
        for pid in marked(marker):  # end them: SIGKILL from the host
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join()
    if os.geteuid() == 0:
        assert len(uids) == 2 and all(uid >= 61000 for uid in uids)
    assert fair.status == "exited" and fair.returncode == 0, fair
    assert results["sleeper"].status == "signalled"
    assert marked(marker) == []

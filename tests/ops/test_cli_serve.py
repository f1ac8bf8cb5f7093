"""`managed-scorers serve`: a standalone scorer server for RemoteRewardBackend, token from a 0600 file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_until_gone
from tests.helpers.math_env import math_env_processes_since

SERVE = [sys.executable, "-m", "supervisor", "serve"]

CLIENT = """
import json, sys
from supervisor import RemoteRewardBackend, RewardItem, RewardRequest
url, token_file = sys.argv[1], sys.argv[2]
token = open(token_file).read().strip()
with RemoteRewardBackend(url, token=token) as backend:
    items = [RewardItem(id="a", text="so \\\\boxed{10\\\\%}", reference="0.1"), RewardItem(id="b", text="7", reference="8")]
    print(json.dumps(backend.compute_rewards(RewardRequest(items=items)).rewards))
"""


def wait_ready(path: Path, deadline_s: float = 60) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return json.loads(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError(f"no readiness line in {path} after {deadline_s} s")


@pytest.mark.slow
def test_serve_outlives_its_launcher_scores_for_another_process_and_stops_on_sigterm(tmp_path):
    start = time.time() - 1
    token_file, ready = tmp_path / "token", tmp_path / "ready.json"
    command = " ".join([*SERVE, "--scorer", "math_verify", "--env", "math", "--token-file", str(token_file)])
    # launched in the background by a shell that exits at once: a managed child would die with it
    launcher_env = {**os.environ, "MANAGED_SCORERS_TOKEN": "v" * 32}  # present, but the file is the token
    subprocess.run(
        ["sh", "-c", f"{command} > {ready} 2> {tmp_path / 'log'} &"], check=True, timeout=30, env=launcher_env
    )
    info = wait_ready(ready)
    server = info["pid"]
    try:
        assert info["scorer"] == "math_verify" and info["port"] > 0
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert psutil.Process(server).ppid() != os.getpid()  # nobody of ours is its parent
        assert "MANAGED_SCORERS_TOKEN" not in psutil.Process(server).environ()  # the token variable stays behind
        fds = {fd: os.readlink(f"/proc/{server}/fd/{fd}") for fd in map(int, os.listdir(f"/proc/{server}/fd"))}
        assert fds[0] == "/dev/null" and not any("memfd" in target for target in fds.values()), fds
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, f"http://127.0.0.1:{info['port']}", str(token_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [1.0, 0.0]  # 10\\% is 0.1: antlr 4.13.2 in the math env
        os.kill(server, signal.SIGTERM)
        assert wait_until_gone([server], 15) == []
    finally:
        if psutil.pid_exists(server):
            os.kill(server, signal.SIGKILL)
    assert wait_until_gone(math_env_processes_since(start), 10) == []  # its graders went with it


def run_serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, "--scorer", "exact_match", "--env", "image", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_serve_refuses_remote_binds_loose_token_files_no_token_and_a_taken_port(tmp_path):
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    wide = run_serve("--host", "0.0.0.0", "--token-file", str(token))
    assert wide.returncode == 2 and "needs --allow-remote" in wide.stderr
    token.chmod(0o644)
    loose = run_serve("--token-file", str(token))
    assert loose.returncode == 2 and "chmod 600" in loose.stderr
    nothing = run_serve(env={"MANAGED_SCORERS_TOKEN": ""})
    assert nothing.returncode == 2 and "no token" in nothing.stderr
    short = run_serve(env={"MANAGED_SCORERS_TOKEN": "short"})
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = run_serve("--port", str(port), env={"MANAGED_SCORERS_TOKEN": "t" * 32})
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr


def test_serve_stops_gracefully_on_sigterm_with_exit_status_0(tmp_path):
    ready = tmp_path / "ready.json"
    with open(ready, "w") as out:
        server = subprocess.Popen(
            [*SERVE, "--scorer", "exact_match", "--env", "image"],
            stdout=out,
            stderr=subprocess.PIPE,
            env={**os.environ, "MANAGED_SCORERS_TOKEN": "t" * 32},
        )
    try:
        wait_ready(ready)
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0, server.stderr.read() if server.stderr else ""  # not 143
    finally:
        server.kill()
        server.wait()
        if server.stderr:
            server.stderr.close()

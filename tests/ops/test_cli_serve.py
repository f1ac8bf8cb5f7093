"""`managed-scorers serve`: a standalone scorer server for RemoteRewardBackend, token from a 0600
file."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
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
    items = [
        RewardItem(id="a", text="so \\\\boxed{10\\\\%}", reference="0.1"),
        RewardItem(id="b", text="7", reference="8"),
    ]
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
    command = " ".join(
        [*SERVE, "--scorer", "math_verify", "--env", "math", "--token-file", str(token_file)]
    )
    # launched in the background by a shell that exits at once: a managed child would die with it
    # present, but the file is the token
    launcher_env = {**os.environ, "MANAGED_SCORERS_TOKEN": "v" * 32}
    subprocess.run(
        ["sh", "-c", f"{command} > {ready} 2> {tmp_path / 'log'} &"],
        check=True,
        timeout=30,
        env=launcher_env,
    )
    info = wait_ready(ready)
    server = info["pid"]
    try:
        assert info["scorer"] == "math_verify" and info["port"] > 0
        # a standalone server says ready once its grading workers are up
        assert info["warming"] is False
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert psutil.Process(server).ppid() != os.getpid()  # nobody of ours is its parent
        # the token variable stays behind
        assert "MANAGED_SCORERS_TOKEN" not in psutil.Process(server).environ()
        fds = {
            fd: os.readlink(f"/proc/{server}/fd/{fd}")
            for fd in map(int, os.listdir(f"/proc/{server}/fd"))
        }
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


def start_serve(
    tmp_path: Path, name: str, *args: str, open_files: int | None = None
) -> tuple[subprocess.Popen, Path, Path]:
    """A `serve` process of ours (its readiness line in NAME.json, its log in NAME.log), not yet
    waited for; `open_files`: its soft RLIMIT_NOFILE when it starts."""

    def limit() -> None:
        if open_files is not None:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            )

    ready, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
    with open(ready, "w") as out, open(log, "w") as err:
        server = subprocess.Popen(
            [*SERVE, *args],
            stdout=out,
            stderr=err,
            env={**os.environ, "MANAGED_SCORERS_TOKEN": "t" * 32},
            preexec_fn=limit,
        )
    return server, ready, log


def stop_serve(server: subprocess.Popen) -> int | None:
    """SIGTERM, then its exit status within 15 s (None if it had to be killed)."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return None


FLAKY = [
    "--scorer",
    "tests.helpers.fixture_scorers:Flaky",
    "--python",
    sys.executable,
    "--input-kind",
    "text",
]
FLAKY += ["--extra-import-path", str(Path(__file__).resolve().parents[2])]


def test_the_openrlhf_route_scores_behind_its_path_secret_and_says_every_refusal_in_the_log(
    tmp_path,
):
    secret_file = tmp_path / "openrlhf-secret"
    route = ["--openrlhf-secret-file", str(secret_file), "--openrlhf-max-request-bytes", "4096"]
    server, ready, log = start_serve(tmp_path, "flaky", *FLAKY, *route, open_files=1024)
    try:
        info = wait_ready(ready)
        assert info["openrlhf_route"] is True and oct(secret_file.stat().st_mode & 0o777) == "0o600"
        # room for the 1024 connections OpenRLHF's bursts may open before any is read (a connection
        # per sample)
        assert psutil.Process(server.pid).rlimit(psutil.RLIMIT_NOFILE)[0] >= 2 * 1024 + 256
        base, secret = f"http://127.0.0.1:{info['port']}", secret_file.read_text().strip()

        def post(path: str, body: object) -> httpx.Response:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return httpx.post(base + path, content=content, timeout=10)

        one = post(
            f"/openrlhf/{secret}",
            {"query": ["Q: x? four</s>"], "prompts": ["Q: x?"], "labels": [None]},
        )
        assert one.status_code == 200 and one.json() == {
            "rewards": 4.0,
            "scores": 4.0,
            "extra_logs": {"flaky": 4.0},
        }
        two = post(
            f"/openrlhf/{secret}",
            {"query": ["P ab", "P abc<|im_end|>"], "prompts": ["P", "P"], "labels": [1, 2]},
        )
        assert two.json() == {
            "rewards": [2.0, 3.0],
            "scores": [2.0, 3.0],
            "extra_logs": {"flaky": [2.0, 3.0]},
        }
        for path in (
            f"/openrlhf/{secret[:-1]}",
            "/openrlhf",
            f"/openrlhf/{secret}/x",
            "/openrlhf/",
        ):
            assert post(path, {}).status_code == 401, path
        # the secret opens no other endpoint
        assert httpx.get(f"{base}/health", timeout=10).status_code == 401
        refusals = {
            b"{not json": "the body is not JSON",
            json.dumps(
                {"query": ["P a"], "prompts": ["P", "P"], "labels": [1]}
            ).encode(): "lengths differ",
            json.dumps(
                {"query": ["a b"], "prompts": ["Q"], "labels": [1]}
            ).encode(): "does not contain its prompt",
            json.dumps({"query": "P a", "prompts": ["P"]}).encode(): "must be lists",
        }
        for body, why in refusals.items():
            answer = post(f"/openrlhf/{secret}", body)
            assert answer.status_code == 400 and why in answer.json()["error"], answer.text
        big = post(
            f"/openrlhf/{secret}", {"query": ["P a"], "prompts": ["P"], "labels": ["x" * 4096]}
        )
        assert (
            big.status_code == 413
            and "exceeds openrlhf_max_request_bytes=4096" in big.json()["error"]
        )
        failed = post(
            f"/openrlhf/{secret}", {"query": ["P raise"], "prompts": ["P"], "labels": [None]}
        )
        assert (
            failed.status_code == 500
            and "ZeroDivisionError: scorer bug on cue" in failed.json()["error"]
        )
        nan = post(f"/openrlhf/{secret}", {"query": ["P nan"], "prompts": ["P"], "labels": [None]})
        assert nan.status_code == 500 and nan.json()["kind"] == "contract"  # never a NaN reward
        assert stop_serve(server) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    lines = log.read_text().splitlines()
    assert (
        len(
            [
                line
                for line in lines
                if " WARNING child_runtime.openrlhf: 401 for 1 request(s)" in line
            ]
        )
        == 1
    )
    errors = [line for line in lines if " ERROR child_runtime.openrlhf: answered " in line]
    # each status and kind said once per 10 s (the four 400s in one line), with the count of its
    # answers
    assert [line.split(" answered ")[1].split(" (")[0] for line in errors] == [
        "400 bad_request x1",
        "413 too_large x1",
        "500 scorer_error x1",
        "500 contract x1",
    ]
    assert "reward=None): ZeroDivisionError: scorer bug on cue" in errors[2]
    assert all("trains on reward=None" in line for line in errors) and secret not in log.read_text()


def test_serve_refuses_a_groupwise_scorer_on_the_openrlhf_route_and_a_secret_equal_to_the_token(
    tmp_path,
):
    secret_file = tmp_path / "openrlhf-secret"
    group_spy = ["--scorer", "tests.helpers.fixture_scorers:GroupSpy", *FLAKY[2:]]
    here = run_serve_args(*group_spy, "--openrlhf-secret-file", str(secret_file))
    assert (
        here.returncode == 2
        and "no group id: the groupwise scorer(s) ['group_spy'] cannot score" in here.stderr
    )
    # a scorer this env cannot import: the server refuses it when it boots, before any weights load
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_judge.py").write_text(
        "from tests.helpers.fixture_scorers import GroupSpy\n\nclass Judge(GroupSpy):\n    pass\n"
    )
    mine = ["--scorer", "my_judge:Judge", *FLAKY[2:], "--extra-import-path", str(tmp_path / "mine")]
    booted = run_serve_args(*mine, "--openrlhf-secret-file", str(secret_file))
    said = json.loads(booted.stdout.splitlines()[0])
    assert (
        booted.returncode == 3
        and said["ready"] is False
        and "['group_spy'] cannot score" in said["error"]
    )
    (tmp_path / "same").write_text("s" * 32 + "\n")
    (tmp_path / "same").chmod(0o600)
    same = run_serve_args(
        *FLAKY,
        "--token-file",
        str(tmp_path / "same"),
        "--openrlhf-secret-file",
        str(tmp_path / "same"),
    )
    assert same.returncode == 2 and "must differ from the token" in same.stderr
    none = run_serve_args(
        *FLAKY, "--openrlhf-secret-file", str(secret_file), "--openrlhf-max-request-bytes", "0"
    )
    assert (
        none.returncode == 2
        and "openrlhf_max_request_bytes" in none.stderr
        and "Traceback" not in none.stderr
    )
    cramped = subprocess.run(
        [*SERVE, *FLAKY, "--openrlhf-secret-file", str(secret_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MANAGED_SCORERS_TOKEN": "t" * 32},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
    )
    assert cramped.returncode == 2 and "need 2304 file descriptors" in cramped.stderr


def run_serve_args(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MANAGED_SCORERS_TOKEN": "t" * 32}
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=60, env=env)

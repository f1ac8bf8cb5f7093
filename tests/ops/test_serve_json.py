"""A served scorer's JSON `/score` (UniRL's protocol) with curl and with UniRL's own client, the
open `/livez`, a `/metrics` scrape with the metrics token only, and the JSON form's limits: one
`serve` of `mean_intensity` (the image env) for the module."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from child_runtime.protocol.headers import IDENTITY_HEADER
from supervisor import RemoteRewardBackend, RewardItem, RewardRequest
from tests.conftest import env_python
from tests.ops.test_cli_serve import FLAKY, SERVE, run_serve_args, stop_serve, wait_ready

JSON_CAP = 64 << 10


@dataclass
class Served:
    url: str
    token: str
    metrics_token: str
    info: dict


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve-json")
    token_file, metrics_file, ready = tmp / "token", tmp / "metrics-token", tmp / "ready.json"
    args = [
        "--scorer",
        "mean_intensity",
        "--token-file",
        str(token_file),
        "--metrics-token-file",
        str(metrics_file),
    ]
    with open(ready, "w") as out, open(tmp / "serve.log", "w") as err:
        server = subprocess.Popen(
            [*SERVE, *args, "--json-max-request-bytes", str(JSON_CAP)], stdout=out, stderr=err
        )
    try:
        info = wait_ready(ready)
        assert oct(metrics_file.stat().st_mode & 0o777) == "0o600"  # made, like the token file
        url = f"http://127.0.0.1:{info['port']}"
        yield Served(url, token_file.read_text().strip(), metrics_file.read_text().strip(), info)
        assert stop_serve(server) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def png_b64(value: int) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((6, 8, 3), value, np.uint8)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def unirl_call(*values: int) -> dict:
    requests = [
        {
            "history": [{"text": "a grey square", "image_b64": png_b64(v)}],
            "request_id": f"r{i}",
            "group_id": i,
        }
        for i, v in enumerate(values)
    ]
    return {"protocol_version": "1", "requests": requests}


def test_curl_scores_unirl_json_and_the_frame_path_is_unchanged(
    served: Served, tmp_path: Path
) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed"
    (tmp_path / "body.json").write_text(json.dumps(unirl_call(51, 204)))
    auth = f"authorization: Bearer {served.token}"
    done = subprocess.run(
        [
            curl,
            "-sS",
            "-D",
            str(tmp_path / "headers"),
            "-H",
            auth,
            "-H",
            "content-type: application/json",
        ]
        + ["--data-binary", f"@{tmp_path / 'body.json'}", f"{served.url}/score"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    headers = (tmp_path / "headers").read_text().lower()
    assert headers.startswith("http/1.1 200") and "content-type: application/json" in headers
    assert f"{IDENTITY_HEADER}: {served.info['identity_hash']}" in headers
    answer = json.loads(done.stdout)
    assert answer["results"] == [
        {"mean_intensity": {"mean_intensity": 0.2}},
        {"mean_intensity": {"mean_intensity": 0.8}},
    ]
    assert answer["errors"] == [{}, {}] and [i["group_id"] for i in answer["identities"]] == [0, 1]
    assert {i["scorer_version"] for i in answer["identities"]} == {served.info["identity_hash"]}
    # the same image in the binary frame, by this project's client
    pixels = np.full((6, 8, 3), 204, np.uint8)
    with RemoteRewardBackend(served.url, token=served.token) as remote:
        assert remote.compute_rewards(
            RewardRequest(items=[RewardItem(id="f", image=pixels)])
        ).rewards == [0.8]


def test_livez_is_open_and_says_nothing_of_the_scorer(served: Served) -> None:
    for method in ("GET", "HEAD"):
        answer = httpx.request(method, f"{served.url}/livez", timeout=10)
        assert answer.status_code == 200 and answer.text == ("ok\n" if method == "GET" else "")
        said = (answer.text + json.dumps(dict(answer.headers))).lower()
        for secret in (
            "mean_intensity",
            served.info["identity_hash"],
            IDENTITY_HEADER,
            "revision",
            "version",
        ):
            assert secret not in said, secret
    assert httpx.post(f"{served.url}/livez", timeout=10).status_code == 405
    # the rest still needs the token
    assert httpx.get(f"{served.url}/health", timeout=10).status_code == 401


def test_the_metrics_token_reads_metrics_and_opens_nothing_else(served: Served) -> None:
    scrape = {"authorization": f"Bearer {served.metrics_token}"}
    metrics = httpx.get(f"{served.url}/metrics", headers=scrape, timeout=10)
    assert (
        metrics.status_code == 200
        and 'managed_scorers_child_items_total{scorer="mean_intensity"' in metrics.text
    )
    assert httpx.get(f"{served.url}/metrics", timeout=10).status_code == 401
    for method, path in (
        ("GET", "/health"),
        ("POST", "/score"),
        ("POST", "/drain"),
        ("POST", "/shutdown"),
    ):
        answer = httpx.request(
            method, served.url + path, headers=scrape, json=unirl_call(1), timeout=10
        )
        assert answer.status_code == 401, (path, answer.text)
    assert (
        httpx.get(
            f"{served.url}/health", headers={"authorization": f"Bearer {served.token}"}
        ).status_code
        == 200
    )


def test_the_json_form_is_refused_over_its_cap_unparsable_or_of_another_protocol(
    served: Served,
) -> None:
    auth = {"authorization": f"Bearer {served.token}", "content-type": "application/json"}

    def post(body: bytes) -> httpx.Response:
        return httpx.post(f"{served.url}/score", content=body, headers=auth, timeout=10)

    big = post(
        json.dumps({"protocol_version": "1", "requests": [], "pad": "x" * JSON_CAP}).encode()
    )
    assert (
        big.status_code == 413
        and f"exceeds json_max_request_bytes={JSON_CAP}" in big.json()["error"]
    )
    bad = post(b'{"protocol_version": "1", "requests": [')
    assert bad.status_code == 400 and bad.json()["kind"] == "bad_request"
    assert (
        bad.json()["error"].startswith("the body is not JSON: ") and "\n" not in bad.json()["error"]
    )
    other = post(json.dumps({**unirl_call(1), "protocol_version": "2"}).encode())
    assert other.status_code == 400 and 'protocol_version must be "1"' in other.json()["error"]
    # every answer names the scorer's identity, an error too
    assert IDENTITY_HEADER in other.headers
    assert post(json.dumps(unirl_call(102)).encode()).json()["results"] == [
        {"mean_intensity": {"mean_intensity": 0.4}}
    ]


UNIRL_CLIENT = """
import json, sys, torch
from unirl.reward.remote import RemoteRewardBackend, RemoteRewardSpec
from unirl.types.primitives import Images, Texts
from unirl.types.reward import RewardRequest

url, token, identity = sys.argv[1:]
spec = RemoteRewardSpec(
    base_url=url,
    required_rewards=("mean_intensity",),
    require_identity_echo=True,
    expected_scorer_version=identity,
)
backend = RemoteRewardBackend(config=spec, base_device="cpu")
backend._session.headers["authorization"] = (
    f"Bearer {token}"  # its own client sends none: a secret path will do
)
images = Images.from_dense(torch.stack([torch.full((3, 8, 8), v) for v in (0.2, 0.6)]))
edits = Images.from_dense(torch.stack([torch.full((3, 8, 8), 0.5)] * 2))
request = RewardRequest(
    generated={"image": images},
    conditioning={"image": edits},
    sample_ids=["s0", "s1"],
    group_ids=["g", "g"],
    generation_prompt=Texts(texts=["a", "a"]),
    metadata=[{"step": 1}, None],
)
response = backend.compute_rewards(request)
print(json.dumps([response.rewards, response.successes]))
"""


@pytest.mark.slow
def test_unirls_own_remote_backend_scores_through_the_json_form(served: Served) -> None:
    """UniRL 0.2.0's client code, unchanged (JPEG, an edit's condition image, identity echo, version
    pin)."""
    identity = served.info["identity_hash"]
    done = subprocess.run(
        [str(env_python("trl")), "-c", UNIRL_CLIENT, served.url, served.token, identity],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rewards, successes = json.loads(done.stdout)
    assert [round(r, 2) for r in rewards] == [0.2, 0.6] and successes == [True, True]


def test_serve_refuses_a_metrics_token_equal_to_the_token(tmp_path: Path) -> None:
    same = tmp_path / "same"
    same.write_text("s" * 32 + "\n")
    same.chmod(0o600)
    refused = run_serve_args(*FLAKY, "--token-file", str(same), "--metrics-token-file", str(same))
    assert (
        refused.returncode == 2 and "the metrics token must differ from the token" in refused.stderr
    )
    assert len(refused.stderr.strip().splitlines()) == 1  # one line, no traceback

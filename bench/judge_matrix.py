"""The LLM judge's failure matrix against the fake OpenAI-compatible server (bench/fake_openai.py).

Each case is one item whose text asks the fake server for a behaviour; the judge runs
in-process with short deadlines so the whole matrix takes about half a minute.
`tests/scorers/test_llm_judge.py` asserts every row; `python -m bench.judge_matrix` prints the
table in docs/reliability.md.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from bench.fake_openai import FakeOpenAI
from supervisor import LocalRewardBackend, RewardItem, RewardRequest, ScorerRequestError

# 1 s per attempt, 3 attempts, backoff 0.1 s doubling to at most 0.5 s, 10 s per batch
PARAMS: dict[str, Any] = {
    "model": "fake-judge",
    "request_timeout_s": 1.0,
    "max_attempts": 3,
    "backoff_s": 0.1,
    "backoff_max_s": 0.5,
    "batch_timeout_s": 10.0,
}


@dataclass(frozen=True)
class Case:
    name: str
    server: str  # what the fake server does
    texts: tuple[str, ...]
    reward: float | None = None  # the expected reward of every item, None when the call must fail
    error: str = ""  # a phrase the error must contain
    attempts: int = 1  # requests the server saw per item
    within_s: float = 2.0  # a generous bound on the call's wall time (shared, noisy machines)
    params: dict[str, Any] = field(default_factory=dict)
    unreachable: bool = False


CASES = (
    Case("answers", "Score: 7", ("[[score:7]]",), reward=0.7),
    Case(
        "slow once",
        "first answer after 3 s",
        ("[[slow:3x1]][[score:6]]",),
        reward=0.6,
        attempts=2,
        within_s=3,
    ),
    Case(
        "slow always",
        "every answer after 3 s",
        ("[[slow:3]]",),
        error="3 attempts failed; last: no whole answer within 1 s",
        attempts=3,
        within_s=5,
    ),
    Case(
        "429 twice",
        "HTTP 429, Retry-After 0.3",
        ("[[status:429x2]][[retry_after:0.3]][[score:5]]",),
        reward=0.5,
        attempts=3,
        within_s=3,
    ),
    Case("500 always", "HTTP 500", ("[[status:500]]",), error="HTTP 500", attempts=3, within_s=3),
    Case(
        "malformed once",
        "truncated JSON body",
        ("[[malformedx1]][[score:4]]",),
        reward=0.4,
        attempts=2,
    ),
    Case(
        "malformed always",
        "truncated JSON body",
        ("[[malformed]]",),
        error="malformed chat completion",
        attempts=3,
    ),
    Case(
        "dropped once",
        "connection closed, no answer",
        ("[[dropx1]][[score:3]]",),
        reward=0.3,
        attempts=2,
    ),
    Case(
        "dropped always",
        "connection closed, no answer",
        ("[[drop]]",),
        error="RemoteProtocolError",
        attempts=3,
    ),
    Case(
        "out of range", "Score: 42", ("[[score:42]]",), error="score 42 outside score_range [0, 10]"
    ),
    Case("unparsable", "a reply with no score", ("[[unparsable]]",), error="unparsable score"),
    Case("HTTP 400", "HTTP 400 (the request's fault)", ("[[status:400]]",), error="HTTP 400"),
    Case(
        "trickled body",
        "a byte every 50 ms",
        ("[[trickle:0.05]]",),
        error="3 attempts failed; last: no whole answer within 1 s",
        attempts=3,
        within_s=5,
    ),
    Case(
        "trickled headers",
        "headers a byte every 0.3 s, never ending",
        ("[[trickle_headers:0.3]]",),
        error="batch deadline (2 s) leaves no time for attempt 3; last: no whole answer within 1 s",
        attempts=2,
        within_s=2.6,
        params={"batch_timeout_s": 2.0},
    ),
    Case(
        "unreachable",
        "nothing listening",
        ("[[score:1]]",),
        error="ConnectError",
        attempts=0,
        unreachable=True,
    ),
    Case(
        "batch deadline 2 s",
        "every answer after 3 s",
        ("[[slow:3]]",),
        error="batch deadline (2 s) leaves no time",
        attempts=2,
        within_s=3,
        params={"batch_timeout_s": 2.0},
    ),
    Case(
        "16 items, concurrency 4",
        "every answer after 0.3 s",
        tuple(f"[[slow:0.3]][[score:{n % 11}]] item #{n}#" for n in range(16)),
        reward=None,
        within_s=4,
        params={"concurrency": 4},
    ),
)


@dataclass
class Outcome:
    rewards: list[float] | None
    error: str | None
    seconds: float
    attempts: list[int]  # requests the server saw, per item
    # distinct request bodies among them, per item (a retry resends the same bytes)
    distinct: list[int]
    gaps: list[list[float]]  # seconds between an item's requests
    max_in_flight: int


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once the probe closes


def run(case: Case) -> Outcome:
    with FakeOpenAI() as server:
        base_url = f"http://127.0.0.1:{closed_port()}/v1" if case.unreachable else server.base_url
        items = [
            RewardItem(id=f"i{n}", prompt="What is 6 x 7?", text=text)
            for n, text in enumerate(case.texts)
        ]
        with LocalRewardBackend(
            "llm_judge", params={**PARAMS, "base_url": base_url, **case.params}
        ) as judge:
            began = time.monotonic()
            try:
                rewards, error = judge.compute_rewards(RewardRequest(items=items)).rewards, None
            except ScorerRequestError as exc:
                rewards, error = None, str(exc)
            seconds = time.monotonic() - began
        bodies = [server.bodies_with(text) for text in case.texts]
        times = [
            [seen.at for seen in server.requests if text.encode() in seen.body]
            for text in case.texts
        ]
        gaps = [
            [later - earlier for earlier, later in zip(at, at[1:], strict=False)] for at in times
        ]
        return Outcome(
            rewards,
            error,
            seconds,
            [len(b) for b in bodies],
            [len(set(b)) for b in bodies],
            gaps,
            server.max_in_flight,
        )


def main() -> None:
    print("| case | the server | the judge | requests per item | wall time |")
    print("|---|---|---|---|---|")
    for case in CASES:
        outcome = run(case)
        if outcome.rewards is not None:
            shown = ", ".join(f"{r:g}" for r in outcome.rewards[:3]) + (
                ", ..." if len(outcome.rewards) > 3 else ""
            )
            verdict = f"rewards {shown}" + (
                f" (at most {outcome.max_in_flight} in flight)" if len(outcome.rewards) > 1 else ""
            )
        else:
            reason = re.sub(
                r" \(\d+ attempts at .*", "", (outcome.error or "").split("'i0': ", 1)[-1]
            )
            verdict = "raises: " + reason[:100].replace("|", "/").replace("\n", " ")
        print(
            f"| {case.name} | {case.server} | {verdict} | {max(outcome.attempts)} | "
            f"{outcome.seconds:.2f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()

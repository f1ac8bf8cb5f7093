"""One trainer rank's judge, in-process in a scorer env's python: `python judge_rank.py PHASES`.

PHASES is a JSON list of `{"params": {...}, "items": n}`. For each phase the rank builds and loads
an `LlmJudge` with those params, prints `ready`, waits for a line on stdin (so every rank starts at
once), scores n items, and prints one JSON line: the rewards (null for a failed item), the errors
by position, and the diagnostics. tests/scorers/test_endpoint_limits.py runs 8 against one endpoint.
"""

from __future__ import annotations

import json
import math
import sys

from scorers.base import ScoreItem
from scorers.builtin.llm_judge import LlmJudge


def main() -> None:
    for phase in json.loads(sys.argv[1]):
        judge = LlmJudge(**phase["params"])
        judge.load()
        try:
            print("ready", flush=True)
            sys.stdin.readline()
            items = [ScoreItem(id=f"i{n}", text=f"answer {n}") for n in range(phase["items"])]
            result = judge.score(items)
        finally:
            judge.close()
        rewards = [None if math.isnan(v) else v for v in result.terms["llm_judge"]]
        print(json.dumps({"rewards": rewards, "errors": result.failed, **result.diagnostics}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()

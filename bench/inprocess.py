"""Run a scorer in-process inside its own env and print timings as JSON.

`envs/NAME/.venv/bin/python -m bench.inprocess SCORER PARAMS_JSON WORKLOAD REPEATS [ITEMS]`:
the in-process baseline for scorers whose packages the trainer env does not have (ITEMS: the
workload's size, its default without it).
"""

from __future__ import annotations

import json
import sys
import time

from bench.workloads import WORKLOADS
from scorers.base import ScoreItem, score_checked
from scorers.registry import resolve_scorer


def main() -> None:
    name, params, workload, repeats = (
        sys.argv[1],
        json.loads(sys.argv[2]),
        sys.argv[3],
        int(sys.argv[4]),
    )
    sizes = [int(n) for n in sys.argv[5:6]]
    scorer = resolve_scorer(name)(**params)
    scorer.load("cpu")
    scorer.onload()
    items = [ScoreItem(**raw) for raw in WORKLOADS[workload](*sizes)]
    score_checked(scorer, items)  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = score_checked(scorer, items)
        samples.append(time.perf_counter() - started)
    scorer.close()
    print(json.dumps({"samples": samples, "terms": result.terms}))


if __name__ == "__main__":
    main()

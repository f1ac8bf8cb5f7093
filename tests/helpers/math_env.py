"""The math env seen from outside: grades made with math_verify called directly there (the expected
value of every managed math reward), and the processes running its python (none may outlive a
test)."""

from __future__ import annotations

import json
import subprocess

import psutil

from tests.conftest import env_python

GRADE = """
import json, sys
from math_verify import parse, verify

rows = json.load(sys.stdin)
print(
    json.dumps(
        [1.0 if verify(parse("$" + gold + "$"), parse(text)) else 0.0 for text, gold in rows]
    )
)
"""


def independent_grades(texts: list[str], golds: list[str]) -> list[float]:
    done = subprocess.run(
        [str(env_python("math")), "-c", GRADE],
        input=json.dumps(list(zip(texts, golds, strict=True))),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def math_env_processes_since(start: float) -> list[int]:
    """Pids of the live processes running the math env's python that started after `start` (a run's
    scorer children and their graders)."""
    root = str(env_python("math").parent.parent)
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        info = proc.info
        if (info["create_time"] or 0) >= start and info["status"] != psutil.STATUS_ZOMBIE:
            if any(root in part for part in info["cmdline"] or ()):
                found.append(proc.pid)
    return found

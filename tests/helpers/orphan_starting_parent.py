"""A stand-in trainer that kill -9s itself while its managed child is starting.

`die_at` picks the window, deterministically (an outside kill cannot hit it: the
parent writes the boot config microseconds after the spawn):

- "before_config": after the spawn, before the boot config is written (the child
  has no parent pid to watch yet; it must give up on EOF of its stdin);
- "after_config": right after the boot config is written, long before the child
  can have armed its lifeline (the parent is gone before prctl; the lifeline's
  first getppid() check must catch it).

Prints one JSON line with the child's pid, then SIGKILLs itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from supervisor import ManagedScorerProcessBackend
from supervisor.child.process import ChildProcess
from tests.conftest import REPO_ROOT


def main() -> None:
    python, scorer, die_at = sys.argv[1], sys.argv[2], sys.argv[3]
    send_boot_config = ChildProcess._send_boot_config

    def die(child: ChildProcess) -> None:
        print(json.dumps({"child": child.pid, "die_at": die_at}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def patched(self: ChildProcess) -> None:
        if die_at == "before_config":
            die(self)
        send_boot_config(self)
        die(self)

    ChildProcess._send_boot_config = patched
    ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": python,
                "startup_timeout": 60,
                "request_timeout": 60,
                "extra_import_paths": [str(REPO_ROOT)],
            },
            "scorer": {"name": scorer},
        }
    )


if __name__ == "__main__":
    main()

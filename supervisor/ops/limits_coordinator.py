"""`managed-scorers limits-coordinator`: the cross-node coordinator as a process of its own, for a
cluster without Ray (on Ray, `coordinate_on_ray()` starts it as an actor). It prints one JSON
line when it listens (`{"url": ...}`), then serves until SIGTERM or Ctrl-C. Callers name it in
`MANAGED_SCORERS_LIMITS_COORDINATOR` (or a recipe's `endpoint_limit: coordinator:`) and hold its
token in `MANAGED_SCORERS_LIMITS_TOKEN`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scorers.limits.remote import TOKEN_ENV


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "limits-coordinator",
        help="serve the shared endpoint limits for callers on every node (until SIGTERM)",
    )
    command.add_argument(
        "--host", default="127.0.0.1", help="default 127.0.0.1; others need --allow-remote"
    )
    command.add_argument("--port", type=int, default=0, help="default 0: any free port")
    command.add_argument("--token-env", default=TOKEN_ENV, help="the variable holding the token")
    command.add_argument(
        "--token-file", type=Path, help="a 0600 file holding the token (made if missing)"
    )
    command.add_argument(
        "--allow-remote", action="store_true", help="listen on a non-loopback address"
    )
    command.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from supervisor.limits.hosting import needs_serving, run_here
    from supervisor.ops.serve import bind, read_token

    needs_serving("limits-coordinator")
    token = read_token(args.token_env, args.token_file)
    listener = bind(args.host, args.port, args.allow_remote)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(json.dumps({"url": f"http://{host}:{listener.getsockname()[1]}"}), flush=True)
    sys.stdout.flush()
    run_here(listener, token)
    return 0

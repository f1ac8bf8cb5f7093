"""`managed-scorers serve`: the child runtime as a standalone server for `RemoteRewardBackend`.

Everything is resolved here, as for a managed child (`launch_plan`: the env's python, an
import path with nothing of this environment, the boot config), and the socket is bound here
(an address in use is reported before anything starts). Then this process becomes the server:
it execs the scorer env's python running the child runtime in standalone mode, with no
parent-death watch (it lives until SIGTERM or Ctrl-C, then shuts down gracefully) and the same
limits and endpoints as a managed child. The token comes from an environment variable or a
0600 file, never argv; the boot config reaches the runtime in a memfd on stdin; the readiness
line (JSON: port, pid, scorer, identity) is printed on stdout.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat
import sys
from pathlib import Path
from typing import NoReturn

from child_runtime import boot
from supervisor.config import ManagedScorerProcessSpec
from supervisor.errors import ConfigError
from supervisor.managed import launch_plan

LOOPBACK_NAMES = ("localhost",)
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_env: str | None, token_file: Path | None) -> str:
    """From the named environment variable, or a file only this user can read (made, with a fresh
    token, when it does not exist yet); never from the command line."""
    if token_file is not None:
        try:
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            info = token_file.stat()
            if info.st_uid != os.getuid() or info.st_mode & 0o077 or not stat.S_ISREG(info.st_mode):
                raise ConfigError(
                    f"{token_file} must be a file of this user's that nobody else can read or write (chmod 600)"
                ) from None
            token = token_file.read_text().strip()
        else:
            token = secrets.token_urlsafe(32)
            with os.fdopen(fd, "w") as handle:
                handle.write(token + "\n")
    elif token_env is not None and os.environ.get(token_env):
        token = os.environ[token_env]
    else:
        raise ConfigError(f"no token: set ${token_env} or pass --token-file (a 0600 file; made if missing)")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"the token must have at least {MIN_TOKEN_CHARS} characters")
    return token


def bind(host: str, port: int, allow_remote: bool) -> socket.socket:
    if not is_loopback(host) and not allow_remote:
        raise ConfigError(
            f"{host} is not a loopback address: serving beyond this machine needs --allow-remote "
            "(the token is then all that guards the scorer: put TLS in front of it)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    listener.listen(1024)
    return listener


def serve(spec: ManagedScorerProcessSpec, host: str, port: int, token: str, allow_remote: bool) -> NoReturn:
    """Become the server (exec); returns only by raising, before the exec."""
    listener = bind(host, port, allow_remote)
    plan = launch_plan(spec, segment=None)
    listener.set_inheritable(True)
    ready_fd = os.dup(sys.stdout.fileno())  # the runtime closes its readiness pipe; stdout stays open
    os.set_inheritable(ready_fd, True)
    config = {**plan.boot, "token": token, "listen_fd": listener.fileno(), "ready_fd": ready_fd, "parent_pid": None}
    stdin = os.memfd_create("managed-scorers-boot", 0)  # not inheritable until it is stdin: only the runtime reads it
    os.write(stdin, boot.frame(config))
    os.lseek(stdin, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdin, 0)
    os.chdir(plan.cwd)
    argv = [str(plan.python_executable), "-X", "faulthandler", "-m", "child_runtime", "--standalone"]
    try:
        os.execve(argv[0], argv, plan.env)
    except OSError as exc:
        raise ConfigError(f"cannot execute {argv[0]}: {exc}") from exc

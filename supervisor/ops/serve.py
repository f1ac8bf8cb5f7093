"""`managed-scorers serve`: the child runtime as a standalone server for `RemoteRewardBackend`.

Everything is resolved here, as for a managed child (`launch_plan`: the env's python, an
import path with nothing of this environment, the boot config), and the socket is bound here
(an address in use is reported before anything starts). Then this process becomes the server:
it execs the scorer env's python running the child runtime in standalone mode, with no
parent-death watch (it lives until SIGTERM or Ctrl-C, then shuts down gracefully) and the same
limits and endpoints as a managed child. The token comes from an environment variable or a
0600 file, never argv, and the variable is not passed on; the boot config reaches the runtime
in a memfd on stdin, which the runtime closes once read; the readiness line (JSON: port, pid,
scorer, identity) is printed on stdout.

With an OpenRLHF secret (`--openrlhf-secret-file`), the server also speaks OpenRLHF's protocol at
`/openrlhf/<secret>`: OpenRLHF's client sends no header, so the secret rides in the URL. It is a
second secret, never the token: a URL ends up in command lines and logs, and this one can only
score (no /shutdown, /offload or /drain). A groupwise scorer is refused there, at boot.

With a UniRL secret (`--unirl-secret-file`), UniRL 0.2.0's own `RemoteRewardBackend` is served
unchanged at `base_url: http://HOST:PORT/unirl/<secret>`: `GET .../health` answers its
`{"status", "rewards"}` and `POST .../score` is /score's JSON form (UniRL's protocol, the same
handler). Its client sends no header either, so the secret rides in the URL; a third secret, which
can only score and say the rewards served. A text or audio scorer is refused there, at boot (UniRL's
client sends images and videos only).

`GET /livez` needs no token and answers 200 while the server runs, nothing more. A Prometheus scrape
of `/metrics` need not hold the token either: `--metrics-token-file` names a second token (a 0600
file, made if missing) that opens `GET /metrics` and nothing else; Prometheus reads it from a file
(`authorization: {credentials_file: ...}`). The metrics stay behind a secret: their labels name the
scorer, and their counts say how busy it is.

With `--recipe`, the server serves a whole panel (`panel_spec`): the same runtime, in this project's
own python, over `ops/panel_scorer.PanelScorer`, whose load() starts every term's children together.
Those children are the server's: a graceful stop closes them, and its death (even SIGKILL) ends them
through their lifeline. Its reward is the panel's weighted reward; each term travels as a component.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import resource
import secrets
import socket
import stat
import sys
from pathlib import Path
from typing import Any, NoReturn

from child_runtime.protocol import boot
from supervisor.backends.managed import launch_plan
from supervisor.child.process import LaunchPlan
from supervisor.compose.recipes import load_recipe
from supervisor.config import ManagedScorerProcessSpec
from supervisor.errors import ConfigError
from supervisor.limits.hosting import listening
from supervisor.ops.precheck import check_recipe

PANEL_SCORER = "supervisor.ops.panel_scorer:PanelScorer"  # imported by the server, never here
LOOPBACK_NAMES = ("localhost",)
MIN_TOKEN_CHARS = 16
DESCRIPTOR_MARGIN = 256  # the server's own: the scorer's files, its grader pipes, the log


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
        token = _token_from_file(token_file)
    elif token_env is not None and os.environ.get(token_env):
        token = os.environ[token_env]
    else:
        raise ConfigError(
            f"no token: set ${token_env} or pass --token-file (a 0600 file; made if missing)"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"the token must have at least {MIN_TOKEN_CHARS} characters")
    return token


def read_secret(path: Path) -> str:
    """A route's secret (OpenRLHF's, UniRL's) or the metrics token: a file only this user can
    read, made with a fresh one when missing."""
    secret = _token_from_file(path)
    if len(secret) < MIN_TOKEN_CHARS or not all(
        c.isascii() and (c.isalnum() or c in "-_") for c in secret
    ):
        raise ConfigError(
            f"the secret in {path} must have at least {MIN_TOKEN_CHARS} characters, all "
            f"ASCII letters, digits, '-' or '_' "
            "(it goes into a URL as it is)"
        )
    return secret


def _token_from_file(path: Path) -> str:
    """Read through one descriptor, never a symlink, checked with fstat on that same descriptor; a
    new file is written whole under a temporary name, then linked into place (no reader sees it
    empty)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _new_token_file(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot open the token file {path}: {exc.strerror} (a symlink is refused)"
        ) from exc
    with os.fdopen(fd) as handle:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077 or not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"{path} must be a file of this user's that nobody else can read or write "
                f"(chmod 600)"
            )
        return handle.read().strip()


def _new_token_file(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        try:
            # fails if another serve made it meanwhile: then that one is the token
            os.link(temporary, path)
        except FileExistsError:
            return _token_from_file(path)
    finally:
        temporary.unlink(missing_ok=True)
    return token


def bind(host: str, port: int, allow_remote: bool) -> socket.socket:
    if not is_loopback(host) and not allow_remote:
        raise ConfigError(
            f"{host} is not a loopback address: serving beyond this machine needs --allow-remote "
            "(the token is then all that guards the scorer: put TLS in front of it)"
        )
    return listening(host, port)


def enough_descriptors(max_pending: int) -> None:
    """Room for every connection the gate lets wait (and as many lingering after eviction) and the
    server's own files: the soft RLIMIT_NOFILE raised toward the hard one, which the exec keeps."""
    needed = 2 * max_pending + DESCRIPTOR_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise ConfigError(
                f"{max_pending} pending connections need {needed} file descriptors; this "
                f"process may open at most {hard} (ulimit -Hn): lower "
                f"--max-pending-connections or raise the limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def panel_spec(recipe: Path, limits: dict[str, Any]) -> ManagedScorerProcessSpec:
    """A panel server as a child spec: the panel scorer (`ops/panel_scorer`) in this very python
    (the trainer env's: the panel's own children get their envs), our packages on its path. The
    recipe is read and preflighted here too (names, params, envs), so that a bad one is refused
    before anything is bound or started."""
    path = recipe.resolve()
    check_recipe(load_recipe(path), recipe)
    # where supervisor/, child_runtime/ and scorers/ lie
    project = Path(__file__).resolve().parents[2]
    return ManagedScorerProcessSpec.model_validate(
        {
            "process": {"python_executable": sys.executable, "extra_import_paths": [str(project)]},
            "scorer": {"name": PANEL_SCORER, "params": {"recipe": str(path)}},
            "limits": limits,
        }
    )


def _as_panel_server(config: dict[str, Any], env: dict[str, str]) -> None:
    """A panel's input kind is its terms' (each backend checks its own), and the server sees this
    machine's GPUs as serve does: each term's children are narrowed by their own config."""
    config["scorer"] = {**config["scorer"], "input_kind": None}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]


def _distinct_secrets(
    token: str, openrlhf_secret: str | None, metrics_token: str | None, unirl_secret: str | None
) -> None:
    """The route secrets and the metrics token each differ from the token, which drives every
    endpoint, and from each other: each is handed to another party."""
    if openrlhf_secret is not None and hmac.compare_digest(openrlhf_secret, token):
        raise ConfigError(
            "the OpenRLHF secret must differ from the token: the URL that carries it is seen "
            "in command lines and logs, and the token drives every endpoint"
        )
    if metrics_token is not None and hmac.compare_digest(metrics_token, token):
        raise ConfigError(
            "the metrics token must differ from the token: it is handed to a scraper, which "
            "may only read"
        )
    others = {"token": token, "OpenRLHF secret": openrlhf_secret, "metrics token": metrics_token}
    for name, other in others.items():
        if unirl_secret is not None and other is not None:
            if hmac.compare_digest(unirl_secret, other):
                raise ConfigError(
                    f"the UniRL secret must differ from the {name}: the URL that carries it is "
                    f"seen in UniRL's configs and logs, and may only score"
                )


def serve(
    spec: ManagedScorerProcessSpec,
    host: str,
    port: int,
    token: str,
    allow_remote: bool,
    token_env: str | None = None,
    openrlhf_secret: str | None = None,
    metrics_token: str | None = None,
    unirl_secret: str | None = None,
) -> NoReturn:
    """Become the server (exec); returns only by raising, before the exec."""
    _distinct_secrets(token, openrlhf_secret, metrics_token, unirl_secret)
    _one_child(spec)
    enough_descriptors(spec.limits.max_pending_connections)
    listener = bind(host, port, allow_remote)
    plan = launch_plan(spec, segment=None)
    # the token reaches it on stdin only
    env = {key: value for key, value in plan.env.items() if key != token_env}
    listener.set_inheritable(True)
    # the runtime closes its readiness pipe; stdout stays open
    ready_fd = os.dup(sys.stdout.fileno())
    os.set_inheritable(ready_fd, True)
    config = {
        **plan.boot,
        "token": token,
        "listen_fd": listener.fileno(),
        "ready_fd": ready_fd,
        "parent_pid": None,
    }
    if spec.scorer.name == PANEL_SCORER:
        _as_panel_server(config, env)
    if openrlhf_secret is not None:
        config["openrlhf_secret"] = openrlhf_secret
    if metrics_token is not None:
        config["metrics_token"] = metrics_token
    if unirl_secret is not None:
        config["unirl_secret"] = unirl_secret
    _exec_runtime(plan, config, env)


def _one_child(spec: ManagedScorerProcessSpec) -> None:
    """A server is one child on one port: a spec asking for replicas is refused before anything
    is bound."""
    if spec.replicas.size > 1:
        raise ConfigError(
            f"serve runs one child; the spec asks for {spec.replicas.size} replicas: serve "
            f"each on its own port "
            "(process.visible_devices narrows each to its GPU)"
        )


def _exec_runtime(plan: LaunchPlan, config: dict[str, Any], env: dict[str, str]) -> NoReturn:
    """Replace this process with the child runtime in standalone mode, its boot config on stdin."""
    # only its dup on fd 0 crosses the exec
    stdin = os.memfd_create("managed-scorers-boot", os.MFD_CLOEXEC)
    os.write(stdin, boot.frame(config))
    os.lseek(stdin, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdin, 0)
    os.chdir(plan.cwd)
    argv = [
        str(plan.python_executable),
        "-X",
        "faulthandler",
        "-m",
        "child_runtime",
        "--standalone",
    ]
    try:
        os.execve(argv[0], argv, env)
    except OSError as exc:
        raise ConfigError(f"cannot execute {argv[0]}: {exc}") from exc

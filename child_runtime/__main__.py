"""`python -m child_runtime`: boot one scorer and serve it on an inherited loopback socket.

The parent writes the boot config, framed, on stdin (so the token is never in
argv or the environment), passes the listening socket and a readiness pipe as
inherited fds, and reads one JSON line from that pipe: ready, or why not.
Boot failures exit with the reserved codes in `exit_codes`, said on the pipe
before anything is written to the log (a full disk must not hide them).
"""

from __future__ import annotations

import gc

gc.disable()  # for the boot's imports, resumed before the scorer loads: see _import_server

import asyncio
import faulthandler
import importlib.util
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

from child_runtime import lifeline
from child_runtime.protocol import boot, exit_codes
from scorers import early

# before the imports below: a scorer's helper starts meanwhile (scorers/early.py)
early.run_from_argv(sys.argv)

# what the runtime needs beyond the stdlib (numpy): a missing package is said on the readiness pipe
try:
    # imported only where an array is met, but part of the contract
    if importlib.util.find_spec("numpy") is None:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
    from child_runtime.gate import ConnectionGate, gated
    from child_runtime.host import GPU_RESIDENCY_MODES, ScorerHost
    from child_runtime.protocol.items import Limits
    from child_runtime.protocol.openrlhf import groupwise_refusal
    from child_runtime.protocol.shared_segment import ChildSegment
except ImportError as _missing:
    _RUNTIME_IMPORT_ERROR: ImportError | None = _missing
else:
    _RUNTIME_IMPORT_ERROR = None

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from scorers.base import ScorerSpec

KEEP_ALIVE_S = 7 * 24 * 3600
# input kinds UniRL's RemoteRewardBackend never sends (its history turns hold images or a video)
UNIRL_UNSENT_KINDS = ("text", "audio")
STANDALONE_WARM_WAIT_S = 120.0  # a backstop: the math grader bounds its own workers' start at 60 s


@dataclass
class BootConfig:
    token: str
    listen_fd: int
    ready_fd: int
    parent_pid: int | None  # None: standalone (`managed-scorers serve`), no parent to die with
    scorer_name: str
    scorer_params: dict[str, Any] = field(default_factory=dict)
    revision: str | None = None  # a pin: the scorer must declare exactly this revision
    identity_hash: str | None = None  # a pin on the whole catalog identity
    catalog: str | None = None  # a custom catalog factory's dotted path
    scorer_input_kind: str | None = None
    gpu_residency: str = "resident"
    boot_offloaded: bool = False  # a restart after the trainer offloaded boots offloaded
    device: str = "cpu"
    graceful_timeout_s: float = 5.0
    # resolved when made: the import may have failed
    limits: Limits = field(default_factory=lambda: Limits())
    shared_fd: int | None = None  # the parent's sealed memfd, when it offers a shared data plane
    rank: int = 0  # the trainer rank that owns this child: a label on its metrics
    cwd: str | None = None  # the trainer's working directory (a spawn cannot set it)
    # `serve --openrlhf-secret-file`: OpenRLHF's route at /openrlhf/<secret>
    openrlhf_secret: str | None = None
    metrics_token: str | None = None  # `serve --metrics-token-file`: a token for GET /metrics only
    # `serve --unirl-secret-file`: UniRL's route at /unirl/<secret>/health and /score
    unirl_secret: str | None = None


def read_boot_config(data: dict[str, Any]) -> BootConfig:
    scorer = data.pop("scorer")
    data["limits"] = Limits(**data.get("limits", {}))
    config = BootConfig(
        scorer_name=scorer["name"],
        scorer_params=scorer.get("params") or {},
        revision=scorer.get("revision"),
        identity_hash=scorer.get("identity_hash"),
        catalog=scorer.get("catalog"),
        scorer_input_kind=scorer.get("input_kind"),
        **data,
    )
    if len(config.token) < 16:
        raise ValueError("token is too short")
    if config.openrlhf_secret is not None and len(config.openrlhf_secret) < 16:
        raise ValueError("the OpenRLHF route's secret is too short")
    if config.unirl_secret is not None and len(config.unirl_secret) < 16:
        raise ValueError("the UniRL route's secret is too short")
    if config.metrics_token is not None and len(config.metrics_token) < 16:
        raise ValueError("the metrics token is too short")
    if config.gpu_residency not in GPU_RESIDENCY_MODES:
        raise ValueError(f"gpu_residency must be one of {GPU_RESIDENCY_MODES}")
    return config


def _say(pipe: BinaryIO, message: dict[str, Any]) -> None:
    pipe.write((json.dumps(message) + "\n").encode())


def _fail(pipe: BinaryIO | None, code: int, message: str) -> NoReturn:
    """Say why on the readiness pipe first, then try the log; exit with the reserved code either
    way."""
    if pipe is not None:
        try:
            _say(pipe, {"ready": False, "exit_code": code, "error": message[-2000:]})
        except OSError:
            pass  # the parent is gone or gave up: the exit code still says why
    _log(f"child_runtime: {exit_codes.describe(code)}: {message}")
    os._exit(code)


def _pipe_of(raw: dict[str, Any]) -> BinaryIO | None:
    """The readiness pipe named by a boot config not read further (so its failure can be said
    there)."""
    fd = raw.get("ready_fd")
    try:
        return os.fdopen(fd, "wb", buffering=0) if isinstance(fd, int) else None
    except OSError:
        return None


def _missing_package(exc: ImportError) -> str:
    """Which package this interpreter lacks, and how to get an env that has it."""
    name = exc.name or str(exc)
    return (
        f"the scorer env's python {sys.executable} cannot run the child runtime: it lacks {name!r} "
        f"({type(exc).__name__}: {exc}). Build a scorer env (`managed-scorers envs build "
        f"NAME`, then "
        '`"env": "NAME"` in the spec), or install numpy, starlette and uvicorn into this one '
        "(where "
        "managed-scorers itself is installed: pip install 'managed-scorers[serving]')."
    )


def _log(line: str) -> None:
    """A line in the child's log; a full or broken log is not a reason to die or to hide the
    cause."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _check_routes(config: BootConfig, spec: ScorerSpec, pipe: BinaryIO) -> None:
    """A headerless route refuses at boot a scorer its framework's client cannot feed."""
    if config.openrlhf_secret is not None and spec.whole_groups:
        _fail(
            pipe,
            exit_codes.BAD_CONFIG,
            f"the OpenRLHF route refuses: {groupwise_refusal([spec.name])}",
        )
    if config.unirl_secret is not None and spec.input_kind in UNIRL_UNSENT_KINDS:
        _fail(
            pipe,
            exit_codes.BAD_CONFIG,
            f"the UniRL route refuses: UniRL's RemoteRewardBackend sends images and videos only, "
            f"and scorer {spec.name!r} takes {spec.input_kind!r}",
        )


def _build_host(config: BootConfig, pipe: BinaryIO) -> ScorerHost:
    try:
        from scorers.registry import CatalogError, UnknownScorerError, resolve_scorer
    except ImportError:  # the scorer env lacks what the scorer contract needs (numpy)
        _fail(pipe, exit_codes.SCORER_IMPORT_FAILED, traceback.format_exc())
    try:
        scorer_cls = resolve_scorer(config.scorer_name, config.catalog)
    except (UnknownScorerError, CatalogError) as exc:
        bad_name = not isinstance(exc.__cause__, ImportError)
        _fail(
            pipe, exit_codes.BAD_CONFIG if bad_name else exit_codes.SCORER_IMPORT_FAILED, str(exc)
        )
    try:
        scorer = scorer_cls(**config.scorer_params)
    except (TypeError, ValueError) as exc:
        _fail(pipe, exit_codes.BAD_CONFIG, f"scorer {config.scorer_name!r} params: {exc}")
    except Exception:  # noqa: BLE001 - a constructor must be cheap; whatever it raised is reported in full
        _fail(pipe, exit_codes.SCORER_LOAD_FAILED, traceback.format_exc())
    _check_routes(config, scorer.spec, pipe)  # before any weights load
    identity_hash = _identity(scorer, config, pipe)
    _check_pins(config, scorer.spec.name, scorer.spec.revision, identity_hash, pipe)
    try:
        host = ScorerHost(scorer, config.gpu_residency, identity_hash)
    except ValueError as exc:
        _fail(pipe, exit_codes.BAD_CONFIG, str(exc))
    declared = config.scorer_input_kind
    if declared is not None and declared != scorer.spec.input_kind:
        _fail(
            pipe,
            exit_codes.BAD_CONFIG,
            f"input_kind {declared!r} configured, but scorer {scorer.spec.name!r} takes "
            f"{scorer.spec.input_kind!r}",
        )
    _load(host, config, pipe)
    _loaded_identity(host, config, pipe)
    if config.parent_pid is None:
        _await_warm(host.scorer)
    return host


def _load(host: ScorerHost, config: BootConfig, pipe: BinaryIO) -> None:
    """The scorer's load(), then a resident one's onload (which load() is told of beforehand); any
    failure is a boot failure."""
    started = time.monotonic()
    scorer = host.scorer
    scorer.boots_resident = config.gpu_residency == "resident" and not config.boot_offloaded
    try:
        scorer.load(config.device)
        if scorer.boots_resident:
            host.onload()
    except Exception:  # noqa: BLE001 - any load failure is a boot failure, reported in full
        _fail(pipe, exit_codes.SCORER_LOAD_FAILED, traceback.format_exc())
    host.load_s = time.monotonic() - started


def _await_warm(scorer: Any) -> None:
    """`managed-scorers serve` says ready only once what load() left starting is up (or has failed,
    which the first request then says): no trainer's start overlaps a standalone server's, and its
    remote clients neither see the ready line's `warming` nor give a first request more time."""
    deadline = time.monotonic() + STANDALONE_WARM_WAIT_S
    while scorer.warming() and time.monotonic() < deadline:
        time.sleep(0.01)


def _loaded_identity(host: ScorerHost, config: BootConfig, pipe: BinaryIO) -> None:
    """A scorer whose identity is known only once loaded (a served panel: its terms' identities come
    from their children) sets its spec in load(): hashed again then, and the pins checked again."""
    loaded = _identity(host.scorer, config, pipe)
    if loaded != host.identity_hash:
        _check_pins(config, host.scorer.spec.name, host.scorer.spec.revision, loaded, pipe)
        host.identity_hash = loaded


def _identity(scorer: Any, config: BootConfig, pipe: BinaryIO) -> str:
    from scorers.identity import scorer_identity_hash

    try:
        return scorer_identity_hash(scorer, config.scorer_params)
    except ValueError as exc:  # a semantic identity that is not finite JSON
        _fail(pipe, exit_codes.BAD_CONFIG, f"scorer {config.scorer_name!r} identity: {exc}")


def _check_pins(
    config: BootConfig, name: str, revision: str, identity_hash: str, pipe: BinaryIO
) -> None:
    """A configured revision or identity hash is a pin: serving another scorer would be a silent
    lie."""
    if config.revision is not None and config.revision != revision:
        _fail(
            pipe,
            exit_codes.BAD_CONFIG,
            f"revision pin {config.revision!r} refused: scorer {name!r} in this env is "
            f"revision {revision!r}",
        )
    if config.identity_hash is not None and config.identity_hash != identity_hash:
        _fail(
            pipe,
            exit_codes.BAD_CONFIG,
            f"identity_hash pin {config.identity_hash} refused: scorer {name!r} with these "
            f"params has identity {identity_hash} (its revision, terms, diagnostics or "
            f"verdict-changing params differ)",
        )


def _enter(cwd: str | None) -> None:
    """The trainer's working directory, as Popen(cwd=...) gave it; "/" when it is gone."""
    if cwd is None:
        return
    try:
        os.chdir(cwd)
    except OSError as exc:
        _log(f"child_runtime: cannot enter the trainer's directory {cwd!r} ({exc}); running in /")
        os.chdir("/")


def _import_server(pipe: BinaryIO) -> None:
    """Import the HTTP stack, then freeze what the boot's imports built and resume the collector.

    Paused, the collector runs none of the full collections the imports would trigger (each walks
    every object made so far): about a quarter of their CPU time, which 8 children booting on two
    cores feel. Frozen, the boot's modules are never walked again. Resumed before the scorer loads,
    so that a load() making cyclic garbage (model weights in a traceback's frames) frees it as
    usual. A scorer's helper started early (scorers/early.py) does its own imports meanwhile."""
    try:
        import uvicorn  # noqa: F401
        import uvicorn.loops.auto  # noqa: F401
        import uvicorn.protocols.http.auto  # noqa: F401

        import child_runtime.app  # noqa: F401
    # the scorer env lacks the child runtime's packages: it will not boot on a retry
    except ImportError as exc:
        _fail(pipe, exit_codes.BAD_CONFIG, _missing_package(exc))
    finally:
        gc.freeze()
        gc.enable()


def _open_segment(config: BootConfig) -> tuple[ChildSegment | None, str | None]:
    """Accept the parent's shared segment, or say why requests must travel in-band."""
    if config.shared_fd is None:
        return None, "not offered by the parent"
    try:
        return ChildSegment(config.shared_fd, config.limits.max_request_bytes), None
    except OSError as exc:
        _log(f"child_runtime: shared data plane refused, using in-band bodies: {exc}")
        return None, str(exc)


def _serve(config: BootConfig, host: ScorerHost, pipe: BinaryIO, timings: dict[str, float]) -> None:
    from child_runtime import access_log

    standalone = config.parent_pid is None  # `managed-scorers serve`: a person reads its stderr
    segment, segment_error = _open_segment(config)
    gate = ConnectionGate(
        config.limits.max_pending_connections, config.limits.pending_connection_timeout_s
    )

    def ready() -> dict[str, Any]:
        if standalone:  # the readiness line goes to stdout, unchanged; the person reads stderr
            access_log.listening(listener)
        return _ready_line(config, host, listener, segment, segment_error, timings)

    app = _child_app(config, host, segment, gate, lambda: setattr(server, "should_exit", True))
    if standalone:
        app = access_log.AccessLog(app)
    server = _announcing_server(_uvicorn_config(app, gate, config.graceful_timeout_s), pipe, ready)
    listener = socket.socket(fileno=config.listen_fd)  # the one socket we pass to run()
    if config.parent_pid is None:
        _stop_gracefully_on_signals()
    server.run(sockets=[listener])  # not asyncio.run(): that would ignore the loop factory


def _ready_line(
    config: BootConfig,
    host: ScorerHost,
    listener: socket.socket,
    segment: ChildSegment | None,
    segment_error: str | None,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The readiness line, said once the server listens (in its event loop, whose type it names)."""
    return {
        "ready": True,
        "pid": os.getpid(),
        "port": listener.getsockname()[1],
        **host.catalog_entry(),
        "shared_memory": segment is not None,
        "shared_memory_error": segment_error,
        "openrlhf_route": config.openrlhf_secret is not None,
        "unirl_route": config.unirl_secret is not None,
        "event_loop": type(asyncio.get_running_loop()).__module__,
        # the first request waits for what load() left starting
        "warming": host.scorer.warming(),
        **timings,
    }


def _child_app(
    config: BootConfig,
    host: ScorerHost,
    segment: ChildSegment | None,
    gate: ConnectionGate,
    request_exit: Callable[[], None],
) -> ASGIApp:
    """The child's endpoints for this boot config; `request_exit` stops the server (/shutdown)."""
    # imported by _import_server, which says a missing package
    from child_runtime.app import build_app

    return build_app(
        host,
        config.token,
        request_exit=request_exit,
        limits=config.limits,
        segment=segment,
        gate=gate,
        rank=config.rank,
        route_secrets=_route_secrets(config),
        metrics_token=config.metrics_token,
    )


def _route_secrets(config: BootConfig) -> dict[str, str]:
    """The headerless routes this server serves, by route, with their secrets."""
    from child_runtime.protocol import openrlhf, unirl

    given = {openrlhf.ROUTE: config.openrlhf_secret, unirl.ROUTE: config.unirl_secret}
    return {route: secret for route, secret in given.items() if secret is not None}


def _stop_gracefully_on_signals() -> None:
    """`managed-scorers serve`: a SIGTERM or Ctrl-C is a graceful stop, exit 0.

    uvicorn drains, restores this handler and raises the signal it caught again: here it ends the
    wait."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda signum, frame: None)


def _uvicorn_config(
    app: ASGIApp, gate: ConnectionGate, graceful_timeout_s: float
) -> uvicorn.Config:
    """uvicorn's settings for our own parent: loop/http "auto" (uvloop and httptools where the env
    has them); the parent reconnects only when it must, so idle keep-alive connections are never
    reaped."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        loop="auto",
        http=gated(AutoHTTPProtocol, gate),
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=graceful_timeout_s,  # type: ignore[arg-type]  # used as a float timeout
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def _announcing_server(
    uv_config: uvicorn.Config, pipe: BinaryIO, ready: Callable[[], dict[str, Any]]
) -> uvicorn.Server:
    """A uvicorn server that says `ready()` on the readiness pipe, then closes it, once it
    listens."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            _say(pipe, ready())
            pipe.close()

    return _Server(uv_config)


def main() -> None:
    faulthandler.enable()
    started = time.monotonic()
    if sys.version_info < (3, 11):  # noqa: UP036 - a scorer env may be older; PYTHONSAFEPATH needs 3.11
        _fail(
            None,
            exit_codes.BAD_CONFIG,
            f"the scorer env's Python is {sys.version.split()[0]}; 3.11+ is needed",
        )
    # `managed-scorers serve`: lives until SIGTERM, not with a parent
    standalone = sys.argv[1:] == ["--standalone"]
    parent = os.getppid()
    if not standalone:
        lifeline.install(parent)  # before anything that can block, reading the boot config included
    config = _read_config(standalone, parent)
    if not standalone:
        boot.close_strays(
            {
                config.listen_fd,
                config.ready_fd,
                *([] if config.shared_fd is None else [config.shared_fd]),
            }
        )
        _enter(config.cwd)
    pipe = os.fdopen(config.ready_fd, "wb", buffering=0)
    _import_server(pipe)
    host = _build_host(config, pipe)
    timings = {"boot_s": round(time.monotonic() - started, 4), "load_s": round(host.load_s, 4)}
    try:
        _serve(config, host, pipe, timings)
    finally:
        host.close(config.graceful_timeout_s)
    _exit_without_teardown()


def _read_config(standalone: bool, parent: int) -> BootConfig:
    """The boot config from stdin, checked against how this child was started; a bad one exits."""
    try:
        raw = boot.read_frame(sys.stdin.fileno())
    except (ValueError, KeyError, TypeError) as exc:
        _fail(None, exit_codes.BAD_CONFIG, f"cannot read boot config from stdin: {exc!r}")
    if _RUNTIME_IMPORT_ERROR is not None:
        _fail(_pipe_of(raw), exit_codes.BAD_CONFIG, _missing_package(_RUNTIME_IMPORT_ERROR))
    try:
        config = read_boot_config(raw)
    except (ValueError, KeyError, TypeError) as exc:
        _fail(None, exit_codes.BAD_CONFIG, f"cannot read boot config from stdin: {exc!r}")
    # stdin is the memfd that held the token: nothing here, nor a subprocess, may read it again
    if standalone:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    if standalone and config.parent_pid is not None:
        _fail(None, exit_codes.BAD_CONFIG, "--standalone takes a boot config without parent_pid")
    if not standalone and config.parent_pid != parent:
        _fail(
            None,
            exit_codes.BAD_CONFIG,
            f"spawned by pid {config.parent_pid}, which was gone before it could be watched",
        )
    return config


def _exit_without_teardown() -> NoReturn:
    """Everything this child owns is closed: skip interpreter teardown (a second with torch
    loaded)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass  # a full log disk does not turn a clean exit into a failure
    os._exit(exit_codes.OK)


if __name__ == "__main__":
    main()

"""Config models for the managed backend; Hydra can build each one from a `_target_` recipe."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    field_validator,
    model_validator,
)

from scorers.base import ScorerSpec
from scorers.diagnostics import NAME as METRIC_NAME
from scorers.registry import declared_spec
from supervisor import scorer_envs

InputKind = Literal["text", "image", "image_edit", "video", "audio"]
# What decides the child's import path: set only by managed-scorers (see
# supervisor.child.import_root).
RESERVED_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONPLATLIBDIR",
        "PYTHONEXECUTABLE",
        "VIRTUAL_ENV",
    }
)


def _plain(value: Any) -> Any:
    """OmegaConf containers (from Hydra) to plain dicts and lists, recursively."""
    if isinstance(value, BaseModel):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def settings(
    config: BaseModel, flatten: Collection[str] = (), leave: Collection[str] = ()
) -> dict[str, Any]:
    """A config model's fields by name, as keywords of the backend it describes (each setting is
    stated once, in its model): the fields of the nested models named in `flatten` lifted beside the
    others, those named in `leave` (not the backend's to take) left out. A name kept twice is
    refused: one name, one setting."""
    found: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        nested = (
            {inner: getattr(value, inner) for inner in type(value).model_fields}
            if name in flatten
            else {name: value}
        )
        for key, item in nested.items():
            if key in leave:
                continue
            if key in found:
                raise TypeError(
                    f"{type(config).__name__}: {key!r} is both a field and a field of {name!r}"
                )
            found[key] = item
    return found


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: Any) -> Any:
        return _plain(data)


class ProcessConfig(_Model):
    """How to launch and bound the child process.

    The child's import path is the scorer env plus this project's own packages, nothing
    of the trainer's environment; `extra_import_paths` (directories, after ours) is the
    one way to hand it your own scorer modules (dotted-path scorers).
    """

    python_executable: Path
    extra_import_paths: list[Path] = Field(default_factory=list)
    startup_timeout: float = Field(default=120.0, gt=0)
    request_timeout: float = Field(default=600.0, gt=0)
    shutdown_timeout: float = Field(default=10.0, gt=0)
    log_dir: Path | None = None
    keep_logs: int = Field(default=20, ge=1)  # per scorer and rank; the oldest go at each launch
    keep_clean_logs: bool = False  # False: a child that exits cleanly at close() leaves no log
    env: dict[str, str] = Field(default_factory=dict)
    local_rank: int | None = Field(default=None, ge=0)
    visible_devices: str | None = None
    allow_multiple_gpus: bool = False

    @field_validator("python_executable")
    @classmethod
    def _executable(cls, value: Path) -> Path:
        """Resolved once, against the current directory (symlinks kept: a venv's python is one)."""
        absolute = Path(os.path.abspath(value))
        if not absolute.is_file() or not os.access(absolute, os.X_OK):
            where = (
                ""
                if value.is_absolute()
                else f" (resolved against the current directory {os.getcwd()})"
            )
            raise ValueError(
                f"{absolute}{where} is not an executable file (build a scorer env: "
                f"managed-scorers envs build NAME)"
            )
        return absolute

    @field_validator("extra_import_paths")
    @classmethod
    def _import_paths(cls, values: list[Path]) -> list[Path]:
        absolute = [Path(os.path.abspath(value)) for value in values]
        missing = [str(path) for path in absolute if not path.is_dir()]
        if missing:
            raise ValueError(f"extra_import_paths must be existing directories: {missing}")
        return absolute

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(RESERVED_ENV & set(value))
        if reserved:
            raise ValueError(
                f"env may not set {reserved}: the child's import path is the scorer env plus this "
                "project's packages; list your own modules' directories in extra_import_paths"
            )
        return value


class ScorerConfig(_Model):
    """Which scorer the child builds, with what params.

    `revision` and `identity_hash` are pins, never overrides: a child whose scorer declares
    another revision, or whose catalog identity differs, is refused at start. `catalog` is a
    custom catalog factory's dotted path (it must be importable in the child too: list its
    directory in `process.extra_import_paths`).
    """

    name: str = Field(min_length=1)
    # when not given: the scorer's own, where it resolves here (else text)
    input_kind: InputKind = "text"
    params: dict[str, JsonValue] = Field(default_factory=dict)
    revision: str | None = None
    identity_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    catalog: str | None = None
    device: str = "cpu"

    @model_validator(mode="before")
    @classmethod
    def _declared_kind(cls, data: Any) -> Any:
        """An image scorer named without `input_kind` is an image scorer, not a text one that cannot
        boot."""
        data = _plain(data)
        if isinstance(data, Mapping) and "input_kind" not in data:
            kind = _scorer_kind(data)
            if kind is not None:
                return {**data, "input_kind": kind}
        return data


class ClientConfig(_Model):
    """How the parent talks to the child and what it demands of the answers."""

    required_rewards: list[str] = Field(default_factory=list)
    weights: dict[str, float] = Field(default_factory=dict)
    input_kind: InputKind = "text"
    request_batch_size: int = Field(default=64, gt=0)
    # candidates per group; a request may declare it instead
    group_size: int | None = Field(default=None, gt=0)
    # Arrays of a request totalling at least this many bytes travel through a shared-memory
    # segment (negotiated at start-up; in-band when the child or platform cannot). None: never.
    shared_memory_min_bytes: int | None = Field(default=64 * 1024, ge=0)
    # time every chunk of every call, as this process sees it (transport and waits included):
    # `runtime.chunk_s` (a histogram) and `runtime.slowest_chunks` in the response's diagnostics.
    # Off by default (two more diagnostics per term); the `score` CLI turns it on.
    time_chunks: bool = False

    @model_validator(mode="after")
    def _weights_named(self) -> ClientConfig:
        unknown = set(self.weights) - set(self.required_rewards)
        if self.required_rewards and unknown:
            raise ValueError(f"weights name rewards not in required_rewards: {sorted(unknown)}")
        return self


class RestartPolicy(_Model):
    """After a crash or a deadline the failing call raises; the next call restarts the child.

    More than `max_restarts` restarts within `window_s` is a crash loop and stops with
    ScorerCrashLoop. A child that cannot boot (reserved exit codes) is never restarted.
    """

    max_restarts: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=1.0, ge=0, le=600)
    window_s: float = Field(default=600.0, gt=0)


class LimitsConfig(_Model):
    """What the child accepts; anything beyond is a 413/400 naming the field, never a crash."""

    max_request_bytes: int = Field(default=1 << 30, gt=0)
    max_items: int = Field(default=4096, gt=0)
    max_text_chars: int = Field(default=1 << 20, gt=0)
    max_media_bytes: int = Field(default=512 << 20, gt=0)
    # The body cap of serve's OpenRLHF route (JSON; its parse may build 4x this, see
    # child_runtime/protocol/bounded_json). OpenRLHF 0.11.2 posts one sample per call: a query of
    # at most its --data.max_len tokens, its prompt again, a label. 128k tokens of ~4 characters,
    # each \uXXXX-escaped (6 bytes: aiohttp's json.dumps writes ASCII), twice: ~6 MiB; 16 MiB leaves
    # room for a large label; serve --openrlhf-max-request-bytes sets it.
    openrlhf_max_request_bytes: int = Field(default=16 << 20, gt=0)
    # The body cap of /score's JSON form (UniRL's protocol: images as base64, 4/3 of their bytes). A
    # 1024x1024 JPEG at UniRL's quality 95 is 0.75-1.6 MiB as base64 (measured: smooth to pure
    # noise), a PNG 3-4 MiB: 128 MiB carries a 64-image DP shard of worst-case JPEGs (UniRL posts
    # one shard per call unless request_batch_size says less) or 32 PNGs. Base64 parses at ~2 bytes
    # a byte, well within the parse's 4x; the decoded pixels count against max_request_bytes, as a
    # frame's do.
    json_max_request_bytes: int = Field(default=128 << 20, gt=0)
    # Connections that have not sent an authenticated request: how many may wait, and for how
    # long, before the child closes them (another local user cannot exhaust its descriptors).
    max_pending_connections: int = Field(default=64, gt=0)
    pending_connection_timeout_s: float = Field(default=10.0, gt=0)


class ReplicasConfig(_Model):
    """Children of one scorer behind one term: one per listed device (CUDA ordinals as this process
    sees them: `0` is the first GPU its launcher gave it), or `count` of them narrowed like a
    single child (N on CPU). A batch is split across them, never splitting a group:
    `even` cuts it into equal runs, `least_loaded` gives each group to the replica with the
    fewest items in flight (calls from several threads)."""

    count: int = Field(default=1, ge=1, le=256)
    devices: list[str] = Field(default_factory=list)
    split: Literal["even", "least_loaded"] = "even"

    @model_validator(mode="after")
    def _devices(self) -> ReplicasConfig:
        if self.devices:
            if self.count not in (1, len(self.devices)):
                raise ValueError(
                    f"count {self.count} != {len(self.devices)} devices: give one or the other"
                )
            if len(set(self.devices)) != len(self.devices) or any(
                "," in d or not d.strip() for d in self.devices
            ):
                raise ValueError(f"devices must be distinct single GPUs, got {self.devices}")
        return self

    @property
    def size(self) -> int:
        return len(self.devices) or self.count


class ManagedScorerProcessSpec(_Model):
    """Process ownership, scorer construction and client semantics, kept apart.

    The child's python is `process.python_executable`, or the built scorer env named by `env`
    (`managed-scorers envs build NAME`), or, with neither, the env the scorer declares
    (`ScorerSpec.env`: `math` for math_verify)."""

    kind: Literal["managed"] = "managed"
    env: str | None = None
    process: ProcessConfig
    scorer: ScorerConfig
    client: ClientConfig = Field(default_factory=ClientConfig)
    gpu_residency: Literal["resident", "per_call"] = "resident"
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    replicas: ReplicasConfig = Field(default_factory=ReplicasConfig)

    @model_validator(mode="before")
    @classmethod
    def _named_env(cls, data: Any) -> Any:
        """Fill `process.python_executable` from the named (or the scorer's declared) scorer env,
        and the client's input kind from the scorer's."""
        data = _client_of_scorer_kind(_plain(data))
        if not isinstance(data, Mapping):
            return data
        process = data.get("process")
        process = (
            process.model_dump() if isinstance(process, ProcessConfig) else dict(process or {})
        )
        if process.get("python_executable") is not None:
            named = data.get("env")
            given = Path(os.path.abspath(process["python_executable"]))
            # agreeing: a dumped spec read back
            if named is not None and given != scorer_envs.env_python(named):
                raise ValueError(
                    "give process.python_executable or env (a scorer env by name), not both"
                )
            return data
        name = data.get("env") or _declared_env(data.get("scorer"))
        if name is None:
            raise ValueError(
                "the child needs a python: process.python_executable, or env (a scorer env "
                "by name: "
                f"{', '.join(scorer_envs.spec_names())})"
            )
        process["python_executable"] = scorer_envs.env_python(name)
        return {**data, "env": name, "process": process}

    @model_validator(mode="after")
    def _kinds_agree(self) -> ManagedScorerProcessSpec:
        if self.client.input_kind != self.scorer.input_kind:
            raise ValueError(
                f"client.input_kind {self.client.input_kind!r} != scorer.input_kind "
                f"{self.scorer.input_kind!r}"
            )
        return self


def _declared(scorer: Any) -> ScorerSpec | None:
    """The spec a built-in (or catalog) scorer declares, if the scorer can be named here (a scorer
    only the child can import says nothing: it must name its env and input kind)."""
    if isinstance(scorer, ScorerConfig):
        return declared_spec(scorer.name, scorer.catalog)
    if isinstance(scorer, Mapping) and isinstance(scorer.get("name"), str):
        catalog = scorer.get("catalog")
        return declared_spec(scorer["name"], catalog if isinstance(catalog, str) else None)
    return None


def _declared_env(scorer: Any) -> str | None:
    spec = _declared(scorer)
    return None if spec is None else spec.env


def _client_of_scorer_kind(data: Any) -> Any:
    """A client without its own `input_kind` takes the scorer's (given, or declared by it)."""
    if not isinstance(data, Mapping) or "scorer" not in data:
        return data
    client = data.get("client")
    if isinstance(client, ClientConfig):
        if "input_kind" in client.model_fields_set:
            return data
        client = client.model_dump(exclude={"input_kind"}, exclude_unset=True)
    client = dict(client or {})
    if "input_kind" in client:
        return data
    kind = _scorer_kind(data["scorer"])
    return data if kind is None else {**data, "client": {**client, "input_kind": kind}}


def _scorer_kind(scorer: Any) -> Any:
    """The input kind a scorer config gives, else the one its scorer declares; None when neither
    says."""
    if isinstance(scorer, ScorerConfig):
        return scorer.input_kind
    if isinstance(scorer, Mapping) and "input_kind" in scorer:
        return scorer["input_kind"]
    spec = _declared(scorer)
    return None if spec is None else spec.input_kind


class LocalBackendConfig(_Model):
    """A scorer in the trainer's own process (LocalRewardBackend)."""

    kind: Literal["local"] = "local"
    scorer: ScorerConfig
    client: ClientConfig = Field(default_factory=ClientConfig)

    @model_validator(mode="before")
    @classmethod
    def _client_kind(cls, data: Any) -> Any:
        return _client_of_scorer_kind(_plain(data))

    @model_validator(mode="after")
    def _kinds_agree(self) -> LocalBackendConfig:
        if self.client.input_kind != self.scorer.input_kind:
            raise ValueError(
                f"client.input_kind {self.client.input_kind!r} != scorer.input_kind "
                f"{self.scorer.input_kind!r}"
            )
        return self


class RemoteBackendConfig(_Model):
    """A scorer server someone else started (RemoteRewardBackend). The token is read from the
    environment variable `token_env`: the variable's name is configuration, its value never is."""

    kind: Literal["remote"] = "remote"
    # one server, or several of one scorer (`base_urls` is the same list): MultiRemoteRewardBackend
    base_url: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    )
    token_env: str | None = None
    # each exchange as a whole, retries included
    request_timeout: float = Field(default=600.0, gt=0)
    # an answer past this (read, never decoded) fails
    max_answer_bytes: int = Field(default=64 * 2**20, ge=1024)
    # refused before it is sent (None: the server judges)
    max_request_bytes: int | None = Field(default=None, gt=0)
    max_retries: int = Field(default=3, ge=0)  # tries after the first, of idempotent exchanges only
    # the first pause between tries, doubling up to the cap
    retry_backoff_s: float = Field(default=0.1, gt=0)
    retry_backoff_cap_s: float = Field(default=2.0, gt=0)
    revision: str | None = None
    identity_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    client: ClientConfig = Field(default_factory=ClientConfig)
    # several servers only: how long a call waits for a server's /health before passing it over, and
    # how often a server passed over (a failed probe or chunk) is asked again, in the background
    probe_timeout_s: float = Field(default=2.0, gt=0)
    probe_interval_s: float = Field(default=1.0, gt=0)
    # several servers only: a chunk not answered within the p95 of the recent chunks' latencies (a
    # quarter of request_timeout until 10 are known) is sent once more to another healthy server;
    # the first answer wins, the other request is closed
    hedge: bool = True

    @model_validator(mode="before")
    @classmethod
    def _base_urls(cls, data: Any) -> Any:
        """`base_urls: [..]` is another spelling of `base_url: [..]`."""
        if isinstance(data, Mapping) and "base_urls" in data:
            if "base_url" in data:
                raise ValueError("give base_url or base_urls, not both")
            data = {
                ("base_url" if key == "base_urls" else key): value for key, value in data.items()
            }
        return data

    @model_validator(mode="after")
    def _backoff(self) -> RemoteBackendConfig:
        if self.retry_backoff_s > self.retry_backoff_cap_s:
            raise ValueError(
                f"retry_backoff_s {self.retry_backoff_s} > retry_backoff_cap_s "
                f"{self.retry_backoff_cap_s}"
            )
        return self

    @property
    def urls(self) -> list[str]:
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)


class JobBackendConfig(_Model):
    """An asynchronous job service (JobRewardBackend): one enqueue per item, pulled until done. The
    token is read from the environment variable `token_env`, as for a remote server."""

    kind: Literal["jobs"] = "jobs"
    base_url: str = Field(min_length=1)
    token_env: str | None = None
    media_type: Literal["video", "image"] = "video"
    fps: float | None = Field(default=None, gt=0)  # required for video: sent with every enqueue
    name: str = "job_service"
    term: str = "score"
    revision: str | None = None
    request_timeout: float = Field(default=600.0, gt=0)  # one absolute deadline for a whole request
    enqueue_timeout: float = Field(default=120.0, gt=0)
    pull_timeout: float = Field(default=30.0, gt=0)
    poll_interval_s: float = Field(default=0.5, gt=0)
    poll_backoff_cap_s: float = Field(default=5.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1, le=16)
    spool_dir: str | None = None  # None: the platform's temporary directory
    enqueue_path: str = "/enqueue"
    result_path: str = "/result/{uuid}"
    score_key: str = "scores"
    # an answer past this (read, never decoded) fails
    max_answer_bytes: int = Field(default=2**20, ge=1024)
    # ended items' job ids kept to refuse one given twice
    remembered_job_ids: int = Field(default=16384, ge=0)

    @property
    def input_kind(self) -> InputKind:
        return self.media_type

    @model_validator(mode="after")
    def _video_has_fps(self) -> JobBackendConfig:
        if self.media_type == "video" and self.fps is None:
            raise ValueError("a video job service needs fps (sent with every enqueue)")
        return self


def _backend_kind(value: Any) -> str:
    """No `kind`: a backend that names a process or a scorer env is managed (a child); else
    local."""
    if isinstance(value, Mapping):
        return str(
            value.get("kind") or ("managed" if "process" in value or "env" in value else "local")
        )
    return str(getattr(value, "kind", "local"))


BackendConfig = Annotated[
    Annotated[ManagedScorerProcessSpec, Tag("managed")]
    | Annotated[LocalBackendConfig, Tag("local")]
    | Annotated[RemoteBackendConfig, Tag("remote")]
    | Annotated[JobBackendConfig, Tag("jobs")],
    Discriminator(_backend_kind),
]


class TermConfig(_Model):
    """One panel term: a backend, the value taken from it (`component`: one of its scorer's
    terms; None: its reward), a weight (a number or `{data_source: weight}`, "*" for the
    rest), whether its failure is fatal, and the datasets it applies to (None: all)."""

    name: str = Field(pattern=METRIC_NAME.pattern)  # a metric path segment, as the panel checks it
    backend: BackendConfig
    weight: float | dict[str, float] = 1.0
    required: bool = True
    applicable_datasets: list[str] | None = Field(default=None, min_length=1)
    component: str | None = None


class PanelConfig(_Model):
    """Named terms combined as `sum(weight * term)`; `group_size` applies to every request."""

    terms: list[TermConfig] = Field(min_length=1)
    group_size: int | None = Field(default=None, gt=0)
    # an optional term failing on some members of a group: fails for the whole group, or refuses the
    # call
    group_failures: Literal["whole_group", "raise"] = "whole_group"

    @model_validator(mode="after")
    def _unique_names(self) -> PanelConfig:
        names = [term.name for term in self.terms]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"term names {duplicates} are used more than once")
        for term in self.terms:
            client = getattr(term.backend, "client", None)
            configured = client.group_size if client is not None else None
            if (
                self.group_size is not None
                and configured is not None
                and configured != self.group_size
            ):
                raise ValueError(
                    f"term {term.name!r}: its backend's client.group_size {configured} "
                    f"differs from the panel's group_size {self.group_size} (every call "
                    f"would be refused)"
                )
        return self

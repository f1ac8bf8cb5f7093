"""Config models for the managed backend; Hydra can build each one from a `_target_` recipe."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

InputKind = Literal["text", "image", "image_edit", "video"]
SERVICE_ROOT = Path(__file__).resolve().parent.parent


def _plain(value: Any) -> Any:
    """OmegaConf containers (from Hydra) to plain dicts and lists, recursively."""
    if isinstance(value, BaseModel):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: Any) -> Any:
        return _plain(data)


class ProcessConfig(_Model):
    """How to launch and bound the child process."""

    python_executable: Path
    service_root: Path = SERVICE_ROOT
    startup_timeout: float = Field(default=120.0, gt=0)
    request_timeout: float = Field(default=600.0, gt=0)
    shutdown_timeout: float = Field(default=10.0, gt=0)
    log_dir: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)
    local_rank: int | None = Field(default=None, ge=0)
    visible_devices: str | None = None
    allow_multiple_gpus: bool = False

    @field_validator("python_executable")
    @classmethod
    def _executable(cls, value: Path) -> Path:
        if not value.is_file() or not os.access(value, os.X_OK):
            raise ValueError(f"{value} is not an executable file (build the scorer env: make env-NAME)")
        return value

    @field_validator("service_root")
    @classmethod
    def _root(cls, value: Path) -> Path:
        if not (value / "child_runtime" / "__main__.py").is_file():
            raise ValueError(f"{value} is not a service root (no child_runtime/__main__.py)")
        return value.resolve()


class ScorerConfig(_Model):
    """Which scorer the child builds, with what params."""

    name: str = Field(min_length=1)
    input_kind: InputKind = "text"
    params: dict[str, JsonValue] = Field(default_factory=dict)
    revision: str | None = None
    device: str = "cpu"


class ClientConfig(_Model):
    """How the parent talks to the child and what it demands of the answers."""

    required_rewards: list[str] = Field(default_factory=list)
    weights: dict[str, float] = Field(default_factory=dict)
    input_kind: InputKind = "text"
    request_batch_size: int = Field(default=64, gt=0)
    # Arrays of a request totalling at least this many bytes travel through a shared-memory
    # segment (negotiated at start-up; in-band when the child or platform cannot). None: never.
    shared_memory_min_bytes: int | None = Field(default=64 * 1024, ge=0)

    @model_validator(mode="after")
    def _weights_named(self) -> "ClientConfig":
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


class ManagedScorerProcessSpec(_Model):
    """Process ownership, scorer construction and client semantics, kept apart."""

    process: ProcessConfig
    scorer: ScorerConfig
    client: ClientConfig = Field(default_factory=ClientConfig)
    gpu_residency: Literal["resident", "per_call"] = "resident"
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)

    @model_validator(mode="after")
    def _kinds_agree(self) -> "ManagedScorerProcessSpec":
        if self.client.input_kind != self.scorer.input_kind:
            raise ValueError(
                f"client.input_kind {self.client.input_kind!r} != scorer.input_kind {self.scorer.input_kind!r}"
            )
        return self


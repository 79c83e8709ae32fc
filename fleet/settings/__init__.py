"""One settings object that every fleet process reads (workers, producer, status, Flower).

Celery's Redis transport emulates acks with a visibility timeout, and any client with a
shorter one redelivers running chunks; building every process from this one object is
what keeps the transport options identical everywhere.

Sources, highest first: CLI flags (init kwargs), environment (`FLEET_`, nested `__`),
`fleet.toml` (or the file named by FLEET_CONFIG), defaults.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fleet.settings.datasetinput import InputSettings
from fleet.settings.engine import EngineSettings
from fleet.settings.hf import HfSettings
from fleet.settings.repetition import RepetitionSettings
from fleet.settings.sections import (
    LEGACY_NAMES,
    FailureSettings,
    LeaseSettings,
    MonitorSettings,
    SpoolSettings,
    StoreClientSettings,
    nest_legacy,
)
from fleet.settings.server import ServerSettings
from fleet.settings.sglang import DEFAULT_SGLANG_RUNNING, SglangSettings
from fleet.settings.sim import SimSettings
from fleet.settings.vllm import VllmSettings

#: re-exported: callers name the engine sections from here
__all__ = [
    "DEFAULT_SGLANG_RUNNING", "ENGINE_SECTIONS", "PLANNED_ENGINE", "EngineName", "EngineSettings", "FailureSettings",
    "HfSettings", "LeaseSettings", "MonitorSettings", "RepetitionSettings", "SamplingSettings", "ServerSettings",
    "Settings", "SglangSettings", "SimSettings", "SpoolSettings", "StoreClientSettings", "VllmSettings",
    "load_settings",
]

DEFAULT_DATA_DIR = Path("fleet-data")
DEFAULT_CHUNK_SIZE = 256
#: RunPod and Vast.ai give an interruptible instance seconds between SIGTERM and SIGKILL
DEFAULT_GRACE_S = 3.0
DEFAULT_CHECKPOINT_INTERVAL_S = 30.0
#: No token for this long while requests run is a hung engine: twice SGLang's own watchdog_timeout
#: (300 s), far beyond a prefill of the reference job's prompts (seconds on a B200)
DEFAULT_STALL_S = 600.0
#: K x C / S, the requests a worker keeps in flight per engine slot. The occupancy table
#: (and `fleet bench projection` at the reference shape) gives 0.81 busy at 8 and 0.97-0.99
#: at 16, so the default is 16.
IN_FLIGHT_FACTOR = 16
#: Every engine's settings section by its name (FLEET_<NAME>__*): one line per engine here, one in
#: fleet.engines.registry (its spec). The sections live in this part, so settings never import engines.
ENGINE_SECTIONS: dict[str, type[EngineSettings]] = {
    "sim": SimSettings,
    "hf": HfSettings,
    "sglang": SglangSettings,
    "vllm": VllmSettings,
    "server": ServerSettings,
}
#: the engine whose capacity model `fleet plan --model` uses unless told another (fleet.model.capacity)
PLANNED_ENGINE = "sglang"
#: "sim", "hf", "sglang", "vllm"
EngineName = Literal[tuple(ENGINE_SECTIONS)]  # type: ignore[valid-type]


class SamplingSettings(BaseModel):
    """Job-wide sampling; unset values come from the model's generation_config.json."""

    temperature: float | None = Field(None, ge=0, description="0 = greedy")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    top_k: int | None = Field(None, ge=-1, description="candidates per step; 0 or -1 = off")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below this fraction of the top one; 0 = off")
    repetition_penalty: float | None = Field(None, gt=0, le=2, description="1 = none (SGLang's range)")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="0 = none")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="0 = none")
    max_tokens: int | None = Field(
        None, ge=1,
        description="output tokens per sample; unset: the model's recommended length (fleet.model.outputlen)",
    )
    n: int = Field(1, ge=1, description="samples per input record (each an output record)")
    stop: list[str] | None = Field(None, description="strings that end a sample (not included in the output)")


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEET_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    broker_url: str | None = Field(None, description="redis:// or rediss://; unset for `fleet run` = local Redis")
    store_url: str | None = Field(None, description="directory, file://..., s3://bucket/prefix or gs://bucket/prefix")
    data_dir: Path = Field(DEFAULT_DATA_DIR, description="local runtime files: store default, local Redis")
    engine: EngineName = Field("sim", description=f"the engine: {', '.join(ENGINE_SECTIONS)} (architecture: Engines)")
    model: str | None = Field(None, description="model directory (or hub id where a hub is reachable)")
    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1, description="records per chunk")
    slots: int | None = Field(None, ge=1, description="K chunks a worker runs at once; default derived")
    max_slots: int = Field(
        32, ge=1, description="upper bound of the derived K (past ~67 a worker's broker cost crosses its "
        "targets: docs/architecture.md, Scaling)"
    )
    in_flight_factor: float = Field(
        IN_FLIGHT_FACTOR, gt=0, description="derived K = ceil(factor x S / C): requests in flight per engine slot"
    )
    seed: int = Field(0, description="job seed; per-record seeds derive from it")
    enable_thinking: bool = Field(True, description="chat template's thinking mode, where the model has one")
    turns: Literal["last", "all"] = Field(
        "last",
        description="conversations with assistant turns: last generates the turn after the last user turn and "
        "keeps earlier assistant turns as given; all generates every assistant turn in order, each prompted with "
        "the turns generated before it (fleet/model/turns.py)",
    )
    return_output_ids: bool = Field(
        True,
        description="store each sample's output token ids (the tokens export needs them; about 4-6 KB a record "
        "at 1,800 output tokens); false keeps results text only",
    )
    queue: str = Field("fleet", description="Celery queue name")

    lease: LeaseSettings = Field(default_factory=LeaseSettings, description="a chunk's lease and the recovery round")
    failure: FailureSettings = Field(default_factory=FailureSettings, description="the fleet's failure policy")
    grace_s: float = Field(
        DEFAULT_GRACE_S, ge=0, description="on SIGTERM, seconds in which samples about to finish may finish; "
        "then running chunks are handed back with every sample's ids checkpointed (nothing made is lost)"
    )
    notice_s: float | None = Field(
        None, ge=0,
        description="seconds a preemption's SIGTERM leaves before its SIGKILL, where the cloud says: GCP's and "
        "Azure's spot VMs 30, AWS's spot instances 120 (RunPod and Vast.ai: a few, grace_s's default). The worker "
        "flushes at once, then generates on until the last moment that leaves room for a hand-over as long as "
        "that flush measured (fleet/worker/process/notice.py). Unset: not known; the hand-over begins after "
        "grace_s",
    )
    stall_s: float = Field(
        DEFAULT_STALL_S, gt=0,
        description="seconds an engine may make no token while requests run before the worker declares it hung: "
        "its chunks are handed back (no attempt spent, their ids kept), its process tree killed and restarted. "
        "Longer than the slowest prefill a job's prompts need, than `stream_interval` decode steps (the clock "
        "ticks on each delta) and than SGLang's own watchdog (300 s)",
    )
    checkpoint_interval_s: float = Field(
        DEFAULT_CHECKPOINT_INTERVAL_S, gt=0,
        description="seconds between a running chunk's checkpoints: a SIGKILL costs at most this much of each "
        "running sample; each costs one store write per running chunk (K per worker), so halving it doubles "
        "the PUTs (30 s, K=16, 6 GPUs: ~3 PUTs/s, ~$1.3/day at S3's $0.005 per 1,000)",
    )
    resume: Literal["token", "row", "chunk"] = Field(
        "token",
        description="what a stopped chunk's next run keeps: token, every sample's ids (a running sample continues "
        "from its own tokens); row, finished records only (a running sample starts again from token 0, as Ray "
        "Data LLM, Curator and datatrove resume); chunk, nothing (no checkpoints: the chunk runs again whole, "
        "as NeMo-Skills resumes). row and chunk are the peers' ways, for `fleet bench preemption`",
    )

    spool: SpoolSettings = Field(default_factory=SpoolSettings, description="a worker's spool for refused writes")

    assist: bool = Field(True, description="idle workers help straggler chunks once the queue is empty")
    assist_poll_s: float = Field(2.0, gt=0, description="seconds between an idle worker's looks for a straggler")

    store_client: StoreClientSettings = Field(
        default_factory=StoreClientSettings, description="how fleet talks to an object store, every scheme alike"
    )
    monitor: MonitorSettings = Field(default_factory=MonitorSettings, description="prices, Flower, Prometheus")

    sampling: SamplingSettings = Field(default_factory=SamplingSettings, description="job-wide sampling")
    repetition: RepetitionSettings = Field(
        default_factory=RepetitionSettings,
        description="the repetition stop: a request whose output ends in an exact cycle of a short block is aborted "
        "(finish reason `repetition`); part of the job's configuration",
    )
    input: InputSettings = Field(
        default_factory=InputSettings,
        description="which records of a dataset input to read: config, split, revision, column names",
    )
    # One section per engine is added below, from ENGINE_SECTIONS.

    @field_validator("broker_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        """A URL redis-py can open (the workers' Celery transport and fleet's own client both do), told
        when the settings load rather than as a traceback from the first connection."""
        if url:
            from redis.connection import parse_url

            parse_url(url)  # its ValueError names the schemes it takes, or the part that is wrong
        return url

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("FLEET_CONFIG", "fleet.toml"))
        toml = TomlConfigSettingsSource(settings_cls, toml_file)
        # the flat names before sections still land in their sections, each at its own source's rank
        return (_LegacyNames(settings_cls, init_settings), env_settings, _LegacyEnv(settings_cls),
                _LegacyNames(settings_cls, toml))

    # -- derived values, computed in one place -------------------------------------------

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or str(self.data_dir / "store")

    @property
    def engine_max_running(self) -> int:
        """S: requests the engine runs at once, as its settings section says."""
        return getattr(self, self.engine).requests_at_once()

    def resolved_slots(self, chunk_size: int | None = None) -> int:
        """K: explicit, else ceil(in_flight_factor x S / C) bounded by max_slots
        (docs/architecture.md, "Keeping the engine full")."""
        if self.slots:
            return self.slots
        c = chunk_size or self.chunk_size
        return max(1, min(self.max_slots, math.ceil(self.in_flight_factor * self.engine_max_running / c)))

    def to_env(self) -> dict[str, str]:
        """FLEET_* variables that rebuild these settings in a child process."""
        env: dict[str, str] = {}
        for name, value in self.model_dump(mode="json").items():
            if value is None:
                continue
            if isinstance(value, dict):
                for sub, subval in value.items():
                    if subval is None:
                        continue
                    key = f"FLEET_{name.upper()}__{sub.upper()}"
                    env[key] = subval if isinstance(subval, str) else json.dumps(subval)
            else:
                env[f"FLEET_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        return env


class _LegacyNames(PydanticBaseSettingsSource):
    """A source whose flat names of before sections (`max_attempts=3`, a flat fleet.toml key) are moved
    into their sections (fleet.settings.sections.LEGACY_NAMES)."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return nest_legacy(self.inner())


class _LegacyEnv(PydanticBaseSettingsSource):
    """The flat variables of before sections (FLEET_LEASE_TTL_S, FLEET_S3_MAX_ATTEMPTS, ...), below the
    sections' own (FLEET_LEASE__TTL_S), so a deployment's environment keeps working."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = {k.lower(): v for k, v in os.environ.items()}
        return nest_legacy({old: env[f"fleet_{old}"] for old in LEGACY_NAMES if f"fleet_{old}" in env})


#: The settings every process reads: the fields above plus one section per registered engine
#: (`settings.sglang`, FLEET_SGLANG__*), so adding an engine is a registry line, not an edit here.
Settings = create_model(
    "Settings",
    __base__=_Settings,
    __module__=__name__,
    **{
        name: (section, Field(default_factory=section, description=f"the {name} engine's settings"))
        for name, section in ENGINE_SECTIONS.items()
    },
)  # type: ignore[call-overload]


def load_settings(**overrides: Any) -> Settings:
    """Settings from every source, with CLI flags (non-None overrides) on top."""
    flat = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**flat)

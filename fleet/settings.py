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

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_DATA_DIR = Path("fleet-data")
DEFAULT_CHUNK_SIZE = 256
DEFAULT_LEASE_TTL_S = 60.0
DEFAULT_VISIBILITY_TIMEOUT_S = 12 * 3600
#: K x C / S, the requests a worker keeps in flight per engine slot. The occupancy table
#: (and `fleet bench projection` at the reference shape) gives 0.81 busy at 8 and 0.97-0.99
#: at 16, so the default is 16.
IN_FLIGHT_FACTOR = 16
#: S for sglang where neither the setting nor a known GPU sizes it.
DEFAULT_SGLANG_RUNNING = 256
EngineName = Literal["sim", "hf", "sglang"]


class SimSettings(BaseModel):
    """A simulated GPU: continuous batching with a slot limit and a fixed step time."""

    max_running: int = Field(256, ge=1, description="concurrent requests (engine slots)")
    step_s: float = Field(0.0005, ge=0, description="seconds per decode step (one token per running request)")
    prefill_s: float = Field(0.0, ge=0, description="seconds of prefill per request")
    mean_output_tokens: float = Field(256, gt=0, description="mean output length, tokens")
    sigma: float = Field(0.8, ge=0, description="log-normal spread of output length")
    vocab_size: int | None = Field(
        None, ge=1, description="token ids, for checking pre-tokenized input; unset: not checked"
    )
    fail_ids: list[str] = Field(
        default_factory=list, description="record ids the engine rejects (fault tests)"
    )
    engine_error_chunks: list[int] = Field(
        default_factory=list, description="chunk indexes whose run kills the engine (fault tests)"
    )
    fault_chunks: list[int] = Field(
        default_factory=list, validation_alias=AliasChoices("fault_chunks", "crash_chunks"),
        description="chunk indexes whose run fails by the chunk's own fault, spending attempts (fault tests; "
        "old name crash_chunks still read)",
    )
    kill_chunks: list[int] = Field(
        default_factory=list, description="chunk indexes whose run SIGKILLs the worker process (fault tests)"
    )


class HfSettings(BaseModel):
    """transformers on a CPU or GPU: batched generate with left padding."""

    device: str = Field("auto", description="'auto', 'cpu' or 'cuda'")
    max_batch: int = Field(16, ge=1, description="requests per generate() call (the engine's slots)")
    batch_wait_s: float = Field(0.01, ge=0, description="seconds to wait for a batch to fill")
    context_length: int | None = Field(None, description="prompt + output limit; default from model config")
    threads: int | None = Field(None, ge=1, description="torch CPU threads per worker; default cores / workers")


class SglangSettings(BaseModel):
    """Kwargs for the embedded `sglang.Engine` (docs/architecture.md, SGLang facts)."""

    dtype: str = Field("bfloat16", description="weights and activations dtype")
    mtp: bool = Field(True, description="multi-token-prediction speculative decoding (NEXTN)")
    speculative_num_steps: int = Field(3, ge=1, description="MTP: draft steps per decode step")
    speculative_eagle_topk: int = Field(1, ge=1, description="MTP: draft candidates kept per step")
    speculative_num_draft_tokens: int = Field(
        4, ge=1, description="MTP: draft tokens verified per decode step (reserved per request)"
    )
    max_running_requests: int | None = Field(
        None, ge=1,
        description="requests the engine runs at once; unset: the most that fit this model on this GPU "
        "(fleet.model.capacity), else 256 where no GPU is known. Always passed: SGLang caps it at 48 with MTP",
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, lt=1,
        description="fraction of GPU memory for weights + KV + state; unset: SGLang's own headroom for "
        "this GPU, passed explicitly so SGLang does not cut it for a vision tower fleet never feeds",
    )
    radix_cache: Literal["auto", "on", "off"] = Field(
        "auto",
        description="prefix cache. auto: off for hybrid (mamba-state) models unless prompts share prefixes "
        "or n > 1, since with it on SGLang keeps 5 state slots per request instead of 1",
    )
    shared_prefixes: bool = Field(False, description="prompts share long prefixes (radix_cache auto turns it on)")
    mamba_full_memory_ratio: float = Field(
        0.9, gt=0, description="radix on: state pool / KV pool memory ratio (SGLang's default 0.9)"
    )
    context_tokens: int = Field(
        4096, ge=1, description="tokens, prompt + output, one running request holds; sizes the batch"
    )
    log_level: str = Field("warning", description="SGLang's log level (its own default, error, hides its warnings)")
    context_length: int | None = Field(
        None, ge=1, description="tokens, prompt + output, SGLang accepts per request; unset: the model's"
    )
    chunked_prefill_size: int | None = Field(
        None, description="tokens of prompt prefilled per step; unset: SGLang's default for the GPU"
    )
    tp_size: int = Field(1, ge=1, description="GPUs one engine spans (tensor parallel)")
    enable_hierarchical_cache: bool = Field(False, description="spill the prefix cache to host memory (HiCache)")
    hicache_ratio: float | None = Field(None, gt=0, description="HiCache: host cache size as a ratio of the GPU cache")
    hicache_size: int | None = Field(None, ge=0, description="GB of host memory for the cache")
    hicache_write_policy: str | None = Field(
        None, description="HiCache: when GPU cache pages are written to host (SGLang's write_through, ...)"
    )
    deterministic: bool = Field(False, description="enable_deterministic_inference (needed for seeds)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed through as is")


class SamplingSettings(BaseModel):
    """Job-wide sampling; unset values come from the model's generation_config.json."""

    temperature: float | None = Field(None, description="0 = greedy")
    top_p: float | None = Field(None, description="nucleus sampling mass; 1 = off")
    top_k: int | None = Field(None, description="candidates per step; 0 or -1 = off")
    min_p: float | None = Field(None, description="drop tokens below this fraction of the top one; 0 = off")
    repetition_penalty: float | None = Field(None, gt=0, le=2, description="1 = none (SGLang's range)")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="0 = none")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="0 = none")
    max_tokens: int | None = Field(
        None, ge=1,
        description="output tokens per sample; unset: the model's recommended length (fleet.model.outputlen)",
    )
    n: int = Field(1, ge=1, description="samples per input record (each an output record)")
    stop: list[str] | None = Field(None, description="strings that end a sample (not included in the output)")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEET_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    broker_url: str | None = Field(None, description="redis:// or rediss://; unset for `fleet run` = local Redis")
    store_url: str | None = Field(None, description="directory, file://... or s3://bucket/prefix")
    data_dir: Path = Field(DEFAULT_DATA_DIR, description="local runtime files: store default, local Redis")
    engine: EngineName = Field("sim", description="sim (simulated GPU), hf (transformers) or sglang")
    model: str | None = Field(None, description="model directory (or hub id where a hub is reachable)")
    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1, description="records per chunk")
    slots: int | None = Field(None, ge=1, description="K chunks a worker runs at once; default derived")
    max_slots: int = Field(32, ge=1, description="upper bound of the derived K")
    in_flight_factor: float = Field(
        IN_FLIGHT_FACTOR, gt=0, description="derived K = ceil(factor x S / C): requests in flight per engine slot"
    )
    seed: int = Field(0, description="job seed; per-record seeds derive from it")
    enable_thinking: bool = Field(True, description="chat template's thinking mode, where the model has one")
    return_output_ids: bool = Field(False, description="also store each sample's output token ids")
    queue: str = Field("fleet", description="Celery queue name")

    lease_ttl_s: float = Field(DEFAULT_LEASE_TTL_S, gt=0, description="lease time to live, seconds")
    reaper_interval_s: float = Field(10.0, gt=0, description="seconds between expired-lease scans")
    visibility_timeout_s: int = Field(DEFAULT_VISIBILITY_TIMEOUT_S, gt=0, description="longer than any chunk runs")
    max_attempts: int = Field(3, ge=1, description="failed attempts before a chunk is quarantined")
    max_crashes: int = Field(
        3, ge=1, description="deaths of processes that ran a chunk alone, all on one host, that quarantine it "
        "(two on two hosts do); deaths beside other chunks never count"
    )
    crash_window_s: float = Field(
        10.0, ge=0, description="seconds, at most: a process dying this soon after taking a chunk's lease (or "
        "starting it alone) makes it a suspect"
    )
    crash_window_fraction: float = Field(
        0.5, gt=0, description="the crash window is this fraction of the job's median chunk run time so far, "
        "capped by crash_window_s"
    )
    suspect_hold_s: float = Field(
        30.0, ge=0, description="seconds a suspected chunk is left to workers other than the one it last died on "
        "(and than benched ones) before they may run it alone again"
    )
    solo_after: int = Field(
        2, ge=1, description="quick deaths beside other chunks after which a suspected chunk runs alone (only "
        "deaths alone count towards quarantine)"
    )
    bench_after: int = Field(
        3, ge=1, description="deaths in a row of a worker's processes, each before finishing a batch, that bench it"
    )
    bench_backoff_s: float = Field(
        10.0, ge=0, description="seconds a benched worker takes no chunk after its last death, doubling with "
        "each more; then it runs one at a time until one commits"
    )
    bench_backoff_max_s: float = Field(300.0, ge=0, description="seconds: cap of the bench backoff")
    retry_backoff_s: float = Field(1.0, ge=0, description="seconds before the first requeue after an infra error")
    retry_backoff_max_s: float = Field(30.0, ge=0, description="seconds: cap of the doubling infra-error backoff")
    grace_s: float = Field(30.0, ge=0, description="on SIGTERM, seconds running chunks may finish")
    checkpoint_interval_s: float = Field(30.0, gt=0, description="seconds between a running chunk's checkpoints")

    assist: bool = Field(True, description="idle workers help straggler chunks once the queue is empty")
    assist_poll_s: float = Field(2.0, gt=0, description="seconds between an idle worker's looks for a straggler")

    s3_max_attempts: int = Field(10, ge=1, description="botocore retry attempts (adaptive mode)")
    multipart_threshold_mb: int = Field(64, ge=5, description="objects above this use multipart upload")

    usd_per_gpu_hour: float = Field(0.0, ge=0, description="price for status and plan")
    flower_port: int = Field(5555, description="`fleet flower` port")
    flower_address: str = Field("127.0.0.1", description="`fleet flower` bind address")
    flower_basic_auth: str | None = Field(None, description="user:password; required off loopback")
    metrics_port: int | None = Field(None, description="Prometheus port per worker (+ worker number)")

    sampling: SamplingSettings = Field(default_factory=SamplingSettings, description="job-wide sampling")
    sim: SimSettings = Field(default_factory=SimSettings, description="engine sim")
    hf: HfSettings = Field(default_factory=HfSettings, description="engine hf")
    sglang: SglangSettings = Field(default_factory=SglangSettings, description="engine sglang")

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
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))

    # -- derived values, computed in one place -------------------------------------------

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or str(self.data_dir / "store")

    @property
    def engine_max_running(self) -> int:
        """S: requests the engine runs at once."""
        return {
            "sim": self.sim.max_running,
            "hf": self.hf.max_batch,
            "sglang": self.sglang.max_running_requests or DEFAULT_SGLANG_RUNNING,
        }[self.engine]

    def resolved_slots(self, chunk_size: int | None = None) -> int:
        """K: explicit, else ceil(in_flight_factor x S / C) bounded by max_slots
        (docs/architecture.md, "Keeping the engine full")."""
        if self.slots:
            return self.slots
        c = chunk_size or self.chunk_size
        return max(1, min(self.max_slots, math.ceil(self.in_flight_factor * self.engine_max_running / c)))

    @property
    def heartbeat_s(self) -> float:
        # At most 2 s: each renewal stamps the lease beat, which dates a lost worker's death
        # for the crash evidence (crash_window_s) to that precision.
        return max(0.2, min(self.lease_ttl_s / 4, 2.0))

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


def load_settings(**overrides: Any) -> Settings:
    """Settings from every source, with CLI flags (non-None overrides) on top."""
    flat = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**flat)

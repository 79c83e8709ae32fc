"""The settings sections that are not an engine's: one concern each, one owner of its readers.

Each is set as `FLEET_<SECTION>__<FIELD>` (or `[<section>]` in fleet.toml); the names of the flat
settings before sections (FLEET_LEASE_TTL_S, FLEET_MAX_ATTEMPTS, FLEET_S3_MAX_ATTEMPTS, ...) are
still read, into the same field (`LEGACY_NAMES`), so a deployment's environment keeps working.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

DEFAULT_LEASE_TTL_S = 60.0
DEFAULT_VISIBILITY_TIMEOUT_S = 12 * 3600
#: A result of the reference job's 256-record chunk is ~2-3 MB (zstd JSON with output ids): 4 GB
#: holds over a thousand, hours of a 6-GPU host's output
DEFAULT_SPOOL_MB = 4096


class LeaseSettings(BaseModel):
    """FLEET_LEASE__*: a running chunk's lease and the recovery round. The beat and renewal timing
    derived from them has one owner, fleet.coord.leaseclock.LeaseClock."""

    ttl_s: float = Field(
        DEFAULT_LEASE_TTL_S, gt=0, description="lease time to live, seconds (old name lease_ttl_s)"
    )
    reaper_interval_s: float = Field(10.0, gt=0, description="seconds between expired-lease scans")
    visibility_timeout_s: int = Field(
        DEFAULT_VISIBILITY_TIMEOUT_S, gt=0,
        description="Celery's Redis visibility timeout: longer than any chunk runs (architecture: Celery facts)",
    )


class FailureSettings(BaseModel):
    """FLEET_FAILURE__*: the fleet's failure policy (fleet.coord.retry); a job's options
    (fleet.store.options: max_attempts, max_crashes) go over it for that job."""

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
    witness_wait_s: float = Field(
        3.0, ge=0, description="seconds past the latest moment a lost process could have died (its lease's last "
        "renewal plus the renewal interval) that the reaper waits for its launcher to say how (a witness) before it "
        "counts the loss against the host alone (fleet.coord.witness)"
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


class StoreClientSettings(BaseModel):
    """FLEET_STORE_CLIENT__*: how fleet talks to an object store, the same for every scheme."""

    max_attempts: int = Field(
        10, ge=1, description="attempts of one store request before it fails, the same for S3 (botocore's "
        "adaptive retries), GCS (api_core's retry deadline, 12 s an attempt) and the Hub (each call tried again "
        "on a busy, limiting or unreachable Hub, fleet.store.hub.attempted) (old name s3_max_attempts)",
    )
    multipart_threshold_mb: int = Field(64, ge=5, description="objects above this use multipart upload (S3)")


class SpoolSettings(BaseModel):
    """FLEET_SPOOL__*: a worker's disk spool for results and checkpoints the store refuses."""

    max_mb: int = Field(
        DEFAULT_SPOOL_MB, ge=0,
        description="MB of results and checkpoints a worker keeps on its own disk (data_dir/spool) while the store "
        "refuses them, committed when it answers or by the worker's next process; a result that does not fit "
        "costs its chunk's generation again. 0: no spool (old name spool_max_mb)",
    )


class MonitorSettings(BaseModel):
    """FLEET_MONITOR__*: what watches the fleet: prices for status and plan, Flower, Prometheus."""

    usd_per_gpu_hour: float = Field(0.0, ge=0, description="price for status and plan")
    flower_port: int = Field(5555, ge=1, le=65535, description="`fleet flower` port (its --port)")
    flower_address: str = Field("127.0.0.1", description="`fleet flower` bind address (its --address)")
    flower_basic_auth: str | None = Field(None, description="user:password; required off loopback")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Prometheus port per worker (+ worker number)"
    )


#: each section by its name (FLEET_<NAME>__*)
SECTIONS: dict[str, type[BaseModel]] = {
    "lease": LeaseSettings,
    "failure": FailureSettings,
    "store_client": StoreClientSettings,
    "spool": SpoolSettings,
    "monitor": MonitorSettings,
}

#: the flat names before sections (FLEET_<NAME>, a flat fleet.toml key, a keyword) -> (section, field)
LEGACY_NAMES: dict[str, tuple[str, str]] = {
    "lease_ttl_s": ("lease", "ttl_s"),
    "reaper_interval_s": ("lease", "reaper_interval_s"),
    "visibility_timeout_s": ("lease", "visibility_timeout_s"),
    **{name: ("failure", name) for name in FailureSettings.model_fields},
    "s3_max_attempts": ("store_client", "max_attempts"),
    "multipart_threshold_mb": ("store_client", "multipart_threshold_mb"),
    "spool_max_mb": ("spool", "max_mb"),
    **{name: ("monitor", name) for name in MonitorSettings.model_fields},
}


def nest_legacy(values: dict) -> dict:
    """`values` (one source's) with every flat legacy name moved into its section. A section's own
    name for the field, given in the same source, wins over the old one."""
    out = dict(values)
    for old, (section, field) in LEGACY_NAMES.items():
        if old in out:
            value = out.pop(old)
            nested = out.get(section)
            nested = dict(nested) if isinstance(nested, dict) else {}
            nested.setdefault(field, value)
            out[section] = nested
    return out

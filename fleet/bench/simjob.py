"""Run one sim job through real processes: local Redis, `fleet worker`, `fleet enqueue`.

Workers are started and awaited before the job is enqueued, so every worker can take a
chunk from the first moment; the job's window then runs from its first chunk's start to
its last result, as the occupancy definition asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.bench.jobstats import JobRun, read_job
from fleet.bench.procs import READY_TIMEOUT_S, WorkerHost, clean_env, cpu_seconds, run_fleet, wait_until, write_prompts
from fleet.coord.localredis import LocalRedis
from fleet.errors import FleetError
from fleet.settings import Settings
from fleet.store import open_store
from fleet.store.layout import failed_prefix, results_prefix

#: Larger than any sim length the suite draws: the heavy tail is what is being measured.
UNCAPPED_TOKENS = 1_000_000


@dataclass(frozen=True)
class SimShape:
    """A simulated engine and chunking, time-scaled so a job fits in seconds."""

    max_running: int = 64
    chunk_size: int = 128
    mean_output_tokens: float = 200
    sigma: float = 0.8
    step_s: float = 0.0005
    prefill_s: float = 0.0

    def env(self) -> dict[str, str]:
        return {
            "FLEET_ENGINE": "sim",
            "FLEET_SIM__MAX_RUNNING": str(self.max_running),
            "FLEET_SIM__STEP_S": repr(self.step_s),
            "FLEET_SIM__PREFILL_S": repr(self.prefill_s),
            "FLEET_SIM__MEAN_OUTPUT_TOKENS": repr(self.mean_output_tokens),
            "FLEET_SIM__SIGMA": repr(self.sigma),
            "FLEET_CHUNK_SIZE": str(self.chunk_size),
            "FLEET_SAMPLING__MAX_TOKENS": str(UNCAPPED_TOKENS),
            # Recovery and assist cadences scaled down with the job (seconds, not minutes).
            "FLEET_ASSIST_POLL_S": "0.25",
            "FLEET_REAPER_INTERVAL_S": "1",
        }

    def default_slots(self, in_flight_factor: float | None = None) -> int:
        """The K a worker derives by itself for this engine and chunk size (and in-flight factor)."""
        factor = {"in_flight_factor": in_flight_factor} if in_flight_factor else {}
        return Settings(engine="sim", chunk_size=self.chunk_size,
                        sim={"max_running": self.max_running}, **factor).resolved_slots()

    def describe(self) -> dict[str, float]:
        return {"S": self.max_running, "C": self.chunk_size, "mean_tokens": self.mean_output_tokens,
                "sigma": self.sigma, "step_s": self.step_s, "prefill_s": self.prefill_s}


@dataclass
class SimJob:
    name: str
    shape: SimShape
    chunks: int
    workers: int
    #: K per worker; None = let the worker derive its default
    slots: int | None = None
    store_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: called once the workers are ready, and once every result exists (a profiler's window)
    on_ready: Callable[[], object] | None = None
    on_done: Callable[[], object] | None = None
    #: seconds a worker may take to be ready (a real engine's start on loaded cores takes minutes)
    ready_timeout_s: float = 0.0
    #: the input to enqueue; None = write_prompts' chat records
    prompts: Path | None = None

    @property
    def records(self) -> int:
        return self.chunks * self.shape.chunk_size

    @property
    def k(self) -> int:
        return self.slots or self.shape.default_slots()


@dataclass
class SimJobResult:
    job: SimJob
    run: JobRun
    startup_s: float
    wall_s: float
    #: each worker process's own CPU seconds (not its children's) from ready to the last result
    worker_cpu_s: list[float] = field(default_factory=list)


def run_sim_job(job: SimJob, workdir: Path, timeout_s: float = 600) -> SimJobResult:
    """Run the job to its last result and read its timings back from the store."""
    base = workdir / job.name
    base.mkdir(parents=True, exist_ok=True)
    prompts = job.prompts or write_prompts(workdir / f"prompts-{job.records}.jsonl", job.records)
    store_url = job.store_url or str(base / "store")
    began = time.monotonic()
    with LocalRedis(base / "redis", persist=False) as redis_server:
        env = clean_env(workdir, {
            **job.shape.env(),
            "FLEET_BROKER_URL": redis_server.url,
            "FLEET_STORE_URL": store_url,
            "FLEET_GRACE_S": "2",
            **({"FLEET_SLOTS": str(job.slots)} if job.slots else {}),
            **job.extra_env,
        })
        host = WorkerHost(env, job.workers, base / "workers.log").start()
        try:
            startup = host.wait_ready(max(READY_TIMEOUT_S, job.ready_timeout_s))
            pids = host.worker_pids()
            cpu = [cpu_seconds(p) for p in pids]
            if job.on_ready:
                job.on_ready()
            run_fleet(["enqueue", str(prompts), "--job", job.name], env, timeout_s, base)
            wait_results(store_url, job, host, timeout_s)
            cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu, strict=True)]
            if job.on_done:
                job.on_done()
        finally:
            host.stop()
    wall = time.monotonic() - began
    run = read_job(open_store(store_url), job.name, job.chunks, job.shape.step_s, job.shape.prefill_s)
    return SimJobResult(job, run, startup, wall, cpu)


def wait_results(store_url: str, job: SimJob, host: WorkerHost, timeout_s: float) -> None:
    store = open_store(store_url)
    poll_s = 0.5 if store_url.startswith("s3://") else 0.1

    def finished() -> bool:
        if any(True for _ in store.list(failed_prefix(job.name))):
            raise FleetError(f"job {job.name} quarantined a chunk; see {host.log_path}")
        return sum(1 for _ in store.list(results_prefix(job.name))) >= job.chunks

    wait_until(finished, timeout_s, f"{job.chunks} results of {job.name}", poll_s)

"""What starting engines costs the fleet, as the workers record it: the one owner of keys.engine_starts.

A GPU is paid from its process's birth and makes no token until its engine is ready; on a spot fleet
every preemption pays that again on the replacement host. Each worker process adds its own start here
once its engine is ready (fleet.worker.process.startclock measures it), so `fleet status` shows the sum
with one HGETALL of a four-field hash, whatever the size of the fleet or the job.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from fleet.coord import keys
from fleet.coord.leases import now_ms


@dataclass(frozen=True)
class EngineStarts:
    """Worker processes whose engine got ready, and the seconds (and GPU-seconds) they spent getting there."""

    starts: int = 0
    seconds: float = 0.0
    gpu_seconds: float = 0.0
    #: ms epoch of the first start recorded (0: none)
    since_ms: int = 0


def gpus_of(visible: str | None) -> int:
    """GPUs a process holds from its CUDA_VISIBLE_DEVICES; a CPU worker (none, or unset) counts as one: it
    stands for a GPU wherever fleet prices one (the sim engine in a bench)."""
    return max(1, len([d for d in (visible or "").split(",") if d.strip()]))


def note_engine_start(r: redis.Redis, seconds: float, gpus: int) -> None:
    """One process's engine is ready, `seconds` after the process was born, on `gpus` GPUs."""
    with r.pipeline(transaction=False) as p:
        p.hincrby(keys.engine_starts(), "starts", 1)
        p.hincrbyfloat(keys.engine_starts(), "seconds", seconds)
        p.hincrbyfloat(keys.engine_starts(), "gpu_seconds", seconds * gpus)
        p.hsetnx(keys.engine_starts(), "since_ms", now_ms())
        p.execute()


def engine_starts(r: redis.Redis) -> EngineStarts:
    raw = {k.decode(): v.decode() for k, v in r.hgetall(keys.engine_starts()).items()}
    return EngineStarts(int(raw.get("starts", 0)), float(raw.get("seconds", 0)), float(raw.get("gpu_seconds", 0)),
                        int(raw.get("since_ms", 0)))

"""Workers whose engine configuration differs from a job's, as `fleet status` shows them.

A mismatched worker hands chunks back without running them, so from the outside the job
only looks slow; recording it in Redis lets the operator see which host has other
settings, and what differs, without reading every worker's log.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from fleet.coord import keys


def record_mismatch(
    r: redis.Redis, worker: str, job: str, identity_hash: str, differences: list[str]
) -> None:
    entry = {"job": job, "identity_hash": identity_hash, "differences": differences, "at": time.time()}
    r.hset(keys.mismatched_workers(), worker, json.dumps(entry))


def clear_mismatch(r: redis.Redis, worker: str) -> None:
    """The worker now matches (restarted with the job's settings, or the job is gone)."""
    r.hdel(keys.mismatched_workers(), worker)


def mismatched_workers(r: redis.Redis, job: str | None = None) -> list[dict[str, Any]]:
    """Recorded mismatches, of one job or all, each with its worker name, by worker."""
    out = []
    for name, raw in sorted(r.hgetall(keys.mismatched_workers()).items()):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # written by a newer fleet in another shape: not ours to judge
        if job is None or entry.get("job") == job:
            out.append({"worker": name.decode(), **entry})
    return out

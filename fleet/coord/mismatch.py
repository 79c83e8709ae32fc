"""Workers that cannot run a job, as `fleet status` shows them: those whose engine configuration
differs from the job's, and those whose store holds no manifest of it (misconfigured: their
store is not the one its URL names to the rest of the fleet).

Such a worker hands chunks back without running them, so from the outside the job only looks
slow; recording it in Redis lets the operator see which host has other settings or another
store, and what differs, without reading every worker's log.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from fleet.coord import keys
from fleet.coord.slices import hash_items


def record_mismatch(
    r: redis.Redis, worker: str, job: str, identity_hash: str, differences: list[str]
) -> None:
    entry = {"job": job, "identity_hash": identity_hash, "differences": differences, "at": time.time()}
    r.hset(keys.mismatched_workers(), worker, json.dumps(entry))


def record_misplaced(r: redis.Redis, worker: str, job: str, store_url: str) -> None:
    """The worker's store holds no manifest of a job of its store's queue (kind "store")."""
    entry = {"job": job, "kind": "store", "store": store_url, "at": time.time(),
             "differences": [f"its store {store_url} holds no manifest of the job (FLEET_STORE_URL names "
                             "another store than the one the job was enqueued into)"]}
    r.hset(keys.mismatched_workers(), worker, json.dumps(entry))


def clear_mismatch(r: redis.Redis, worker: str) -> None:
    """The worker now matches (restarted with the job's settings, or the job is gone)."""
    r.hdel(keys.mismatched_workers(), worker)


def mismatched_workers(r: redis.Redis, job: str | None = None) -> list[dict[str, Any]]:
    """Recorded mismatches, of one job or all, each with its worker name, by worker."""
    out = []
    for name, raw in sorted(hash_items(r, keys.mismatched_workers()).items()):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # written by a newer fleet in another shape: not ours to judge
        if job is None or entry.get("job") == job:
            out.append({"worker": name.decode(), **entry})
    return out

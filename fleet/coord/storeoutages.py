"""Store outages as the workers see them, for `fleet status`: the store is the source of truth,
so while it cannot be reached the broker is where a worker says so (fleet.worker.process.storewriter)."""

from __future__ import annotations

import json
from typing import Any

import redis

from fleet.coord import keys
from fleet.coord.leases import now_ms
from fleet.coord.slices import hash_items


def note_store_outage(r: redis.Redis, worker: str, since_ms: int, waiting: int) -> None:
    r.hset(keys.store_outages(), worker, json.dumps({"since_ms": since_ms, "waiting": waiting}))


def clear_store_outage(r: redis.Redis, worker: str) -> None:
    r.hdel(keys.store_outages(), worker)


def store_outages(r: redis.Redis) -> list[dict[str, Any]]:
    """{worker, unreachable_s, results_waiting} for each worker the store refuses now."""
    now = now_ms()
    out = []
    for worker, raw in hash_items(r, keys.store_outages()).items():
        data = json.loads(raw)
        out.append({"worker": worker.decode(), "unreachable_s": round((now - data["since_ms"]) / 1000, 1),
                    "results_waiting": data["waiting"]})
    return sorted(out, key=lambda d: d["worker"])

"""Which chunks of a job have a message in the broker: in a queue list or in kombu's unacked hash.

The "queued" markers (keys.queued) are fleet's own bookkeeping and can outlive their
message: a worker killed after taking a message and before clearing the marker leaves
the marker set while the message sits in kombu's unacked hash until the visibility
timeout (12 h). `fleet enqueue` compares the markers with the messages themselves, so a
marker is trusted only while a message could still start its chunk.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from fleet.coord import keys, leases
from fleet.coord.broker import TASK_NAME

PAGE = 1000


@dataclass
class Waiting:
    """A job's chunks with a message: waiting in a list, or taken and not acked (since when)."""

    listed: set[int] = field(default_factory=set)
    #: index -> unix time the newest unacked copy was taken
    unacked: dict[int, float] = field(default_factory=dict)


def chunk_of(payload: dict[str, Any]) -> tuple[str, int] | None:
    """(job, index) of a kombu message carrying a fleet chunk task, else None."""
    if payload.get("headers", {}).get("task") != TASK_NAME:
        return None
    body: Any = payload.get("body", "")
    if payload.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    decoded = json.loads(body)
    # Celery protocol 2 is [args, kwargs, embed]; protocol 1 a dict with "kwargs".
    kwargs = decoded[1] if isinstance(decoded, list) else decoded.get("kwargs", {})
    try:
        return str(kwargs["job"]), int(kwargs["index"])
    except (KeyError, TypeError, ValueError):
        return None


def _chunk(raw: bytes) -> tuple[str, int] | None:
    try:
        return chunk_of(json.loads(raw))
    except (ValueError, TypeError, AttributeError):
        return None  # another application's message on this Redis: not ours


def waiting_messages(r: redis.Redis, queue: str, job: str) -> Waiting:
    """Every message of `job` in `queue`'s lists and in the unacked hash (a full scan)."""
    found = Waiting()
    for name in keys.queue_lists(queue):
        for start in range(0, r.llen(name), PAGE):
            for raw in r.lrange(name, start, start + PAGE - 1):
                chunk = _chunk(raw)
                if chunk is not None and chunk[0] == job:
                    found.listed.add(chunk[1])
    taken_at: dict[bytes, float] | None = None
    for tag, raw in r.hscan_iter(keys.KOMBU_UNACKED, count=PAGE):
        try:
            message = json.loads(raw)[0]
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        chunk = chunk_of(message) if isinstance(message, dict) else None
        if chunk is not None and chunk[0] == job:
            if taken_at is None:  # one read of the index, only once a message of this job is there
                taken_at = dict(r.zrange(keys.KOMBU_UNACKED_INDEX, 0, -1, withscores=True))
            taken = taken_at.get(tag) or time.time()
            found.unacked[chunk[1]] = max(taken, found.unacked.get(chunk[1], 0.0))
    return found


def stale_markers(
    r: redis.Redis, queue: str, job: str, markers: set[int], lost_after_s: float
) -> set[int]:
    """Markers (chunks not done and not running) no message can start any more.

    A chunk's message is live when it waits in a list, or was taken less than
    `lost_after_s` ago (its worker takes the lease at once; an older one without a lease
    was taken by a worker that died). kombu moves a message from its list to the unacked
    hash in two steps, so a marker counts as stale only when two scans agree; a marker
    judged stale wrongly costs a duplicate message, which workers skip.
    """
    stale = set(markers)
    for _ in range(2):
        if not stale:
            break
        found = waiting_messages(r, queue, job)
        now = time.time()
        live = found.listed | {i for i, t in found.unacked.items() if now - t < lost_after_s}
        stale -= live
    return {i for i in stale if not leases.leased(r, job, i)}

"""Reads of a whole hash or set in slices, so that no look holds the broker.

Redis runs one command at a time: one HGETALL of a 64,000-entry hash (the done chunks' cached
stats) holds every lease renewal behind it for tens of milliseconds. HSCAN and SSCAN with a COUNT
read the same entries a slice per command, and renewals run between the slices (issue 48,
docs/architecture.md "Scaling"). A scan returns every entry present for its whole length at
least once; the dict or set it fills drops the repeats a rehash can bring.
"""

from __future__ import annotations

import redis

#: entries a look asks for per command: ~1 ms of Redis for the largest entries fleet keeps
SLICE = 1000


def hash_items(r: redis.Redis, key: str) -> dict[bytes, bytes]:
    """Every field of the hash, a slice per HSCAN."""
    return dict(r.hscan_iter(key, count=SLICE))


def set_members(r: redis.Redis, key: str) -> set[bytes]:
    """Every member of the set, a slice per SSCAN."""
    return set(r.sscan_iter(key, count=SLICE))

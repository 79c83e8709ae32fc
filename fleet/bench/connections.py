"""A broker's connections by kind, from CLIENT LIST (docs/architecture.md, "Scaling").

A worker holds three (fleet.coord.pool): the process's pool (named fleet.coord.pool.CLIENT_NAME),
kombu's BRPOP and kombu's remote-control subscription (both named KOMBU_NAME; the subscription is
the one with a pattern). The control-plane bench's simulated worker opens the same, and a test
holds the two to each other.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from fleet.coord.pool import CLIENT_NAME, KOMBU_NAME


def kind_of(client: dict[str, Any]) -> str:
    """'pool', 'consumer', 'subscription', or the connection's own name (a tool's, the bench's)."""
    name = client.get("name") or ""
    if name == CLIENT_NAME:
        return "pool"
    if name == KOMBU_NAME:
        return "subscription" if int(client.get("psub", 0)) or int(client.get("sub", 0)) else "consumer"
    return name or "unnamed"


def connection_kinds(admin: redis.Redis, ports: set[int] | None = None) -> Counter[str]:
    """The broker's connections by kind; only those from local `ports`, if given."""
    out: Counter[str] = Counter()
    for client in admin.client_list():
        if ports is not None and int(client["addr"].rsplit(":", 1)[1]) not in ports:
            continue
        out[kind_of(client)] += 1
    return out

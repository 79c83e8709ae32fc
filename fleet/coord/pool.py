"""One pool of broker connections per process, fleet's and kombu's (docs/architecture.md, "Scaling").

A worker process needs three connections to the broker: kombu's BRPOP (it blocks), kombu's
remote-control subscription (a subscribed connection takes no other command), and one for
everything else: fleet's leases, beats, rounds and markers, and kombu's acks and event
PUBLISHes (fleet.coord.transport routes kombu's short commands here). Each of those commands
takes well under a millisecond, so one connection carries them all; a thread that finds it in
use waits its turn. Before, a worker held 8-9 (a pool per kombu channel, one per fleet thread at
once), and 1,000 GPUs used most of Redis's default `maxclients`.
"""

from __future__ import annotations

import threading

import redis
from kombu import Connection
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry

#: the name fleet's pool gives its connections (CLIENT SETNAME), kombu's short commands included
CLIENT_NAME = "fleet"
#: the name kombu's own connections (its BRPOP, its subscription) give themselves
KOMBU_NAME = "celery"
#: connections in a process's pool
POOL_CONNECTIONS = 1
#: seconds a command waits for the pool's connection before it fails as a connection error: longer
#: than any command holds it (a socket timeout) and the retries of one that meets an outage
POOL_WAIT_S = 30.0
#: broker connections one worker process holds: its pool, kombu's BRPOP and its subscription
WORKER_CONNECTIONS = POOL_CONNECTIONS + 2

#: fleet's own client, jittered so that a restarted broker meets no stampede (fleet.coord.reconnect): the first
#: retry after 50-100 ms, doubling to 1-2 s, eight in all (~5-9 s), then the command fails and its caller (a
#: beat, a round) tries again at its next turn
CLIENT_BACKOFF_BASE_S = 0.05
CLIENT_BACKOFF_CAP_S = 2.0
CLIENT_RETRIES = 8


def client_retry() -> Retry:
    return Retry(EqualJitterBackoff(cap=CLIENT_BACKOFF_CAP_S, base=CLIENT_BACKOFF_BASE_S), retries=CLIENT_RETRIES)


_pools: dict[tuple[object, ...], redis.ConnectionPool] = {}
_lock = threading.Lock()


def broker_key(conninfo: Connection) -> tuple[object, ...]:
    """Which broker a kombu connection's parameters name (two URLs spelled apart may be one)."""
    db = str(conninfo.virtual_host or "0").strip("/") or "0"
    return (conninfo.hostname, conninfo.port or 6379, db, conninfo.userid, conninfo.password)


def new_pool(url: str) -> redis.ConnectionPool:
    """A pool of POOL_CONNECTIONS for `url`, retrying through short outages with jittered waits
    (fleet.coord.reconnect). Its own for each simulated worker of the control-plane bench."""
    return redis.BlockingConnectionPool.from_url(
        url, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT_S,
        retry=client_retry(), retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        socket_timeout=10, socket_connect_timeout=5, health_check_interval=10,
        # CLIENT LIST names fleet's connections apart from kombu's (the control-plane bench counts them so)
        client_name=CLIENT_NAME,
    )


def shared_pool(url: str) -> redis.ConnectionPool:
    """This process's pool for the broker at `url`: every fleet client and kombu channel on it share it."""
    key = broker_key(Connection(url))
    with _lock:
        if key not in _pools:
            _pools[key] = new_pool(url)
        return _pools[key]

#: connections beside the workers': Flower, the metrics exporter, `fleet` commands, their launchers' notes
HEAD_CONNECTIONS = 64
#: what Redis's `maxclients` must hold over a fleet's connections: a worker whose broker vanished
#: (a network cut, not a restart) opens new connections before the broker's keepalive (60 s) drops
#: its old ones, and every worker does so at once
MAXCLIENTS_HEADROOM = 2


def broker_connections(workers: int) -> int:
    """Connections a fleet of `workers` worker processes holds on its broker."""
    return workers * WORKER_CONNECTIONS + HEAD_CONNECTIONS


def maxclients_needed(workers: int) -> int:
    """The least `maxclients` a broker of `workers` worker processes should have."""
    return MAXCLIENTS_HEADROOM * broker_connections(workers)

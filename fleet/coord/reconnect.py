"""Reconnecting to a restarted broker without a stampede (docs/architecture.md, "Scaling").

Every worker loses a restarting broker at the same instant. With fixed waits they would all
come back at the same instants too: kombu's consumer retries 2, 4, 6 ... 30 s after the loss,
the same for every process, and a thousand workers would open their connections and
re-declare their queues in the same millisecond. Each wait here is drawn between half and all
of its step ("equal jitter"): the same schedule on average, spread over half of it.

- fleet's own client (leases, the beat, the reaper): redis-py's Retry with its
  EqualJitterBackoff (`fleet.coord.pool.client_retry`, on the process's one pool).
- Celery's consumer: kombu's `Connection.ensure_connection` with the same schedule as before,
  each wait jittered (`JitteredConnection`, the app's connection class through `FleetAMQP`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery.app.amqp import AMQP
from kombu import Connection
from kombu.transport import redis as kombu_redis


def jittered_waits(start: float, step: float, cap: float) -> Iterator[float]:
    """kombu's waits (start, start + step, ... up to cap, then cap again), each drawn in [w/2, w]."""
    wait = start
    while True:
        yield wait / 2 + random.uniform(0, wait / 2)
        wait = min(cap, wait + step)


def sleep_in_steps(seconds: float, callback: Callable[[], Any] | None) -> None:
    """Sleep, calling `callback` every second (Celery's shutdown check raises from it), as kombu does."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if callback:
            callback()
        time.sleep(min(1.0, left))


class JitteredConnection(Connection):
    """A kombu connection whose reconnection waits are jittered (module docstring)."""

    def ensure_connection(self, errback: Callable[[Exception, float], Any] | None = None,
                          max_retries: int | None = None, interval_start: float = 2, interval_step: float = 2,
                          interval_max: float = 30, callback: Callable[[], Any] | None = None,
                          reraise_as_library_errors: bool = True, timeout: float | None = None) -> Connection:
        waits = jittered_waits(interval_start, interval_step, interval_max)

        def wait(exc: Exception, _interval: float) -> None:
            seconds = next(waits)
            if errback:
                errback(exc, seconds)  # Celery logs "trying again in N seconds" with the real wait
            sleep_in_steps(seconds, callback)

        # kombu's own waits are zero: the errback above, called before each retry, does the waiting.
        return super().ensure_connection(wait, max_retries, 0, 0, 0, callback, reraise_as_library_errors, timeout)

    def get_transport_cls(self) -> type:
        """kombu's Redis transport on the process's one pool of connections (fleet.coord.transport)."""
        from fleet.coord.transport import SharedPoolTransport  # imports kombu's Redis transport, and redis

        found = super().get_transport_cls()
        return SharedPoolTransport if found is kombu_redis.Transport else found


class FleetAMQP(AMQP):
    """Celery's AMQP glue with fleet's connection class (`Celery(amqp=FleetAMQP)`)."""

    Connection = JitteredConnection

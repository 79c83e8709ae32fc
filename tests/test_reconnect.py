"""Reconnecting to a restarted broker (fleet.coord.reconnect): Celery's consumer and fleet's own
client wait jittered times, so a fleet that lost its broker at one instant does not come back
at one instant. Against a real redis-server that is stopped and started on the same port."""

from __future__ import annotations

from pathlib import Path

import pytest
from kombu.exceptions import OperationalError

from fleet.coord.broker import make_celery, redis_client
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.leases import Lease, holder
from fleet.coord.localredis import LocalRedis, free_port
from fleet.coord.reconnect import jittered_waits
from fleet.settings import Settings
from tests.fleetproc import wait_for


def test_each_wait_is_drawn_between_half_and_all_of_kombus_step():
    # Given kombu's reconnection schedule (2, 4, 6 ... 30 s after a loss)
    steps = [2.0, 4.0, 6.0] + [30.0] * 3
    # When a thousand consumers draw their waits
    draws = [[next(w) for _ in range(20)] for w in (jittered_waits(2, 2, 30) for _ in range(1000))]
    # Then every wait lies in [step/2, step], the schedule caps at 30 s, and the consumers are spread
    # over that half: no two thousand come back at one instant
    for n, step in enumerate(steps):
        nth = [d[n if n < 3 else 14 + n] for d in draws]
        assert all(step / 2 <= w <= step for w in nth)
        assert max(nth) - min(nth) > step / 2 * 0.9
        assert len({round(w, 3) for w in nth}) > 300


@pytest.mark.slow
def test_the_consumer_waits_jittered_times_and_connects_once_the_broker_is_back(tmp_path: Path):
    # Given a worker's Celery connection to a broker that is down
    port = free_port()
    app = make_celery(Settings(broker_url=f"redis://127.0.0.1:{port}/0"))
    conn = app.connection_for_read()
    waits: list[float] = []
    server = LocalRedis(tmp_path / "redis", port=port, persist=False)

    def failed(exc: Exception, seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:  # the broker comes back while the consumer waits
            server.start()

    # When it ensures its connection (as Celery's consumer does after losing the broker)
    try:
        conn.ensure_connection(failed, max_retries=20, interval_start=0.2, interval_step=0.2, interval_max=1.0)
        # Then it connected once the broker answered, after waits drawn from the jittered schedule
        assert conn.connected
        assert len(waits) == 3
        for wait, step in zip(waits, (0.2, 0.4, 0.6), strict=True):
            assert step / 2 <= wait <= step
    finally:
        conn.release()
        server.stop()


@pytest.mark.slow
def test_the_consumer_gives_up_after_its_retries_when_the_broker_stays_down():
    app = make_celery(Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0"))
    conn = app.connection_for_read()
    waits: list[float] = []
    with pytest.raises(OperationalError):
        conn.ensure_connection(lambda exc, s: waits.append(s), max_retries=2, interval_start=0.05,
                               interval_step=0.05, interval_max=0.1)
    assert len(waits) == 2 and all(0.025 <= w <= 0.1 for w in waits)
    conn.release()


def test_fleets_client_draws_jittered_waits():
    client = redis_client(Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0"))
    backoff = client.get_retry()._backoff
    # The fifth retry waits between 0.4 and 0.8 s (50 ms doubled four times, halved then jittered)
    fifth = [backoff.compute(4) for _ in range(500)]
    assert all(0.4 <= w <= 0.8 for w in fifth) and len({round(w, 4) for w in fifth}) > 100
    client.close()


def test_a_heartbeat_keeps_its_leases_across_a_broker_restart(tmp_path: Path):
    # Given a worker's client (jittered retries) holding a lease on a heartbeat, and a persistent broker
    server = LocalRedis(tmp_path / "redis", persist=True).start()
    client = redis_client(Settings(broker_url=server.url))
    hb = Heartbeat(interval_s=0.1)
    lease = Lease(client, "j", 0, "gpu0@a:1#1", ttl_s=30)
    assert lease.acquire()
    hb.add(lease)
    hb.start()
    try:
        wait_for(lambda: len(hb.round_trips) >= 2, 30, "two beats", interval=0.02)
        # When the broker restarts on the same port and directory
        server.stop()
        server = LocalRedis(tmp_path / "redis", port=server.port, persist=True).start()
        beats = len(hb.round_trips)
        # Then the heartbeat reconnects and renews the lease again: never lost, still ours
        wait_for(lambda: len(hb.round_trips) >= beats + 2, 30, "two beats after the restart", interval=0.02)
        assert not lease.lost and holder(client, "j", 0) == "gpu0@a:1"
    finally:
        hb.stop()
        client.close()
        server.stop()

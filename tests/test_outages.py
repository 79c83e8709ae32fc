"""fleet.coord.outages: a process's own record of when the broker did not answer it, on a real
redis-server (a late answer is tested with a stopped server in tests/test_recovery.py)."""

from __future__ import annotations

import time

import pytest
import redis

from fleet.coord.localredis import LocalRedis, free_port
from fleet.coord.outages import Outages, WatchedRedis, outages_of


def watched(port: int) -> WatchedRedis:
    # generous timeouts: a refused connection fails at once, and no answer of a busy machine's
    # broker is slow enough to count as an outage
    client = WatchedRedis(host="127.0.0.1", port=port, socket_connect_timeout=10, socket_timeout=10)
    client.outages = Outages(slow_s=10)
    return client


def test_prompt_answers_record_nothing(redis_server):
    client = watched(redis_server.port)
    for _ in range(20):
        client.ping()
    assert client.outages.windows() == []


@pytest.mark.slow
def test_a_broker_out_of_reach_opens_a_window_that_its_next_answer_closes(tmp_path):
    # Given a client whose broker is not there
    port = free_port()
    client = watched(port)
    began = time.time()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    # Then the outage is open: it lasts until now
    now = time.time()
    [open_window] = client.outages.windows()
    assert began <= open_window.start and open_window.end >= now
    # When the broker answers again
    time.sleep(0.3)
    with LocalRedis(tmp_path / "redis", port=port, persist=False):
        client.ping()
    answered = time.time()
    # Then the window is closed where it answered, and covers what ran out inside it
    [window] = client.outages.windows()
    assert window.start == open_window.start and window.end <= answered and window.end - window.start >= 0.3
    assert client.outages.covering(window.start + 0.1, before_s=0, after_s=0) == window
    assert client.outages.covering(window.end + 5, before_s=0, after_s=1) is None


def test_a_plain_client_has_an_empty_record(redis_server):
    assert outages_of(redis.Redis(port=redis_server.port)).windows() == []

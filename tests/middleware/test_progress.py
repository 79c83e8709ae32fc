"""ProgressMiddleware, StatsMiddleware and MetricsMiddleware: a copy whose chunk was
committed elsewhere stops at once; a commit leaves its stats and metrics."""

from __future__ import annotations

import json

from fleet import metrics
from fleet.coord import keys
from fleet.store.layout import checkpoint_prefix, result_key
from fleet.worker.run.outcome import Committed, Superseded
from tests.middleware.conftest import JOB
from tests.middleware.tasks import hold


def test_owner_stops_at_once_when_its_helper_committed_first(worker, other, r, store):
    # Given an owner running chunk 0, with a checkpoint, and a helper assisting it
    store.put(checkpoint_prefix(JOB, 0) + "000001-owner", b"")

    def helper_commits(run):
        assert isinstance(other.run(0, assist=True)[1], Committed)

    # When the helper commits while the owner still runs
    _, outcome = worker.run(0, hold(worker.task, lambda: False, then=helper_commits))
    # Then the owner drops its copy without waiting to finish, and the checkpoints go
    assert isinstance(outcome, Superseded)
    assert store.exists(result_key(JOB, 0)) and list(store.list(checkpoint_prefix(JOB, 0))) == []
    assert r.zscore(keys.progress(JOB), 0) is None


def test_commit_caches_stats_and_counts_requests_where_they_change(worker, r):
    samples = []
    gauge = metrics.RUNNING_REQUESTS._value

    def watch(run):
        samples.append(gauge.get())

    # When a chunk runs to its commit
    _, outcome = worker.run(1, hold(worker.task, lambda: True, then=watch))
    # Then its stats are cached for `fleet status`, and the in-flight gauge is back where it started
    assert isinstance(outcome, Committed)
    cached = json.loads(r.hget(keys.chunk_stats(JOB), 1))
    assert cached["samples"] == 4 and cached["chunk"] == 1
    assert gauge.get() == samples[0]


def test_in_flight_gauge_follows_the_run():
    from fleet.worker.run.chunk import ChunkRun

    gauge = metrics.RUNNING_REQUESTS._value
    before = gauge.get()
    run = ChunkRun(job=JOB, index=0, attempt=1, worker="w")
    run.inflight += 3
    assert gauge.get() == before + 3
    run.inflight -= 3
    assert gauge.get() == before

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


def test_a_stopped_run_reports_every_token_its_last_checkpoint_holds(worker, store, r):
    """The engine may still stream while a stopped run ends (a cancelled generation settles on the
    engine loop): what the run reports as made must cover every id its last flush stored, or the
    next run's result counts fewer tokens made than its records hold."""
    import threading
    import time

    from fleet.coord import figures
    from fleet.store.checkpoints import longest_prefixes, read_checkpoint
    from fleet.worker.run.outcome import HandedBack

    streaming, ended = threading.Event(), threading.Event()

    def engine_goes_on(run) -> None:
        live = run.begin(run.records[0].id, 0)
        while not ended.is_set():
            run.extend(live, [7])
            streaming.set()
            time.sleep(0.0002)

    def stopped_mid_stream(run, poll):
        from fleet.store.layout import read_chunk

        run.records = read_chunk(store, run.job, run.index)
        threading.Thread(target=engine_goes_on, args=(run,), daemon=True).start()
        streaming.wait(5)
        worker.ctx.stopping.set()
        while (stop := poll()) is None:
            time.sleep(0.01)
        return stop

    # When a run is stopped while its engine still streams one sample's ids
    try:
        _, outcome = worker.run(2, stopped_mid_stream)
    finally:
        ended.set()
    assert isinstance(outcome, HandedBack)
    # Then its last checkpoint holds ids, and the tokens it reported cover every one of them
    segments = [seg for key in store.list(checkpoint_prefix(JOB, 2))
                for seg in read_checkpoint(store.get(key), key, worker.ctx.identity_hash).segments]
    stored = sum(len(p.ids) for p in longest_prefixes(segments).values())
    assert stored > 0
    assert figures.made_by(r, JOB, 2) >= stored

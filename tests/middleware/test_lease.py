"""LeaseMiddleware: one live owner per chunk; a lease lost while alive is retaken, or the
run cancelled at once when another worker holds it."""

from __future__ import annotations

import time

from fleet.coord import keys
from fleet.coord.leases import holder, leased_process, run_owner
from fleet.store.layout import result_key
from fleet.worker.run.outcome import Committed, Skipped
from tests.middleware.conftest import JOB, queued_messages
from tests.middleware.tasks import hold


def take(r, index: int, owner: str) -> bool:
    """Another worker's live lease on the chunk, set by hand: the lease names its run, its process's key lives."""
    return bool(r.set(keys.lease(JOB, index), owner) and r.set(keys.process_lease(leased_process(owner)), 1, px=30_000))


def test_lease_is_held_while_running_and_released_after_commit(worker, r, store):
    seen = {}

    def look(run):
        seen["holder"] = holder(r, JOB, 0)
        seen["running"] = r.sismember(keys.running(), keys.member(JOB, 0))
        seen["started"] = r.hget(keys.lease_started(), keys.member(JOB, 0))

    # Given a delivered chunk marked queued
    r.sadd(keys.queued(JOB), 0)
    # When it runs to its commit
    _, outcome = worker.run(0, hold(worker.task, lambda: True, then=look))
    # Then the lease was ours and watched while it ran, and everything is gone after
    assert isinstance(outcome, Committed) and store.exists(result_key(JOB, 0))
    assert seen["holder"] == worker.ctx.owner and seen["running"] and seen["started"]
    assert holder(r, JOB, 0) is None and not r.smembers(keys.running())
    assert not r.hgetall(keys.lease_started()) and not r.hgetall(keys.lease_beat())
    assert not r.smembers(keys.queued(JOB))


def test_delivery_of_a_chunk_leased_by_a_live_worker_is_skipped(worker, other, r, store):
    # Given chunk 1 leased by another worker
    other_lease_taken = take(r, 1, other.ctx.owner)
    assert other_lease_taken
    # When a duplicate delivery reaches this worker
    _, outcome = worker.run(1)
    # Then it skips: no work, no requeue, the other lease untouched
    assert isinstance(outcome, Skipped) and "held by" in outcome.reason
    assert holder(r, JOB, 1) == other.ctx.owner
    assert queued_messages(r) == [] and not store.exists(result_key(JOB, 1))


def test_lease_lost_while_alive_is_taken_again_and_the_run_commits(worker, r, store):
    # Given a running chunk whose lease vanishes (expired during a broker stall, or flushed)
    def vanish(run):
        r.delete(keys.lease(JOB, 0))

    def retaken() -> bool:
        return holder(r, JOB, 0) == worker.ctx.owner

    # When the heartbeat notices and the run goes on
    _, outcome = worker.run(0, hold(worker.task, retaken, then=vanish))
    # Then the lease was taken again and the run committed
    assert isinstance(outcome, Committed) and store.exists(result_key(JOB, 0))


def test_lease_taken_by_another_worker_cancels_the_run_at_once(worker, other, r, store):
    # Given a running chunk whose lease another worker takes over
    def steal(run):
        take(r, 2, other.ctx.owner)

    # When the run polls its middleware (it would otherwise wait forever here)
    _, outcome = worker.run(2, hold(worker.task, lambda: False, then=steal))
    # Then it is cancelled at once: no commit, no requeue, the new owner keeps its lease
    assert isinstance(outcome, Skipped) and "taken by" in outcome.reason
    assert not store.exists(result_key(JOB, 2)) and queued_messages(r) == []
    assert holder(r, JOB, 2) == other.ctx.owner


def test_a_second_delivery_of_a_chunk_this_process_runs_is_skipped(worker, r, store):
    # Given chunk 0 running in this process, its lease run out (a broker pause) and free to take
    seen = {}

    def redeliver(run):
        r.delete(keys.lease(JOB, 0))
        # When a second delivery of it reaches the same process (a requeue, a message Celery restored)
        seen["second"] = worker.run(0)[1]

    _, outcome = worker.run(0, hold(worker.task, lambda: holder(r, JOB, 0) == worker.ctx.owner, then=redeliver))
    # Then the second copy never starts: skipped without taking the lease, and the first takes its lease
    # back and commits
    assert isinstance(seen["second"], Skipped) and "runs in this process already" in seen["second"].reason
    assert isinstance(outcome, Committed) and store.exists(result_key(JOB, 0))
    assert queued_messages(r) == []


def test_the_lease_names_the_run_so_a_stale_run_of_the_same_process_is_cancelled(worker, r, store):
    # Given a running chunk whose lease another run of this same process takes over (a copy started
    # before the guard, or by an older fleet): same process, another run
    def steal(run):
        r.set(keys.lease(JOB, 2), run_owner(worker.ctx.owner, run.serial + 1000), px=30_000)

    # When the run renews
    _, outcome = worker.run(2, hold(worker.task, lambda: False, then=steal))
    # Then its renewal fails although the process is the same, and the run is cancelled at once
    assert isinstance(outcome, Skipped) and "taken by" in outcome.reason
    assert not store.exists(result_key(JOB, 2))


def test_a_retaken_lease_keeps_its_clock(worker, r, store):
    # Given a running chunk whose lease vanishes a while after it was taken
    seen = {}

    def vanish(run):
        seen["started"] = r.hget(keys.lease_started(), keys.member(JOB, 1))
        time.sleep(0.3)
        r.delete(keys.lease(JOB, 1))

    def retaken() -> bool:
        if holder(r, JOB, 1) != worker.ctx.owner:
            return False
        seen["again"] = r.hget(keys.lease_started(), keys.member(JOB, 1))
        return True

    # When the run takes it back
    _, outcome = worker.run(1, hold(worker.task, retaken, then=vanish))
    # Then the lease clock (the crash evidence) still starts when the run first took it
    assert isinstance(outcome, Committed)
    assert seen["again"] == seen["started"] is not None

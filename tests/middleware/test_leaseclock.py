"""The crash evidence is one clock, the lease clock: a failure the worker sees is timed from
taking the chunk lease (as the reaper times a lost worker, lease beat - lease start), never
from the delivery, so time spent in the gates never clears a suspicion."""

from __future__ import annotations

import time

from fleet.coord import keys
from fleet.coord.retry import RetryPolicy
from fleet.coord.suspects import suspicion
from fleet.errors import EngineError, StoreError
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.outcome import Failed
from tests.middleware.conftest import JOB
from tests.middleware.tasks import raise_


def crashes(r, index: int) -> int:
    return int(r.hget(keys.crashes(JOB), index) or 0)


def test_a_death_right_after_the_lease_is_suspected_however_long_the_delivery_waited(worker, r):
    # Given a delivery that arrived a minute before its run took the lease (far past the crash window)
    run = ChunkRun(job=JOB, index=0, attempt=1, worker=worker.ctx.name, started=time.time() - 60)
    # When the engine dies at once
    outcome = worker.owner.execute(run, raise_(EngineError("engine process died")))
    # Then the failure carries the lease clock, a fraction of a second, and the chunk is suspected
    assert isinstance(outcome, Failed) and outcome.leased_s is not None and outcome.leased_s < 5
    assert suspicion(r, JOB, 0).deaths == 1 and crashes(r, 0) == 0  # a death beside others: suspected, not counted


def test_a_death_long_after_the_lease_is_not_suspected(worker, r):
    # Given a crash window shorter than the run holds its lease
    object.__setattr__(worker.ctx, "policy", RetryPolicy(crash_window_s=0.3))

    def slow_death(run, poll):
        time.sleep(0.6)
        raise EngineError("engine process died")

    # When the engine dies 0.6 s after the lease was taken
    _, outcome = worker.run(1, slow_death)
    # Then the lease clock says so, and no suspicion is charged
    assert isinstance(outcome, Failed) and outcome.leased_s is not None and outcome.leased_s >= 0.6
    assert crashes(r, 1) == 0 and not suspicion(r, JOB, 1) and r.hget(keys.attempts(JOB), 1) is None


def test_a_failure_before_the_lease_has_no_lease_clock(worker, r, store):
    # Given a store that refuses to read the job's manifest: the manifest gate fails the run before the lease
    class RefusingManifests:
        def get(self, job: str) -> None:
            raise StoreError("the store answered 503")

    object.__setattr__(worker.ctx, "manifests", RefusingManifests())
    # When a delivery arrives
    _, outcome = worker.run(2)
    # Then it failed without a lease clock, and nothing was charged to the chunk
    assert isinstance(outcome, Failed) and outcome.leased_s is None
    assert crashes(r, 2) == 0 and r.hget(keys.attempts(JOB), 2) is None and r.hget(keys.retries(JOB), 2) == b"1"

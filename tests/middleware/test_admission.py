"""AdmissionMiddleware: a suspected chunk runs alone, on another worker than the one it last
died on; a benched worker backs off, then runs one chunk at a time until one commits."""

from __future__ import annotations

import threading
import time

import pytest

from fleet.coord import keys, suspects
from fleet.errors import EngineError
from fleet.worker.process.runslots import RunSlots
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.outcome import Committed, Failed, HandedBack
from tests.fleetproc import wait_for
from tests.middleware.conftest import JOB, queued_messages
from tests.middleware.tasks import hold, raise_


def suspect(r, index: int, died_on: str, at: float | None = None, deaths: int = 2) -> None:
    """The chunk was in `deaths` quick deaths beside other chunks, the last on `died_on`."""
    s = suspects.Suspicion()
    for _ in range(deaths):
        s = s.with_death(died_on, solo=False, at=at)
    r.hset(keys.suspects(JOB), index, s.to_json())


def ran_alone(caplog, index: int, worker: str) -> bool:
    return f"chunk {JOB}/{index} runs alone on {worker}" in caplog.text


@pytest.mark.slow
def test_a_suspect_waits_for_the_other_runs_then_runs_alone_and_is_cleared(worker, r, store, caplog):
    # Given a worker running chunk 0, and chunk 1 suspected after a death on another worker
    release, outcomes = threading.Event(), {}
    suspect(r, 1, died_on="gpu0@b")

    def run(index, task=None):
        outcomes[index] = worker.run(index, task)

    first = threading.Thread(target=run, args=(0, hold(worker.task, release.is_set)))
    first.start()
    wait_for(lambda: len(worker.ctx.run_slots) == 1, 60, "chunk 0 admitted")
    # When chunk 1 is delivered, it takes its lease and waits for chunk 0 to end
    second = threading.Thread(target=run, args=(1,))
    second.start()
    wait_for(lambda: worker.ctx.run_slots.alone is not None, 60, "chunk 1 claims the worker")
    assert r.hget(keys.solo_runs(), f"{JOB}/1") is None and r.get(keys.lease(JOB, 1)) is not None
    # marked as waiting, not running, alone: a death now is no evidence either way
    assert r.hget(keys.solo_waits(), f"{JOB}/1") == worker.ctx.owner.encode()
    # and meanwhile a third chunk is handed back to the queue at once, not run beside it
    began = time.monotonic()
    _, third = worker.run(2)
    assert isinstance(third, HandedBack) and "alone" in third.reason and time.monotonic() - began >= 0.9
    assert [m["index"] for m in queued_messages(r)] == [2]
    release.set()
    first.join(30)
    second.join(30)
    # Then chunk 1 ran alone after chunk 0 ended, committed, and is no longer suspected
    run1, outcome1 = outcomes[1]
    assert isinstance(outcomes[0][1], Committed) and isinstance(outcome1, Committed)
    assert ran_alone(caplog, 1, "gpu0@a") and not ran_alone(caplog, 0, "gpu0@a")
    assert suspects.suspicion(r, JOB, 1).deaths == 0
    assert r.hget(keys.solo_runs(), f"{JOB}/1") is None and r.hget(keys.lease_holder(), f"{JOB}/1") is None
    assert r.hget(keys.solo_waits(), f"{JOB}/1") is None
    assert worker.ctx.run_slots.alone is None and len(worker.ctx.run_slots) == 0
    assert suspects.median_duration(r, JOB) is not None


@pytest.mark.slow
def test_a_suspect_is_left_to_another_worker_than_the_one_it_died_on(worker, other, r, store, settings, caplog):
    # Given chunk 1 whose last death (its first, beside other chunks) was on worker gpu0@a, just now
    suspect(r, 1, died_on="gpu0@a", deaths=1)
    # When gpu0@a is delivered it, Then it hands it back
    _, outcome = worker.run(1)
    assert isinstance(outcome, HandedBack) and "left to other workers" in outcome.reason
    # and another worker runs it, beside others still (one death says little), and clears it
    run, outcome = other.run(1)
    assert isinstance(outcome, Committed) and not ran_alone(caplog, 1, "gpu0@b") and not suspects.suspicion(r, JOB, 1)
    # and once the hold is over, gpu0@a would take it too
    suspect(r, 0, died_on="gpu0@a", at=time.time() - settings.failure.suspect_hold_s - 1)
    run, outcome = worker.run(0)
    assert isinstance(outcome, Committed) and ran_alone(caplog, 0, "gpu0@a")


@pytest.mark.slow
def test_a_benched_worker_backs_off_then_runs_one_chunk_alone_and_a_commit_ends_its_bench(worker, r, store, caplog):
    # Given worker gpu0@a benched: its processes died bench_after times in a row before finishing a batch,
    # while worker gpu0@b commits
    policy = worker.ctx.policy
    suspects.note_commit(r, "gpu0@b:1")
    for n in range(policy.bench_after):
        suspects.note_process_death(r, f"gpu0@a:{100 + n}")
    assert policy.benched_for(suspects.worker_health(r, "gpu0@a").streak, others_healthy=True) is not None
    # When a chunk is delivered within its bench time
    _, outcome = worker.run(0)
    # Then it is handed back at once, to the queue
    assert isinstance(outcome, HandedBack) and "benched" in outcome.reason
    assert [m["index"] for m in queued_messages(r)] == [0]
    # When the bench time is over (the last death long ago)
    r.hset(keys.worker_last_death(), "gpu0@a", int((time.time() - 3600) * 1000))
    time.sleep(1.1)  # the worker's read of its record is a second old at most
    run, outcome = worker.run(0)
    # Then it runs the chunk alone, and the commit ends the streak
    assert isinstance(outcome, Committed) and ran_alone(caplog, 0, "gpu0@a")
    assert suspects.worker_health(r, "gpu0@a").streak == 0 and suspects.dying_workers(r) == []


def test_an_engine_death_in_a_solo_run_counts_against_the_chunk(worker, r, store):
    # Given chunk 2, suspected twice beside other chunks on another worker
    suspect(r, 2, died_on="gpu0@b")
    # When its engine dies right after it starts alone here
    _, outcome = worker.run(2, raise_(EngineError("engine process died")))
    # Then the failure says it ran alone, timed from its solo start, and that death counts
    assert isinstance(outcome, Failed) and outcome.solo and outcome.leased_s is not None and outcome.leased_s < 1
    assert int(r.hget(keys.crashes(JOB), 2)) == 1 and suspects.suspicion(r, JOB, 2).solo == ("gpu0@a",)
    assert [m["index"] for m in queued_messages(r)] == [2]


def test_a_process_is_healthy_once_it_finished_a_batch():
    # Given a process that ran three chunks at once
    slots = RunSlots()
    runs = [ChunkRun(job=JOB, index=i, attempt=1, worker="gpu0@a") for i in range(3)]
    assert all(slots.enter(run) for run in runs)
    for run in runs:
        slots.leave(run)
    # Then one or two commits are no proof of health (a crash-looping process may get that far); three are
    assert [slots.committed() for _ in range(4)] == [False, False, True, True]


def test_a_suspect_handed_back_while_waiting_to_run_alone_leaves_no_marks(worker, r, store):
    # Given a worker running chunk 0, and suspected chunk 1 leased and waiting for it to end
    release, outcomes = threading.Event(), {}
    suspect(r, 1, died_on="gpu0@b")

    def run(index, task=None):
        outcomes[index] = worker.run(index, task)

    first = threading.Thread(target=run, args=(0, hold(worker.task, release.is_set)))
    first.start()
    wait_for(lambda: len(worker.ctx.run_slots) == 1, 60, "chunk 0 admitted")
    second = threading.Thread(target=run, args=(1,))
    second.start()
    wait_for(lambda: r.hget(keys.solo_waits(), f"{JOB}/1") is not None, 60, "chunk 1 waits to run alone")
    # When the worker shuts down during the wait
    worker.ctx.stopping.set()
    second.join(30)
    release.set()
    first.join(30)
    # Then chunk 1 is handed back, never having run, and no mark says it waits or runs here
    assert isinstance(outcomes[1][1], HandedBack) and "shutdown" in outcomes[1][1].reason
    assert r.hget(keys.solo_waits(), f"{JOB}/1") is None and r.hget(keys.solo_runs(), f"{JOB}/1") is None
    assert r.hget(keys.lease_holder(), f"{JOB}/1") is None
    assert suspects.suspicion(r, JOB, 1).deaths == 2 and r.hget(keys.crashes(JOB), 1) is None

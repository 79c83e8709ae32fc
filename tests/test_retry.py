"""fleet.coord.retry: one table of what a failure means, read from the error's class only."""

from __future__ import annotations

import math

import pytest
import redis as redis_lib

from fleet.coord.retry import Action, History, RetryPolicy, Spend, fault_of
from fleet.coord.suspects import Suspicion
from fleet.errors import ChunkCorrupt, EngineError, ObjectMissing, StoreError, WorkerLost

POLICY = RetryPolicy(max_attempts=3, max_crashes=3, crash_window_s=10, backoff_s=1, backoff_max_s=30,
                     crash_window_fraction=0.5)


@pytest.mark.parametrize("cause", [StoreError("s3 down"),
                                   redis_lib.ConnectionError("broker gone"), ConnectionResetError("reset")])
def test_infra_errors_never_spend_or_quarantine(cause):
    # Given a chunk far past every budget, When an infra error ends its run
    d = POLICY.decide(cause, History(attempts=99, crashes=99, retries=3, ran_s=0))
    # Then it is requeued after a doubling backoff, with only the retry counter grown
    assert (d.action, d.spend, d.count, d.delay_s) == (Action.REQUEUE, Spend.RETRY, 4, 8.0)


def test_backoff_is_capped():
    assert POLICY.decide(StoreError("x"), History(retries=40)).delay_s == 30


@pytest.mark.parametrize("cause", [RuntimeError("bad"), ChunkCorrupt("broken"), EngineError("died")])
def test_nothing_is_quarantined_before_the_lease_is_taken(cause):
    d = POLICY.decide(cause, History(attempts=99, crashes=99, ran_s=0, lease_taken=False))
    assert d.action is Action.REQUEUE and d.spend is Spend.RETRY


def test_chunk_fault_spends_attempts_up_to_quarantine():
    assert POLICY.decide(RuntimeError("x"), History(attempts=1)).action is Action.REQUEUE
    d = POLICY.decide(RuntimeError("x"), History(attempts=2))
    assert (d.action, d.spend, d.count) == (Action.QUARANTINE, Spend.ATTEMPT, 3)


@pytest.mark.parametrize("cause", [ChunkCorrupt("bad json"), ObjectMissing("chunk object gone")])
def test_hopeless_is_quarantined_at_once(cause):
    assert POLICY.decide(cause, History()).action is Action.QUARANTINE


@pytest.mark.parametrize("cause", [WorkerLost("lease expired"), EngineError("engine died")])
def test_a_crash_after_a_long_run_is_not_the_chunks(cause):
    d = POLICY.decide(cause, History(attempts=2, crashes=4, ran_s=60))
    assert (d.action, d.spend) == (Action.REQUEUE, Spend.NOTHING)


def test_a_crash_with_no_clock_is_no_evidence():
    assert POLICY.decide(WorkerLost("x"), History(crashes=4, ran_s=math.inf)).spend is Spend.NOTHING


@pytest.mark.parametrize("cause", [WorkerLost("lease expired"), EngineError("engine died")])
def test_a_quick_death_beside_other_chunks_is_a_suspicion_never_a_quarantine(cause):
    # Given a chunk already in many quick deaths, each beside the other chunks of its worker
    history = History(attempts=2, ran_s=1.5, worker="cpu0@a", suspicion=Suspicion(deaths=40, last="cpu0@a"))
    # When one more such death is seen
    d = POLICY.decide(cause, history)
    # Then it stays a suspect (it runs alone next); nothing counts towards quarantine
    assert (d.action, d.spend, d.count) == (Action.REQUEUE, Spend.SUSPECT, 41)
    assert "alone" in d.why


def test_a_worker_that_keeps_dying_beside_healthy_ones_is_blamed_not_its_chunks():
    # Given a worker whose previous process also died before finishing a batch, in a fleet
    # where another worker commits
    d = POLICY.decide(WorkerLost("x"), History(ran_s=1.0, worker="cpu0@bad", worker_streak=1, others_healthy=True))
    # Then its chunks are not even suspected, and no evidence they had is erased
    assert (d.action, d.spend, d.clears) == (Action.REQUEUE, Spend.NOTHING, False)
    assert "cpu0@bad" in d.why


def test_a_dying_worker_alone_cannot_be_told_from_its_chunks_so_they_are_judged():
    # Given the only worker of a machine, benched after dying on a poison chunk again and again
    history = History(crashes=2, ran_s=0.5, solo=True, worker="cpu0@h", worker_streak=POLICY.bench_after,
                      suspicion=Suspicion(deaths=4, solo=("cpu0@h", "cpu0@h"), last="cpu0@h"))
    # Then its deaths still count against the chunk: the one-machine poison case ends
    assert POLICY.decide(WorkerLost("x"), history).action is Action.QUARANTINE
    assert POLICY.decide(WorkerLost("x"), History(ran_s=1.0, worker="cpu0@h", worker_streak=2)).spend is Spend.SUSPECT


def test_a_chunk_runs_alone_after_solo_after_deaths_beside_others():
    assert not POLICY.runs_alone(Suspicion())
    assert not POLICY.runs_alone(Suspicion(deaths=POLICY.solo_after - 1))
    assert POLICY.runs_alone(Suspicion(deaths=POLICY.solo_after))
    assert POLICY.decide(WorkerLost("x"), History(ran_s=1, suspicion=Suspicion(deaths=1))).why.endswith(
        "runs alone next")


def test_a_solo_death_on_a_benched_worker_is_the_workers():
    # Given a benched worker (its processes died bench_after times in a row before finishing a batch)
    history = History(crashes=2, ran_s=0.5, solo=True, worker="cpu0@bad", worker_streak=POLICY.bench_after,
                      suspicion=Suspicion(deaths=4, solo=("cpu0@bad", "cpu0@bad"), last="cpu0@bad"),
                      others_healthy=True)
    # When it dies running a chunk alone on probation, Then nothing counts against the chunk
    d = POLICY.decide(WorkerLost("x"), history)
    assert (d.action, d.spend, d.clears) == (Action.REQUEUE, Spend.NOTHING, False) and "benched" in d.why


def test_solo_deaths_on_two_hosts_quarantine():
    # Given a chunk whose solo run already killed a worker on host a
    history = History(crashes=1, ran_s=0.5, solo=True, worker="cpu0@b",
                      suspicion=Suspicion(deaths=2, solo=("cpu0@a",), last="cpu0@a"))
    # When it kills a worker on host b, alone
    d = POLICY.decide(WorkerLost("x"), history)
    # Then it is quarantined, naming both hosts
    assert (d.action, d.spend, d.count) == (Action.QUARANTINE, Spend.CRASH, 2)
    assert "a, b" in d.why


def test_solo_deaths_on_one_host_need_max_crashes():
    # Given one machine: every solo death is on host a (several workers, or one restarted)
    one = Suspicion(deaths=2, solo=("cpu0@a",), last="cpu0@a")
    d = POLICY.decide(WorkerLost("x"), History(crashes=1, ran_s=0.5, solo=True, worker="cpu1@a", suspicion=one))
    assert (d.action, d.spend, d.count) == (Action.REQUEUE, Spend.CRASH, 2)
    two = Suspicion(deaths=3, solo=("cpu0@a", "cpu1@a"), last="cpu1@a")
    d = POLICY.decide(WorkerLost("x"), History(crashes=2, ran_s=0.5, solo=True, worker="cpu0@a", suspicion=two))
    # Then the max_crashes-th quarantines it: the one-machine poison case ends
    assert (d.action, d.spend, d.count) == (Action.QUARANTINE, Spend.CRASH, POLICY.max_crashes)


def test_the_crash_window_is_a_fraction_of_the_jobs_median_chunk_time_capped_by_the_setting():
    assert POLICY.window(None) == 10
    assert POLICY.window(8.0) == 4.0
    assert POLICY.window(600.0) == 10
    # a death 5 s into a chunk of a job whose chunks run 8 s is no evidence; 3 s is
    d = POLICY.decide(WorkerLost("x"), History(ran_s=5, median_s=8, solo=True, crashes=2,
                                               suspicion=Suspicion(deaths=3, solo=("cpu0@a",))))
    assert (d.action, d.spend, d.clears) == (Action.REQUEUE, Spend.NOTHING, True)
    assert POLICY.decide(WorkerLost("x"), History(ran_s=3, median_s=8)).spend is Spend.SUSPECT


def test_the_bench_starts_at_bench_after_and_doubles_to_its_cap():
    policy = RetryPolicy(bench_after=3, bench_backoff_s=10, bench_backoff_max_s=60)
    assert [policy.benched_for(n) for n in range(6)] == [None, None, None, 10, 20, 40]
    assert policy.benched_for(30) == 60
    # and only beside a healthy worker: a fleet whose workers all die alike benches none
    assert policy.benched_for(5, others_healthy=False) is None


def test_fault_is_read_from_the_class_never_the_message():
    assert fault_of(RuntimeError("S3 connection reset")).value == "chunk"
    assert fault_of(StoreError("bad record")).value == "infra"


@pytest.mark.parametrize("waited_s", [0.5, 60.0])
def test_a_death_while_waiting_to_run_alone_spends_nothing_and_clears_nothing(waited_s):
    # Given a suspect with a solo death behind it, that waited (leased) for its worker's other chunks to end
    history = History(crashes=1, ran_s=waited_s, waiting=True, worker="cpu0@a",
                      suspicion=Suspicion(deaths=3, solo=("cpu0@b",), last="cpu0@b"))
    # When its process dies during the wait, short or long
    d = POLICY.decide(WorkerLost("x"), history)
    # Then it is requeued: it never ran, so it is neither suspected again nor cleared
    assert (d.action, d.spend, d.count, d.clears) == (Action.REQUEUE, Spend.NOTHING, 0, False)
    assert "waited" in d.why

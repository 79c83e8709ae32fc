"""fleet.coord.retry: one table of what a failure means, read from the error's class only."""

from __future__ import annotations

import math

import pytest
import redis as redis_lib

from fleet.coord.retry import Action, History, RetryPolicy, Spend, fault_of
from fleet.errors import ChunkCorrupt, EngineError, ManifestMissing, ObjectMissing, StoreError, WorkerLost

POLICY = RetryPolicy(max_attempts=3, max_crashes=5, crash_window_s=10, backoff_s=1, backoff_max_s=30)


@pytest.mark.parametrize("cause", [StoreError("s3 down"), ManifestMissing("other store"),
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
def test_quick_crashes_are_suspicions_with_their_own_budget(cause):
    d = POLICY.decide(cause, History(attempts=2, crashes=3, ran_s=1.5))
    assert (d.action, d.spend, d.count) == (Action.REQUEUE, Spend.CRASH, 4)
    d = POLICY.decide(cause, History(attempts=0, crashes=4, ran_s=1.5))
    assert (d.action, d.spend, d.count) == (Action.QUARANTINE, Spend.CRASH, 5)


def test_fault_is_read_from_the_class_never_the_message():
    assert fault_of(RuntimeError("S3 connection reset")).value == "chunk"
    assert fault_of(StoreError("bad record")).value == "infra"

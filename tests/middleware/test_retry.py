"""RetryMiddleware and the gates: every failure goes through fleet.coord.retry; a hand-back
spends nothing; nothing is quarantined before its lease was taken."""

from __future__ import annotations

import logging
import time

from fleet.coord import keys
from fleet.coord.broker import PRIORITY_NORMAL, chunk_queue
from fleet.coord.chunkstate import read_failures
from fleet.coord.mismatch import mismatched_workers
from fleet.coord.suspects import suspicion, worker_health
from fleet.errors import EngineError, EngineUnavailable, StoreError
from fleet.store.layout import manifest_key, result_key
from fleet.store.options import JobOptions, OptionsCache, write_options
from fleet.worker.process.context import ManifestCache
from fleet.worker.run.middleware import Middleware, Order, owner_stack
from fleet.worker.run.outcome import Committed, Failed, HandedBack, Outcome
from fleet.worker.runtime import log_outcome
from tests.middleware.conftest import JOB, queued_messages
from tests.middleware.tasks import raise_


def attempts(r, index: int) -> int:
    return int(r.hget(keys.attempts(JOB), index) or 0)


def test_the_chunks_own_failure_spends_attempts_until_quarantine(worker, r, store):
    # Given a chunk whose run always fails by its own fault
    for n in (1, 2):
        # When it fails, Then an attempt is spent and it is requeued
        _, outcome = worker.run(0, raise_(RuntimeError("bad chunk")), attempt=n)
        assert isinstance(outcome, Failed)
        assert attempts(r, 0) == n and len(queued_messages(r)) == n
    # and the third failure quarantines it with its traceback
    worker.run(0, raise_(RuntimeError("bad chunk")), attempt=3)
    [failure] = read_failures(store, JOB)
    assert failure["attempts"] == 3 and failure["error_type"] == "RuntimeError" and "Traceback" in failure["traceback"]
    assert len(queued_messages(r)) == 2


def test_the_jobs_own_attempts_go_over_the_fleets(worker, r, store):
    # Given a job whose options allow one attempt (the fleet's max_attempts is 3), set while the worker runs
    write_options(store, JOB, JobOptions(max_attempts=1))
    object.__setattr__(worker.ctx, "options", OptionsCache(store, max_age_s=0.0))
    # When a chunk fails by its own fault once
    worker.run(0, raise_(RuntimeError("bad chunk")), attempt=1)
    # Then it is quarantined at once, nothing requeued
    [failure] = read_failures(store, JOB)
    assert failure["attempts"] == 1 and queued_messages(r) == []


def test_store_errors_spend_nothing_and_back_off(worker, r, store):
    # Given a store failing on every run of chunk 1, far more often than max_attempts
    began = time.monotonic()
    for _ in range(6):
        _, outcome = worker.run(1, raise_(StoreError("S3 put failed after retries")))
        assert isinstance(outcome, Failed)
    # Then every run was requeued after a backoff, none quarantined, no attempt spent
    assert len(queued_messages(r)) == 6 and read_failures(store, JOB) == []
    assert attempts(r, 1) == 0 and int(r.hget(keys.retries(JOB), 1)) == 6
    assert time.monotonic() - began >= 0.01 + 0.02 + 0.04 + 3 * 0.05


def test_an_outage_requeue_is_logged_once_saying_no_attempt_was_spent(worker, r, caplog):
    # Given a run that fails because the engine's server is out of reach (an infrastructure fault)
    caplog.set_level(logging.INFO)
    run, outcome = worker.run(1, raise_(EngineUnavailable("the server at http://gpu-7:8000 is out of reach")))
    log_outcome(run, outcome)  # the runtime's line for the run (Runtime.run_chunk)
    # Then it is requeued with no attempt spent, and its one failure line says so: a warning, no "attempt 1 failed"
    assert isinstance(outcome, Failed) and attempts(r, 1) == 0 and len(queued_messages(r)) == 1
    failed = [x for x in caplog.records if "failed" in x.getMessage()]
    assert [x.levelname for x in failed] == ["WARNING"], [x.getMessage() for x in failed]
    [line] = [x.getMessage() for x in failed]
    assert "EngineUnavailable" in line and "requeued in" in line and "no attempt spent" in line
    assert "attempt 1" not in line and not any(x.levelno >= logging.ERROR for x in caplog.records)


def test_a_store_without_the_manifest_hands_back_behind_the_queue_and_says_so_once(worker, r, store, settings,
                                                                                   caplog, monkeypatch):
    import fleet.worker.run.middleware.gates as gates

    monkeypatch.setattr(gates, "MISPLACED_HOLD_S", 0.01)
    # Given a worker whose store lacks the job's manifest (not the store the job's queue is for)
    store.delete(manifest_key(JOB))
    object.__setattr__(worker.ctx, "manifests", ManifestCache(store))
    # When three deliveries of the job reach it
    with caplog.at_level(logging.CRITICAL):
        outcomes = [worker.run(0)[1] for _ in range(3)]
    # Then each is handed back behind every waiting chunk (normal priority, never recovery priority),
    # never leased, never quarantined, no attempt or retry spent
    assert all(isinstance(o, HandedBack) and o.tail for o in outcomes)
    waiting = {p: r.llen(name) for p, name in zip(keys.PRIORITY_STEPS, keys.queue_lists(chunk_queue(settings)),
                                                  strict=True)}
    assert {p: n for p, n in waiting.items() if n} == {PRIORITY_NORMAL: 3}
    assert r.get(keys.lease(JOB, 0)) is None and not r.hgetall(keys.lease_started())
    assert read_failures(store, JOB) == [] and attempts(r, 0) == 0 and not r.hgetall(keys.retries(JOB))
    # And it said so once, as CRITICAL, naming the setting to check, and `fleet status` names it
    critical = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.CRITICAL]
    assert len(critical) == 1 and "misconfigured" in critical[0] and "FLEET_STORE_URL" in critical[0]
    [entry] = mismatched_workers(r, JOB)
    assert entry["worker"] == worker.ctx.name and entry["kind"] == "store" and entry["store"] == store.url


def test_engine_death_right_after_start_is_a_suspicion_and_restarts_the_worker(worker, r, store):
    # When the engine dies on a chunk just started
    _, outcome = worker.run(2, raise_(EngineError("engine process died")))
    # Then the worker restarts and stops taking chunks; the chunk is requeued as a suspect, no attempt spent
    assert isinstance(outcome, Failed)
    assert worker.restarts and worker.ctx.stopping.is_set()
    assert suspicion(r, JOB, 2).deaths == 1 and r.hget(keys.crashes(JOB), 2) is None and attempts(r, 2) == 0
    assert [m["index"] for m in queued_messages(r)] == [2]
    # and the death is counted against the worker
    assert worker_health(r, "gpu0@a").deaths == 1


def test_a_stopping_worker_hands_the_delivery_straight_back(worker, r, store):
    # Given a worker past its grace period
    worker.ctx.stopping.set()
    # When a chunk is delivered
    _, outcome = worker.run(1)
    # Then it goes back to the queue at once, unleased, with no attempt spent
    assert isinstance(outcome, HandedBack)
    assert queued_messages(r) == [{"job": JOB, "index": 1, "attempt": 1}]
    assert r.sismember(keys.queued(JOB), 1) and attempts(r, 1) == 0 and r.get(keys.lease(JOB, 1)) is None


class RefuseAll(Middleware[None]):
    """A gate like the worker configuration check: hands every chunk back."""

    order = Order.GATE

    def before(self, run, state) -> Outcome | None:
        return HandedBack("configuration differs from the job's", delay_s=0.01)


def test_a_gate_middleware_hands_back_without_spending(worker, r, store):
    # Given the owner stack with one more gate
    from fleet.worker.run.chunk import ChunkRun
    from fleet.worker.run.executor import Executor

    executor = Executor([*owner_stack(worker.ctx), RefuseAll(worker.ctx)])
    # When a chunk is delivered
    outcome = executor.execute(ChunkRun(job=JOB, index=0, attempt=1, worker="w"), worker.task)
    # Then it is handed back before its lease: requeued, no attempt, no result
    assert isinstance(outcome, HandedBack)
    assert len(queued_messages(r)) == 1 and attempts(r, 0) == 0 and not store.exists(result_key(JOB, 0))
    # And the same worker without the gate commits it
    assert isinstance(worker.run(0)[1], Committed)


def test_every_middleware_states_a_distinct_order(worker):
    stack = owner_stack(worker.ctx)
    orders = [m.order for m in stack]
    assert len(set(orders)) == len(orders)
    by_name = {type(m).__name__: m.order for m in stack}
    # the lease is released (after, reverse order) before the retry middleware requeues
    assert by_name["RetryMiddleware"] < by_name["LeaseMiddleware"]
    assert by_name["RetryMiddleware"] < by_name["CrashMiddleware"]

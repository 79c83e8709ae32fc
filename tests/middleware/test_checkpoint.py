"""CheckpointMiddleware and ResultGate: finished records survive a failed or stopped run;
checkpoints go only once the chunk's result exists, on every path that finds it."""

from __future__ import annotations

from fleet.store.layout import checkpoint_prefix, result_key
from fleet.store.results import read_result
from fleet.worker.outcome import Committed, Failed, HandedBack, Skipped
from tests.middleware.conftest import JOB, queued_messages
from tests.middleware.tasks import generate_then_raise, hold


def partials(store, index: int) -> list[str]:
    return list(store.list(checkpoint_prefix(JOB, index)))


def test_failed_run_keeps_its_records_and_the_rerun_resumes_them(worker, store):
    # Given a run that generated every sample and then failed before committing
    _, outcome = worker.run(0, generate_then_raise(worker.task, RuntimeError("late failure")))
    assert isinstance(outcome, Failed) and partials(store, 0)
    # When the chunk runs again
    _, again = worker.run(0, attempt=2)
    # Then it resumes all of them, commits, and the checkpoints are gone
    assert isinstance(again, Committed)
    stats, rows = read_result(store, JOB, 0)
    assert stats is not None and stats.resumed == len(rows) == 4
    assert partials(store, 0) == []


def test_a_stopping_helper_keeps_the_owners_checkpoints(worker, other, store, r):
    # Given the owner's checkpoint of chunk 1, and a helper assisting it
    store.put(checkpoint_prefix(JOB, 1) + "000001-owner", b"")
    stopping = other.ctx.stopping
    # When the helper's worker starts stopping mid-run
    _, outcome = other.run(1, hold(other.task, lambda: False, then=lambda run: stopping.set()), assist=True)
    # Then the helper hands back: no result, nothing requeued (the owner goes on), and the
    # owner's checkpoint is still there
    assert isinstance(outcome, HandedBack)
    assert not store.exists(result_key(JOB, 1)) and queued_messages(r) == []
    assert partials(store, 1) == [checkpoint_prefix(JOB, 1) + "000001-owner"]


def test_redelivery_after_commit_drops_leftover_checkpoints(worker, store, r):
    # Given a committed chunk whose worker died before deleting its checkpoints
    assert isinstance(worker.run(2)[1], Committed)
    store.put(checkpoint_prefix(JOB, 2) + "000001-dead", b"")
    # When its message is delivered again
    _, outcome = worker.run(2)
    # Then the run does nothing but drop the checkpoints
    assert isinstance(outcome, Skipped) and outcome.reason == "already has a result"
    assert partials(store, 2) == [] and queued_messages(r) == []

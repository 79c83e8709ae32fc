"""CheckpointMiddleware and ResultGate: finished records survive a failed or stopped run;
checkpoints go only once the chunk's result exists, on every path that finds it."""

from __future__ import annotations

from fleet.store.layout import checkpoint_prefix, result_key
from fleet.store.results import read_result
from fleet.worker.run.outcome import Committed, Failed, HandedBack, Skipped
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


def test_a_run_stopped_after_another_worker_committed_its_chunk_leaves_no_checkpoint(worker, other, store):
    # Given a checkpoint of chunk 1, and a helper assisting it
    store.put(checkpoint_prefix(JOB, 1) + "000001-owner", b"")
    stopping = other.ctx.stopping

    def committed_then_stopping(run) -> None:
        store.put(result_key(JOB, 1), b"committed by the owner")
        stopping.set()

    # When the owner commits the chunk and then the helper's worker starts stopping mid-run
    _, outcome = other.run(1, hold(other.task, lambda: False, then=committed_then_stopping), assist=True)
    # Then the helper hands back, and no checkpoint is kept for a chunk no one will run again
    assert isinstance(outcome, HandedBack)
    assert partials(store, 1) == []


def test_redelivery_after_commit_drops_leftover_checkpoints(worker, store, r):
    # Given a committed chunk whose worker died before deleting its checkpoints
    assert isinstance(worker.run(2)[1], Committed)
    store.put(checkpoint_prefix(JOB, 2) + "000001-dead", b"")
    # When its message is delivered again
    _, outcome = worker.run(2)
    # Then the run does nothing but drop the checkpoints
    assert isinstance(outcome, Skipped) and outcome.reason == "already has a result"
    assert partials(store, 2) == [] and queued_messages(r) == []


def test_a_chunk_suspected_of_killing_an_engine_starts_its_running_samples_again(worker, store, r, settings):
    from fleet.coord import suspects
    from fleet.engines.sim.engine import sim_length
    from fleet.engines.sim.tokenchain import SimVocab, sim_tokens
    from fleet.records import derive_seed
    from fleet.store.checkpoints import IdsDigest, Segment, encode_checkpoint
    from fleet.store.layout import checkpoint_key

    # Given a checkpoint of chunk 0 with the first ids of two of its samples, as a run left them when its
    # engine died, and the chunk suspected of that death
    segments = []
    for rid in ("r00000", "r00001"):
        seed = derive_seed(0, rid, 0)
        ids, _ = sim_tokens(SimVocab(), seed, sim_length(settings.sim, seed), 10**6)
        segments.append(Segment(rid, 0, 0, IdsDigest().hexdigest(), ids[:3]))
    store.put(checkpoint_key(JOB, 0, 1, "gpu0@dead"), encode_checkpoint([], worker.ctx.identity_hash, segments))
    suspects.note_death(r, JOB, 0, "gpu0@dead", solo=False)
    # When it runs again
    _, outcome = worker.run(0)
    # Then those samples were made again from token 0 (a continuation's prefill is what likely killed it),
    # counted, and the chunk committed
    assert isinstance(outcome, Committed)
    stats, rows = read_result(store, JOB, 0)
    assert stats is not None and stats.samples_restarted == 2
    assert all(row["continued_at"] is None for row in rows)


def test_a_run_that_ends_before_its_drain_flush_still_counts_for_the_notices_clock(worker):
    # Given a worker told of a SIGTERM (its drain begun) while a run was finishing its chunk, after its
    # last look at the middleware: no drain flush of it will come
    def finish_then_drain(run, poll):
        outcome = worker.task(run, poll)
        worker.ctx.drain_clock.begin()
        worker.ctx.draining.set()
        return outcome

    # When the run ends
    worker.run(0, finish_then_drain)
    # Then the notice's clock counts it as flushed (nothing of it is left to flush), so the worker measures
    # its drain instead of waiting out half its notice for a flush that never comes
    assert worker.ctx.drain_clock.wait(1, 0.5) is not None

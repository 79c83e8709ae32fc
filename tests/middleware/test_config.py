"""The configuration gate: a worker whose engine differs from the job's hands chunks back."""

from __future__ import annotations

import logging

from fleet.coord import keys
from fleet.coord.mismatch import mismatched_workers
from fleet.store.checkpoints import encode_checkpoint
from fleet.store.layout import checkpoint_prefix, result_key
from fleet.worker.run.outcome import Committed, HandedBack
from tests.middleware.conftest import JOB, make_worker, queued_messages


def other_engine(settings):
    """The same worker settings with another sim length distribution: other outputs."""
    return settings.model_copy(update={"sim": settings.sim.model_copy(update={"mean_output_tokens": 300})})


def test_a_mismatched_worker_hands_back_without_spending_and_says_so_once(settings, store, r, host, job, caplog,
                                                                         monkeypatch):
    import fleet.worker.run.middleware.configmatch as config

    monkeypatch.setattr(config, "MISMATCH_HOLD_S", 0.01)
    # Given a worker whose sim engine makes longer outputs than the job's
    odd = make_worker(other_engine(settings), store, r, host, "gpu0@odd")
    try:
        # When two of the job's chunks are delivered to it
        with caplog.at_level(logging.CRITICAL):
            outcomes = [odd.run(i)[1] for i in (0, 1)]
    finally:
        odd.ctx.heartbeat.stop()
    # Then both go back to the queue unleased, with no attempt spent and no result
    assert all(isinstance(o, HandedBack) for o in outcomes)
    assert sorted(m["index"] for m in queued_messages(r)) == [0, 1]
    assert not r.hgetall(keys.attempts(JOB)) and r.get(keys.lease(JOB, 0)) is None
    assert not store.exists(result_key(JOB, 0))
    # And it logged the difference once as critical, and `fleet status` can list it
    critical = [rec for rec in caplog.records if rec.levelno == logging.CRITICAL]
    assert len(critical) == 1 and "sim.mean_output_tokens: 40.0 -> 300" in critical[0].getMessage()
    [entry] = mismatched_workers(r, JOB)
    assert entry["worker"] == "gpu0@odd" and entry["differences"] == ["sim.mean_output_tokens: 40.0 -> 300"]


def test_a_matching_worker_runs_the_chunk(worker, r, store):
    # Given a worker with the job's own engine settings, When it runs a chunk, Then it commits
    _, outcome = worker.run(0)
    assert isinstance(outcome, Committed) and store.exists(result_key(JOB, 0))
    assert mismatched_workers(r, JOB) == []


def test_checkpoints_of_another_configuration_are_not_resumed(worker, store):
    # Given a checkpoint of chunk 2 made under another engine configuration, claiming every sample
    manifest = worker.ctx.manifests.get(JOB)
    assert manifest is not None
    fake = [{"id": f"r{i:05d}", "sample": 0, "output": "FOREIGN"} for i in range(8, 12)]
    store.put(checkpoint_prefix(JOB, 2) + "000001-odd", encode_checkpoint(fake, "another-identity"))
    # When a matching worker runs the chunk
    run, outcome = worker.run(2)
    # Then it generated every record itself: nothing foreign in the result
    assert isinstance(outcome, Committed) and run.resumed == 0
    assert all(row["output"] != "FOREIGN" for row in run.finished.values())

"""End of job: an idle worker helps a straggler chunk; first committed result wins."""

from __future__ import annotations

import json

import pytest

from fleet.store import open_store
from fleet.store.layout import checkpoint_prefix, results_prefix
from fleet.store.results import read_result
from tests.conftest import run_fleet
from tests.fleetproc import Workers, read_jsonl, wait_for, write_prompts

pytestmark = pytest.mark.e2e


def test_idle_worker_assists_saturated_owner(tmp_path, redis_server, clean_env):
    # Given one worker holding all four chunks of a job on a saturated 4-slot engine
    prompts = write_prompts(tmp_path / "p.jsonl", 32)
    store_url = str(tmp_path / "store")
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": "8", "FLEET_SLOTS": "4", "FLEET_SIM__MAX_RUNNING": "4",
           "FLEET_SIM__STEP_S": "0.02", "FLEET_SIM__MEAN_OUTPUT_TOKENS": "200", "FLEET_SIM__SIGMA": "0.5",
           "FLEET_REAPER_INTERVAL_S": "0.5", "FLEET_LEASE_TTL_S": "30"}
    assert run_fleet("enqueue", str(prompts), "--job", "tail", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    workers.start("owner")
    store = open_store(store_url)
    try:
        wait_for(lambda: "ready" in workers.logs(), 30, "owner ready")
        # When a second, idle worker joins once the queue is empty
        workers.start("helper")
        wait_for(lambda: len(list(store.list(results_prefix("tail")))) == 4, 120, "all results")
    finally:
        workers.stop()
    # Then the helper committed at least one chunk as an assist, the owner dropped its copy,
    stats = [s for s in (read_result(store, "tail", i)[0] for i in range(4)) if s is not None]
    assisted = [s for s in stats if s.assist]
    print(f"\nassisted chunks: {[(s.chunk, s.worker, s.resumed) for s in assisted]}")
    assert len(stats) == 4 and assisted and all((s.worker or "").endswith("@helper") for s in assisted)
    assert "dropped this copy" in workers.logs()
    # and the export still has every record exactly once, with no checkpoint left behind
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "tail", "--out", str(out), env=env).returncode == 0
    assert [r["id"] for r in read_jsonl(out)] == [f"r{i:05d}" for i in range(32)]
    assert not any(list(store.list(checkpoint_prefix("tail", s.chunk))) for s in stats)
    json.dumps([s.model_dump() for s in stats])


def test_a_stopping_process_waits_for_its_assist_copy_to_end():
    """The assist copy runs outside Celery's pool, which is all a warm shutdown waits for: the process
    waits for it (Runtime.stop), so the copy's middleware flushes or drops its checkpoints before the
    exit. Cut off, a helper stopped just after the owner committed left a checkpoint of a done chunk."""
    import threading
    from types import SimpleNamespace

    from fleet.worker.process.assist import Assister

    handed_back, ended = threading.Event(), []

    def run_assist(job: str, index: int) -> None:
        handed_back.wait(10)
        ended.append((job, index))

    assister = Assister(SimpleNamespace(), 4, lambda: 0, run_assist)  # type: ignore[arg-type]
    assert assister.join(0.01)  # nothing running: nothing to wait for
    # Given an assist copy still running
    assister.begin("tail", 2)
    # Then the wait runs out while it runs, and returns once it has ended
    assert not assister.join(0.2) and ended == [] and assister.assisting
    handed_back.set()
    assert assister.join(5) and ended == [("tail", 2)] and not assister.assisting


def test_a_worker_under_a_sigterm_starts_no_assist_copy():
    """A copy begun during a SIGTERM's notice is handed back at the notice's end, every token it made made
    twice. A hand-over at once (`stopping`) left no room to begin one; a long notice does."""
    import threading
    from types import SimpleNamespace

    from fleet.worker.process.assist import Assister

    ctx = SimpleNamespace(stopping=threading.Event(), draining=threading.Event(),
                          run_slots=SimpleNamespace(alone=False))
    running = [0]
    assister = Assister(ctx, 4, lambda: running[0], lambda job, index: None)  # type: ignore[arg-type]
    # Given an idle worker with room in its engine, it may assist
    assert assister.idle()
    # When a SIGTERM begins its drain (the notice's generation goes on), it may not
    ctx.draining.set()
    assert not assister.idle()
    # And neither may a full engine, a suspect running alone, or a stopping worker
    ctx.draining.clear()
    running[0] = 4
    assert not assister.idle()
    running[0], ctx.run_slots.alone = 0, True
    assert not assister.idle()
    ctx.run_slots.alone = False
    ctx.stopping.set()
    assert not assister.idle()

"""A job's options (fleet.store.options): stored beside its manifest, outside its identity, set at
`fleet enqueue`, changed with `fleet job set`, read by the retry policy of the worker and the reaper,
shown by `fleet status`; a job's priority decides which job's chunks the workers take first."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.coord.broker import PRIORITY_NORMAL, chunk_queue, make_celery, message_priority
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.queuescan import chunk_of
from fleet.coord.retry import Action, History, RetryPolicy
from fleet.errors import ConfigError
from fleet.producer.enqueue import enqueue_missing, prepare_job
from fleet.producer.jobset import apply_change, planned
from fleet.settings import Settings
from fleet.store.layout import manifest_key, options_key
from fleet.store.local import LocalStore
from fleet.store.options import JobOptions, OptionsCache, load_options, parse_assignments, write_options
from fleet.worker.run.middleware.limits import MADE_MAX_AGE_S
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, wait_for, write_prompts


def test_an_option_is_checked_and_named_when_wrong():
    # Given the defaults, when options are changed as the CLI gives them (strings)
    changed = JobOptions().changed(parse_assignments(["priority=3", "max-attempts=5"]))
    # Then they are typed, and the unset one stays the fleet's
    assert (changed.priority, changed.max_attempts, changed.max_crashes) == (3, 5, None)
    assert changed.changed({"priority": ""}).priority == 0  # back to every job's
    # And a bad name, a bad value or a word without `=` is one line naming it
    with pytest.raises(ConfigError, match="unknown job option 'priorty'"):
        JobOptions().changed({"priorty": "3"})
    with pytest.raises(ConfigError, match="job option priority=9: .*less than or equal to 5"):
        JobOptions().changed({"priority": "9"})
    with pytest.raises(ConfigError, match="'priority': write a job option as NAME=VALUE"):
        parse_assignments(["priority"])


def test_the_job_option_goes_over_the_fleet_setting():
    # Given the fleet's policy of 3 attempts and a job that allows 5
    fleet = RetryPolicy(max_attempts=3)
    job = fleet.for_job(JobOptions(max_attempts=5))
    history = History(attempts=3)
    # Then the fourth failure quarantines under the fleet's policy and not under the job's
    assert fleet.decide(RuntimeError("x"), history).action is Action.QUARANTINE
    assert job.decide(RuntimeError("x"), history).action is Action.REQUEUE
    # And a job that sets nothing keeps the fleet's
    assert fleet.for_job(JobOptions()) == fleet


def test_options_live_outside_the_identity_and_the_cache_sees_a_change(tmp_path: Path):
    # Given a job's manifest and a worker's cached reader
    store = LocalStore(str(tmp_path / "store"))
    store.put(manifest_key("j"), b"{}")
    cache = OptionsCache(store, max_age_s=0.0)
    assert cache.get("j") == JobOptions()  # none written: the defaults
    # When its options are written
    write_options(store, "j", JobOptions(priority=2, max_crashes=1))
    # Then they sit beside the manifest, which is untouched, and the reader sees them
    assert store.get(manifest_key("j")) == b"{}"
    assert json.loads(store.get(options_key("j")))["priority"] == 2
    assert cache.get("j").max_crashes == 1
    # And a broken file keeps the reader's last copy (options never stop a run), while load names it
    store.put(options_key("j"), b"{not json")
    assert cache.get("j").max_crashes == 1
    with pytest.raises(ConfigError, match="options.json .* not valid job options"):
        load_options(store, "j")


@pytest.fixture
def settings(redis_server, clean_env, tmp_path: Path) -> Settings:
    return Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue="fleet-opts", chunk_size=4)


def listed(r: redis.Redis, settings: Settings) -> dict[int, list[tuple[str, int]]]:
    """Waiting chunks by kombu priority list, oldest first."""
    out = {}
    for step, name in zip(keys.PRIORITY_STEPS, keys.queue_lists(chunk_queue(settings)), strict=True):
        rows = [chunk_of(json.loads(raw)) for raw in reversed(r.lrange(name, 0, -1))]
        if rows:
            out[step] = rows
    return out


def test_a_priority_sends_a_job_ahead_and_a_change_moves_its_waiting_chunks(settings, tmp_path: Path):
    # Given job a (priority 0) enqueued, then job b with priority 2
    store, r = LocalStore(settings.store_url), redis.Redis.from_url(settings.broker_url)
    app = make_celery(settings)
    for job in ("a", "b"):
        manifest, _ = prepare_job(settings, store, str(write_prompts(tmp_path / f"{job}.jsonl", 12, job)), job)
        change = planned(store, job, {"priority": 2} if job == "b" else {})
        enqueue_missing(r, app, store, settings, manifest, change=change)
    # Then b's chunks wait in a list workers empty before a's
    assert message_priority(0) == PRIORITY_NORMAL and message_priority(2) < PRIORITY_NORMAL
    assert listed(r, settings) == {PRIORITY_NORMAL: [("a", 0), ("a", 1), ("a", 2)],
                                   message_priority(2): [("b", 0), ("b", 1), ("b", 2)]}
    # When a is given priority 5 while its chunks wait
    queue = ChunkQueue.of(app, settings, r)
    done = apply_change(store, r, queue, "a", planned(store, "a", {"priority": "5"}))
    # Then its waiting chunks move, in their order, ahead of b's, and its stored options say so
    assert done.moved == 3
    assert listed(r, settings) == {message_priority(5): [("a", 0), ("a", 1), ("a", 2)],
                                   message_priority(2): [("b", 0), ("b", 1), ("b", 2)]}
    assert load_options(store, "a").priority == 5
    # And a moved message carries its new priority (a copy kombu restores lands in the same list)
    raw = r.lrange(keys.queue_lists(chunk_queue(settings))[message_priority(5)], 0, 0)[0]
    assert json.loads(raw)["properties"]["priority"] == message_priority(5)
    app.close()


def one_slot_fleet(tmp_path: Path, broker_url: str, step_s: float) -> tuple[dict[str, str], Callable[[str], int]]:
    """The environment of a fleet whose worker runs one 2-record sim chunk at a time, and a count of
    a job's results in its store."""
    store_url = str(tmp_path / "store")
    env = {**FAST_SIM, "FLEET_SIM__STEP_S": str(step_s), "FLEET_SIM__SIGMA": "0", "FLEET_BROKER_URL": broker_url,
           "FLEET_STORE_URL": store_url, "FLEET_CHUNK_SIZE": "2", "FLEET_SLOTS": "1", "FLEET_ASSIST": "false"}
    store = LocalStore(store_url)
    return env, lambda job: len(list(store.list(f"{job}/results/")))


@pytest.mark.e2e
@pytest.mark.slow
def test_two_jobs_on_one_fleet_run_in_priority_order_without_a_restart(tmp_path, redis_server, clean_env):
    # Given one worker running one chunk at a time, each chunk ~0.5 s, busy with job a (priority 0)
    env, done = one_slot_fleet(tmp_path, redis_server.url, step_s=0.02)

    a = run_fleet("enqueue", str(write_prompts(tmp_path / "a.jsonl", 32, "a")), "--job", "a", env=env)
    assert a.returncode == 0, a.stderr
    workers = Workers(env, tmp_path / "logs")
    workers.start("h")
    try:
        wait_for(lambda: done("a") >= 2, 120, "job a under way")
        # When job b is enqueued later with a higher priority
        b = run_fleet("enqueue", str(write_prompts(tmp_path / "b.jsonl", 48, "b")), "--job", "b",
                      "--priority", "3", env=env)
        assert b.returncode == 0, b.stderr
        assert "options: priority 3" in b.stderr
        a_at_b = done("a")
        wait_for(lambda: done("b") >= 4, 120, "b's first chunks")
        # Then the worker takes b's chunks before a's remaining ones (at most the one it held goes on)
        overtaken = done("a") - a_at_b
        assert overtaken <= 2, (a_at_b, done("a"), done("b"))
        # When a is given a higher priority than b with `fleet job set`, on the same running fleet
        s = run_fleet("job", "set", "--job", "a", "priority=5", env=env)
        assert s.returncode == 0, s.stderr
        assert "moved to the new priority" in s.stdout + s.stderr
        b_at_set = done("b")
        wait_for(lambda: done("a") == 16, 120, "job a done")
        # Then a's waiting chunks go before b's remaining ones, without a restart
        assert done("b") - b_at_set <= 2, (b_at_set, done("b"))
        assert done("b") < 24
        wait_for(lambda: done("b") == 24, 120, "job b done")
        assert workers.logs().count("engine ready") == 1  # one worker process all along
    finally:
        workers.stop()
    # And status shows each job's options
    st = run_fleet("status", "--job", "a", "--json", env=env)
    assert json.loads(st.stdout)["options"].startswith("priority 5, max_attempts (fleet setting)")


@pytest.mark.slow
def test_job_set_refuses_a_bad_option_in_one_line_and_writes_nothing(settings, tmp_path: Path):
    # Given a job in the store
    store = LocalStore(settings.store_url)
    prepare_job(settings, store, str(write_prompts(tmp_path / "a.jsonl", 4, "a")), "a")
    env = {"FLEET_BROKER_URL": settings.broker_url, "FLEET_STORE_URL": settings.store_url}
    for words, says in ((["priority=9"], "job option priority=9"), (["retries=2"], "unknown job option 'retries'"),
                        (["priority"], "write a job option as NAME=VALUE")):
        # When `fleet job set` is given a bad option
        out = run_fleet("job", "set", "--job", "a", *words, env=env)
        # Then it exits 2 with one line naming it, no traceback, and no options are written
        assert out.returncode == 2 and says in out.stdout + out.stderr, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        assert not store.exists(options_key("a"))
    # And a job that does not exist is named
    out = run_fleet("job", "set", "--job", "nope", "priority=1", env=env)
    assert out.returncode == 2 and "no manifest" in out.stdout + out.stderr


def test_a_deadline_or_a_spent_budget_holds_chunks_not_started_and_says_why():
    # Given a job whose budget the tokens made have reached, and one whose deadline has passed
    budget = JobOptions().changed({"token_budget": "100", "deadline": "6h"})
    assert budget.held(99) is None
    assert "token budget is spent (100 of 100 output tokens made)" in (budget.held(100) or "")
    late = JobOptions().changed({"deadline": "2020-01-01T00:00"})
    # Then the first is held for its budget only, the second for its deadline (a time without zone is UTC)
    assert "past its deadline 2020-01-01 00:00:00 UTC" in (late.held(None) or "")
    assert late.deadline is not None and late.deadline.utcoffset() is not None
    # And unset, neither holds anything; a bad deadline is one line naming it
    assert late.changed({"deadline": ""}).held(None) is None
    with pytest.raises(ConfigError, match="job option deadline=tomorrow"):
        JobOptions().changed({"deadline": "tomorrow"})


@pytest.mark.e2e
@pytest.mark.slow
def test_a_spent_budget_and_a_past_deadline_hold_a_job_until_set_again(tmp_path, redis_server, clean_env):
    # Given one worker (one chunk at a time) and job t with a token budget about one chunk's output
    env, done = one_slot_fleet(tmp_path, redis_server.url, step_s=0.01)
    store = LocalStore(env["FLEET_STORE_URL"])

    def status(job: str) -> dict:
        out = run_fleet("status", "--job", job, "--json", env=env)
        return json.loads(out.stdout)

    t = run_fleet("enqueue", str(write_prompts(tmp_path / "t.jsonl", 16, "t")), "--job", "t", "--token-budget", "40",
                  env=env)
    assert t.returncode == 0, t.stderr
    assert "token_budget 40" in t.stderr
    manifests = {"t": store.get(manifest_key("t"))}
    workers = Workers(env, tmp_path / "logs")
    workers.start("h")
    try:
        # When the worker has made the budget's tokens
        wait_for(lambda: "token budget is spent" in status("t")["held"], 120, "job t held for its budget")
        # and the chunks that had started meanwhile have finished: a worker trusts its sum of the job's
        # tokens for MADE_MAX_AGE_S, so a chunk may start just after the budget is spent; two looks more
        # than that apart, with nothing running and nothing more done, say none can start now
        looks: list[tuple[int, float]] = []

        def settled() -> bool:
            st = status("t")
            if st["chunks_running"] or (looks and looks[-1][0] != done("t")):
                looks.clear()
            else:
                looks.append((done("t"), time.monotonic()))
            return len(looks) >= 2 and looks[-1][1] - looks[0][1] > MADE_MAX_AGE_S
        wait_for(settled, 60, "job t's running chunks finished")
        # Then the chunks not started wait: none commits meanwhile, and status says why
        held_at = done("t")
        assert 1 <= held_at < 8
        # When job late is enqueued with a deadline already past
        late = run_fleet("enqueue", str(write_prompts(tmp_path / "late.jsonl", 4, "late")), "--job", "late",
                         "--deadline", "2020-01-01T00:00", env=env)
        assert late.returncode == 0, late.stderr
        manifests["late"] = store.get(manifest_key("late"))
        wait_for(lambda: workers.logs().count("is past its deadline") >= 2, 60, "late's chunks handed back")
        # Then none of its chunks starts, and status says why; t stays where its budget stopped it
        assert done("late") == 0 and done("t") == held_at
        st = status("late")
        assert "past its deadline 2020-01-01 00:00:00 UTC" in st["held"] and st["chunks_queued"] == 2
        # When the deadline is unset and the budget raised, on the same running worker
        for job, option in (("late", "deadline="), ("t", "token_budget=100000")):
            s = run_fleet("job", "set", "--job", job, option, env=env)
            assert s.returncode == 0, s.stderr
        # Then both jobs finish, nothing made twice, no chunk failed, one worker process throughout
        wait_for(lambda: done("t") == 8 and done("late") == 2, 120, "both jobs done")
        assert workers.logs().count("engine ready") == 1
    finally:
        workers.stop()
    for job in ("t", "late"):
        st = status(job)
        assert st["done"] and st["held"] == "" and st["chunks_failed"] == 0 and st["tokens_made_twice"] == 0
        # And the options changed the job's options file only, never its manifest (its identity)
        assert store.get(manifest_key(job)) == manifests[job]

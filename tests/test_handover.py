"""A stop is a hand-over: workers stopped over and over (as interruptible instances are) still
finish a job whose records outlive every worker, and a SIGTERM costs seconds, not records.

Real worker processes, a real redis-server, the sim engine (its output is a function of seed and
position, so a continued record equals an uninterrupted one and the export a clean run's)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import time
from pathlib import Path
from subprocess import Popen

import pytest
import redis

from fleet.coord import keys
from fleet.coord.localredis import free_port
from fleet.store import Store, open_store
from fleet.store.layout import checkpoint_prefix, results_prefix
from fleet.store.results import read_result
from fleet.worker.process.notice import HANDOVER_FLOOR_S, HANDOVER_FLUSHES
from tests.conftest import run_fleet
from tests.fleetproc import (
    Workers,
    clean_reference,
    made_tokens,
    memory_dir,
    read_jsonl,
    tokens_made_by,
    wait_for,
    worker_pids,
    write_prompts,
)
from tests.modelkit import tiny_model_fixture  # noqa: F401
from tests.runshared import built_once

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECORDS = 24
# ~6 s records (300 tokens at 0.02 s a step) on 16 engine slots; chunks of 4, 4 chunks a worker.
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.02",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "300",
    "FLEET_SIM__SIGMA": "0.2",
    "FLEET_SIM__MAX_RUNNING": "16",
    "FLEET_CHUNK_SIZE": "4",
    "FLEET_SLOTS": "4",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "1",
    "FLEET_GRACE_S": "0.5",
    "FLEET_ASSIST": "false",
}


def status(env: dict[str, str], job: str) -> dict:
    out = run_fleet("status", "--job", job, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_job_whose_records_outlive_every_worker_finishes_while_the_stops_go_on(tmp_path, redis_server, clean_env):
    # Given a job of ~6 s records, and its clean run's export
    (tmp_path / "ref").mkdir()
    prompts, ref = clean_reference(tmp_path / "ref", SIM, "hand", RECORDS)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "hand", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store = open_store(store_url)
    hosts = [workers.start("host0"), workers.start("host1")]
    stops, n = 0, 2
    began = time.monotonic()
    try:
        # When, every 3.5 s, the older host gets SIGTERM and a new one starts (each lives ~7 s,
        # boot included: shorter than a record), for as long as the job runs; never before the newer
        # one consumes (on a busy machine a boot may outlast 3.5 s: then the stops wait for it)
        while len(list(store.list(results_prefix("hand")))) < RECORDS // 4:
            assert time.monotonic() - began < 480, "the job did not finish while the stops went on"
            time.sleep(3.5)
            wait_for(functools.partial(workers.ready, f"host{n - 1}"), 300, f"host{n - 1} ready")
            old = hosts.pop(0)
            old.send_signal(signal.SIGTERM)
            stops += 1
            hosts.append(workers.start(f"host{n}"))
            n += 1
    finally:
        workers.stop()
    took = time.monotonic() - began
    # Then it finished during the stops, every record once, equal to the clean run's export
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "hand", "--out", str(out), "--stable", env=env).returncode == 0
    assert out.read_bytes() == ref
    full = tmp_path / "full.jsonl"
    assert run_fleet("export", "--job", "hand", "--out", str(full), env=env).returncode == 0
    rows = [json.loads(line) for line in full.read_text().splitlines()]
    continued = [r for r in rows if r.get("continued_at")]
    st = status(env, "hand")
    print(f"\n{stops} stops in {took:.0f}s; {len(continued)} of {len(rows)} records continued; tokens continued "
          f"{st['tokens_continued']}, made twice {st['tokens_made_twice']} of {st['completion_tokens']}")
    assert stops >= 3 and continued
    assert st["tokens_continued"] > 0
    # a SIGTERM flushes before handing back: what was made is never made again
    assert st["tokens_made_twice"] <= st["completion_tokens"] * 0.05


def test_sigterm_exits_in_seconds_and_the_next_worker_makes_none_of_its_tokens_again(
        tmp_path, redis_server, clean_env):
    # Given one worker holding K=4 chunks with 16 requests running (8 s records)
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "400", "FLEET_CHECKPOINT_INTERVAL_S": "30"}
    assert run_fleet("enqueue", str(prompts), "--job", "term", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    a = workers.start("hostA")
    try:
        wait_for(lambda: made_tokens(r, "term") > 16 * 60, 60, "requests running")
        # When it gets SIGTERM mid-generation (no checkpoint taken yet: the interval is 30 s)
        began = time.monotonic()
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
        exit_s = time.monotonic() - began
        made_before = made_tokens(r, "term")
        # And another worker finishes the job
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix("term")))) == 4, 120, "all results")
    finally:
        workers.stop()
    results = [read_result(store, "term", i) for i in range(4)]
    made = sum(s.tokens_made for s, _ in results if s)
    completion = sum(s.completion_tokens for s, _ in results if s)
    continued = sum(s.tokens_continued for s, _ in results if s)
    print(f"\nSIGTERM to exit with K=4 chunks, 16 requests running: {exit_s:.2f}s; tokens made before it "
          f"{made_before}, continued from {continued}; made twice {made - completion}")
    # Then it exited within seconds, and hostB continued every running sample where it stopped (a sample
    # that had ended in hostA is kept whole, its tokens in no continuation): every token hostA made is
    # in the output once
    assert exit_s < 10
    assert 0 < continued <= made_before
    assert made - completion == 0


def start_told_a_notice(tmp_path: Path, redis_server, job: str, notice: float) -> tuple[Workers, Store, Popen, int]:
    """hostA, a worker told its cloud's notice, holding K=4 chunks of `job` with 16 requests running (20 s
    records, 800 tokens a second in all) and no checkpoint due for 30 s; its metrics on the port returned."""
    port = free_port()
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "1000", "FLEET_CHECKPOINT_INTERVAL_S": "30",
           "FLEET_NOTICE_S": str(notice), "FLEET_METRICS_PORT": str(port)}
    assert run_fleet("enqueue", str(prompts), "--job", job, env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    a = workers.start("hostA")
    wait_for(lambda: tokens_made_by(port) > 16 * 60, 60, "requests running")
    return workers, open_store(store_url), a, port


def made_twice(store: Store, job: str) -> int:
    """Tokens the job's 4 results say were made beyond what they kept."""
    results = [read_result(store, job, i) for i in range(4)]
    return sum(s.tokens_made - s.completion_tokens for s, _ in results if s)


def test_a_known_notice_is_spent_generating_and_its_hand_over_ends_before_the_kill(tmp_path, redis_server, clean_env):
    # Given one worker told its cloud's notice (6 s between SIGTERM and SIGKILL), holding K=4 chunks with
    # 16 requests running (20 s records, 800 tokens a second in all), and no checkpoint due for 30 s
    notice = 6.0
    workers, store, a, port = start_told_a_notice(tmp_path, redis_server, "notice", notice)
    try:
        # When it gets SIGTERM, and the SIGKILL of its whole host when the notice ends, as a spot VM does
        term, at_term = time.monotonic(), tokens_made_by(port)
        a.send_signal(signal.SIGTERM)
        last = at_term
        while time.monotonic() < term + notice:
            last = max(last, tokens_made_by(port))
            time.sleep(0.1)
        os.killpg(a.pid, signal.SIGKILL)  # the worker follows its launcher (PR_SET_PDEATHSIG)
        a.wait(timeout=30)
        # And another worker finishes the job
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix("notice")))) == 4, 120, "all results")
    finally:
        workers.stop()
    twice = made_twice(store, "notice")
    print(f"\nnotice {notice:g} s: {last - at_term:.0f} tokens made after the SIGTERM; made twice {twice}")
    # Then host A generated through most of the notice (at least half of it: 2,400 tokens), where a
    # hand-over at once (after grace_s, 0.5 s) makes ~400
    assert last - at_term >= 16 * (notice / 2) / float(SIM["FLEET_SIM__STEP_S"])
    # And its hand-over ended before the kill: host B continued every sample where host A stopped
    assert twice == 0
    assert "generating for" in (tmp_path / "logs" / "hostA.log").read_text()


def test_a_short_notice_is_spent_generating_up_to_the_measured_hand_over(tmp_path, redis_server, clean_env):
    # Given one worker told a 3 s notice (a 120 s notice at 40x), holding K=4 chunks with 16 requests running
    # and no checkpoint due for 30 s
    notice = 3.0
    workers, store, a, _ = start_told_a_notice(tmp_path, redis_server, "short", notice)
    try:
        # When the host shuts down: SIGTERM to every process of it (the launcher, which passes it on, and the
        # worker: systemd's control-group stop), and SIGKILL to them all when the notice ends
        [worker] = worker_pids(a.pid)
        term = time.time()
        a.send_signal(signal.SIGTERM)
        os.kill(worker, signal.SIGTERM)
        time.sleep(max(0.0, term + notice - time.time()))
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
        # (a checkpoint is named by the nanosecond it was flushed at: fleet.store.layout.checkpoint_key)
        flushed = [int(key.rsplit("/", 1)[1].split("-")[0]) / 1e9 - term for i in range(4)
                   for key in store.list(checkpoint_prefix("short", i))]
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix("short")))) == 4, 120, "all results")
    finally:
        workers.stop()
    twice = made_twice(store, "short")
    print(f"\nnotice {notice:g} s: host A's flushes at {', '.join(f'{t:.2f}' for t in sorted(flushed))}s after "
          f"the SIGTERM; made twice {twice}")
    # Then host A generated until its hand-over's margin, as it measured it at the SIGTERM (twice the drain's
    # flush, plus the floor), was all that was left of the notice, and flushed every chunk then (0.3 s of
    # slack): no reserve for a poll (the stop's bell wakes every chunk at once), and the second SIGTERM, its
    # launcher's, restarted nothing. On a busy disk the drain's flush is long, and the margin with it.
    drain = re.search(r"chunk\(s\) flushed in ([0-9.]+)s", (tmp_path / "logs" / "hostA.log").read_text())
    assert drain is not None
    stop = notice - HANDOVER_FLOOR_S - HANDOVER_FLUSHES * float(drain.group(1))
    assert len([t for t in flushed if stop - 0.3 <= t < notice]) == 4, (flushed, stop)
    # And its last flush ended before the kill: host B continued every sample where host A stopped
    assert twice == 0


def test_status_counts_tokens_in_flight_before_anything_commits(tmp_path, redis_server, clean_env):
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "600"}
    assert run_fleet("enqueue", str(prompts), "--job", "pace", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    r = redis.Redis(port=redis_server.port)
    workers.start("hostA")
    try:
        wait_for(lambda: sum(int(v) for v in r.hvals(keys.made("pace"))) > 400, 60, "tokens streaming")
        time.sleep(2)
        st = status(env, "pace")
    finally:
        workers.stop()
    # 16 requests at 50 tok/s each: ~800 tok/s, long before the first chunk (12 s) commits
    print(f"\nlive: {st['tok_s']} tok/s, {st['tokens_in_flight']} tokens in flight, done {st['chunks_done']}")
    assert st["chunks_done"] == 0
    assert st["tokens_in_flight"] > 400
    # at most the sim's 800 tok/s (its steps sleep: a busy machine slows them, never speeds them)
    assert 0 < st["tok_s"] < 1200




def stop_and_replace_until_done(workers: Workers, store, r: redis.Redis, job: str, chunks: int, every_tokens: int,
                                deadline_s: float, signum: int = signal.SIGTERM) -> int:
    """Two hosts at a time, each stopped with `signum` once the job has made `every_tokens` more tokens
    since its successor was ready: each round waits for the newer host to be ready (its worker's engine
    loaded, however busy the machine), then for that much work, then stops the older one and starts
    another, until the job's `chunks` results exist. Work, not seconds: on a quiet 2-core box the whole
    job once took less than two rounds of a fixed 12 s, and no record was running at the one stop.
    Returns the stops sent."""
    names = ["host0", "host1"]
    hosts = [workers.start(name) for name in names]
    stops, began = 0, time.monotonic()

    def done() -> bool:
        return len(list(store.list(results_prefix(job)))) >= chunks

    while not done():
        assert time.monotonic() - began < deadline_s, f"the job did not finish while the stops went on ({stops})"
        wait_for(functools.partial(workers.ready, names[-1]), deadline_s, f"{names[-1]} ready")
        start = made_tokens(r, job)
        wait_for(lambda: done() or made_tokens(r, job) - start >= every_tokens, deadline_s,  # noqa: B023
                 f"{every_tokens} tokens made", interval=0.05)
        if done():
            break
        old = hosts.pop(0)
        names.pop(0)
        if signum == signal.SIGKILL:
            os.killpg(old.pid, signal.SIGKILL)
        else:
            old.send_signal(signum)
        stops += 1
        names.append(f"host{stops + 1}")
        hosts.append(workers.start(names[-1]))
    return stops


def storm_records(tmp: Path) -> Path:
    """The example prompts under the model's own sampling (rows end on their end id at various lengths,
    most within the job's 256 tokens) and one long greedy row in each chunk of nine, which keeps its batch running
    on after the sampled rows ended inside it."""
    example = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"
    sampled = [json.loads(line) for line in example.read_text().splitlines()]
    lines = []
    for i in range(0, len(sampled), 8):
        lines += [{"id": f"long{i // 8}", "prompt": f"def long_{i}(x):", "sampling": {"temperature": 0,
                                                                                     "max_tokens": 1200}},
                  *sampled[i : i + 8]]  # fmt: skip
    path = tmp / "storm.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def storm_hf(model: Path) -> dict[str, str]:
    """The storm job's settings on the hf engine, the clean run's and the stopped runs' alike."""
    return {"FLEET_ENGINE": "hf", "FLEET_MODEL": str(model), "FLEET_CHUNK_SIZE": "9", "FLEET_HF__THREADS": "1",
            "FLEET_SAMPLING__MAX_TOKENS": "256"}


@pytest.fixture(scope="module")
def storm_reference(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The storm job's clean run on the hf engine, exported with --stable: made once for the run
    (tests/runshared.py), for both the SIGTERM and the SIGKILL case compare with the same run (it was
    made once by each: ~40% of each case's time). Holds `storm.jsonl` and `ref.jsonl`."""

    def build(tmp: Path) -> None:
        prompts = storm_records(tmp)
        env = {**storm_hf(tiny_model), "FLEET_DATA_DIR": str(tmp / "data")}
        for k in os.environ:
            if k.startswith("FLEET_"):
                env.setdefault(k, "")
        done = run_fleet("run", str(prompts), "--job", "hs", env=env, timeout=900, cwd=tmp)
        assert done.returncode == 0, done.stderr[-3000:]
        exported = run_fleet("export", "--job", "hs", "--out", str(tmp / "ref.jsonl"), "--stable", env=env, cwd=tmp)
        assert exported.returncode == 0, exported.stderr[-3000:]

    return built_once(tmp_path_factory, "storm-reference", build)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("signum", "every_tokens"), [(signal.SIGTERM, 1000), (signal.SIGKILL, 1500)],
                         ids=["sigterm", "sigkill"])
def test_a_sampled_hf_job_stopped_every_few_seconds_exports_what_one_run_makes(
        tmp_path, redis_server, clean_env, tiny_model, storm_reference, signum, every_tokens):
    """The tiny model under its own sampling (temperature 1: rows end at different lengths inside a
    batch that runs on), its workers stopped every few seconds until the job is done: every record is
    what one uninterrupted run makes, token for token, and none holds an end id before its last position."""
    # Given the job's clean run
    prompts = storm_reference / "storm.jsonl"
    hf = storm_hf(tiny_model)
    # When its workers are stopped every few seconds of work (each after its engine is up; SIGKILL of a
    # host's whole process group, checkpoints every second, and no crash blame for an operator's kills)
    env = {**hf, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(memory_dir(tmp_path, "hs")),
           "FLEET_LEASE_TTL_S": "3", "FLEET_REAPER_INTERVAL_S": "1", "FLEET_CHECKPOINT_INTERVAL_S": "1",
           "FLEET_GRACE_S": "0", "FLEET_ASSIST": "false", "FLEET_SLOTS": "4", "FLEET_CRASH_WINDOW_S": "0"}
    assert run_fleet("enqueue", str(prompts), "--job", "hs", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store = open_store(env["FLEET_STORE_URL"])
    try:
        stops = stop_and_replace_until_done(workers, store, redis.Redis.from_url(redis_server.url), "hs", 8,
                                            every_tokens, 900, signum)
    finally:
        workers.stop()
    # Then every record passes the audit and equals the clean run's, ids included
    verify = run_fleet("verify", "--job", "hs", env=env)
    assert verify.returncode == 0, verify.stderr[-3000:]
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "hs", "--out", str(out), "--stable", env=env).returncode == 0
    full = tmp_path / "full.jsonl"  # with the run facts --stable leaves out (continued_at)
    assert run_fleet("export", "--job", "hs", "--out", str(full), env=env).returncode == 0
    rows, ref = read_jsonl(out), read_jsonl(storm_reference / "ref.jsonl")
    eos = {0, 2}  # the tiny model's generation_config.json
    assert not [r["id"] for r in rows if eos & set(r["output_ids"][:-1])]
    continued = [r for r in read_jsonl(full) if r.get("continued_at")]
    ended_early = [r for r in rows if r["finish_reason"] == "stop" and not r["id"].startswith("long")]
    differ = [r["id"] for r, x in zip(rows, ref, strict=True) if r["output_ids"] != x["output_ids"]]
    st = status(env, "hs")
    print(f"\n{stops} stops ({signal.Signals(signum).name} every {every_tokens} tokens made); {len(continued)} of "
          f"{len(rows)} records continued; {len(ended_early)} sampled rows ended on their end id; "
          f"{st['tokens_made_twice']} of {st['completion_tokens']} tokens made twice "
          f"({st['tokens_made_twice'] / max(stops, 1):.0f} per stop); records unlike the clean run: {differ}")
    assert not differ
    assert [(r["finish_reason"], r["output"], r["reasoning"]) for r in rows] == \
        [(x["finish_reason"], x["output"], x["reasoning"]) for x in ref]
    assert stops >= 2 and continued and len(ended_early) >= 32

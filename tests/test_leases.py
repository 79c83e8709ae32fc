"""Leases (docs/architecture.md, Celery facts) on a real redis-server: a key per running chunk naming its
run, live while its process's key (PX TTL) lives; renew and release by the owner only, expiry after the
TTL, a heartbeat that keeps a lease alive.
Also the local redis-server that `fleet run` and these tests start (fleet.coord.localredis)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from fleet.coord import keys, leases
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.leaseclock import FIGURES_EVERY, FIGURES_LEASES, LeaseClock, figures_every
from fleet.coord.leases import Figures, Lease, Look, beat, holder, leased_process, run_owner
from fleet.coord.localredis import LocalRedis, free_port
from fleet.errors import BrokerMissing
from fleet.monitor.status import PACE_STALE_S
from fleet.settings import Settings


@pytest.fixture
def r(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def running(r: redis.Redis) -> set[str]:
    return {m.decode() for m in r.smembers(keys.running())}


def take_over(r: redis.Redis, key: str, owner: str, px: int = 5000) -> None:
    """Another process's live lease on a chunk, set by hand: the lease names its run, and its
    process's key lives `px` ms."""
    r.set(key, owner)
    r.set(keys.process_lease(leased_process(owner)), 1, px=px)


def wait_until(cond, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# -- acquire -----------------------------------------------------------------------------


def test_acquire_sets_owner_ttl_and_running_member(r):
    # Given a free chunk
    lease = Lease(r, "j", 3, "gpu0@a:1", ttl_s=5)
    # When a worker acquires it
    assert lease.acquire() is True
    # Then the key holds the owner, its process's key a TTL of at most 5 s, and the chunk is in the running set
    assert holder(r, "j", 3) == "gpu0@a:1" and r.get(keys.lease("j", 3)) == b"gpu0@a:1"
    assert 4000 < r.pttl(keys.process_lease("gpu0@a:1")) <= 5000
    assert running(r) == {"j/3"}


def test_second_owner_is_refused(r):
    # Given a lease held by A
    a = Lease(r, "j", 0, "A", ttl_s=5)
    assert a.acquire()
    # When B tries the same chunk, and A tries again
    b = Lease(r, "j", 0, "B", ttl_s=5)
    # Then both are refused (NX), and A still holds it
    assert b.acquire() is False
    assert Lease(r, "j", 0, "A", ttl_s=5).acquire() is False
    assert holder(r, "j", 0) == "A"


def test_leases_of_other_chunks_are_independent(r):
    assert Lease(r, "j", 0, "A", 5).acquire()
    assert Lease(r, "j", 1, "B", 5).acquire()
    assert Lease(r, "k", 0, "C", 5).acquire()
    assert running(r) == {"j/0", "j/1", "k/0"}
    assert (holder(r, "j", 1), holder(r, "k", 0), holder(r, "j", 9)) == ("B", "C", None)


# -- renew -------------------------------------------------------------------------------


def test_renew_by_owner_extends_the_ttl(r):
    # Given a lease that has run down part of its TTL (set down here, not slept down: a busy
    # machine could sleep past all of it)
    a = Lease(r, "j", 0, "A", ttl_s=30)
    a.acquire()
    r.pexpire(a.process_key, 10_000)
    before = r.pttl(a.process_key)
    # When the owner renews
    assert a.renew() is True
    # Then its process's TTL is back to full and the lease is not lost
    assert r.pttl(a.process_key) > before + 10_000
    assert a.lost is False


def test_renew_by_another_owner_is_refused(r):
    # Given A's lease partly run down
    a = Lease(r, "j", 0, "A", ttl_s=30)
    a.acquire()
    r.pexpire(a.process_key, 10_000)
    before = r.pttl(a.process_key)
    # When B tries to renew it
    b = Lease(r, "j", 0, "B", ttl_s=10)
    assert b.renew() is False
    # Then nothing changes for A, and B knows it has no lease
    assert r.pttl(a.process_key) <= before
    assert holder(r, "j", 0) == "A"
    assert b.lost is True


# -- release -----------------------------------------------------------------------------


def test_release_by_owner_frees_the_chunk(r):
    a = Lease(r, "j", 0, "A", 5)
    a.acquire()
    a.release()
    assert holder(r, "j", 0) is None
    assert running(r) == set()
    assert Lease(r, "j", 0, "B", 5).acquire()


@pytest.mark.parametrize(("job", "others"), [
    ("j", ["j2", "xj"]),
    ("team/run-1", ["team/run-1/x", "team", "team/run-10"]),
    ("a*b?[c]\\d", ["aXbYcd", "a*b?c\\d", "axb?[c]\\d"]),
])
def test_whether_a_job_has_a_chunk_running_is_its_own_members_only(r, job, others):
    # Given chunks of other jobs running, whose names a glob of the job's could match
    for i, other in enumerate(others):
        assert Lease(r, other, i, f"gpu0@h:{i}", ttl_s=600).acquire()
    # Then the job has none running
    assert not leases.watches_any(r, job)
    # When a chunk of it takes its lease, then loses it (a dead process: it stays watched)
    lease = Lease(r, job, 7, "gpu0@h:99", ttl_s=600)
    assert lease.acquire()
    r.delete(lease.process_key)
    # Then it has one running, and the others still have theirs
    assert leases.watches_any(r, job) and all(leases.watches_any(r, other) for other in others)


def test_release_by_another_owner_keeps_the_lease(r):
    # Given A's lease
    a = Lease(r, "j", 0, "A", 5)
    a.acquire()
    # When B (whose own lease was lost and taken over by A) releases
    Lease(r, "j", 0, "B", 5).release()
    # Then A's lease key is untouched
    assert holder(r, "j", 0) == "A"


def test_release_by_another_owner_keeps_the_chunk_watched(r):
    # Given worker B's lease (A lost its lease; the chunk was requeued and B took it)
    old = Lease(r, "j", 0, "A", 0.2)
    old.acquire()
    time.sleep(0.3)
    b = Lease(r, "j", 0, "B", 5)
    assert b.acquire()
    # When the stale A finishes and releases
    old.release()
    # Then the chunk is still in the running set, so B's death would still be noticed
    assert running(r) == {"j/0"}


# -- expiry ------------------------------------------------------------------------------


def test_lease_expires_after_its_ttl(r):
    # Given a lease with a 0.3 s TTL and no heartbeat
    a = Lease(r, "j", 0, "A", ttl_s=0.3)
    began = time.monotonic()
    a.acquire()
    # When the TTL passes, Then the key is gone (not before it), a late renew fails, and another
    # worker can take the chunk
    assert wait_until(lambda: holder(r, "j", 0) is None, 30)
    assert time.monotonic() - began >= 0.3
    assert a.renew() is False and a.lost is True
    assert Lease(r, "j", 0, "B", 5).acquire()
    assert holder(r, "j", 0) == "B"
    # While the running set still names the chunk: the reaper's cue
    assert running(r) == {"j/0"}


# -- heartbeat ---------------------------------------------------------------------------


@pytest.mark.slow
def test_heartbeat_keeps_a_lease_past_its_ttl(r):
    # Given 2 s leases on a heartbeat renewing every 0.1 s (a TTL no busy machine's scheduling
    # delay reaches, twenty beats long)
    hb = Heartbeat(interval_s=0.1)
    hb.start()
    try:
        a = Lease(r, "j", 0, "A", ttl_s=2.0)
        b = Lease(r, "j", 1, "A", ttl_s=2.0)
        a.acquire()
        b.acquire()
        began = time.monotonic()
        hb.add(a)
        hb.add(b)
        # When more than one TTL passes
        while time.monotonic() - began < 3.0:
            time.sleep(0.1)
        # Then both leases are still held
        assert holder(r, "j", 0) == "A" and holder(r, "j", 1) == "A"
        assert not a.lost
        # When one lease is discarded from the heartbeat, it expires and the other lives on
        hb.discard(b)
        assert wait_until(lambda: holder(r, "j", 1) is None, 30)
        assert holder(r, "j", 0) == "A"
    finally:
        hb.stop()
    # When the heartbeat stops, the last lease expires too
    assert wait_until(lambda: holder(r, "j", 0) is None, 30)


def test_heartbeat_marks_a_taken_over_lease_lost(r):
    # Given a heartbeat renewing A's lease, which someone else takes over
    hb = Heartbeat(interval_s=0.05)
    hb.start()
    try:
        a = Lease(r, "j", 0, "A", ttl_s=5)
        a.acquire()
        hb.add(a)
        take_over(r, a.key, "B")
        # Then A's next renew finds it lost and leaves B's lease alone
        assert wait_until(lambda: a.lost, 30)
        assert holder(r, "j", 0) == "B"
    finally:
        hb.stop()


def test_heartbeat_survives_a_broker_outage(redis_server):
    # Given a lease on a heartbeat
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    hb = Heartbeat(interval_s=0.05)
    hb.start()
    a = Lease(client, "j", 0, "A", ttl_s=5)
    a.acquire()
    hb.add(a)
    # When Redis goes away, the heartbeat thread keeps running (it logs, never dies)
    redis_server.stop()
    time.sleep(0.3)
    try:
        assert hb._thread.is_alive()
    finally:
        hb.stop()
        hb._thread.join(3)
    assert not hb._thread.is_alive()


# -- the local redis-server --------------------------------------------------------------


def test_local_redis_is_persistent_and_never_evicts(tmp_path):
    # Given a persistent local Redis
    server = LocalRedis(tmp_path / "r", persist=True)
    argv = server.argv()
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction"
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"
    port = server.port
    # When a key is written, the server stopped and started again on the same directory
    with server:
        c = redis.Redis(port=port)
        c.rpush("fleet", "m1")
        assert c.config_get("appendonly") == {"appendonly": "yes"}
        c.close()
    with LocalRedis(tmp_path / "r", port=port, persist=True) as again:
        assert again.url == f"redis://127.0.0.1:{port}/0"
        c = redis.Redis(port=port)
        # Then the queue survived
        assert c.lrange("fleet", 0, -1) == [b"m1"]
        c.close()


def test_local_redis_without_persistence(tmp_path):
    with LocalRedis(tmp_path / "r", persist=False) as server:
        c = redis.Redis.from_url(server.url)
        assert c.config_get("appendonly") == {"appendonly": "no"}
        assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        c.close()
    assert server.proc is not None and server.proc.poll() is not None


def test_local_redis_missing_binary_is_broker_missing(tmp_path, monkeypatch):
    monkeypatch.setattr("fleet.coord.localredis.shutil.which", lambda name: None)
    with pytest.raises(BrokerMissing, match="redis-server"):
        LocalRedis(tmp_path / "r")


def test_local_redis_on_a_port_in_use_does_not_adopt_another_server(tmp_path, redis_server):
    # Given a port already served by another redis-server
    mine = LocalRedis(tmp_path / "r2", port=redis_server.port, persist=False)
    # When a local Redis is started on it
    try:
        mine.start(timeout_s=3)
    except BrokerMissing:
        return  # refusing is right
    # Then, if it claims to have started, the server answering must be its own process
    try:
        time.sleep(0.3)
        answering = redis.Redis(port=redis_server.port).info("server")["process_id"]
        assert mine.proc is not None and mine.proc.poll() is None
        assert answering == mine.proc.pid
    finally:
        mine.stop()


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_watched_lease_registers_its_job_again_after_a_broker_wipe(r):
    # Given a broker that lost its job set
    r.flushall()
    # When a worker (re)takes a chunk lease, Then the job is known again, with the lease clock
    assert Lease(r, "j", 2, "A", ttl_s=30, store="s1").acquire()
    assert r.hgetall(keys.job_stores()) == {b"j": b"s1"}
    assert r.hget(keys.lease_started(), "j/2") == r.hget(keys.lease_beat(), "j/2") is not None
    # while an assist lease registers nothing
    r.flushall()
    assert Lease(r, "j", 2, "A", ttl_s=30, assist=True, store="s1").acquire()
    assert r.hgetall(keys.job_stores()) == {}
    # and a lease never moves a job of one store to another
    assert Lease(r, "k", 0, "A", ttl_s=30, store="s1").acquire()
    assert Lease(r, "k", 1, "B", ttl_s=30, store="s2").acquire()
    assert r.hgetall(keys.job_stores()) == {b"k": b"s1"}


# -- the beat: every lease of a process in one round trip ----------------------------------


def calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def test_a_beat_renews_every_lease_and_carries_its_figures_in_one_command(r):
    # Given a process running 16 chunks of two jobs
    leases = [Lease(r, "j" if i % 2 else "k", i, f"gpu0@a:1#{i}", ttl_s=1.0) for i in range(16)]
    for lease in leases:
        lease.acquire()
    pace = {"made": 50, "started_ms": 1, "samples": 0, "sample_tokens": 0}
    beat(r, leases, [Figures(look=Look.ASSISTED)] * 16)  # the broker learns the script (SCRIPT LOAD) once
    r.hset(keys.made("j"), 1, 100)  # tokens earlier runs of chunk j/1 made
    time.sleep(0.3)
    before = calls(r)
    # When one beat renews them with each run's figures (tokens made, pace, unstarted samples)
    seen = beat(r, leases, [Figures(made=7, pace=pace, unstarted=i, look=Look.ASSISTED) for i in range(16)])
    after = calls(r)
    # Then the clients sent one command; the process is back to its full TTL, every lease stamped, its
    # figures counted
    assert after["evalsha"] - before["evalsha"] == 1 and after.get("eval") == before.get("eval")
    assert all(s.renewed and s.looked and not s.committed and not s.assisted for s in seen)
    assert r.pttl(leases[0].process_key) > 900
    assert len(r.hgetall(keys.lease_beat())) == 16
    assert r.hget(keys.made("j"), 1) == b"107" and r.hget(keys.made("j"), 3) == b"7"
    assert json.loads(r.hget(keys.pace("k"), 2))["made"] == 50
    assert r.zscore(keys.progress("j"), 15) == 15.0
    # and what the script ran inside grows with the jobs, not with the chunks: the tokens made go in
    # one HMGET and one HSET per job, never an HINCRBY per chunk
    ran = {k: after[k] - before.get(k, 0) for k in after}
    assert ran.get("hincrby", 0) == 0 and ran["pexpire"] == 1
    assert ran["hmget"] <= 2 * 2 and ran["hset"] <= 1 + 2 * 3


def heartbeat_calls(r: redis.Redis, k: int) -> dict[str, int]:
    """What the broker ran (its commandstats, the scripts' own commands counted) for a heartbeat's
    `figures_every(128)` beats (20 s at the defaults) of a process holding `k` leases of one job past
    their crash window, each run reporting tokens."""
    r.flushall()
    hb = Heartbeat(interval_s=60, renew_every=FIGURES_EVERY, young_s=0)
    held = [Lease(r, "j", i, run_owner("gpu0@a:1", i), ttl_s=30) for i in range(k)]
    for lease in held:
        assert lease.acquire()
        hb.add(lease)
    for _ in range(figures_every(128)):  # the broker learns the scripts
        hb.beat()
    r.config_resetstat()
    for lease in held:
        hb.report(lease, 5, None, None)
    for _ in range(figures_every(128)):
        hb.beat()
    return {name: n for name, n in calls(r).items() if name not in ("info", "config|resetstat")}


def test_a_process_holding_128_leases_costs_the_broker_the_commands_of_one_holding_1(r):
    # Given a process holding one lease, and one holding 128 (a K set by hand)
    # When each heartbeat runs the same beats, full ones (the runs' tokens, every lease renewed) among them
    one, many = heartbeat_calls(r, 1), heartbeat_calls(r, 128)
    # Then the broker ran no more commands for 128 than for 1: the process's key renewed once a renewal,
    # never a command per lease (before issue 48's process lease: a PEXPIRE per lease, 128 against 1)
    assert many["pexpire"] == one["pexpire"] == 2 and many["evalsha"] == one["evalsha"] == 2
    assert sum(many.values()) <= sum(one.values())
    # and every lease was renewed (its beat stamped), none lost
    assert len(r.hgetall(keys.lease_beat())) == 128
    assert r.pttl(keys.process_lease(leased_process(run_owner("gpu0@a:1", 0)))) > 29_000


def test_a_process_past_figures_leases_sends_its_figures_less_often_and_renews_as_often(r):
    # Given a heartbeat holding 128 leases past their crash window (twice FIGURES_LEASES), each run
    # reporting tokens before every beat
    hb = Heartbeat(interval_s=60, renew_every=FIGURES_EVERY, young_s=0)
    held = [Lease(r, "j", i, run_owner("gpu0@a:1", i), ttl_s=30) for i in range(2 * FIGURES_LEASES)]
    for lease in held:
        assert lease.acquire()
        hb.add(lease)
    carried, stamped = [], []
    # When it beats 20 times
    for n in range(4 * FIGURES_EVERY):
        for lease in held:
            hb.report(lease, 1, {"made": n, "started_ms": 1, "samples": 0, "sample_tokens": 0}, 3)
        before = r.hget(keys.lease_beat(), keys.member("j", 127))
        time.sleep(0.002)
        hb.beat()
        carried.append(int(r.hget(keys.made("j"), 127) or 0))
        stamped.append(r.hget(keys.lease_beat(), keys.member("j", 127)) != before)
    # Then the figures went every 2 x FIGURES_EVERY beats, each time with every token made since (none lost)
    assert figures_every(len(held)) == 2 * FIGURES_EVERY and figures_every(FIGURES_LEASES) == FIGURES_EVERY
    # (never slower, however many: status takes a pace PACE_STALE_S old for a dead run's)
    assert figures_every(100_000) * LeaseClock(60).beat_s < PACE_STALE_S
    assert [n for n in range(1, len(carried)) if carried[n] != carried[n - 1]] == [10]
    assert carried[-1] == 11 and hb.settle(held[127]) == 9
    # and every lease was renewed every FIGURES_EVERY beats as before (its stamp moved), none lost
    assert [n for n, moved in enumerate(stamped) if moved] == [0, 5, 10, 15]
    assert not any(lease.lost for lease in held)


def test_a_release_after_its_process_ran_out_leaves_no_lease_another_run_could_bring_back(r):
    # Given a run holding chunk 0 whose process's key ran out (a broker pause longer than the TTL)
    first = Lease(r, "j", 0, run_owner("gpu0@a:1", 1), ttl_s=30)
    assert first.acquire()
    r.delete(first.process_key)
    # When the run releases it (its chunk done or failed), then another run of the process takes chunk 1
    first.release()
    assert Lease(r, "j", 1, run_owner("gpu0@a:1", 2), ttl_s=30).acquire()
    # Then chunk 0 is not held: it stays watched, and the reaper takes it back with its clock
    assert not leases.leased(r, "j", 0) and holder(r, "j", 0) is None
    assert "j/0" in running(r) and leases.forget_unleased(r, "j", 0) is not None


def test_a_worker_restarted_with_the_same_name_and_pid_does_not_hold_its_predecessors_chunks(r, monkeypatch):
    # Given a worker process that held chunk 0 and died (its process key ran out: a container killed)
    monkeypatch.setattr(leases, "BOOT", "aaaa", raising=False)
    dead = Lease(r, "j", 0, run_owner("gpu0@host:1", 1), ttl_s=30)
    assert dead.acquire()
    r.delete(dead.process_key)
    # When the container restarts it with the same name and pid (its PID 1), and it takes chunk 1
    monkeypatch.setattr(leases, "BOOT", "bbbb", raising=False)
    assert Lease(r, "j", 1, run_owner("gpu0@host:1", 1), ttl_s=30).acquire()
    # Then chunk 0 is still its dead predecessor's, not held: the reaper takes it back, and any worker may
    assert holder(r, "j", 1) == "gpu0@host:1" and not leases.leased(r, "j", 0)
    assert Lease(r, "j", 0, run_owner("gpu0@other:2", 1), ttl_s=30).acquire()


def test_a_beat_renews_only_its_own_leases_and_reads_back_what_the_runs_must_know(r):
    # Given three leases of a process: one taken over by another run, one assisted, one whose chunk
    # another run committed
    mine = [Lease(r, "j", i, "A#1", ttl_s=30) for i in range(3)]
    for lease in mine:
        lease.acquire()
    take_over(r, mine[0].key, "B#1")
    r.set(keys.assist("j", 1), "helper", px=5000)
    r.hset(keys.chunk_stats("j"), 2, "{}")
    # When a beat with figures (it looks) and one without (it renews) run
    full = beat(r, mine, [Figures(look=Look.ASSISTED)] * 3)
    light = beat(r, mine, [Figures(look=Look.COMMITTED), Figures(), Figures()])
    # Then the taken-over lease is lost and left as it was, its TTL not extended by us
    assert [s.renewed for s in full] == [False, True, True] and mine[0].lost and not mine[1].lost
    assert holder(r, "j", 0) == "B" and r.pttl(keys.process_lease("B")) <= 5000
    # and the reads: assisted, committed; a renewal-only beat reads only what it was asked to
    assert [(s.assisted, s.committed) for s in full] == [(False, False), (True, False), (False, True)]
    assert [s.looked for s in light] == [True, False, False]
    assert r.hget(keys.made("j"), 0) is None


def test_a_full_beat_renews_a_helpers_assist_lease_and_the_leases_of_other_jobs_and_ttls(r):
    # Given a process's chunk lease of job j, a helper's assist lease on chunk 1 of j, a chunk lease
    # of job k with another TTL, and an assist lease another helper has taken over since
    owner = run_owner("gpu0@a:1", 1)
    mine = [Lease(r, "j", 0, owner, ttl_s=30), Lease(r, "j", 1, owner, ttl_s=30, assist=True),
            Lease(r, "k", 0, owner, ttl_s=90), Lease(r, "j", 2, owner, ttl_s=30, assist=True)]
    for lease in mine:
        assert lease.acquire()
    r.set(keys.assist("j", 2), "other", px=3000)
    r.pexpire(keys.assist("j", 1), 1000)
    # When a full beat carries their figures (the helper's tokens count for its chunk too)
    seen = beat(r, mine, [Figures(3, None, None, Look.ASSISTED), Figures(4, None, None, Look.COMMITTED),
                          Figures(5, None, None, Look.ASSISTED), Figures(6, None, None, Look.COMMITTED)])
    # Then the three still its own are renewed, each under its own key and TTL; the taken one is lost
    assert [s.renewed for s in seen] == [True, True, True, False] and mine[3].lost
    assert 25_000 < r.pttl(keys.assist("j", 1)) <= 30_000 and r.get(keys.assist("j", 2)) == b"other"
    assert r.pttl(mine[2].process_key) > 85_000
    # and each token went to its own job's chunk, the stamps to the watched leases only
    assert r.hgetall(keys.made("j")) == {b"0": b"3", b"1": b"4", b"2": b"6"}
    assert r.hgetall(keys.made("k")) == {b"0": b"5"}
    assert set(r.hkeys(keys.lease_beat())) == {b"j/0", b"k/0"}


def test_the_heartbeat_carries_figures_every_few_beats_and_a_run_settles_what_is_left(r):
    # Given a heartbeat (driven by hand) holding a run's lease, with tokens reported
    hb = Heartbeat(interval_s=60)
    lease = Lease(r, "j", 0, "A#1", ttl_s=30)
    lease.acquire()
    hb.add(lease)
    hb.report(lease, 10, {"made": 10, "started_ms": 1, "samples": 0, "sample_tokens": 0}, 3)
    # When it beats, the first beat carries the figures; the next FIGURES_EVERY - 1 renew only
    hb.beat()
    assert r.hget(keys.made("j"), 0) == b"10"
    hb.report(lease, 5, None, 2)
    for _ in range(FIGURES_EVERY - 1):
        hb.beat()
    assert r.hget(keys.made("j"), 0) == b"10" and len(hb.round_trips) == FIGURES_EVERY
    # Then the run's end takes what no beat carried yet, and no later beat carries it twice
    assert hb.settle(lease) == 5
    hb.beat()
    assert r.hget(keys.made("j"), 0) == b"10"


# -- the cadence: young leases every beat, old ones every few ----------------------------


def marked(r: redis.Redis, *leases_: Lease) -> None:
    """Clear each lease's beat stamp: a beat that renewed it since stamped it again (its process's
    key is what lives a TTL, renewed with any of its leases)."""
    for lease in leases_:
        r.hset(keys.lease_beat(), keys.member(lease.job, lease.index), 0)


def renewed(r: redis.Redis, lease: Lease) -> bool:
    return int(r.hget(keys.lease_beat(), keys.member(lease.job, lease.index)) or 0) > 0


def test_a_young_lease_is_renewed_every_beat_and_an_old_one_only_on_full_beats(r):
    # Given a heartbeat (driven by hand) renewing old leases on its full beats, with a 10 s crash
    # window, holding a lease taken now and one held for a minute already
    hb = Heartbeat(interval_s=60, renew_every=FIGURES_EVERY, young_s=10)
    young, old = Lease(r, "j", 0, "A#1", ttl_s=30), Lease(r, "j", 1, "A#2", ttl_s=30)
    assert young.acquire() and old.acquire()
    old.taken_ms -= 60_000
    hb.add(young)
    hb.add(old)
    # When the first (full) beat runs, Then both are renewed
    marked(r, young, old)
    hb.beat()
    assert renewed(r, young) and renewed(r, old)
    # When the beats between full ones run, Then each renews the young lease alone, one round trip each,
    # and the old one, not sent, is neither renewed nor lost
    for n in range(1, FIGURES_EVERY):
        marked(r, young, old)
        hb.beat()
        assert renewed(r, young) and not renewed(r, old) and not old.lost
        assert len(hb.round_trips) == 1 + n
    # When the next full beat runs, Then the old lease is renewed again
    marked(r, young, old)
    hb.beat()
    assert renewed(r, young) and renewed(r, old) and not old.lost


def test_a_lease_is_young_until_a_stamp_lies_past_the_crash_window(r):
    # Given a heartbeat past its first (full) beat, with a 50 ms crash window, and a lease taken then
    hb = Heartbeat(interval_s=60, renew_every=FIGURES_EVERY, young_s=0.05)
    hb.beat()
    lease = Lease(r, "j", 0, "A#1", ttl_s=30)
    assert lease.acquire()
    hb.add(lease)
    time.sleep(0.1)
    # When the next beat runs, past the window, Then it renews the lease: the stamp now dates a death
    # outside the window (the last one, at the take, would have dated it inside)
    marked(r, lease)
    hb.beat()
    assert renewed(r, lease) and lease.beat_ms - lease.taken_ms >= 50
    # When the beat after it runs, Then the lease is old: nothing is sent
    marked(r, lease)
    hb.beat()
    assert not renewed(r, lease) and len(hb.round_trips) == 1


def test_a_beat_with_nothing_due_sends_nothing_and_a_lease_not_sent_is_not_lost(r):
    # Given a heartbeat holding only old leases, past its first (full) beat
    hb = Heartbeat(interval_s=60, renew_every=FIGURES_EVERY, young_s=0)
    leases_ = [Lease(r, "j", i, f"A#{i}", ttl_s=30) for i in range(3)]
    for lease in leases_:
        assert lease.acquire()
        hb.add(lease)
    hb.beat()
    # When the broker loses one of them (a wipe), and the beats between full ones run
    r.delete(leases_[0].key)
    before = calls(r)
    for _ in range(1, FIGURES_EVERY):
        hb.beat()
    # Then no command reached the broker, and no lease is marked lost
    after = calls(r)
    assert after.get("evalsha") == before.get("evalsha") and after.get("eval") == before.get("eval")
    assert len(hb.round_trips) == 1 and not any(x.lost for x in leases_)
    # When the next full beat runs, Then it finds the lost one (the lease middleware takes it back) and
    # renews the rest
    hb.beat()
    assert leases_[0].lost and not leases_[1].lost and not leases_[2].lost
    assert len(hb.round_trips) == 2


def test_a_worker_heartbeat_renews_old_leases_at_least_four_times_a_ttl():
    # Given the settings of TTLs from tests' 0.2 s to the 60 s default and beyond
    for ttl in (0.2, 1, 3, 8, 16, 30, 60, 600):
        settings = Settings(lease_ttl_s=ttl)
        hb = Heartbeat.of(settings)
        # Then an old lease is renewed every renew_s, a whole number of beats, at most a quarter TTL
        # apart (or every beat where a beat is that long already)
        clock = LeaseClock.of(settings)
        assert hb.renew_every * hb.interval_s == clock.renew_s
        assert clock.renew_s <= max(ttl / 4, clock.beat_s)
        assert hb.young_s == settings.failure.crash_window_s
    # and at the defaults on the full beats: every 10 s, six renewals a TTL
    assert LeaseClock(60).renew_s == 10 and LeaseClock(60).renew_every == FIGURES_EVERY

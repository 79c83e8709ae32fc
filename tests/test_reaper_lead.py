"""One recovery round for the whole fleet (fleet.coord.recovery, `Reaper.turn`): of a thousand
workers' reapers one leads and scans the running set; a chunk whose lease expired is requeued
at the next round after its TTL, whether its worker was a follower or the leader itself.

A thousand simulated workers, four chunks each, against a real redis-server: each has its own
reaper and its own leases; rounds are stepped (every worker takes one turn, in random order,
from four threads), so nothing here depends on timing."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import redis

from fleet.coord import keys, leases
from fleet.coord.broker import chunk_queue, make_celery, store_of
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.leases import Figures, Lease, run_owner
from fleet.coord.recovery import Reaper, lead_ttl_s
from fleet.coord.scangate import Why
from fleet.settings import Settings
from fleet.store.local import LocalStore
from tests.fleetproc import wait_for
from tests.test_recovery import QUEUE, queued_messages

WORKERS = 1000
K = 4
JOB = "big"
#: a live worker's leases: long enough that none runs out while the test steps its rounds
LIVE_TTL_S = 600.0


@dataclass
class SimWorker:
    owner: str
    reaper: Reaper
    leases: list[Lease] = field(default_factory=list)

    def beat(self, ttl_s: float | None = None) -> None:
        """A heartbeat (fleet.coord.leases.beat), with the TTL the process's settings give its leases."""
        held = [Lease(x.r, x.job, x.index, x.owner, ttl_s) for x in self.leases] if ttl_s else self.leases
        seen = leases.beat(self.leases[0].r, held, [Figures(made=1)] * len(held))
        assert all(s.renewed for s in seen)


@pytest.fixture
def settings(redis_server, clean_env) -> Settings:
    # lead TTL = min(2 x 2 s, 4 s - 1 s heartbeat) = 3 s
    return Settings(broker_url=redis_server.url, queue=QUEUE, lease_ttl_s=4.0, reaper_interval_s=2.0)


@pytest.fixture
def fleet(settings, tmp_path, redis_server):
    """WORKERS simulated workers on four clients, each with its reaper and K leased chunks."""
    app = make_celery(settings)
    store = LocalStore(tmp_path / "store")
    clients = [redis.Redis.from_url(redis_server.url) for _ in range(4)]
    workers = []
    for w in range(WORKERS):
        r = clients[w % 4]
        owner = f"gpu{w % 8}@host{w // 8:03d}:{1000 + w}"
        reaper = Reaper(r, store, app, settings, chunks_of=lambda job: WORKERS * K)
        worker = SimWorker(owner, reaper)
        for i in range(K):
            lease = Lease(r, JOB, w * K + i, run_owner(owner, i), LIVE_TTL_S, store=store_of(settings))
            assert lease.acquire()
            worker.leases.append(lease)
        workers.append(worker)
    yield workers
    for c in clients:
        c.close()
    app.close()


def one_round(workers: list[SimWorker]) -> list[SimWorker]:
    """Every worker takes its turn once, in random order, four at a time; those that ran the round."""
    order = random.sample(workers, len(workers))
    with ThreadPoolExecutor(4) as pool:
        led = list(pool.map(lambda w: w.reaper.turn(w.owner), order))
    return [w for w, ran in zip(order, led, strict=True) if ran]


def calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def dies(worker: SimWorker, settings: Settings, r: redis.Redis) -> None:
    """Its last beat renews its leases for the settings' TTL; then it stops, and they run out."""
    worker.beat(settings.lease.ttl_s)
    wait_for(lambda: not any(leases.leased_of(r, [(x.job, x.index) for x in worker.leases])), 30,
             "the dead worker's leases to run out", interval=0.05)


@pytest.mark.slow
def test_one_reaper_scans_for_the_fleet_and_requeues_an_expired_lease_at_the_next_round(fleet, settings,
                                                                                           redis_server):
    r = redis.Redis.from_url(redis_server.url)
    # Given a thousand workers' reapers taking their turns
    leaders = one_round(fleet)
    # Then one of them leads
    assert len(leaders) == 1
    leader = leaders[0]
    assert r.get(keys.reaper_leader(store_of(settings))) == leader.owner.encode()
    # When a worker that does not lead dies, and its leases run out
    dead = next(w for w in fleet if w is not leader)
    dies(dead, settings, r)
    before = {c: calls(r, c) for c in ("mget", "exists")}
    leaders = one_round(fleet)
    # Then the next round (its lead may have passed to another while no turn came) requeued
    # exactly its chunks, once, and was one look at the processes' keys and one scan of the running set
    assert len(leaders) == 1 and leaders[0].reaper.gate.why is (Why.DEATH if leaders[0] is leader else Why.FIRST)
    assert sorted(m["index"] for m in queued_messages(r)) == sorted(x.index for x in dead.leases)
    assert r.scard(keys.running()) == (WORKERS - 1) * K
    # the 1,000 processes' keys in one MGET (fleet.coord.scangate), then one scan: the running set's 4,000
    # leases read in MGETs of 1,000, then their processes' keys in as many, no lease asked after alone
    assert calls(r, "mget") - before["mget"] == 1 + 2 * WORKERS * K // 1000
    assert calls(r, "exists") - before["exists"] < 100
    # When the requeued chunks are taken off the queue, and the leader's next round finds no death (the dead
    # worker forgotten: nothing of it left to recover)
    for name in keys.queue_lists(chunk_queue(settings)):
        r.delete(name)
    before = {c: calls(r, c) for c in ("mget", "sscan")}
    [leader] = leaders
    assert leader.reaper.turn(leader.owner)
    # Then it reads the processes' keys (one MGET), and the stall watch, with nothing queued, one slice of
    # the running set (whether anything of the job runs), never the 4,000 leases
    assert leader.reaper.gate.why is None
    assert calls(r, "mget") - before["mget"] == 1 and calls(r, "sscan") - before["sscan"] == 1
    r.close()


@pytest.mark.slow
def test_when_the_leader_dies_another_leads_by_the_time_its_own_leases_run_out(fleet, settings, redis_server):
    r = redis.Redis.from_url(redis_server.url)
    assert lead_ttl_s(settings) <= settings.lease.ttl_s - LeaseClock.of(settings).renew_s
    # Given the fleet's leader
    [leader] = one_round(fleet)
    # When it takes its last turn, beats once more and dies
    assert leader.reaper.turn(leader.owner)
    dies(leader, settings, r)
    # Then its lead ran out with its leases, and at the next round one other worker leads and
    # requeues its chunks
    assert r.get(keys.reaper_leader(store_of(settings))) is None
    leaders = one_round([w for w in fleet if w is not leader])
    assert len(leaders) == 1 and leaders[0] is not leader
    assert sorted(m["index"] for m in queued_messages(r)) == sorted(x.index for x in leader.leases)
    assert r.scard(keys.running()) == (WORKERS - 1) * K
    r.close()


@pytest.mark.slow
def test_a_lost_lead_is_no_loss_of_rounds(fleet, settings, redis_server):
    # Given a leader whose lead another process took while it was cut off (its key expired)
    r = redis.Redis.from_url(redis_server.url)
    [leader] = one_round(fleet)
    r.delete(keys.reaper_leader(store_of(settings)))
    other = next(w for w in fleet if w is not leader)
    assert other.reaper.turn(other.owner)
    # When the old leader takes its turn, Then it does not run the round, and the new one keeps leading
    assert not leader.reaper.turn(leader.owner) and not leader.reaper.leading
    assert one_round(fleet) == [other]
    r.close()

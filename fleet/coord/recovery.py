"""Fast recovery: chunks whose lease expired without a result go back to the queue.

One round (`Reaper.round`) serves every worker's periodic check, `fleet enqueue` and
`fleet run`, so a SIGKILLed worker's chunk runs elsewhere within about TTL + the check
interval, whatever Celery's visibility timeout is. What a lost worker means for the chunk
is fleet.coord.retry's decision (a worker loss is the chunk's fault only on evidence, and only
a death something saw is evidence: fleet.coord.witness).

Of a store's workers, one runs the round for the store's whole fleet: the one that holds the
store's reaper lead (`Reaper.turn`, keys.reaper_leader); the others' turns only try to take it.
The broker then serves one scan per store and round whatever the fleet's size (docs/architecture.md,
"Scaling"). A round reads and decides only its own store's jobs: another store's are not its to
requeue or drop ("Stores on one broker").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from celery import Celery

from fleet.coord import chunkqueue, keys, leases, suspects, witness
from fleet.coord.broker import chunk_queue, store_of
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.chunkstate import delete_checkpoints, done_indexes, failed_indexes
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.outages import Outages, outages_of
from fleet.coord.pause import Expiry, PauseJudge
from fleet.coord.retry import Action, History, RetryPolicy, settle
from fleet.coord.scangate import ScanGate
from fleet.coord.suspects import Run
from fleet.errors import WorkerLost
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.layout import checkpoints_prefix, result_key
from fleet.store.manifest import load_manifest
from fleet.store.options import OptionsCache

log = logging.getLogger(__name__)

# Take the lead, or keep it: only its holder renews it.
_LEAD = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]); return 1 end "
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0"
)


def lead_ttl_s(settings: Settings) -> float:
    """How long the reaper lead lasts unrenewed (LeaseClock.lead_ttl_s)."""
    return LeaseClock.of(settings).lead_ttl_s


@dataclass
class Scan:
    """What one scan of the running set did."""

    #: the chunks ("job/index") it requeued or quarantined
    touched: list[str] = field(default_factory=list)
    #: lost chunks it left for a later round (a witness awaited, a holder cut off, a failed recovery)
    pending: int = 0


def requeue_expired(r: redis.Redis, store: Store, app: Celery, settings: Settings,
                    outages: Outages | None = None, options: OptionsCache | None = None) -> list[str]:
    """Requeue (or, on evidence, quarantine) every chunk of the store's jobs in the running set
    whose lease is gone, each under its job's retry policy (`options`, the reaper's reader of the
    jobs' options, fleet.store.options). A lease that ran out in a broker pause (`outages`: when
    this process could not reach the broker) is left to its holder to take back, then requeued
    without judgement. The chunks it touched."""
    return scan_expired(r, store, app, settings, outages, options).touched


def scan_expired(r: redis.Redis, store: Store, app: Celery, settings: Settings,
                 outages: Outages | None = None, options: OptionsCache | None = None) -> Scan:
    """`requeue_expired`, with the count of lost chunks it left for a later round."""
    queue, policy = ChunkQueue.of(app, settings, r), RetryPolicy.from_settings(settings)
    options = options or OptionsCache(store)
    judge = PauseJudge(outages or outages_of(r), settings)
    expired, live = leases.scan_leases(r)
    scan = Scan()
    if expired:  # another store's chunk is that store's reaper's: its result is not in this store
        mine = set(leases.known_jobs(r, queue.store))
        # pending here too: the dead process stays in the set every store's leader looks at until that
        # store's leader recovered them (fleet.coord.scangate)
        scan.pending = sum(1 for job, _ in expired if job not in mine)
        expired = [(job, index) for job, index in expired if job in mine]
    lost = [(job, index) for job, index in expired if not store.exists(result_key(job, index))]
    for job, index in set(expired) - set(lost):
        if leases.forget_unleased(r, job, index) is not None:
            delete_checkpoints(store, job, index)
            leases.drop_clock(r, job, index)  # its process died after the commit: nothing to judge
            suspects.drop_lost(r, job, index)
    expiries = {(job, index): judge.expiry(r, job, index) for job, index in lost}
    judge.note_round([e for e in expiries.values() if e is not None], live)
    for job, index in lost:
        member = keys.member(job, index)
        pause = judge.pause(expiries[job, index])
        if pause is not None and judge.holding(pause):
            scan.pending += 1
            continue  # its holder, cut off like us, takes the lease back when it reaches the broker
        if pause is None and awaits_witness(r, expiries[job, index], judge.renew_s + settings.failure.witness_wait_s):
            scan.pending += 1
            continue  # its launcher, if it outlived the process, is about to say how it died
        if not leases.claim_recovery(r, job, index, LeaseClock.of(settings).recovery_claim_s):
            scan.pending += 1
            continue
        ran_s = leases.forget_unleased(r, job, index)
        if ran_s is None:
            continue  # a new owner took it since the scan
        try:
            if pause is not None:
                requeue_paused(r, queue, job, index)
            else:
                requeue_lost(r, store, queue, policy.for_job(options.get(job)), job, index, ran_s)
        except Exception as e:  # the chunk left the running set: put it back, with its evidence, for the next round
            leases.rewatch(r, job, index)
            scan.pending += 1
            log.warning("chunk %s: recovery failed, retried next round: %s", member, e)
            continue
        scan.touched.append(member)
    return scan


def awaits_witness(r: redis.Redis, expiry: Expiry | None, wait_s: float, now: float | None = None) -> bool:
    """Whether a lost chunk's death is left for a round more, for a witness: its process is known, none
    saw it die yet, and a live launcher could still be about to say how it died. A live holder renews
    its lease every renewal interval (LeaseClock.renew_s), so it died by its last renewal plus that, and
    its launcher records the death at once: `wait_s` (that interval plus `failure.witness_wait_s`) counts
    from its last renewal, not from the lease's run-out, which at fleet's TTLs comes most of a TTL later
    (a lease of 60 s, renewed every 10 s, has waited 47 s more than the witness needs when it runs out:
    a vanished host's chunks are requeued in the reaper's next round instead of 3 s after it)."""
    if expiry is None or expiry.holder is None:
        return False
    if (time.time() if now is None else now) >= expiry.last_beat + wait_s:
        return False
    return witness.witnessed(r, expiry.holder) is None


def requeue_lost(r: redis.Redis, store: Store, queue: ChunkQueue, policy: RetryPolicy, job: str, index: int,
                 ran_s: float) -> None:
    """What a lost worker's chunk comes to: the retry policy requeues or quarantines it.
    `ran_s` is the lease clock: how long the lost worker held the lease (since it started
    alone, for a solo run). The death is recorded first: against its process's worker when
    something saw the process die (fleet.coord.witness), else against its host alone. The
    evidence (the lease clock, who held the chunk and how) is dropped only once the decision
    is carried out: if this raises, the next round judges the same death again."""
    member = keys.member(job, index)
    lost = suspects.lost_marks(r, job, index)
    owner = lost.owner
    seen = witness.witnessed(r, owner) if owner is not None else None
    if seen is not None:
        count_process_death(r, policy, owner)
    elif owner is not None:
        count_host_loss(r, owner)
    history = History.load(r, job, index, ran_s=ran_s, solo=lost.run is Run.ALONE, owner=owner,
                           waiting=lost.run is Run.WAITING, witnessed=seen is not None)
    how = {Run.ALONE: ", alone", Run.WAITING: ", waiting to run alone", Run.SHARED: ""}[lost.run]
    error = WorkerLost(f"worker lost: lease of {member} expired with no result"
                       + (f" (held by {owner}{how}; {seen or 'no one saw it die'})" if owner else ""))
    decision = settle(r, store, policy, job, index, error, history, history.worker or None)
    if decision.action is Action.QUARANTINE:
        log.error("chunk %s quarantined: %s", member, decision.why)
    else:  # a lost worker never spends an attempt
        queue.requeue(job, index)
        log.warning("chunk %s lease expired without result: requeued (%s)", member, decision.why)
    leases.drop_clock(r, job, index)
    suspects.drop_lost(r, job, index, lost)


def requeue_paused(r: redis.Redis, queue: ChunkQueue, job: str, index: int) -> None:
    """A lease that ran out in a broker pause and was not taken back: no evidence against the
    chunk or its holder (no death, suspicion or bench), only a requeue."""
    lost = suspects.lost_marks(r, job, index)
    queue.requeue(job, index)
    log.warning("chunk %s: lease ran out during a broker pause and %s did not take it back: requeued, "
                "no death recorded", keys.member(job, index), lost.owner or "its holder")
    leases.drop_clock(r, job, index)
    suspects.drop_lost(r, job, index, lost)


def count_host_loss(r: redis.Redis, owner: str) -> None:
    """Count a process no one saw die against its host alone: it vanished with it (a preemption, a
    power cut, its launcher killed with it), which says nothing of its worker or its chunks."""
    host = suspects.host_of(suspects.worker_of(owner))
    if n := witness.note_host_loss(r, owner, host):
        log.warning("process %s vanished with no witness of its death: host %s lost whole (%d process(es) so "
                    "far); counted against the host, not its worker or chunks", owner, host, n)


def count_process_death(r: redis.Redis, policy: RetryPolicy, owner: str) -> None:
    """Count a process's death against its worker; say so loudly when it benches the worker."""
    first, before = suspects.note_process_death(r, owner)
    if not first:
        return
    worker = suspects.worker_of(owner)
    health = suspects.worker_health(r, worker)
    bench_s = policy.benched_for(health.streak, suspects.healthy_others(r, worker))
    if bench_s is not None and health.streak > before:
        log.critical("worker %s benched: %d of its processes in a row died before finishing a batch (%d deaths in "
                     "all); it takes no chunk for %.0fs, then one at a time until one commits", worker,
                     health.streak, health.deaths, bench_s)
    else:
        log.warning("process %s died holding chunks (worker %s: %d deaths, %d in a row before finishing a batch)",
                    owner, worker, health.deaths, health.streak)


def watch_jobs(r: redis.Redis, store: Store, app: Celery, settings: Settings, stall: StallWatch,
               chunks_of: Callable[[str], int | None], outages: Outages | None = None,
               options: OptionsCache | None = None, gate: ScanGate | None = None) -> None:
    """One recovery round over every job of the store on this broker. A job fails alone: its
    error is logged and the others are still checked. A job of the store with no manifest in it
    (its prefix was deleted) leaves the store's job set once nothing of it is queued or running:
    while something is, a worker of the store runs it, and this process may be the one whose
    store is not the one its URL names (a local path on another host). The running set is scanned
    when `gate` says so (fleet.coord.scangate), every round without one."""
    try:
        if gate is None or gate.due(r):
            scan = scan_expired(r, store, app, settings, outages, options)
            if gate is not None:
                gate.scanned(r, scan.pending)
    except redis.RedisError as e:  # the broker may be restarting; the jobs below get their turn
        log.warning("expired-lease scan failed: %s", e)
    mine = store_of(settings)
    try:
        adopt_legacy(r, mine, chunks_of)
    except Exception as e:  # the old set is only read; the next round tries again
        log.warning("adopting jobs of the old shared job set failed: %s", e)
    for job in leases.known_jobs(r, mine):
        if job in stall.finished:
            continue
        try:
            count = chunks_of(job)
            if count is None:
                if not (chunkqueue.queued_indexes(r, job) or leases.watches_any(r, job)) \
                        and leases.drop_job(r, job, mine):
                    log.warning("job %s has no manifest in %s and nothing queued or running: dropped from the "
                                "store's job set", job, store.url)
                continue
            stall.check(r, store, app, settings, job, count)
        except Exception as e:  # one broken job must not stop recovery of the others
            log.warning("recovery check of job %s failed: %s", job, e)


def adopt_legacy(r: redis.Redis, mine: str, chunks_of: Callable[[str], int | None]) -> list[str]:
    """Jobs of the job set every store shared before issue 44 whose manifest this store holds
    join its own job set; the others stay for their own store. Returns those adopted."""
    adopted = []
    for job in leases.legacy_jobs(r):
        if chunks_of(job) is not None:
            leases.adopt_job(r, job, mine)
            adopted.append(job)
            log.info("job %s (enqueued before stores had a queue each) joins this store's job set", job)
    return adopted


class Reaper:
    """The recovery round of a process that watches the broker: a worker's thread, `fleet run`'s
    loop, `fleet enqueue`. Holds the stall watch between rounds."""

    def __init__(self, r: redis.Redis, store: Store, app: Celery, settings: Settings,
                 chunks_of: Callable[[str], int | None] | None = None):
        self.r, self.store, self.app, self.settings = r, store, app, settings
        #: the id of the store this reaper recovers (fleet.store.identity): its lead and job set
        self.store_id = store_of(settings)
        self.chunks_of = chunks_of or self._manifest_chunks
        self.stall = StallWatch()
        #: when this process could not reach the broker (its client's record, kept between rounds)
        self.outages = outages_of(r)
        #: whether this reaper led the fleet's recovery at its last turn
        self.leading = False
        #: (epoch seconds, seconds it took) of this reaper's recent rounds (the control-plane bench reads them)
        self.rounds: deque[tuple[float, float]] = deque(maxlen=64)
        #: the jobs' options (fleet.store.options), kept between rounds: each lost chunk's retry policy
        self.options = OptionsCache(store)
        #: when its rounds scan every running chunk's lease (a death, a let-go, every few rounds)
        self.gate = ScanGate()

    def _manifest_chunks(self, job: str) -> int | None:
        manifest = load_manifest(self.store, job)
        return manifest.chunks if manifest else None

    def round(self) -> None:
        """Never raises: the broker may be restarting, the next round tries again."""
        began = time.monotonic()
        try:
            watch_jobs(self.r, self.store, self.app, self.settings, self.stall, self.chunks_of, self.outages,
                       self.options, self.gate)
        except Exception as e:
            log.warning("recovery check failed: %s", e)
        self.rounds.append((time.time(), time.monotonic() - began))

    def turn(self, owner: str) -> bool:
        """A worker's periodic turn: the round if this process (`owner`, `name:pid`) holds the reaper
        lead or takes it now, else nothing. Whether it ran the round; never raises."""
        try:
            ttl_ms = int(lead_ttl_s(self.settings) * 1000)
            lead = bool(self.r.eval(_LEAD, 1, keys.reaper_leader(self.store_id), owner, ttl_ms))
        except redis.RedisError as e:
            log.warning("reaper lead check failed: %s", e)
            return False
        if lead and not self.leading:
            self.gate = ScanGate()  # a lead taken (back) scans at once: what it saw before is old
        if lead != self.leading:
            log.info("%s %s the recovery rounds of store %s", owner, "leads" if lead else "no longer leads",
                     self.store_id)
            self.leading = lead
        if lead:
            self.round()
        return lead

    def run(self, owner: str, stop: threading.Event) -> None:
        """A worker's reaper thread: a turn every reaper interval until `stop` is set."""
        while not stop.wait(LeaseClock.of(self.settings).reaper_interval_s):
            self.turn(owner)


class StallWatch:
    """Re-enqueue a job's missing chunks when nothing is queued or running for two checks. A
    chunk in the running set counts as running even with its lease gone: the reaper decides it
    (after a broker pause it waits for the holder to take its lease back).

    Covers the one gap leases cannot: a message taken off the queue by a worker killed
    before it took the lease (kombu has the same window between pop and its unacked
    record). Duplicates are harmless: a delivery of a done or leased chunk is skipped.
    """

    def __init__(self) -> None:
        self.idle_checks: dict[str, int] = {}
        #: jobs whose every chunk has a result: never checked again
        self.finished: set[str] = set()

    def check(self, r: redis.Redis, store: Store, app: Celery, settings: Settings, job: str, total: int) -> list[int]:
        if job in self.finished:
            return []
        if any(r.llen(q) for q in keys.queue_lists(chunk_queue(settings))) or leases.watches_any(r, job):
            self.idle_checks[job] = 0
            return []
        done = done_indexes(store, job)
        if len(done) == total:
            self.finished.add(job)
            store.delete_prefix(checkpoints_prefix(job))  # job end: every chunk has its result
            return []
        missing = set(range(total)) - done - failed_indexes(store, job)
        if not missing:
            return []
        self.idle_checks[job] = self.idle_checks.get(job, 0) + 1
        if self.idle_checks[job] < 2:
            return []
        self.idle_checks[job] = 0
        guard_s = max(5, int(LeaseClock.of(settings).reaper_interval_s * 3))
        if not r.set(keys.stall_guard(job), "1", nx=True, ex=guard_s):
            return []
        queue = ChunkQueue.of(app, settings, r)
        for index in sorted(missing):
            queue.requeue(job, index)
        log.warning("job %s stalled with %d chunks missing and none queued: re-enqueued", job, len(missing))
        return sorted(missing)

"""Simulated workers for the control-plane bench (fleet.bench.controlplane): a process of many.

A simulated worker is what a worker process asks of the broker, through fleet's own code: its
client (fleet.coord.broker.redis_client: named, jittered retries), its heartbeat carrying K
leases and their runs' figures (fleet.coord.heartbeat, `Heartbeat.beat`), its reaper's turns
(`Reaper.turn`: one leader for the fleet), and the coordination calls the middleware make as a
chunk starts and ends (lease, admission's holder mark, progress, stats; fleet.worker.run.middleware).
The engine is a timer (tokens made at the reference rate; a chunk ends after its run time);
Celery's consumer is a stand-in that sends what a real one was measured to send
(fleet.bench.celerycost), holds its pattern subscriptions, and reconnects after a broker restart
on JitteredConnection's schedule. A simulated worker holds a real one's connections
(fleet.bench.connections): its pool (fleet's commands and kombu's PUBLISHes), the consumer's
and the subscription.

Its events are Celery's worker-heartbeat envelopes (`heartbeat_event`), so a Flower beside the
simulated fleet sees its workers. With `idle`, the end of a job: no chunk to take, each worker's
assist poll (the assist policy's own read, fleet.coord.stragglers.straggler) every
assist_poll_s, and Celery's idle consumer.

What is not a worker's: the loops. A worker has a heartbeat thread and a reaper thread; here
one scheduler per process calls each worker's beat every heartbeat and its reaper's turn every
round, each at its own random phase, on a few threads: a thousand workers' worth of idle
threads in a few processes would cost the machine more than the broker they measure.

`python -m fleet.bench.simfleet SPEC.json`: prints "ready" once every lease is taken; SIGUSR1
opens the measured window, SIGUSR2 closes it, SIGTERM writes the results (SPEC's `out`) and exits.
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import json
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.connection

from fleet.coord import chunkqueue, figures, suspects
from fleet.coord.broker import make_celery, redis_client
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.leases import Lease, run_owner
from fleet.coord.pool import KOMBU_NAME, new_pool
from fleet.coord.reconnect import jittered_waits
from fleet.coord.recovery import Reaper
from fleet.coord.stragglers import straggler
from fleet.settings import Settings
from fleet.store import open_store
from fleet.store.layout import result_key
from fleet.store.results import ChunkStats, encode_result

#: seconds between the timers' looks at every run: the progress middleware reports every assist_poll_s / 2,
#: but only every FIGURES_EVERY-th beat (10 s) carries figures to the broker, so a slower timer changes
#: nothing the broker sees and costs the bench's CPU less
TICK_S = 5.0
#: threads that run the workers' beats and reaper turns in one process
LOOPS = 8
#: kombu's reconnection schedule as Celery's consumer calls it (start, step, cap), jittered as fleet's is
CELERY_RECONNECT = (2.0, 2.0, 30.0)
#: what kombu 5.7's Redis transport sends per chunk delivered and acked, as (PUBLISHes, other commands):
#: the task-received and task-started events beside the BRPOP that delivers it and the unacked record
#: (MULTI, ZADD, HSET, EXEC); then the task-succeeded event and the ack (ZREM, HDEL)
START_COMMANDS, END_COMMANDS = (2, 5), (1, 2)


class Counted:
    """Every command this process's clients send, a pipeline's one by one (a script counts once)."""

    def __init__(self) -> None:
        self.sent = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def install(self) -> None:
        send, pack = redis.connection.AbstractConnection.send_command, redis.connection.AbstractConnection.pack_commands
        counter = self

        def send_command(conn: Any, *args: Any, **kwargs: Any) -> Any:
            counter.add(1)
            return send(conn, *args, **kwargs)

        def pack_commands(conn: Any, commands: Any) -> Any:
            counter.add(len(commands))
            return pack(conn, commands)

        redis.connection.AbstractConnection.send_command = send_command  # type: ignore[method-assign]
        redis.connection.AbstractConnection.pack_commands = pack_commands  # type: ignore[method-assign]


@dataclass
class Spec:
    """What one process simulates (written by the driver as JSON)."""

    broker_url: str
    store_url: str
    queue: str
    job: str
    host: str
    workers: int
    k: int
    #: the chunk indexes this process's workers take, [first, last)
    first: int
    last: int
    #: a chunk's run time at the reference shape, and the tokens a second one chunk's run makes
    chunk_s: float
    chunk_tok_s: float
    chunk_records: int
    lease_ttl_s: float
    reaper_interval_s: float
    #: the Celery stand-in: (command, per second per worker), a PUBLISH's size, the patterns a worker holds
    celery_mix: list[tuple[str, float]]
    publish_bytes: int
    patterns: list[str]
    out: str
    #: the end of a job: no chunk to take, every worker's assist poll (every assist_poll_s) and Celery's
    #: idle consumer (`celery_mix` then carries the idle phase's commands)
    idle: bool = False
    assist_poll_s: float = 2.0


@dataclass
class SimRun:
    lease: Lease
    index: int
    started: float
    ends: float
    made: int = 0
    reported: int = 0


@dataclass
class Stats:
    lost: int = 0
    #: when each lost lease was found (the driver counts those of a restart)
    lost_at: list[float] = field(default_factory=list)
    retaken: int = 0
    ended: int = 0
    celery_sent: int = 0
    celery_reconnects: list[float] = field(default_factory=list)


class SimWorker:
    """One worker process's coordination (module docstring)."""

    def __init__(self, spec: Spec, n: int, settings: Settings, store: Any, app: Any, ids: Iterator[int],
                 stats: Stats):  # fmt: skip
        self.spec, self.settings, self.store, self.ids, self.stats = spec, settings, store, ids, stats
        self.name = f"gpu{n % 8}@{spec.host}{n // 8:04d}"
        self.owner = f"{self.name}:{100_000 + n}"
        # a worker's three connections (fleet.coord.pool): its pool, which carries kombu's PUBLISHes too
        self.pool = new_pool(spec.broker_url)
        self.r = redis_client(settings, self.pool)
        self.events = redis.Redis(connection_pool=self.pool)
        self.heartbeat = Heartbeat.of(settings)
        self.reaper = Reaper(self.r, store, app, settings)
        self.runs: list[SimRun] = []
        self.serial = 0
        #: chunks to begin that the broker refused to start (a restart): begun at a later tick
        self.owed_begins = 0
        #: the Celery stand-in's consumer (the BRPOP's connection; its subscription is the second of its
        #: pool), and the per-chunk commands it owes
        self.celery = redis.Redis.from_url(spec.broker_url, socket_timeout=5, socket_connect_timeout=2, retry=None,
                                           client_name=KOMBU_NAME)
        self.owed: list[tuple[int, int]] = []

    def start(self) -> None:
        if self.spec.idle:
            return
        for _ in range(self.spec.k):
            self.begin(age=random.uniform(0, self.spec.chunk_s))

    def assist_poll(self) -> None:
        """An idle worker's assist poll (fleet.worker.process.assist): is anything queued, and if
        not, which running chunk lags most."""
        if not chunkqueue.waiting(self.r, self.spec.queue):
            straggler(self.r, self.reaper.store_id, self.owner, set())

    def next_run(self) -> None:
        """A slot freed: begin its next chunk now, or at a later tick if the broker refuses."""
        self.owed_begins += 1
        self.begin_owed()

    def begin_owed(self) -> None:
        while self.owed_begins:
            self.begin()  # a refusal (RedisError) keeps the debt for the next tick
            self.owed_begins -= 1

    def begin(self, age: float = 0.0) -> None:
        """The lease, admission and progress middlewares' calls as a delivered chunk starts."""
        spec, r = self.spec, self.r
        while True:
            index = next(self.ids)
            chunkqueue.taken(r, spec.job, index)
            self.serial += 1
            lease = Lease(r, spec.job, index, run_owner(self.owner, self.serial), spec.lease_ttl_s,
                          store=self.reaper.store_id)
            if lease.acquire():
                break
        self.heartbeat.add(lease)
        suspects.note_holder(r, spec.job, index, self.owner)
        figures.made_by(r, spec.job, index)
        now = time.time()
        self.runs.append(SimRun(lease, index, now - age, time.monotonic() + spec.chunk_s - age,
                             made=int(age * spec.chunk_tok_s)))
        self.owed.append(START_COMMANDS)

    def finish(self, run: SimRun, committed: bool = True) -> None:
        """The progress, stats, lease and admission middlewares' calls as a run commits."""
        spec, r = self.spec, self.r
        pending = self.heartbeat.settle(run.lease)
        figures.end_run(r, spec.job, run.index, pending + run.made - run.reported, owner=True)
        if committed:
            now = time.time()
            stats = ChunkStats(job=spec.job, chunk=run.index, records=spec.chunk_records, samples=spec.chunk_records,
                               completion_tokens=run.made, tokens_made=run.made, started=run.started, finished=now,
                               seconds=round(now - run.started, 3), worker=self.name)
            self.store.put_if_absent(result_key(spec.job, run.index), encode_result(stats, []))
            figures.cache_stats(r, spec.job, run.index, stats)
        self.heartbeat.discard(run.lease)
        run.lease.release()
        suspects.drop_holder(r, spec.job, run.index, self.owner)
        if committed:
            suspects.note_commit(r, self.owner)
            suspects.note_duration(r, spec.job, time.time() - run.started)
        self.runs.remove(run)
        self.owed.append(END_COMMANDS)
        self.stats.ended += 1

    def tick(self, dt: float) -> None:
        """The engine's timer and the middleware's poll: tokens made, figures reported, a lost lease
        taken back (fleet.worker.run.middleware.lease), a chunk at its end committed and the next begun."""
        now = time.monotonic()
        self.begin_owed()
        for run in list(self.runs):
            if run.lease.lost:
                self.stats.lost += 1
                self.stats.lost_at.append(time.time())
                if run.lease.retake():
                    self.stats.retaken += 1
                else:
                    self.finish(run, committed=False)
                    self.next_run()
                    continue
            run.made += int(self.spec.chunk_tok_s * dt)
            left = max(0.0, (run.ends - now) / self.spec.chunk_s)
            pace = {"made": run.made, "started_ms": int(run.started * 1000), "samples": 0, "sample_tokens": 0}
            self.heartbeat.report(run.lease, run.made - run.reported, pace,
                                  int(self.spec.chunk_records * max(0.0, 2 * left - 1)))
            run.reported = run.made
            if now >= run.ends:
                self.finish(run)
                self.next_run()


#: threads that carry the stand-ins' event PUBLISHes (each blocks only while the broker is away)
PUBLISH_THREADS = 32
#: the longest a process waits for its workers' first chunks' Celery commands before it says ready
DRAIN_S = 600.0


class CeleryStandIn:
    """Celery's consumer for every worker of the process: its measured steady commands at their
    rates, its per-chunk commands, its pattern subscriptions, its jittered reconnection."""

    def __init__(self, spec: Spec, workers: list[SimWorker], stats: Stats):
        self.spec, self.workers, self.stats = spec, workers, stats
        self.subs: dict[int, Any] = {}
        #: worker -> the jittered waits left before its next reconnection attempt (down while present)
        self.down: dict[int, Iterator[float]] = {}
        #: a worker's event PUBLISH goes through its pool, whose client retries through an outage and
        #: waits its turn for the pool's connection (fleet.coord.pool): it holds up that worker's hub, not
        #: every worker's, so publishes run on threads of their own
        self.publisher = ThreadPoolExecutor(max_workers=PUBLISH_THREADS, thread_name_prefix="publish")
        self.lock = threading.Lock()
        #: PUBLISHes handed to the threads and not yet sent (and a chunk's commands being sent)
        self.publishing = 0

    def subscribe(self, n: int) -> None:
        if not self.spec.patterns:
            return
        old = self.subs.pop(n, None)
        if old is not None:
            old.close()
        sub = self.workers[n].celery.pubsub(ignore_subscribe_messages=True)
        sub.psubscribe(*self.spec.patterns)
        self.subs[n] = sub

    def run(self, stop: threading.Event) -> None:
        for n in range(len(self.workers)):
            self.subscribe(n)
        heap: list[tuple[float, int, int]] = []
        now = time.monotonic()
        for n in range(len(self.workers)):
            for c, (_, rate) in enumerate(self.spec.celery_mix):
                if rate > 0:
                    heapq.heappush(heap, (now + random.uniform(0, 1 / rate), n, c))
        while not stop.is_set():
            when, n, c = heap[0] if heap else (time.monotonic() + TICK_S, -1, -1)
            if stop.wait(max(0.0, min(when, time.monotonic() + 0.2) - time.monotonic())):
                return
            self._owed()
            if heap and heap[0][0] <= time.monotonic():
                when, n, c = heapq.heappop(heap)
                cmd, rate = self.spec.celery_mix[c]
                if n in self.down:
                    heapq.heappush(heap, (when + next(self.down[n]), n, c))
                    self._reconnect(n)
                    continue
                self._send(n, cmd)
                heapq.heappush(heap, (when + 1 / rate, n, c))

    def _owed(self) -> None:
        for n, worker in enumerate(self.workers):
            while worker.owed and n not in self.down:
                with self.lock:
                    self.publishing += 1  # an entry on its way counts as a PUBLISH not yet sent
                try:
                    publishes, others = worker.owed.pop()
                    for _ in range(publishes):
                        self._send(n, "PUBLISH")
                    self._send_many(n, others)
                finally:
                    with self.lock:
                        self.publishing -= 1

    def drained(self) -> bool:
        """Every chunk's commands sent (the K chunks a worker begins with owe theirs at once)."""
        with self.lock:
            publishing = self.publishing
        return publishing == 0 and not any(worker.owed for worker in self.workers)

    def _send_many(self, n: int, count: int) -> None:
        """A chunk's other commands, in one round trip as kombu's pipeline sends its unacked record."""
        try:
            with self.workers[n].celery.pipeline(transaction=False) as p:
                for _ in range(count):
                    p.ping()
                p.execute()
        except redis.ConnectionError:
            self._lost(n)
            return
        with self.lock:
            self.stats.celery_sent += count

    def _send(self, n: int, cmd: str) -> None:
        if cmd == "PUBLISH":  # kombu's events go through the worker's pool (fleet.coord.transport)
            with self.lock:
                self.publishing += 1
            self.publisher.submit(self._publish, n)
            return
        try:
            self.workers[n].celery.ping()
        except redis.ConnectionError:
            self._lost(n)
            return
        with self.lock:
            self.stats.celery_sent += 1

    def _publish(self, n: int) -> None:
        worker = self.workers[n]
        try:
            worker.events.publish("/0.celeryev/worker.heartbeat",
                                  heartbeat_event(worker.name, worker.owner, len(worker.runs), self.stats.ended))
        except redis.ConnectionError:
            return  # the consumer's own connection (the PINGs above) finds the broker gone and reconnects
        else:
            with self.lock:
                self.stats.celery_sent += 1
        finally:
            with self.lock:
                self.publishing -= 1

    def _lost(self, n: int) -> None:
        self.down[n] = jittered_waits(*CELERY_RECONNECT)
        self._reconnect(n)

    def _reconnect(self, n: int) -> None:
        """Celery's consumer reconnects at once, then after each jittered wait."""
        try:
            self.workers[n].celery.ping()
        except redis.ConnectionError:
            return
        self.down.pop(n, None)
        self.subscribe(n)
        self.stats.celery_reconnects.append(time.time())


def heartbeat_event(hostname: str, owner: str, active: int, processed: int) -> str:
    """A worker-heartbeat event as kombu's Redis fanout carries it (Celery's event dispatcher): what
    Flower reads, so a Flower beside the simulated fleet sees its workers."""
    now = time.time()
    body = {"hostname": hostname, "utcoffset": 0, "pid": int(owner.rsplit(":", 1)[-1]), "clock": int(now),
            "freq": 10.0, "active": active, "processed": processed, "loadavg": [0.5, 0.5, 0.5],
            "sw_ident": "py-celery", "sw_ver": "5.5.0", "sw_sys": "Linux", "timestamp": now,
            "type": "worker-heartbeat"}
    return json.dumps({
        "body": base64.b64encode(json.dumps(body).encode()).decode(), "content-encoding": "utf-8",
        "content-type": "application/json", "headers": {"hostname": hostname},
        "properties": {"delivery_mode": 1, "delivery_info": {"exchange": "celeryev", "routing_key": "worker.heartbeat"},
                       "priority": 0, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}})


class Process:
    """The workers of one process, their timers and the measured window."""

    def __init__(self, spec: Spec):
        self.spec, self.stats, self.counted = spec, Stats(), Counted()
        self.counted.install()
        settings = Settings(broker_url=spec.broker_url, store_url=spec.store_url, queue=spec.queue,
                            lease_ttl_s=spec.lease_ttl_s, reaper_interval_s=spec.reaper_interval_s)
        store, app = open_store(spec.store_url), make_celery(settings)
        per = max(1, (spec.last - spec.first) // spec.workers)
        self.workers = [SimWorker(spec, n, settings, store, app, _cycle(spec.first + n * per, per), self.stats)
                        for n in range(spec.workers)]
        self.celery = CeleryStandIn(spec, self.workers, self.stats)
        self.stop = threading.Event()
        self.window: dict[str, float] = {}

    def start(self) -> None:
        for worker in self.workers:
            worker.start()
        threading.Thread(target=self._schedule, daemon=True).start()
        threading.Thread(target=self._tick, daemon=True).start()
        threading.Thread(target=self.celery.run, args=(self.stop,), daemon=True).start()
        if self.spec.idle:
            threading.Thread(target=self._assist_polls, daemon=True).start()

    def _assist_polls(self) -> None:
        """Every idle worker's assist poll, each at its own phase of assist_poll_s."""
        period = self.spec.assist_poll_s
        now = time.monotonic()
        heap = [(now + random.uniform(0, period), n) for n in range(len(self.workers))]
        heapq.heapify(heap)
        while not self.stop.is_set():
            when, n = heap[0]
            if self.stop.wait(max(0.0, when - time.monotonic())):
                return
            heapq.heapreplace(heap, (when + period, n))
            with contextlib.suppress(redis.RedisError):
                self.workers[n].assist_poll()

    def _schedule(self) -> None:
        """Each worker's heartbeat and reaper turn at its own period and random phase, on LOOPS
        threads; a worker's next beat waits for its last (as its one heartbeat thread would)."""
        beat_s, turn_s = LeaseClock.of(self.workers[0].settings).beat_s, self.spec.reaper_interval_s
        now = time.monotonic()
        heap = [(now + random.uniform(0, beat_s), n, "beat") for n in range(len(self.workers))]
        heap += [(now + random.uniform(0, turn_s), n, "turn") for n in range(len(self.workers))]
        heapq.heapify(heap)
        busy: set[tuple[int, str]] = set()
        lock = threading.Lock()

        def run(n: int, kind: str) -> None:
            worker = self.workers[n]
            try:
                if kind == "beat":
                    worker.heartbeat.beat()
                else:
                    worker.reaper.turn(worker.owner)
            finally:
                with lock:
                    busy.discard((n, kind))

        with ThreadPoolExecutor(LOOPS) as pool:
            while not self.stop.is_set():
                when, n, kind = heap[0]
                if self.stop.wait(max(0.0, when - time.monotonic())):
                    return
                heapq.heapreplace(heap, (when + (beat_s if kind == "beat" else turn_s), n, kind))
                with lock:
                    if (n, kind) in busy:
                        continue
                    busy.add((n, kind))
                pool.submit(run, n, kind)

    def _tick(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(TICK_S):
            now = time.monotonic()
            for worker in self.workers:
                # the broker restarts: the next tick tries again, as a worker's next poll does
                with contextlib.suppress(redis.RedisError):
                    worker.tick(now - last)
            last = now

    def mark(self, edge: str) -> None:
        self.window |= {f"{edge}_t": time.time(), f"{edge}_sent": self.counted.sent,
                        f"{edge}_celery": self.stats.celery_sent, f"{edge}_cpu": time.process_time(),
                        f"{edge}_ended": self.stats.ended}

    def results(self) -> dict[str, Any]:
        w = self.window
        start, end = w.get("start_t", 0.0), w.get("end_t", time.time())
        beats = [s for x in self.workers for t, s in x.heartbeat.round_trips if start <= t <= end]
        rounds = [(t, s) for x in self.workers for t, s in x.reaper.rounds if start <= t <= end]
        window = {k: w.get(f"end_{k}", 0) - w.get(f"start_{k}", 0) for k in ("t", "sent", "celery", "cpu", "ended")}
        return {"window": window, "beats": beats, "rounds": rounds, "lost": self.stats.lost,
                "lost_at": self.stats.lost_at, "retaken": self.stats.retaken,
                "celery_reconnects": self.stats.celery_reconnects,
                "beat_times": [[t for t, _ in x.heartbeat.round_trips] for x in self.workers]}


def _cycle(first: int, count: int) -> Iterator[int]:
    while True:
        yield from range(first, first + count)


def main(argv: list[str]) -> None:
    spec = Spec(**json.loads(Path(argv[0]).read_text()))
    proc = Process(spec)
    signal.signal(signal.SIGUSR1, lambda *_: proc.mark("start"))
    signal.signal(signal.SIGUSR2, lambda *_: proc.mark("end"))
    signal.signal(signal.SIGTERM, lambda *_: proc.stop.set())
    proc.start()
    # Ready once the K chunks each worker began with have sent their Celery commands too: at K=128 and
    # 1,000 workers that backlog is ~900,000 commands, which would otherwise drain through the window
    began = time.monotonic()
    while not proc.celery.drained() and time.monotonic() - began < DRAIN_S:
        time.sleep(0.2)
    print("ready", flush=True)
    while not proc.stop.wait(0.5):
        pass
    Path(spec.out).write_text(json.dumps(proc.results()))


if __name__ == "__main__":
    main(sys.argv[1:])

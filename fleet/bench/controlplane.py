"""The control plane at a thousand GPUs (`fleet bench control-plane`): what N workers cost one
broker, run through fleet's own coordination code against one real redis-server.

For each N, simulated workers (fleet.bench.simfleet, a few hundred to a process) run K leased
chunks each at the reference job's shape: their heartbeats, reaper threads (one leader), the
middleware's calls as chunks start and end, and a stand-in for Celery's consumer sending what a
real worker was measured to send (fleet.bench.celerycost). Over a window at steady state it
reads the broker's INFO (commands, CPU) and the clients' own counts, the beats' round trips, the
leader's rounds and `fleet status` on the job. At the largest N it restarts the broker (workers
reconnect with jittered waits) and then wipes it (workers take their leases back, `fleet
enqueue`'s round rebuilds the queue from the store). The store's requests per GPU-hour come
from fleet.bench.storecost.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from fleet.bench.celerycost import CeleryCost, measure_celery, replay_mix
from fleet.bench.connections import connection_kinds
from fleet.bench.controlfigures import section
from fleet.bench.looks import Looks
from fleet.bench.overhead import percentile
from fleet.bench.procs import FLEET_ROOT, clean_env, cpu_seconds, wait_until
from fleet.bench.reference import REFERENCE
from fleet.bench.report import Section
from fleet.bench.simfleet import Spec
from fleet.bench.storecost import requests_per_gpu_hour
from fleet.coord import figures
from fleet.coord.broker import make_celery, redis_client, store_of
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.leases import Lease, add_job, run_owner, running_indexes
from fleet.coord.localredis import LocalRedis
from fleet.errors import FleetError
from fleet.monitor.status import job_status
from fleet.producer.enqueue import enqueue_missing
from fleet.settings import DEFAULT_CHUNK_SIZE, LeaseSettings, Settings
from fleet.store import open_store
from fleet.store.layout import manifest_key, result_key
from fleet.store.manifest import Manifest
from fleet.store.results import ChunkStats, encode_result

QUEUE = "controlplane"
#: `fleet status` calls timed per level
STATUS_CALLS = 3
#: simulated workers one process runs (its threads share one GIL)
WORKERS_PER_PROCESS = 200
#: the simulated workers' niceness (the broker and the probe run at 0)
SIM_NICE = 10
#: done chunks the bench writes to a level's job at most (the default K at 1,000 workers)
DONE_CAP = 16_000
#: seconds between the probe's beats: many round trips to read a p99 from in a window
PROBE_BEAT_S = 0.1


class Probe:
    """One more worker, in the driver on its own thread: fleet's client and Heartbeat with K leases,
    beating every PROBE_BEAT_S. Its round trips are what a worker on a host of its own sees of the
    broker under the fleet's load (the simulated workers' own include their crowded processes)."""

    def __init__(self, broker_url: str, k: int, ttl_s: float):
        self.r = redis_client(Settings(broker_url=broker_url))
        self.heartbeat = Heartbeat(PROBE_BEAT_S)
        for index in range(k):
            lease = Lease(self.r, "probe", index, run_owner("probe@driver:1", index), ttl_s, assist=True)
            lease.acquire()
            self.heartbeat.add(lease)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(PROBE_BEAT_S):
            self.heartbeat.beat()

    def __enter__(self) -> Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.r.close()

    def ms(self) -> dict[str, float | None]:
        took = [s for _, s in self.heartbeat.round_trips]
        return {"p50": _ms(took, 50), "p99": _ms(took, 99), "max": _ms(took, 100), "n": len(took)}


@dataclass(frozen=True)
class CPProfile:
    workers: tuple[int, ...] = (10, 100, 1000)
    #: chunks a worker runs at once: the derived default for SGLang's 256 slots and 256-record chunks
    k: int = 16
    #: more K, each at `k_workers` workers after the levels above: what a worker costs does not follow K
    more_k: tuple[int, ...] = (4, 32)
    k_workers: int = 1000
    warmup_s: float = 30.0
    window_s: float = 60.0
    #: the probe measured alone at each level: what it costs the broker is the instrument's, not the
    #: fleet's (K assist leases looked at ten times a second: 32 commands a worker at 10 workers)
    probe_alone_s: float = 10.0
    celery_s: float = 30.0
    #: how long the broker stays down in the restart, and how long the reconnections are watched
    down_s: float = 5.0
    watch_s: float = 40.0
    lease_ttl_s: float = LeaseSettings.model_fields["ttl_s"].default
    reaper_interval_s: float = LeaseSettings.model_fields["reaper_interval_s"].default
    #: the job exporter and Flower beside the largest level and each K (fleet.bench.looks): Prometheus's
    #: scrape interval, and how often a person refreshes Flower's workers page (its inspect broadcasts)
    looks: bool = True
    scrape_s: float = 15.0
    inspect_s: float = 30.0
    #: the end of a job at the largest level: idle workers' assist polls and Celery's idle consumer
    idle: bool = True


FULL = CPProfile()
#: what CI runs: every part once, each as short as still shows it (a reaper round, a scrape, a Flower refresh)
QUICK = CPProfile(workers=(10, 40), more_k=(32,), k_workers=10, warmup_s=8.0, window_s=12.0, celery_s=10.0,
                  probe_alone_s=3.0, scrape_s=4.0, inspect_s=6.0,
                  down_s=2.0, watch_s=10.0)


@dataclass(frozen=True)
class Shape:
    """The reference job's chunk as a simulated worker runs it."""

    k: int
    records: int = DEFAULT_CHUNK_SIZE

    @property
    def chunk_tokens(self) -> float:
        return self.records * REFERENCE.output_tokens

    @property
    def chunk_s(self) -> float:
        """A chunk's run: K chunks share one GPU's tokens."""
        return self.k * self.chunk_tokens / REFERENCE.tok_s_per_gpu

    @property
    def chunk_tok_s(self) -> float:
        return REFERENCE.tok_s_per_gpu / self.k


def shipped_maxclients() -> int:
    """The `maxclients` of the shipped Redis configuration (ops/redis.conf)."""
    conf = FLEET_ROOT / "ops" / "redis.conf"
    for line in conf.read_text().splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "maxclients":
            return int(words[1])
    raise FleetError(f"{conf} sets no maxclients")


class Broker:
    """The one redis-server, persistent as ops/redis.conf has it (AOF, fsync every second), with
    its connection limit."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.maxclients = shipped_maxclients()
        self.server = LocalRedis(directory, persist=True, extra_args=["--maxclients", str(self.maxclients)]).start()
        self.url = self.server.url
        self.admin = self.client()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, client_name="bench", socket_timeout=30)

    def info(self) -> dict[str, Any]:
        return {**self.admin.info("cpu"), **self.admin.info("stats"), "cmd": self.admin.info("commandstats")}

    def restart(self, down_s: float) -> float:
        """Stop (its AOF flushed), stay down, start on the same port and files; when it answered."""
        self.admin.close()
        self.server.stop()
        time.sleep(down_s)
        self.server = LocalRedis(self.dir, port=self.server.port, persist=True,
                                 extra_args=["--maxclients", str(self.maxclients)]).start()
        self.admin = self.client()
        return time.time()

    def stop(self) -> None:
        self.admin.close()
        self.server.stop()


def delta(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, float]:
    """The broker's work between two INFOs, per second."""
    cpu = (after["used_cpu_sys"] + after["used_cpu_user"] - before["used_cpu_sys"] - before["used_cpu_user"])
    calls = {k: after["cmd"][k]["calls"] - before["cmd"].get(k, {"calls": 0})["calls"] for k in after["cmd"]}
    calls = {k.removeprefix("cmdstat_"): v for k, v in calls.items() if v}
    # The bench's own INFOs are not the fleet's
    calls.pop("info", None)
    usec = {k.removeprefix("cmdstat_"): after["cmd"][k]["usec"] - before["cmd"].get(k, {"usec": 0})["usec"]
            for k in after["cmd"]}
    usec = {k: v for k, v in usec.items() if v and k != "info"}
    return {"cpu_s": cpu / seconds, "commands": sum(calls.values()) / seconds,
            "by_command": {k: round(v / seconds, 2) for k, v in sorted(calls.items(), key=lambda x: -x[1])},
            # microseconds a second each command took (a script's own commands count in it and again by name)
            "usec_by_command": {k: round(v / seconds, 1) for k, v in sorted(usec.items(), key=lambda x: -x[1])},
            "connections": after.get("total_connections_received", 0) - before.get("total_connections_received", 0),
            "refused": after.get("rejected_connections", 0) - before.get("rejected_connections", 0)}


def write_bench_job(broker: Broker, store_url: str, job: str, total: int, done: int, shape: Shape) -> Manifest:
    """A job of `total` chunks in the store, the first `done` of them committed (results, and their
    stats cached in the broker as the committing runs leave them)."""
    store = open_store(store_url)
    manifest = Manifest(job=job, input="bench", chunk_size=shape.records, chunks=total, records=total * shape.records,
                        samples=total * shape.records, config={"sampling": {}}, config_hash="bench")
    store.put(manifest_key(job), manifest.to_bytes())
    # enqueued: the store's job set holds it (idle workers' assist polls read each known job's stragglers)
    add_job(broker.admin, job, store_of(Settings(store_url=store_url)))
    now = time.time()
    with broker.admin.pipeline(transaction=False) as p:
        for index in range(done):
            stats = ChunkStats(job=job, chunk=index, records=shape.records, samples=shape.records,
                               completion_tokens=int(shape.chunk_tokens), started=now - shape.chunk_s - index * 0.1,
                               finished=now - index * 0.1, worker=f"gpu{index % 8}@done")
            store.put(result_key(job, index), encode_result(stats, []))
            figures.cache_stats(p, job, index, stats)  # type: ignore[arg-type]
        p.execute()
    return manifest


class Fleet:
    """The simulated workers' processes of one level."""

    def __init__(self, workdir: Path, specs: list[Spec]):
        self.specs, self.procs = specs, []
        env = clean_env(workdir)
        for n, spec in enumerate(specs):
            path = workdir / f"spec{n}.json"
            path.write_text(json.dumps(asdict(spec)))
            log = open(workdir / f"simfleet{n}.log", "wb")  # noqa: SIM115 - lives as long as the process
            # niced: on the broker's two cores the broker and the probe (one worker as on a host of
            # its own) get the CPU first, the thousand workers simulated beside them after
            self.procs.append(subprocess.Popen(["nice", "-n", str(SIM_NICE), sys.executable, "-m",
                                                "fleet.bench.simfleet", str(path)], env=env,
                                               stdout=subprocess.PIPE, stderr=log, cwd=workdir))

    def wait_ready(self, timeout_s: float) -> None:
        for proc in self.procs:
            line = _readline(proc, timeout_s)
            if line.strip() != b"ready":
                raise FleetError(f"a simulated fleet process did not start (exit {proc.poll()}); see its log")

    def signal(self, sig: int) -> None:
        for proc in self.procs:
            proc.send_signal(sig)

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs if p.poll() is None)

    def stop(self) -> list[dict[str, Any]]:
        self.signal(signal.SIGTERM)
        results = []
        for proc, spec in zip(self.procs, self.specs, strict=True):
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            results.append(json.loads(Path(spec.out).read_text()) if Path(spec.out).exists() else {})
        return results


def _readline(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else b""), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else b""


def specs_for(n: int, profile: CPProfile, shape: Shape, broker: Broker, store_url: str, job: str, first: int,
              total: int, celery: CeleryCost, workdir: Path, idle: bool = False) -> list[Spec]:  # fmt: skip
    procs = max(1, math.ceil(n / WORKERS_PER_PROCESS))
    span = (total - first) // procs
    specs = []
    for p in range(procs):
        workers = n // procs + (1 if p < n % procs else 0)
        specs.append(Spec(broker_url=broker.url, store_url=store_url, queue=QUEUE, job=job, host=f"sim{p}-",
                          workers=workers, k=shape.k, first=first + p * span, last=first + (p + 1) * span,
                          chunk_s=shape.chunk_s, chunk_tok_s=shape.chunk_tok_s, chunk_records=shape.records,
                          lease_ttl_s=profile.lease_ttl_s, reaper_interval_s=profile.reaper_interval_s,
                          celery_mix=replay_mix(celery, "idle" if idle else "busy"),
                          publish_bytes=int(celery.busy.publish_bytes), patterns=celery.patterns,
                          out=str(workdir / f"result{p}.json"), idle=idle,
                          assist_poll_s=Settings.model_fields["assist_poll_s"].default))
    return specs


def timed_status(store_url: str, broker: Broker, job: str) -> float:
    began = time.monotonic()
    job_status(open_store(store_url), broker.admin, job)
    return time.monotonic() - began


def status_cost(store_url: str, broker: Broker, job: str, calls: int, background_cpu_s: float) -> dict[str, Any]:
    """`fleet status` on the job, `calls` times: its wall time, and the broker CPU one costs over
    the fleet's own (`background_cpu_s` a second, the window's)."""
    before = broker.info()
    began = time.monotonic()
    took = [timed_status(store_url, broker, job) for _ in range(calls)]
    seconds = time.monotonic() - began
    spent = delta(before, broker.info(), seconds)["cpu_s"] - background_cpu_s
    return {"s": [round(t, 3) for t in took], "redis_cpu_ms": round(max(0.0, spent) * seconds * 1000 / calls, 1)}


def probe_alone(broker: Broker, k: int, ttl_s: float, seconds: float) -> dict[str, float]:
    """What the probe alone costs the broker a second (its commands are the same per beat under any
    load), subtracted from the level's figures per worker; its keys are wiped after."""
    with Probe(broker.url, k, ttl_s):
        time.sleep(1.0)  # its first beats load the scripts
        before, began = broker.info(), time.monotonic()
        time.sleep(seconds)
        alone = delta(before, broker.info(), time.monotonic() - began)
    broker.admin.flushall()
    return alone


def run_level(n: int, profile: CPProfile, shape: Shape, broker: Broker, celery: CeleryCost, workdir: Path,
              demos: bool, looks: bool = False, idle: bool = False,
              restart: bool = False) -> dict[str, Any]:
    """N simulated workers at steady state: the window's figures (and, with `demos`, a restart and a wipe;
    with `restart`, the restart alone; with `looks`, the job exporter and Flower beside them through the
    window and the restart; with `idle`, the end of a job: no chunk left to take)."""
    workdir.mkdir(parents=True, exist_ok=True)
    broker.admin.flushall()
    probe_cost = probe_alone(broker, shape.k, profile.lease_ttl_s, profile.probe_alone_s)
    store_url, job = str(workdir / "store"), f"cp{n}"
    total = 4 * n * shape.k
    # a committed result costs the store a file (~7 ms on a busy VM): past DONE_CAP the job is no bigger a look
    done = min(n * shape.k, DONE_CAP)
    manifest = write_bench_job(broker, store_url, job, total, done, shape)
    fleet = Fleet(workdir, specs_for(n, profile, shape, broker, store_url, job, done, total, celery, workdir, idle))
    out: dict[str, Any] = {"workers": n, "k": shape.k, "chunks": total, "chunks_done_before": done,
                           "probe_broker": probe_cost, "idle": idle}
    watching: Looks | None = None
    try:
        fleet.wait_ready(900)
        time.sleep(profile.warmup_s)
        if looks:
            watching = Looks(broker, store_url, QUEUE, workdir, profile.scrape_s, profile.inspect_s).__enter__()
            watching.slowlog_reset()
        with Probe(broker.url, shape.k, profile.lease_ttl_s) as probe:
            fleet.signal(signal.SIGUSR1)
            before, began, cpu0, mine0 = broker.info(), time.monotonic(), fleet.cpu(), time.process_time()
            time.sleep(profile.window_s)
            seconds = time.monotonic() - began
            after, cpu1, mine1 = broker.info(), fleet.cpu(), time.process_time()
            fleet.signal(signal.SIGUSR2)
        out["broker"] = delta(before, after, seconds)
        out["connections"] = connections_held(broker, n)
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        if watching is not None:
            out["slowlog"] = watching.slowlog()
        out["probe_ms"] = probe.ms()
        out["seconds"] = round(seconds, 1)
        out["client_cpu"] = (cpu1 - cpu0 + mine1 - mine0) / seconds
        # `fleet status` after the window, so the workers' figures above are the workers' alone
        out["status"] = status_cost(store_url, broker, job, STATUS_CALLS, out["broker"]["cpu_s"])
        if demos or restart:
            time.sleep(1)
            out["restart"] = restart_demo(broker, profile, job, n * shape.k)
        if watching is not None:
            watching.__exit__(None, None, None)
            out["looks"], watching = watching.close(), None
        if demos:
            out["wipe_at"] = time.time()
            out["wipe"] = wipe_demo(broker, profile, store_url, manifest, n * shape.k)
    finally:
        if watching is not None:
            watching.__exit__(None, None, None)
            watching.close()
        results = fleet.stop()
    return out | process_figures(results, out.get("restart", {}), out.get("wipe_at", math.inf))


def connections_held(broker: Broker, workers: int) -> dict[str, Any]:
    """The broker's connections now, by kind (fleet.bench.connections), against the shipped limit."""
    kinds = connection_kinds(broker.admin)
    held = sum(kinds.values())
    return {"held": held, "by_kind": dict(kinds), "maxclients": broker.maxclients,
            "share": round(held / broker.maxclients, 4),
            "per_worker": {k: round(v / workers, 3) for k, v in kinds.items()
                           if k in ("pool", "consumer", "subscription")}}


def restart_demo(broker: Broker, profile: CPProfile, job: str, leases: int) -> dict[str, Any]:
    """The broker restarts under the fleet: how its connections come back, and whether a lease was lost."""
    down_at = time.time()
    up_at = broker.restart(profile.down_s)
    series: list[tuple[float, int]] = []
    while time.time() - up_at < profile.watch_s:
        series.append((time.time() - up_at, int(broker.admin.info("stats")["total_connections_received"])))
        time.sleep(0.1)
    buckets = [b - a for (_, a), (_, b) in zip(series, series[1:], strict=False)]
    alive = len(running_indexes(broker.admin, job))
    refused = int(broker.admin.info("stats")["rejected_connections"])
    return {"refused": refused, "held_after": sum(connection_kinds(broker.admin).values()),
            "down_at": down_at, "up_at": up_at, "down_s": round(up_at - down_at, 2), "watched_until": time.time(),
            "connections": series[-1][1] if series else 0, "peak_per_100ms": max(buckets, default=0),
            "connections_by_s": [c for t, c in series if abs(t - round(t)) < 0.05],
            "leases_after": alive, "leases_before": leases}


def wipe_demo(broker: Broker, profile: CPProfile, store_url: str, manifest: Manifest, leases: int) -> dict[str, Any]:
    """The broker loses everything: the workers take their leases back, `fleet enqueue`'s round
    rebuilds the queue from the store, and status reads the result headers the cache lost."""
    broker.admin.flushall()
    wiped = time.monotonic()
    back = wait_until(lambda: len(running_indexes(broker.admin, manifest.job)) >= leases, 120,
                      "every lease taken back", 0.5)
    settings = Settings(broker_url=broker.url, store_url=store_url, queue=QUEUE, lease_ttl_s=profile.lease_ttl_s)
    app = make_celery(settings)
    began = time.monotonic()
    report = enqueue_missing(broker.admin, app, open_store(store_url), settings, manifest)
    enqueue_s = time.monotonic() - began
    app.close()
    status_s = timed_status(store_url, broker, manifest.job)
    return {"leases_back_s": round(back, 2), "since_wipe_s": round(time.monotonic() - wiped, 1),
            "enqueue_s": round(enqueue_s, 2), "enqueued": len(report.enqueued), "running": report.running,
            "done": report.done, "chunks": manifest.chunks, "status_after_s": round(status_s, 3)}


def process_figures(results: list[dict[str, Any]], restart: dict[str, Any], wipe_at: float = math.inf
                    ) -> dict[str, Any]:  # fmt: skip
    """The processes' own figures: commands they sent, beats, rounds, lost leases (all, and before a
    wipe, which takes every lease on purpose), reconnections."""
    window = {k: sum(r.get("window", {}).get(k, 0) for r in results) for k in ("sent", "celery", "ended")}
    seconds = max((r.get("window", {}).get("t", 0) for r in results), default=0) or 1.0
    beats = [b for r in results for b in r.get("beats", [])]
    rounds = sorted(s for r in results for _, s in r.get("rounds", []))
    out: dict[str, Any] = {
        "sent_per_s": window["sent"] / seconds, "celery_sent_per_s": window["celery"] / seconds,
        "chunk_ends_per_s": window["ended"] / seconds,
        "beat_ms": {"p50": _ms(beats, 50), "p99": _ms(beats, 99), "max": _ms(beats, 100), "n": len(beats)},
        "round_s": {"p50": percentile(rounds, 50) if rounds else None, "max": max(rounds, default=None),
                    "n": len(rounds)},
        "lost": sum(r.get("lost", 0) for r in results), "retaken": sum(r.get("retaken", 0) for r in results),
        "lost_before_wipe": sum(1 for r in results for t in r.get("lost_at", []) if t < wipe_at),
    }
    if restart:
        up_at = restart["up_at"]
        out["lost_in_restart"] = sum(1 for r in results for t in r.get("lost_at", [])
                                     if restart["down_at"] <= t <= restart["watched_until"])
        firsts = [min((t for t in times if t > up_at), default=math.inf) - up_at
                  for r in results for times in r.get("beat_times", [])]
        celery = sorted(t - up_at for r in results for t in r.get("celery_reconnects", []) if t > up_at)
        back = sorted(f for f in firsts if math.isfinite(f))
        out["reconnect"] = {"workers": len(firsts), "beat_back": len(back), "celery_back": len(celery),
                            "fleet_s": _spread(back), "celery_s": _spread(celery)}
    return out


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 2) if values else None


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"p5": round(percentile(values, 5), 2), "p50": round(percentile(values, 50), 2),
            "p95": round(percentile(values, 95), 2), "max": round(max(values), 2)}


def measure_levels(profile: CPProfile, workdir: Path, log: Any = print) -> dict[str, Any]:
    """Celery's own cost, then every level; the restart and the wipe at the largest."""
    shape = Shape(profile.k)
    log(f"control plane: Celery's consumer measured from a real worker ({profile.celery_s:.0f}s idle, busy)")
    celery = measure_celery(workdir / "celery", profile.celery_s)
    broker = Broker(workdir / "broker")
    levels = []
    try:
        largest = max(profile.workers)
        for n in profile.workers:
            log(f"control plane: {n} simulated workers x K={shape.k}" + (", job-metrics and Flower beside"
                                                                          if profile.looks and n == largest else ""))
            levels.append(run_level(n, profile, shape, broker, celery, workdir / f"n{n}",
                                    demos=n == largest, looks=profile.looks and n == largest))
        idle = None
        if profile.idle:
            log(f"control plane: {largest} simulated workers idle at a job's end (assist polls, Celery idle)")
            idle = run_level(largest, profile, shape, broker, celery, workdir / f"n{largest}idle", demos=False,
                             idle=True)
        by_k = []
        at = min(profile.k_workers, largest)
        for k in profile.more_k:
            log(f"control plane: {at} simulated workers x K={k}, the broker restarted after the window")
            by_k.append(run_level(at, profile, Shape(k), broker, celery, workdir / f"n{at}k{k}", demos=False,
                                  looks=profile.looks, restart=True))
    finally:
        broker.stop()
    return {"shape": {"k": shape.k, "records": shape.records, "chunk_s": round(shape.chunk_s, 1),
                      "chunk_tok_s": round(shape.chunk_tok_s, 1)},
            "celery": celery.to_json(), "levels": levels, "by_k": by_k, "idle": idle, "machine_cpus": os.cpu_count(),
            "load_average": os.getloadavg()}


def measure_control_plane(profile: CPProfile, workdir: Path, log: Any = print) -> Section:
    """Every level, the demos, and the store's requests per GPU-hour at the reference shape."""
    data = measure_levels(profile, workdir, log)
    log("control plane: store requests per GPU-hour, counted through a worker's middleware")
    interval = Settings.model_fields["checkpoint_interval_s"].default
    data["store"] = requests_per_gpu_hour(workdir / "store-cost", profile.k, DEFAULT_CHUNK_SIZE, interval)
    data["profile"] = asdict(profile)
    return section(data)

"""Start and supervise worker processes: one per GPU or group of GPUs (pinned) or N for CPU engines.

An engine crash kills its worker process (SGLang sends SIGQUIT to its host), so the
launcher restarts dead workers with backoff and logs why they died. Before it starts a
successor it ends every process the dead worker left that the parent-death signal
(fleet.worker.supervisor.parent) did not end: a program a subprocess exec'd, a double fork
(fleet.worker.supervisor.proctree). SIGTERM to the launcher stops every worker gracefully and
leaves none of their processes; a launcher killed outright takes its workers with it
(fleet.worker.supervisor.parent).

A worker that dies while its launcher lives died on its own (a crash, an OOM kill, a kill of it
alone): the launcher records how, at once, as its witness (fleet.coord.witness). Only such a death
counts against the chunks the worker ran; one no launcher saw is a lost host.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from fleet.coord import witness
from fleet.engines.specs import spec_for
from fleet.model.gpus import gpu_groups, pin_env
from fleet.settings import Settings
from fleet.worker.supervisor import proctree
from fleet.worker.supervisor.parent import LAUNCHER_PID_ENV

log = logging.getLogger(__name__)
BACKOFF_MAX_S = 60.0
HEALTHY_AFTER_S = 60.0
#: the most a witness's write holds the launcher's poll when the broker does not answer
WITNESS_TIMEOUT_S = 2.0
#: seconds between two looks at the workers (a dead one restarted); a signal wakes the launcher at once
POLL_S = 0.5


@dataclass
class WorkerSpec:
    name: str
    env: dict[str, str] = field(default_factory=dict)


def plan_workers(
    settings: Settings, workers: int | None, gpus: list[int] | None, host: str | None = None, per_worker: int = 1
) -> list[WorkerSpec]:
    """One worker per GPU, or per group of `per_worker` GPUs (named by its GPUs: gpu0+1@host), or
    `workers` CPU workers."""
    host = host or socket.gethostname()
    if gpus:
        specs = [WorkerSpec(f"gpu{'+'.join(map(str, group))}@{host}", pin_env(group))
                 for group in gpu_groups(gpus, per_worker)]
    else:
        specs = cpu_workers(settings, 1 if workers is None else workers, host)
    if settings.monitor.metrics_port:  # one Prometheus port per worker process
        for n, spec in enumerate(specs):
            spec.env["FLEET_MONITOR__METRICS_PORT"] = str(settings.monitor.metrics_port + n)
    return specs


def cpu_workers(settings: Settings, count: int, host: str) -> list[WorkerSpec]:
    # CPU workers share the cores: torch's default of one thread per core in every
    # process oversubscribes them and runs dozens of times slower.
    threads = str(spec_for(settings).cpu_threads(settings) or max(1, (os.cpu_count() or 1) // count))
    cpu_env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}
    return [WorkerSpec(f"cpu{i}@{host}", dict(cpu_env)) for i in range(count)]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class _Child:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    #: TREE_ENV of the process last started: what it starts carries it
    tag: str = ""


class Supervisor:
    def __init__(self, settings: Settings, specs: list[WorkerSpec], log_dir: Path | None = None,
                 concurrency: int | None = None, restart: bool = True):
        # S (hence K) from what the engine can really run on this host's GPUs (fleet.model.capacity).
        self.settings = settings = spec_for(settings).planned(settings)
        self.children = [_Child(s) for s in specs]
        self.log_dir = log_dir
        self.concurrency = concurrency or settings.resolved_slots()
        self.restart = restart
        self.stopping = False
        #: worker pids sent SIGTERM already: each gets one (a second would restart its notice's clock)
        self.termed: set[int] = set()
        self.spawned = 0
        #: the fleet whose orphans this launcher ends: its data directory's
        self.scope = proctree.scope_of(settings.data_dir)

    def _spawn(self, child: _Child) -> None:
        self.spawned += 1
        child.tag = proctree.make_tag(os.getpid(), self.spawned, self.scope)
        env = {**os.environ, **self.settings.to_env(), **child.spec.env, "PYTHONUNBUFFERED": "1",
               LAUNCHER_PID_ENV: str(os.getpid()), proctree.TREE_ENV: child.tag}
        argv = [sys.executable, "-m", "fleet.worker.main", "--name", child.spec.name,
                "--concurrency", str(self.concurrency)]
        out = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{child.spec.name.split('@')[0]}.log", "ab")  # noqa: SIM115
        # A session of its own: what the worker starts is found by session too, and a terminal's
        # Ctrl-C reaches the launcher alone, which stops the workers in order.
        child.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                      start_new_session=True)
        if out:
            out.close()
        child.started = time.monotonic()
        log.info("started worker %s (pid %d, %d slots)", child.spec.name, child.proc.pid, self.concurrency)

    def start(self) -> None:
        if not proctree.become_subreaper():
            log.warning("no PR_SET_CHILD_SUBREAPER: orphans of a dead worker are found, not adopted")
        if left := proctree.orphaned_trees(self.scope):
            proctree.kill_tree(left)
            log.warning("ended %d process(es) %s left by workers of a launcher that is gone", len(left), left)
        for child in self.children:
            if self.stopping:  # a SIGTERM while starting: the workers not started yet never start
                break
            self._spawn(child)

    def poll(self) -> None:
        """Restart dead workers with exponential backoff; call this periodically."""
        now = time.monotonic()
        # Orphans that exit by themselves (SGLang's, on their PR_SET_PDEATHSIG) come back to us as zombies.
        proctree.reap_orphans(keep=self._pids())
        dead: list[tuple[_Child, int]] = []
        for child in self.children:
            if child.proc is None:
                if now >= child.next_start and not self.stopping:
                    self._spawn(child)
                continue
            code = child.proc.poll()
            if code is None or self.stopping:
                continue
            dead.append((child, code))
        for child, code in dead:  # every one before any tree is ended: the reaper waits only seconds for it
            self._witness(f"{child.spec.name}:{child.proc.pid if child.proc else 0}", code)
        for child, code in dead:
            ran = now - child.started
            self._end_tree(child)  # before its successor can start: it would meet them on the GPU
            if ran > HEALTHY_AFTER_S:
                child.restarts = 0
            delay = min(BACKOFF_MAX_S, 2.0 ** child.restarts) if child.restarts else 0.5
            log.warning("worker %s %s after %.0fs; restarting in %.1fs",
                        child.spec.name, describe_exit(code), ran, delay)
            child.restarts += 1
            child.proc = None
            child.next_start = now + delay if self.restart else float("inf")

    def _witness(self, owner: str, code: int) -> None:
        """Record that the worker process `owner` (`name:pid`, its name in its leases' evidence) died on
        its own, and how: the launcher outlived it and did not stop it. Never raises: a broker that does
        not answer costs the evidence, not the launcher."""
        if not self.settings.broker_url:
            return
        # A connection for the note alone: a death is rare, and one kept open would be idle for the
        # launcher's whole life (the broker's `maxclients` counts it: fleet.coord.pool)
        broker = redis.Redis.from_url(self.settings.broker_url, socket_timeout=WITNESS_TIMEOUT_S,
                                      socket_connect_timeout=WITNESS_TIMEOUT_S)
        try:
            witness.note_witnessed(broker, owner, f"its launcher saw it {describe_exit(code)}")
        except redis.RedisError as e:
            log.warning("could not record how worker %s died (%s): its chunks will count it as a lost host",
                        owner, e)
        finally:
            broker.close()

    def _pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.proc is not None]

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM every worker (warm shutdown), SIGKILL what outlives grace (or a known notice) + timeout."""
        self.term()
        waits = max(self.settings.grace_s, self.settings.notice_s or 0.0)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else waits + 30)
        for proc in self.alive():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d ignored SIGTERM: killing", proc.pid)
                proc.kill()
                proc.wait()
        for child in self.children:
            self._end_tree(child)

    def _end_tree(self, child: _Child) -> None:
        """End every process the child's worker left: what carries its tag or stayed in its
        session, wherever it was reparented. Looks again after each kill: a process may fork
        while the tree is ended."""
        if not child.tag or child.proc is None:
            return
        began, ended = time.monotonic(), []
        for _ in range(3):
            left = proctree.tree_of(child.tag, session=child.proc.pid)
            if not left:
                break
            ended += proctree.kill_tree(left)
        proctree.reap_orphans(keep=self._pids())
        if ended:
            log.warning("worker %s left %d process(es) %s: ended in %.2fs", child.spec.name, len(ended),
                        sorted(set(ended)), time.monotonic() - began)

    def term(self) -> None:
        """SIGTERM to every worker not sent one yet; none is started after it."""
        self.stopping = True
        for proc in self.alive():
            if proc.pid not in self.termed:
                self.termed.add(proc.pid)
                proc.send_signal(signal.SIGTERM)

    def run_forever(self) -> None:
        """Supervise until SIGTERM/SIGINT, then stop the workers gracefully. The SIGTERM is passed on
        in the handler itself, not at the next poll: a known notice (`notice_s`) counts from the
        worker's own SIGTERM, and a cloud's SIGKILL from the launcher's, so every moment the launcher
        held it would be taken from the worker's generation or its last flush. The handler takes no
        lock (a threading.Event's would deadlock against the main thread's own wait on it, which the
        signal interrupts): it reads and sets a plain flag, and the loop sleeps."""

        def handler(signum: int, _frame: object) -> None:
            if not self.stopping:  # a second signal finds every worker sent its SIGTERM
                self.term()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        self.start()
        while not self.stopping:
            self.poll()
            time.sleep(POLL_S)
        log.info("stopping %d worker(s)", len(self.alive()))
        self.stop()

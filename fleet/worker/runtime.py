"""What one worker process holds for its whole life: the context, the engine, the
executors, and the background threads (heartbeat, reaper, assister, the spool's drain), and
what it does when its engine hangs.

Built once when the Celery worker starts (before it consumes), torn down at shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import redis
from celery import Celery

from fleet import metrics
from fleet.coord import suspects
from fleet.coord.broker import redis_client
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.enginestarts import gpus_of, note_engine_start
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.mismatch import clear_mismatch
from fleet.coord.recovery import Reaper
from fleet.coord.retry import RetryPolicy
from fleet.engines.identity import engine_identity, identity_hash
from fleet.engines.specs import build_engine
from fleet.settings import Settings
from fleet.store import store_for
from fleet.store.counted import CountedStore
from fleet.worker.process.assist import Assister
from fleet.worker.process.context import ManifestCache, WorkerContext
from fleet.worker.process.enginehost import EngineHost, take_early
from fleet.worker.process.notice import generate_for
from fleet.worker.process.spool import Spool
from fleet.worker.process.startclock import CLOCK
from fleet.worker.process.storewriter import StoreWriter, outage_reporter
from fleet.worker.process.watchdog import Watchdog
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.executor import Executor
from fleet.worker.run.middleware import assist_stack, owner_stack
from fleet.worker.run.outcome import Committed, Failed, HandedBack, Outcome, Skipped, Superseded
from fleet.worker.run.task import ChunkTask, poll_s_of
from fleet.worker.supervisor.proctree import descendants, kill_tree

log = logging.getLogger(__name__)

#: seconds a stalled worker has to hand its chunks back and exit before it exits outright
STALL_EXIT_S = 30.0
#: its exit status then (EX_SOFTWARE): the launcher restarts it like any death
STALL_EXIT_CODE = 70
#: seconds a stalled worker waits for its chunks to be handed back before it kills its engine
STALL_HAND_BACK_S = 10.0
#: beyond grace_s, how long a stopping process waits for its assist copy's hand-back (a poll and a flush)
ASSIST_JOIN_S = 10.0


class Runtime:
    def __init__(self, settings: Settings, app: Celery, name: str):
        self.settings = settings
        self.name = name
        # The engine the main module started early (fleet.worker.main) is ready before this thread reads the
        # model (engine_identity loads its tokenizer): a model library imported by two threads at once can fail,
        # as transformers' lazy module did ("cannot import name 'AutoTokenizer'").
        early = take_early()
        if early is not None:
            early.start()
        # every request the process makes of its store is counted (fleet_store_requests)
        store, r = CountedStore(store_for(settings)), redis_client(settings)
        identity = engine_identity(settings)
        spool = Spool(settings.data_dir / "spool" / name.replace("/", "_"), settings.spool.max_mb * 2**20) \
            if settings.spool.max_mb else None
        writer = StoreWriter(store, spool, outage_reporter(r, name))
        self.ctx = WorkerContext(
            settings=settings, store=store, redis=r, heartbeat=Heartbeat.of(settings), name=name,
            owner=f"{name}:{os.getpid()}", queue=ChunkQueue.of(app, settings, r),
            policy=RetryPolicy.from_settings(settings), manifests=ManifestCache(store), restart=self.restart,
            identity=identity, identity_hash=identity_hash(identity), writer=writer,
        )
        self.app = app
        self.host = early or EngineHost(build_engine(settings))
        self.engine = self.host.engine
        self.task = ChunkTask(store, self.host, writer, self.ctx.bell, poll_s_of(settings))
        self.owner = Executor(owner_stack(self.ctx))
        self.assister = Executor(assist_stack(self.ctx))
        #: chunks this process runs now (Celery slots and assists)
        self.active: set[ChunkRun] = set()
        self.assist = Assister(self.ctx, self.engine.max_running, self.inflight,
                               lambda job, index: self.run_chunk(job, index, assist=True))
        self._stop = threading.Event()
        self.watchdog = Watchdog(self.host.clock, settings.stall_s, self.stalled)

    def start(self) -> None:
        began = time.monotonic()
        self.host.start()
        since_birth = CLOCK.engine_ready()
        log.info("worker %s: %s engine ready in %.1fs, %.1fs after the process started", self.name,
                 self.engine.name, time.monotonic() - began, since_birth)
        try:  # what this start cost the fleet, for `fleet status`; the broker may be restarting
            note_engine_start(self.ctx.redis, since_birth, gpus_of(os.environ.get("CUDA_VISIBLE_DEVICES")))
        except redis.RedisError as e:
            log.warning("could not record the engine start: %s", e)
        self.ctx.heartbeat.start()
        # What an earlier process of this name could not run (another store, other engine settings)
        # is this one's to find again: `fleet status` names only what is still so.
        with contextlib.suppress(redis.RedisError):  # the broker may be restarting: the gates record again
            clear_mismatch(self.ctx.redis, self.name)
        self.watchdog.start()  # only now: loading weights or capturing graphs is never a stall
        threading.Thread(target=self._reaper, name="fleet-reaper", daemon=True).start()
        self.ctx.writer.start_drain(self.name, self._stop)
        if self.settings.assist:
            self.assist.start(self._stop)
        metrics.set_worker_info(self.name, gpu=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                                engine=self.engine.name, model=self.engine.model_name() or "")
        metrics.set_price(self.settings.monitor.usd_per_gpu_hour)
        port = metrics.start_metrics_server(self.settings.monitor.metrics_port)
        log.info("worker %s: CUDA_VISIBLE_DEVICES=%r, metrics %s", self.name,
                 os.environ.get("CUDA_VISIBLE_DEVICES"), f"on :{port}" if port else "off")

    def run_chunk(self, job: str, index: int, attempt: int = 1, assist: bool = False) -> dict[str, Any]:
        run = ChunkRun(job=job, index=index, attempt=attempt, worker=self.name, assist=assist)
        self.active.add(run)
        try:
            outcome = (self.assister if assist else self.owner).execute(run, self.task)
        finally:
            self.active.discard(run)
        log_outcome(run, outcome)
        return {
            "job": job, "index": index, "committed": isinstance(outcome, Committed),
            "outcome": type(outcome).__name__.lower(),
            "error": f"{type(outcome.cause).__name__}: {outcome.cause}" if isinstance(outcome, Failed) else None,
        }

    def inflight(self) -> int:
        """Requests this worker's engine runs or queues now."""
        return sum(run.inflight for run in list(self.active))

    def _reaper(self) -> None:
        reaper = Reaper(self.ctx.redis, self.ctx.store, self.app, self.settings, self.ctx.manifests.chunks)
        reaper.run(self.ctx.owner, self._stop)

    def begin_shutdown(self) -> None:
        """SIGTERM, a hand-over: Celery stops consuming; every running chunk flushes its samples'
        ids at once (a SIGKILL that follows loses nothing), samples about to finish get `grace_s`,
        then the chunks are handed back with what they made, for the next worker to continue."""
        notice = self.settings.notice_s
        if self.ctx.draining.is_set():  # a second SIGTERM (a host's shutdown and the launcher's both send one)
            log.info("worker %s: SIGTERM again; the first one's hand-over goes on", self.name)
            return
        self.ctx.drain_clock.begin()
        runs = len(self.active)
        self.ctx.draining.set()
        if notice is None:
            log.info("worker %s stopping: flushing running samples, handing chunks back in %.1fs", self.name,
                     self.settings.grace_s)
            timer = threading.Timer(self.settings.grace_s, self.ctx.stopping.set)
            timer.daemon = True
            timer.start()
            return
        threading.Thread(target=self._use_notice, args=(notice, runs, time.monotonic()), name="fleet-notice",
                         daemon=True).start()

    def _use_notice(self, notice_s: float, runs: int, term: float) -> None:
        """A known notice (fleet.worker.process.notice): generate on until the last moment that leaves
        room for the hand-over this host's flush just took, then hand over."""
        flush_s = self.ctx.drain_clock.wait(runs, notice_s / 2)
        left = generate_for(notice_s, time.monotonic() - term, flush_s)
        log.info("worker %s stopping with %.1fs of notice: %d running chunk(s) flushed in %s; generating for %.1fs "
                 "more, then handing them back", self.name, notice_s, runs,
                 "more than half the notice" if flush_s is None else f"{flush_s:.2f}s", left)
        self.ctx.stopping.wait(left)
        self.ctx.stopping.set()
        stop, end = time.monotonic(), term + notice_s
        self._until_handed_back(end, step_s=0.005)
        now = time.monotonic()
        log.info("worker %s: %s %.3fs after the stop, %.3fs before the notice's end", self.name,
                 "still handing back" if self.active else "handed back", now - stop, end - now)

    def stalled(self, seconds: float) -> None:
        """The engine made no token for `seconds` while requests ran: it is hung. Hand every chunk
        back at once (the stop gate; no attempt spent, their ids flushed by the checkpoint
        middleware), count it against this worker, kill whatever the engine started, restart."""
        log.critical("worker %s: engine made no token for %.0fs with %d requests running: declaring it hung, "
                     "handing its chunks back and restarting", self.name, seconds, self.host.clock.running)
        metrics.ENGINE_STALLED.set(1)
        self.ctx.draining.set()
        self.ctx.stopping.set()
        try:
            stalls = suspects.note_stall(self.ctx.redis, self.ctx.owner, seconds)
            log.critical("worker %s: %d stall(s) since it last committed", self.name, stalls)
        except Exception as e:
            log.warning("could not record the stall: %s", e)
        threading.Thread(target=self._end_engine, name="fleet-stall-kill", daemon=True).start()
        # The hand-back takes a poll (the bell's, at once) and a flush; a process that cannot exit after that
        # (a thread stuck inside the engine) is ended outright, and its launcher starts a fresh one.
        threading.Timer(STALL_EXIT_S, os._exit, args=(STALL_EXIT_CODE,)).start()
        self.restart("engine stalled")

    def _end_engine(self) -> None:
        """Kill what the hung engine started, once its chunks are handed back: vLLM's client notices
        its EngineCore's death at once (its monitor thread) and fails every open stream with
        EngineDeadError, which would fail the chunks as an engine death (suspects, a second death)
        before the stop gate's poll (the bell's) hands them back. A hung engine's processes (vLLM's EngineCore, SGLang's
        scheduler) may ignore everything but SIGKILL; whatever runs in this process ends with it."""
        self._until_handed_back(time.monotonic() + STALL_HAND_BACK_S, step_s=0.05)
        kill_tree(descendants(os.getpid()))

    def _until_handed_back(self, deadline: float, step_s: float) -> None:
        """Wait until no chunk runs here (each handed back, with its last flush) or the monotonic deadline."""
        while self.active and time.monotonic() < deadline:
            time.sleep(step_s)

    def restart(self, why: str) -> None:
        """The engine is gone: stop this process so its supervisor starts a fresh one."""
        log.critical("%s: shutting down worker %s for restart", why, self.name)
        self.ctx.stopping.set()
        os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        self._stop.set()
        # Celery waited for its own tasks; an assist copy runs outside its pool: its hand-back (a poll
        # and a flush; at grace_s after a SIGTERM, at once on any other way out) ends it before the engine goes
        self.ctx.stopping.set()
        if not self.assist.join(self.settings.grace_s + ASSIST_JOIN_S):
            log.warning("worker %s: its assist copy did not end in time; exiting without it", self.name)
        self.watchdog.stop()
        self.ctx.heartbeat.stop()
        try:
            self.host.stop()
        except Exception as e:
            log.warning("engine shutdown: %s", e)
        self.ctx.redis.close()


def log_outcome(run: ChunkRun, outcome: Outcome) -> None:
    """One log line per run, at the level its outcome deserves. An owner's failure is logged where the
    retry policy decides it (fleet.worker.run.middleware.retry), with the decision: what it spent."""
    if isinstance(outcome, Failed) and run.assist:
        log.warning("chunk %s assist failed: %s: %s (its owner's run goes on)", run.name,
                    type(outcome.cause).__name__, outcome.cause)
    elif isinstance(outcome, HandedBack):
        log.info("chunk %s handed back: %s, with %d samples checkpointed", run.name, outcome.reason, len(run.finished))
    elif isinstance(outcome, Superseded | Skipped):
        log.info("chunk %s %s: %s", run.name, type(outcome).__name__.lower(), outcome.reason)

"""What one worker process holds for its whole life: settings, store, Redis, the engine.

Built once when the Celery worker starts (before it consumes), torn down at shutdown.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from celery import Celery

from fleet import keys, metrics
from fleet.broker import redis_client
from fleet.engines import build_engine
from fleet.errors import EngineError
from fleet.leases import Heartbeat
from fleet.manifest import Manifest, require_manifest
from fleet.producer.enqueue import store_for
from fleet.recovery import StallWatch, requeue_expired
from fleet.settings import Settings
from fleet.worker.chunk import ChunkRun
from fleet.worker.enginehost import EngineHost
from fleet.worker.hooks import (
    AssistHook,
    CheckpointHook,
    Hooks,
    LeaseHook,
    MetricsHook,
    OutcomeHook,
    ProgressHook,
    StatsHook,
)

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, settings: Settings, app: Celery, name: str):
        self.settings = settings
        self.app = app
        self.name = name
        #: unique per process: a restarted worker with the same name is another owner
        self.lease_owner = f"{name}:{os.getpid()}"
        self.store = store_for(settings)
        self.redis = redis_client(settings)
        self.engine = build_engine(settings)
        self.host = EngineHost(self.engine)
        self.heartbeat = Heartbeat(settings.heartbeat_s)
        # Order matters: after() runs in reverse, so the lease is released before the
        # outcome hook requeues, and a requeued message never meets our own live lease.
        self.hooks = Hooks([OutcomeHook(self), LeaseHook(self), CheckpointHook(self), ProgressHook(self),
                            StatsHook(self), MetricsHook()])
        self.assist_hooks = Hooks([AssistHook(self), CheckpointHook(self), ProgressHook(self), StatsHook(self),
                                   MetricsHook()])
        #: chunks this process runs now (Celery slots and assists)
        self.active: set[ChunkRun] = set()
        self._assisting = threading.Event()
        self._assisted: set[tuple[str, int]] = set()
        self.release_now = threading.Event()
        self._stop = threading.Event()
        self._manifests: dict[str, Manifest] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        began = time.monotonic()
        self.host.start()
        log.info("worker %s: %s engine ready in %.1fs", self.name, self.engine.name, time.monotonic() - began)
        self.heartbeat.start()
        threading.Thread(target=self._reaper, name="fleet-reaper", daemon=True).start()
        if self.settings.assist:
            threading.Thread(target=self._assister, name="fleet-assist", daemon=True).start()
        metrics.set_worker_info(self.name, gpu=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                                engine=self.engine.name, model=self.engine.model_name() or "")
        metrics.set_capacity(self.engine.max_running, self.settings.usd_per_gpu_hour)
        port = metrics.start_metrics_server(self.settings.metrics_port)
        log.info("worker %s: CUDA_VISIBLE_DEVICES=%r, metrics %s", self.name,
                 os.environ.get("CUDA_VISIBLE_DEVICES"), f"on :{port}" if port else "off")

    def inflight(self) -> int:
        """Requests this worker's engine runs or queues now."""
        return sum(run.inflight for run in list(self.active))

    def _assister(self) -> None:
        """Once the queue is empty and the engine has room, help the most lagging chunk."""
        interval = self.settings.assist_poll_s
        while not self._stop.wait(interval):
            try:
                metrics.RUNNING_REQUESTS.set(self.inflight())
                if self._assisting.is_set() or self.release_now.is_set():
                    continue
                if self.inflight() >= self.engine.max_running:
                    continue
                if any(self.redis.llen(q) for q in keys.queue_lists(self.settings.queue)):
                    continue
                target = self._straggler()
                if target is not None:
                    self._assisting.set()
                    threading.Thread(target=self._assist, args=target, name="fleet-assist-run", daemon=True).start()
            except Exception as e:
                log.warning("assist check failed: %s", e)

    def _straggler(self) -> tuple[str, int] | None:
        """The running chunk of another worker with the most unstarted samples."""
        best: tuple[int, str, int] | None = None
        for raw in self.redis.smembers(keys.jobs()):
            job = raw.decode()
            for index_raw, unstarted_raw in self.redis.hgetall(keys.progress(job)).items():
                index, unstarted = int(index_raw), int(unstarted_raw)
                if unstarted <= 0 or (best and unstarted <= best[0]):
                    continue
                if (job, index) in self._assisted:
                    continue
                owner = self.redis.get(keys.lease(job, index))
                if owner is None or owner.decode() == self.lease_owner or self.redis.exists(keys.assist(job, index)):
                    continue
                best = (unstarted, job, index)
        return (best[1], best[2]) if best else None

    def _assist(self, job: str, index: int) -> None:
        from fleet.worker.task import run_chunk

        self._assisted.add((job, index))
        try:
            log.info("queue empty: assisting straggler chunk %s/%d", job, index)
            run_chunk(self, job, index, assist=True)
        finally:
            self._assisting.clear()

    def manifest(self, job: str) -> Manifest:
        with self._lock:
            if job not in self._manifests:
                self._manifests[job] = require_manifest(self.store, job)
            return self._manifests[job]

    def _reaper(self) -> None:
        stall = StallWatch()
        while not self._stop.wait(self.settings.reaper_interval_s):
            try:
                requeue_expired(self.redis, self.store, self.app, self.settings)
                for raw in self.redis.smembers(keys.jobs()):
                    job = raw.decode()
                    if job not in stall.finished:
                        stall.check(self.redis, self.store, self.app, self.settings, job, self.manifest(job).chunks)
            except Exception as e:  # the broker may be restarting; try again next round
                log.warning("recovery check failed: %s", e)

    def begin_shutdown(self) -> None:
        """SIGTERM: Celery stops consuming; after the grace period, hand running chunks back."""
        timer = threading.Timer(self.settings.grace_s, self.release_now.set)
        timer.daemon = True
        timer.start()

    def engine_failed(self, exc: EngineError) -> None:
        """The engine is gone: stop this process so its supervisor starts a fresh one."""
        log.critical("engine failed (%s): shutting down worker %s for restart", exc, self.name)
        self.release_now.set()
        os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        self._stop.set()
        self.heartbeat.stop()
        try:
            self.host.stop()
        except Exception as e:
            log.warning("engine shutdown: %s", e)
        self.redis.close()

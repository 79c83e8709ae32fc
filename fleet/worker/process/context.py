"""What every middleware and the task may use, fixed for a worker process's life.

Frozen: a middleware reads the worker's parts here and keeps its per-run state in its
own typed state object (held by the executor), never on the context or the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.retry import RetryPolicy
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.manifest import Manifest, load_manifest
from fleet.store.options import OptionsCache
from fleet.worker.process.bell import Bell, RingingEvent
from fleet.worker.process.notice import DrainClock
from fleet.worker.process.runslots import RunSlots
from fleet.worker.process.storewriter import StoreWriter

#: seconds a worker trusts its copy of a job's manifest before reading it again
MANIFEST_MAX_AGE_S = 30.0


class ManifestCache:
    """Manifests by job; a missing one is not cached, so a job enqueued later is seen."""

    def __init__(self, store: Store, max_age_s: float = MANIFEST_MAX_AGE_S):
        self.store = store
        self.max_age_s = max_age_s
        self._manifests: dict[str, tuple[float, Manifest]] = {}
        self._lock = threading.Lock()

    def get(self, job: str) -> Manifest | None:
        """Re-read after `max_age_s`: a job deleted and enqueued again under its name (another
        configuration hash) must not run with the old manifest for the worker's whole life."""
        now = time.monotonic()
        with self._lock:
            cached = self._manifests.get(job)
            if cached is None or now - cached[0] >= self.max_age_s:
                found = load_manifest(self.store, job)
                if found is None:
                    self._manifests.pop(job, None)
                    return None
                self._manifests[job] = (now, found)
            return self._manifests[job][1]

    def chunks(self, job: str) -> int | None:
        manifest = self.get(job)
        return manifest.chunks if manifest else None


class OwnedRuns:
    """The chunks this process runs as their owner, one run each. A second delivery of one it
    runs (a requeue after its lease ran out in a broker pause, a message Celery restored) must
    not start a second copy beside it: the lease cannot tell, the first run may be retaking it."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def claim(self, job: str, index: int, serial: int) -> bool:
        """Claim the chunk for run `serial`; False while another run of this process has it."""
        with self._lock:
            return self._runs.setdefault((job, index), serial) == serial

    def release(self, job: str, index: int, serial: int) -> None:
        with self._lock:
            if self._runs.get((job, index)) == serial:
                del self._runs[(job, index)]


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    store: Store
    redis: redis.Redis
    heartbeat: Heartbeat
    #: Celery node name, e.g. gpu0@host
    name: str
    #: this process, `name:pid`: a restarted worker with the same name is another process. Crash
    #: evidence names processes; a lease names a run of one (fleet.coord.leases.run_owner)
    owner: str
    queue: ChunkQueue
    policy: RetryPolicy
    manifests: ManifestCache
    #: what this worker's engine is (fleet.engines.identity): compared with each job's, stamped on checkpoints
    identity: dict[str, Any] = field(default_factory=dict)
    identity_hash: str = ""
    #: wakes the runs waiting on the engine when `stopping` or `draining` is set (fleet.worker.process.bell)
    bell: Bell = field(default_factory=Bell)
    #: set when running chunks must be handed back (grace period over, or the engine died); rings the bell
    stopping: threading.Event = None  # type: ignore[assignment]  # set in __post_init__, on the bell
    #: set on SIGTERM: every running chunk flushes its samples' ids at once (this host is going away)
    draining: threading.Event = None  # type: ignore[assignment]  # set in __post_init__, on the bell
    #: times the flush every running chunk makes on SIGTERM: the hand-over a known notice leaves room for
    drain_clock: DrainClock = field(default_factory=DrainClock)
    #: stops the process for its supervisor to restart it (the engine is gone)
    restart: Callable[[str], None] = lambda why: None
    #: which chunks this process runs now, and whether one runs alone (process-wide, both stacks)
    run_slots: RunSlots = field(default_factory=RunSlots)
    #: results and checkpoints to the store, spooled on this worker's disk while it refuses them
    writer: StoreWriter = None  # type: ignore[assignment]  # set in __post_init__ from the store
    #: the chunks this process runs as their owner, one run each
    owned: OwnedRuns = field(default_factory=OwnedRuns)
    #: each job's options (fleet.store.options), re-read every few seconds: its retry policy and priority
    options: OptionsCache = None  # type: ignore[assignment]  # set in __post_init__ from the store

    def __post_init__(self) -> None:
        for flag in ("stopping", "draining"):
            if getattr(self, flag) is None:
                object.__setattr__(self, flag, RingingEvent(self.bell))
        if self.writer is None:
            object.__setattr__(self, "writer", StoreWriter(self.store))
        if self.options is None:
            object.__setattr__(self, "options", OptionsCache(self.store))

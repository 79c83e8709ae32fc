"""What every middleware and the task may use, fixed for a worker process's life.

Frozen: a middleware reads the worker's parts here and keeps its per-run state in its
own typed state object (held by the executor), never on the context or the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from fleet.chunkqueue import ChunkQueue
from fleet.leases import Heartbeat
from fleet.manifest import Manifest, load_manifest
from fleet.retry import RetryPolicy
from fleet.settings import Settings
from fleet.store import Store


class ManifestCache:
    """Manifests by job; a missing one is not cached, so a job enqueued later is seen."""

    def __init__(self, store: Store):
        self.store = store
        self._manifests: dict[str, Manifest] = {}
        self._lock = threading.Lock()

    def get(self, job: str) -> Manifest | None:
        with self._lock:
            if job not in self._manifests:
                found = load_manifest(self.store, job)
                if found is None:
                    return None
                self._manifests[job] = found
            return self._manifests[job]

    def chunks(self, job: str) -> int | None:
        manifest = self.get(job)
        return manifest.chunks if manifest else None


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    store: Store
    redis: redis.Redis
    heartbeat: Heartbeat
    #: Celery node name, e.g. gpu0@host
    name: str
    #: lease owner, unique per process: a restarted worker with the same name is another owner
    owner: str
    queue: ChunkQueue
    policy: RetryPolicy
    manifests: ManifestCache
    #: set when running chunks must be handed back (grace period over, or the engine died)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: stops the process for its supervisor to restart it (the engine is gone)
    restart: Callable[[str], None] = lambda why: None

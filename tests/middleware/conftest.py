"""Middleware tests run in-process, as dramatiq's tests/middleware do, but against a real
redis-server, the local store, a real Celery producer and the sim engine on its own loop."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from fleet.coord.broker import make_celery
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.retry import RetryPolicy
from fleet.engines.identity import engine_identity, identity_hash
from fleet.engines.specs import build_engine
from fleet.producer.enqueue import prepare_job
from fleet.settings import Settings
from fleet.store.local import LocalStore
from fleet.worker.process.context import ManifestCache, WorkerContext
from fleet.worker.process.enginehost import EngineHost
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.executor import Executor
from fleet.worker.run.middleware import assist_stack, owner_stack
from fleet.worker.run.outcome import Outcome
from fleet.worker.run.task import ChunkTask
from tests.fleetproc import write_prompts

QUEUE = "fleet-mw-q"
JOB = "mw"


@dataclass
class Worker:
    """One in-process worker: its context, both stacks and the real chunk task."""

    ctx: WorkerContext
    task: ChunkTask
    restarts: list[str]

    def __post_init__(self) -> None:
        # One executor per stack for the worker's life, as the runtime holds them.
        self.owner = Executor(owner_stack(self.ctx))
        self.assister = Executor(assist_stack(self.ctx))

    def run(self, index: int, task: Callable[[ChunkRun, Callable[[], Outcome | None]], Outcome] | None = None,
            assist: bool = False, attempt: int = 1) -> tuple[ChunkRun, Outcome]:
        run = ChunkRun(job=JOB, index=index, attempt=attempt, worker=self.ctx.name, assist=assist)
        return run, (self.assister if assist else self.owner).execute(run, task or self.task)


@pytest.fixture
def settings(redis_server, tmp_path: Path, clean_env) -> Settings:
    return Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE, chunk_size=4,
                    lease_ttl_s=1.0, checkpoint_interval_s=0.2, assist_poll_s=0.2, max_attempts=3,
                    retry_backoff_s=0.01, retry_backoff_max_s=0.05,
                    sim={"step_s": 0.002, "mean_output_tokens": 40, "sigma": 0.5, "max_running": 8})


@pytest.fixture
def r(redis_server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def store(settings: Settings) -> LocalStore:
    return LocalStore(Path(settings.store_url or ""))


@pytest.fixture
def job(settings: Settings, store: LocalStore, tmp_path: Path) -> str:
    """Three chunks of four records in the store, with their manifest."""
    prepare_job(settings, store, str(write_prompts(tmp_path / "p.jsonl", 12)), JOB)
    return JOB


@pytest.fixture
def host(settings: Settings) -> Iterator[EngineHost]:
    h = EngineHost(build_engine(settings))
    h.start(timeout_s=30)
    yield h
    h.stop()


def make_worker(settings: Settings, store: LocalStore, r: redis.Redis, host: EngineHost, name: str) -> Worker:
    """`settings` names the worker's own engine (its identity), which may differ from the job's."""
    restarts: list[str] = []
    identity = engine_identity(settings)
    hb = Heartbeat.of(settings)
    hb.start()
    ctx = WorkerContext(settings=settings, store=store, redis=r, heartbeat=hb, name=name, owner=f"{name}:1",
                        queue=ChunkQueue.of(make_celery(settings), settings, r),
                        policy=RetryPolicy.from_settings(settings), manifests=ManifestCache(store),
                        restart=restarts.append, identity=identity, identity_hash=identity_hash(identity))
    return Worker(ctx, ChunkTask(store, host, ctx.writer, ctx.bell), restarts)


@pytest.fixture
def worker(settings, store, r, host, job) -> Iterator[Worker]:
    w = make_worker(settings, store, r, host, "gpu0@a")
    yield w
    w.ctx.heartbeat.stop()


@pytest.fixture
def other(settings, store, r, host, job) -> Iterator[Worker]:
    w = make_worker(settings, store, r, host, "gpu0@b")
    yield w
    w.ctx.heartbeat.stop()


def queued_messages(r: redis.Redis) -> list[dict]:
    """Chunk messages waiting in the Celery queue, over every priority list kombu keeps."""

    out = []
    # every store's queue of this test's name (`<QUEUE>.<store id>`), over every priority list
    for q in sorted(name.decode() for name in r.scan_iter(match=f"{QUEUE}.*")):
        for raw in r.lrange(q, 0, -1):
            _args, kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
            out.append(kwargs)
    return out

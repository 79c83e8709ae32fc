"""The Celery app, built from the one settings object, and the chunk message.

A message names a chunk (job, index, attempt); prompts never travel through Redis. Each store's
chunks go through a queue of their own (`chunk_queue`), so a worker only ever receives chunks of
the store it reads (docs/architecture.md, "Stores on one broker").
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from kombu import Queue

from fleet.coord import keys
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.outages import Outages, WatchedRedis
from fleet.coord.pool import KOMBU_NAME, shared_pool
from fleet.coord.reconnect import FleetAMQP
from fleet.errors import ConfigError
from fleet.settings import Settings
from fleet.store.identity import store_id

TASK_NAME = "fleet.run_chunk"
#: kombu's Redis transport serves priority 0 first. Chunks handed back after a lost or
#: stopping worker jump the queue, so recovery does not wait behind the whole job.
PRIORITY_RECOVERY = 0
#: a job of priority 0 (every job's unless set): its chunks' messages, as before job options
PRIORITY_NORMAL = 6


def message_priority(job_priority: int) -> int:
    """The kombu priority of a job's fresh chunks: a job of higher priority (fleet.store.options) gets a
    lower number, a list of its own that workers empty first (keys.PRIORITY_STEPS), never recovery's."""
    return max(PRIORITY_RECOVERY + 1, min(keys.PRIORITY_STEPS[-1], PRIORITY_NORMAL - job_priority))


#: broker connections a process keeps for sending messages: more than its senders at once (K chunk
#: threads, the reaper, the assister)
BROKER_POOL = 64


def store_of(settings: Settings) -> str:
    """The id of the settings' store on the broker (fleet.store.identity)."""
    return store_id(settings.resolved_store_url)


def chunk_queue(settings: Settings) -> str:
    """The Celery queue of the settings' store: `<queue>.<store id>`. The workers of a store
    consume it alone (`--queues`), so another store's chunk never reaches them."""
    return f"{settings.queue}.{store_of(settings)}"


def make_celery(settings: Settings, broker_url: str | None = None) -> Celery:
    url = broker_url or settings.broker_url
    if not url:
        raise ConfigError("no broker configured: set FLEET_BROKER_URL (redis://host:port/db)")
    # FleetAMQP: the consumer reconnects to a restarted broker with jittered waits (fleet.coord.reconnect).
    app = Celery("fleet", broker=url, set_as_current=False, amqp=FleetAMQP)
    transport: dict[str, Any] = {
        # Redis emulates acks: a message unacked longer than this goes to another worker,
        # so it must exceed any chunk's run time (docs/architecture.md, Celery facts).
        "visibility_timeout": settings.lease.visibility_timeout_s,
        "health_check_interval": 10,
        "priority_steps": list(keys.PRIORITY_STEPS),
        "sep": keys.PRIORITY_SEP,
        "queue_order_strategy": "priority",
        # CLIENT LIST names kombu's own connections (its BRPOP, its subscription) apart from the pool's
        "client_name": KOMBU_NAME,
    }
    app.conf.update(
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # JSON only: a broker that accepts pickle lets anyone who can write to Redis run code.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=chunk_queue(settings),
        task_queues=[Queue(chunk_queue(settings))],
        task_send_sent_event=True,
        worker_send_task_events=True,
        worker_pool="threads",
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # A pool, not a connection per message: with none (None) every send opened and closed two
        # connections (the message and its task-sent event), 6 ms a chunk at enqueue and a
        # handshake for the broker each time. Senders beyond the limit wait for a free one.
        broker_pool_limit=BROKER_POOL,
    )
    return app


def chunk_message(job: str, index: int, attempt: int = 1) -> dict[str, Any]:
    return {"job": job, "index": index, "attempt": attempt}


def chunk_label(job: str, index: int) -> str:
    """What Flower and Celery's logs call a chunk task instead of `fleet.run_chunk`."""
    return f"chunk {job}/{index}"


def send_chunk(
    app: Celery, queue: str, job: str, index: int, attempt: int = 1, priority: int = PRIORITY_NORMAL
) -> None:
    # The shadow name only relabels the task (events, Flower, logs); the worker still runs
    # TASK_NAME, which the message's `task` header names.
    app.send_task(
        TASK_NAME, kwargs=chunk_message(job, index, attempt), queue=queue, priority=priority,
        shadow=chunk_label(job, index),
    )


def redis_client(settings: Settings, pool: redis.ConnectionPool | None = None) -> redis.Redis:
    """The broker's Redis for leases and queue markers, on the process's one pool of connections
    (fleet.coord.pool: it retries through short outages with jittered waits); it records when the
    broker did not answer (fleet.coord.outages), for this process's reaper. `pool`: another than the
    process's (the control-plane bench's simulated workers have one each)."""
    if not settings.broker_url:
        raise ConfigError("no broker configured: set FLEET_BROKER_URL (redis://host:port/db)")
    client = WatchedRedis(connection_pool=pool or shared_pool(settings.broker_url))
    client.outages = Outages(slow_s=LeaseClock.of(settings).beat_s)
    return client

"""The one way a chunk goes back to the queue: send its message and mark it queued.

Every requeue (a failed or handed-back run, the reaper, the stall watch) comes through
here, so the "queued" marker `fleet enqueue` trusts is never missing for a sent message.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from fleet import metrics
from fleet.coord import keys
from fleet.coord.broker import PRIORITY_RECOVERY, send_chunk


@dataclass(frozen=True)
class ChunkQueue:
    app: Celery
    queue: str
    redis: redis.Redis

    def requeue(self, job: str, index: int, attempt: int) -> None:
        """Recovery priority: a chunk coming back jumps the queue instead of waiting behind the job."""
        # Marker first: a consumer fast enough to take the message clears it after us, not before.
        self.redis.sadd(keys.queued(job), index)
        send_chunk(self.app, self.queue, job, index, attempt, PRIORITY_RECOVERY)
        metrics.CHUNKS_REQUEUED.inc()

"""The middleware protocol (after dramatiq's `middleware/middleware.py`).

The executor runs `before` in ascending `order`, `progress` every poll while the task
runs, and `after` in descending order for every middleware whose `before` ran, with the
run's outcome. Any hook may end the run by returning an outcome (a gate that cannot run
the chunk returns `HandedBack`: the owner stack requeues it, no attempt spent); an `after`
may return the outcome with facts only it knows added, which later `after`s see. Each
middleware keeps what it needs between hooks in its own typed state, made per run by
`new_state` and held by the executor. A hook's own failure is logged, never fatal.
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from fleet.worker.process.context import WorkerContext
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.outcome import Outcome

S = TypeVar("S")


class Middleware(Generic[S]):
    #: position in the stack: `before` ascending, `after` descending
    order: ClassVar[int]

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    def new_state(self, run: ChunkRun) -> S:
        return None  # type: ignore[return-value]

    def before(self, run: ChunkRun, state: S) -> Outcome | None:
        return None

    def progress(self, run: ChunkRun, state: S) -> Outcome | None:
        return None

    def after(self, run: ChunkRun, state: S, outcome: Outcome) -> Outcome | None:
        return None


class Order:
    """Every middleware's place, in one table, so the stack reads top to bottom."""

    METRICS = 10
    STATS = 15
    #: after the lease is released (after runs in reverse), so a requeued message never meets our own lease
    RETRY = 20
    #: before RETRY's after: a dead engine stops the worker before its chunk is requeued
    CRASH = 25
    #: first of the gates: a delivery of a done chunk is skipped, never handed back again
    RESULT = 28
    STOP = 30
    MANIFEST = 32
    #: the worker's engine configuration against the job's (hands chunks back)
    GATE = 34
    #: the job's deadline and token budget: after the gates that find nothing to run, before the lease
    LIMITS = 36
    LEASE = 40
    #: after the lease: a chunk that must run alone holds its lease while the others end
    ADMISSION = 45
    #: before CHECKPOINT, so its after runs after the run's last flush: the tokens a stopped run
    #: reports cover every id its checkpoint holds (the engine may still stream while the run ends)
    PROGRESS = 48
    CHECKPOINT = 50

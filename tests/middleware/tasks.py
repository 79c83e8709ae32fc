"""Task wrappers for middleware tests: hold the run (polling its middleware like the real
task does) until something happened, then run the real task."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleet.store.layout import read_chunk
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.outcome import Outcome
from fleet.worker.run.task import ChunkTask

Poll = Callable[[], Outcome | None]


def hold(task: ChunkTask, until: Callable[[], bool], then: Callable[[ChunkRun], None] | None = None,
         timeout: float = 20) -> Callable[[ChunkRun, Poll], Outcome]:
    def run_it(run: ChunkRun, poll: Poll) -> Outcome:
        if then:
            then(run)
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError("test condition never came")
            stop = poll()
            if stop is not None:
                return stop
            time.sleep(0.05)
        return task(run, poll)

    return run_it


def generate_then_raise(task: ChunkTask, exc: BaseException) -> Callable[[ChunkRun, Poll], Outcome]:
    """Generate every sample, then fail before committing (a crash after the work)."""

    def run_it(run: ChunkRun, poll: Poll) -> Outcome:
        run.records = read_chunk(task.store, run.job, run.index)
        task.generate(run, poll)
        raise exc

    return run_it


def raise_(exc: BaseException) -> Callable[[ChunkRun, Poll], Outcome]:
    def run_it(run: ChunkRun, poll: Poll) -> Outcome:
        raise exc

    return run_it

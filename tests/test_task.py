"""The chunk task's wait on the engine loop (fleet.worker.run.task.ChunkTask.generate)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.task import ChunkTask


class FailingHost:
    """An engine host whose generation has already failed with `error`."""

    engine, gate, clock = None, None, None

    def __init__(self, error: BaseException):
        self.error = error

    def submit(self, coro: Any) -> concurrent.futures.Future:
        coro.close()
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_exception(self.error)
        return future


def test_an_engine_timeout_is_a_failure_not_a_poll_forever():
    # Given a generation that failed with asyncio's TimeoutError (on 3.11 the very class
    # concurrent.futures raises when a wait times out)
    task = ChunkTask(store=None, host=FailingHost(TimeoutError("engine timed out")))  # type: ignore[arg-type]
    polls = []
    # When the task waits for it, Then the error comes out at once, after no poll
    with pytest.raises(TimeoutError, match="engine timed out"):
        task.generate(ChunkRun(job="j", index=0, attempt=1, worker="w"), lambda: polls.append(1))
    assert polls == []

"""The executor's poll: a middleware that holds it up, and a poll that comes late, are logged (a
hand-back or a checkpoint waits behind them)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest

from fleet.worker.run import executor, task
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.executor import Executor
from fleet.worker.run.middleware.base import Middleware
from fleet.worker.run.outcome import Outcome, Superseded


class Slow(Middleware[None]):
    order = 10

    def __init__(self, seconds: float):
        super().__init__(None)  # type: ignore[arg-type]
        self.seconds = seconds

    def progress(self, run: ChunkRun, state: None) -> Outcome | None:
        time.sleep(self.seconds)
        return None


def run_of() -> ChunkRun:
    return ChunkRun(job="j", index=0, attempt=1, worker="w")


def polled_once(run: ChunkRun, poll: Any) -> Outcome:
    assert poll() is None
    return Superseded("done")


def test_a_slow_middleware_progress_is_logged_by_name(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr(executor, "SLOW_PROGRESS_S", 0.05)
    with caplog.at_level(logging.WARNING, logger="fleet.worker.run.executor"):
        Executor([Slow(0.1)]).execute(run_of(), polled_once)
    # at least the 0.1 s it slept (a busy machine may add to it)
    took = re.search(r"chunk j/0: Slow\.progress took (\d+\.\d)s", caplog.text)
    assert took is not None and float(took[1]) >= 0.1


def test_a_quick_progress_is_not_logged(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    # quick: far under the threshold, however busy the machine
    monkeypatch.setattr(executor, "SLOW_PROGRESS_S", 30)
    with caplog.at_level(logging.WARNING, logger="fleet.worker.run.executor"):
        Executor([Slow(0.0)]).execute(run_of(), polled_once)
    assert "took" not in caplog.text


def test_a_late_poll_is_logged(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    import concurrent.futures

    class Host:
        engine, gate, clock = None, None, None

        def submit(self, coro: Any) -> concurrent.futures.Future:
            coro.close()
            return concurrent.futures.Future()  # never done: only the poll ends the run

    def waits_long(woken: Any, timeout: float) -> bool:
        time.sleep(timeout + 0.2)  # the thread got no CPU (or no GIL) for 0.2 s past its timeout
        return False

    monkeypatch.setattr(task, "LATE_POLL_S", 0.1)
    monkeypatch.setattr(task.ChunkTask, "wait", staticmethod(waits_long))
    monkeypatch.setattr(task, "generate_chunk", lambda *a: _coro())
    with caplog.at_level(logging.WARNING, logger="fleet.worker.run.task"):
        chunk_task = task.ChunkTask(None, Host(), poll_s=0.01)  # type: ignore[arg-type]
        stop = chunk_task.generate(run_of(), lambda: Superseded("stop"))
    assert isinstance(stop, Superseded)
    # at least the 0.2 s it slept past its timeout
    late = re.search(r"chunk j/0: its poll came (\d+\.\d)s late", caplog.text)
    assert late is not None and float(late[1]) >= 0.2


async def _coro() -> None:
    return None

"""The chunk task's wait on the engine loop (fleet.worker.run.task.ChunkTask.generate)."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

from fleet.coord.leaseclock import LeaseClock
from fleet.settings import Settings
from fleet.worker.process.bell import Bell, RingingEvent
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.outcome import HandedBack
from fleet.worker.run.task import POLL_S, ChunkTask, poll_s_of


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


class PendingHost:
    """An engine host whose generation runs until the test ends it."""

    engine, gate, clock = None, None, None

    def __init__(self) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        coro.close()
        return self.future


def run_in_thread(task: ChunkTask, poll: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(task.generate(ChunkRun(job="j", index=0, attempt=1,
                                                                                   worker="w"), poll)))
    thread.start()
    return thread, out


def test_a_stop_wakes_a_waiting_run_at_once_not_at_its_next_poll():
    # Given a run that polls its middleware once a minute, waiting on an engine that runs on
    bell, host = Bell(), PendingHost()
    stopping = RingingEvent(bell)
    polls: list[bool] = []

    def poll() -> HandedBack | None:
        polls.append(stopping.is_set())
        return HandedBack("stopping") if stopping.is_set() else None

    thread, out = run_in_thread(ChunkTask(None, host, bell=bell, poll_s=60), poll)  # type: ignore[arg-type]
    thread.join(0.3)
    assert thread.is_alive() and polls == []  # nothing woke it: no poll yet
    # When the process's stopping flag is set
    stopping.set()
    # Then the run polls at once, hands back, and cancels its generation
    thread.join(10)
    assert not thread.is_alive()
    assert polls == [True] and isinstance(out[0], HandedBack)
    assert host.future.cancelled()


def test_a_generation_that_ends_wakes_its_run_at_once():
    host = PendingHost()
    thread, out = run_in_thread(ChunkTask(None, host, poll_s=60), lambda: None)  # type: ignore[arg-type]
    thread.join(0.3)
    assert thread.is_alive()
    host.future.set_result(None)
    thread.join(10)
    assert not thread.is_alive() and out == [None]


def test_a_ring_while_a_run_polls_is_not_lost():
    # Given a run whose first poll is under way when the bell rings
    bell, host = Bell(), PendingHost()
    stopping = RingingEvent(bell)
    polls: list[bool] = []

    task = ChunkTask(None, host, bell=bell, poll_s=0.2)  # type: ignore[arg-type]

    def poll() -> HandedBack | None:
        if not polls:
            task.poll_s = 60  # the next poll is far: only the ring can end the next wait
            stopping.set()  # rings while this run polls, after its wait returned
            polls.append(False)
            return None
        polls.append(stopping.is_set())
        return HandedBack("stopping")

    thread, out = run_in_thread(task, poll)
    # Then the ring wakes its next wait at once
    thread.join(10)
    assert not thread.is_alive() and polls == [False, True] and isinstance(out[0], HandedBack)


def test_the_worker_flags_ring_the_bell_and_a_bell_wakes_only_its_listeners():
    bell = Bell()
    draining = RingingEvent(bell)
    listening, other = threading.Event(), threading.Event()
    with bell.listening(listening):
        draining.set()
    assert listening.is_set() and draining.is_set() and not other.is_set()
    listening.clear()
    bell.ring()  # no longer listening
    assert not listening.is_set()


def test_a_worker_polls_at_the_heartbeat_pace_never_below_the_floor():
    assert poll_s_of(Settings()) == min(LeaseClock.of(Settings()).beat_s, Settings().assist_poll_s) > POLL_S
    assert poll_s_of(Settings(checkpoint_interval_s=1.5)) == 1.5  # a checkpoint due sooner than a beat
    assert poll_s_of(Settings(assist_poll_s=0.1)) == POLL_S

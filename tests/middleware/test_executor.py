"""The executor: before in order, after in reverse for exactly the middleware whose before
ran, every exception an outcome, a middleware's own failure never fatal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleet.store.results import ChunkStats
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.executor import Executor
from fleet.worker.run.middleware.base import Middleware
from fleet.worker.run.outcome import Committed, Failed, HandedBack, Outcome


@dataclass
class Calls:
    seen: list[str] = field(default_factory=list)


class Probe(Middleware[Calls]):
    def __init__(self, order: int, log: list[str], stop_before: Outcome | None = None, stop_progress: bool = False,
                 broken_after: bool = False):
        super().__init__(None)  # type: ignore[arg-type]
        self.order = order  # type: ignore[misc]
        self.log, self.stop_before = log, stop_before
        self.stop_progress, self.broken_after = stop_progress, broken_after

    def new_state(self, run: ChunkRun) -> Calls:
        return Calls()

    def before(self, run: ChunkRun, state: Calls) -> Outcome | None:
        state.seen.append("before")
        self.log.append(f"before {self.order}")
        return self.stop_before

    def progress(self, run: ChunkRun, state: Calls) -> Outcome | None:
        state.seen.append("progress")
        return HandedBack(f"stopped by {self.order}") if self.stop_progress else None

    def after(self, run: ChunkRun, state: Calls, outcome: Outcome) -> None:
        self.log.append(f"after {self.order} {type(outcome).__name__} {state.seen}")
        if self.broken_after:
            raise RuntimeError("after hook bug")


def run() -> ChunkRun:
    return ChunkRun(job="j", index=0, attempt=1, worker="w")


def task(r: ChunkRun, poll: Any) -> Outcome:
    stop = poll()
    return stop if stop is not None else Committed(ChunkStats(chunk=0))


def test_before_in_order_after_in_reverse_with_each_own_state():
    log: list[str] = []
    outcome = Executor([Probe(30, log), Probe(10, log), Probe(20, log)]).execute(run(), task)
    assert isinstance(outcome, Committed)
    assert log == ["before 10", "before 20", "before 30",
                   "after 30 Committed ['before', 'progress']", "after 20 Committed ['before', 'progress']",
                   "after 10 Committed ['before', 'progress']"]


def test_an_outcome_from_before_ends_the_run_and_only_those_that_ran_get_after():
    log: list[str] = []
    gate = HandedBack("not here")
    outcome = Executor([Probe(10, log), Probe(20, log, stop_before=gate), Probe(30, log)]).execute(run(), task)
    assert outcome is gate
    assert log == ["before 10", "before 20", "after 20 HandedBack ['before']", "after 10 HandedBack ['before']"]


def test_progress_stops_the_task_and_a_task_exception_is_a_failed_outcome():
    log: list[str] = []
    stopped = Executor([Probe(10, log, stop_progress=True)]).execute(run(), task)
    assert isinstance(stopped, HandedBack) and stopped.reason == "stopped by 10"

    def boom(r: ChunkRun, poll: Any) -> Outcome:
        raise ValueError("bad record shape")

    failed = Executor([Probe(10, log)]).execute(run(), boom)
    assert isinstance(failed, Failed) and isinstance(failed.cause, ValueError)


def test_a_broken_after_hook_does_not_stop_the_others(caplog):
    log: list[str] = []
    outcome = Executor([Probe(10, log), Probe(20, log, broken_after=True)]).execute(run(), task)
    assert isinstance(outcome, Committed)
    assert log[-1].startswith("after 10 Committed")
    assert "Probe.after failed" in caplog.text

"""Runs a task inside a middleware stack and turns everything that happens into an Outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware
from fleet.worker.run.outcome import Failed, Outcome

log = logging.getLogger(__name__)
#: a middleware's progress that takes this long is logged: a poll waits for it (docs/architecture.md)
SLOW_PROGRESS_S = 1.0

#: the task: given the run and a poll that returns an outcome when it must stop early
Task = Callable[[ChunkRun, Callable[[], Outcome | None]], Outcome]


class Executor:
    def __init__(self, middleware: list[Middleware[Any]]):
        self.middleware = sorted(middleware, key=lambda m: m.order)

    def execute(self, run: ChunkRun, task: Task) -> Outcome:
        """`before` in order (the first outcome ends the run), the task, then `after` in
        reverse for every middleware whose `before` ran, even when a later one failed; an
        `after` may hand the next ones the outcome with its own facts added."""
        states: dict[Middleware[Any], Any] = {}
        outcome: Outcome | None = None
        try:
            for m in self.middleware:
                states[m] = m.new_state(run)
                outcome = m.before(run, states[m])
                if outcome is not None:
                    break
            if outcome is None:
                outcome = task(run, lambda: self._progress(run, states))
        except Exception as e:  # every failure becomes an outcome, decided by the retry policy
            outcome = Failed(e)
        for m in reversed(list(states)):
            try:
                outcome = m.after(run, states[m], outcome) or outcome
            except Exception:
                log.exception("%s.after failed for chunk %s", type(m).__name__, run.name)
        return outcome

    @staticmethod
    def _progress(run: ChunkRun, states: dict[Middleware[Any], Any]) -> Outcome | None:
        for m, state in states.items():
            began = time.monotonic()
            try:
                stop = m.progress(run, state)
            except Exception:
                log.exception("%s.progress failed for chunk %s", type(m).__name__, run.name)
                stop = None
            if (took := time.monotonic() - began) >= SLOW_PROGRESS_S:  # the poll's hand-backs wait behind it
                log.warning("chunk %s: %s.progress took %.1fs", run.name, type(m).__name__, took)
            if stop is not None:
                return stop
        return None

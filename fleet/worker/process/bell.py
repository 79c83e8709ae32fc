"""Wakes every run of a worker process that waits on its engine, at once, when the process's state
changes (a SIGTERM's drain, a stop): each run then looks at its middleware seldom, at the pace the
heartbeat carries their figures, and still flushes or hands its chunk back the moment it must. A
look costs a thread's wake-up and every middleware's progress, so K runs looking twice a second
cost the process more CPU per second than anything else it does while it waits (docs/architecture.md,
"A stop is a hand-over")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Bell:
    """The events of the runs waiting now; `ring` sets them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[threading.Event] = set()

    @contextmanager
    def listening(self, event: threading.Event) -> Iterator[threading.Event]:
        with self._lock:
            self._waiting.add(event)
        try:
            yield event
        finally:
            with self._lock:
                self._waiting.discard(event)

    def ring(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
        for event in waiting:
            event.set()


class RingingEvent(threading.Event):
    """A process-wide flag (stopping, draining) whose `set` also rings the bell, so no run waits a
    whole poll to see it."""

    def __init__(self, bell: Bell):
        super().__init__()
        self.bell = bell

    def set(self) -> None:
        super().set()
        self.bell.ring()

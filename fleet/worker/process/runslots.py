"""Which chunks one worker process runs at once: up to its K slots, or one alone.

A suspected chunk (its process died soon after starting it beside others) and every chunk
of a benched worker run alone, so that a death during the run is evidence against that
chunk only. Process-wide, shared by the owner and assist stacks; the policy of when to
run alone is the admission middleware's (fleet.worker.run.middleware.admission).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

#: seconds between looks while a run waits for the process's other runs to end
WAIT_POLL_S = 0.2


class RunSlots:
    """The process's runs admitted now, and the one (if any) that claimed the process alone. A run
    is any hashable handle (a chunk's ChunkRun): the slots outlive every run and know none of them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: set[Hashable] = set()
        #: the run that claimed the process alone: waiting for the others to end, or running
        self._alone: Hashable | None = None
        #: the most chunks this process has run at once, and the chunks it committed
        self._peak = 0
        self._commits = 0

    def enter(self, run: Hashable, alone: bool = False) -> bool:
        """Admit the run; refused while another runs (or waits to run) alone. A run that must
        run alone claims the process: nothing else is admitted until it leaves."""
        with self._cond:
            if self._alone is not None:
                return False
            if alone:
                self._alone = run
            self._active.add(run)
            self._peak = max(self._peak, len(self._active))
            return True

    def wait_alone(self, run: Hashable, stop: threading.Event) -> bool:
        """Block until `run` is the only one admitted; False if `stop` is set first."""
        with self._cond:
            while len(self._active - {run}) > 0:
                if stop.is_set():
                    return False
                self._cond.wait(WAIT_POLL_S)
            return not stop.is_set()

    def leave(self, run: Hashable) -> None:
        with self._cond:
            self._active.discard(run)
            if self._alone is run:
                self._alone = None
            self._cond.notify_all()

    def committed(self) -> bool:
        """Count a commit; True once this process has finished as many chunks as it ever ran at
        once (a batch): it is healthy, its death would not be an early one."""
        with self._cond:
            self._commits += 1
            return self._commits >= self._peak

    @property
    def alone(self) -> Hashable | None:
        return self._alone

    def __len__(self) -> int:
        return len(self._active)

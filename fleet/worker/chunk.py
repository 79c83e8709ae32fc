"""The data of one run of a chunk: its manifest and records, and the samples finished so
far (from checkpoints and this run). The task, the manifest gate and the checkpoint
middleware fill it; every middleware may read it.

Policy state (the lease, retry counts, the crash evidence) never lives here: each
middleware keeps its own in its typed state, and a fact a later `after` needs travels on
the outcome (`Failed.leased_s`)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleet import metrics
from fleet.records import InputRecord
from fleet.store.manifest import Manifest

#: numbers the runs of a process: a run's lease owner is its process and this number
_RUN_SERIALS = itertools.count(1)


def sample_key(record_id: str, sample: int) -> str:
    return f"{record_id}\x00{sample}"


@dataclass(eq=False)
class ChunkRun:
    job: str
    index: int
    attempt: int
    worker: str
    manifest: Manifest | None = None
    records: list[InputRecord] = field(default_factory=list)
    #: finished output records by (id, sample), from checkpoints and this run
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: finished in this run and not yet checkpointed
    fresh: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    #: an end-of-job helper run: no chunk lease, first committed result wins
    assist: bool = False
    #: when the delivery arrived (the result's `started` and `seconds`; the crash evidence
    #: is the lease clock, fleet.coord.chunks)
    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: this run among the process's runs (its lease owner, fleet.coord.chunks.run_owner)
    serial: int = field(default_factory=lambda: next(_RUN_SERIALS))
    _inflight: int = 0

    @property
    def name(self) -> str:
        return f"{self.job}/{self.index}"

    @property
    def inflight(self) -> int:
        """Requests of this chunk inside the engine now (updated on the engine loop)."""
        return self._inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        # The gauge moves where requests enter and leave the engine, not on a poll.
        metrics.RUNNING_REQUESTS.inc(value - self._inflight)
        self._inflight = value

    def add(self, out: dict[str, Any]) -> None:
        """Called on the engine loop as each sample finishes."""
        with self.lock:
            self.finished[sample_key(out["id"], out["sample"])] = out
            self.fresh.append(out)

    def take_fresh(self) -> list[dict[str, Any]]:
        with self.lock:
            fresh, self.fresh = self.fresh, []
        return fresh

    def remaining(self) -> int:
        return max(0, self.expected() - len(self.finished))

    def expected(self) -> int:
        n = self.manifest.config["sampling"]["n"] if self.manifest else 1
        return sum(r.sample_count(n) for r in self.records)

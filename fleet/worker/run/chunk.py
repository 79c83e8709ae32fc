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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet import metrics
from fleet.records import InputRecord
from fleet.store.checkpoints import IdsDigest, Partial, Segment
from fleet.store.manifest import Manifest
from fleet.worker.process.startclock import CLOCK

#: numbers the runs of a process: a run's lease owner is its process and this number
_RUN_SERIALS = itertools.count(1)


def sample_key(record_id: str, sample: int) -> str:
    return f"{record_id}\x00{sample}"


def turn_key(record_id: str, sample: int, turn: int) -> str:
    """A running turn's key (turns = all); a sample's first turn is the sample's own key."""
    return sample_key(record_id, sample) + (f"\x00{turn}" if turn else "")


@dataclass(eq=False)
class LiveSample:
    """A sample running in this run: its output ids so far (a continued sample's prefix
    included), and how many of them the store already holds."""

    id: str
    sample: int
    ids: list[int]
    #: ids[:flushed] are in checkpoints; `digest` is theirs
    flushed: int
    digest: IdsDigest
    #: where this sample's lineage was continued from checkpointed ids (this run's start last)
    continued_at: list[int]
    #: the conversation turn running (turns = all); 0 for a sample of one turn
    turn: int = 0

    def segment(self) -> Segment | None:
        """The ids made since the last flush, chained to what the store holds."""
        if len(self.ids) <= self.flushed:
            return None
        return Segment(self.id, self.sample, self.flushed, self.digest.hexdigest(), self.ids[self.flushed :],
                       list(self.continued_at), self.turn)  # fmt: skip

    def stored(self, segment: Segment) -> None:
        """`segment` is in the store now: later segments follow it."""
        self.digest.update(segment.ids)
        self.flushed = segment.start + len(segment.ids)


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
    #: turns = all: the finished turns of unfinished samples, by sample_key and turn (checkpoints
    #: and this run), and those not yet checkpointed
    turns: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    fresh_turns: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    #: each unfinished sample's longest checkpointed prefix: this run continues from it
    partials: dict[str, Partial] = field(default_factory=dict)
    #: samples running now, by sample_key
    live: dict[str, LiveSample] = field(default_factory=dict)
    #: output tokens the engine made for this run (the result's header sums `continued_at` instead)
    tokens_made: int = 0
    #: tokens made for this chunk by earlier runs (fleet.coord.figures), for the result's header
    made_before: int = 0
    #: samples this run started again from token 0 instead of continuing them (Engine.restart_reason)
    restarted: int = 0
    #: an end-of-job helper run: no chunk lease, first committed result wins
    assist: bool = False
    #: when the delivery arrived (the result's `started` and `seconds`; the crash evidence
    #: is the lease clock, fleet.coord.leases)
    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: this run among the process's runs (its lease owner, fleet.coord.leases.run_owner)
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

    def add(self, out: dict[str, Any], turn: int = 0) -> None:
        """Called on the engine loop as each sample finishes (`turn`: the one it ended on)."""
        key = sample_key(out["id"], out["sample"])
        with self.lock:
            self.finished[key] = out
            self.fresh.append(out)
            self.live.pop(turn_key(out["id"], out["sample"], turn), None)
            self.turns.pop(key, None)

    def add_turn(self, record_id: str, sample: int, turn: dict[str, Any]) -> None:
        """A finished turn of a sample that goes on (turns = all): kept for the next checkpoint,
        so a later run starts at the turn after it."""
        row = {"id": record_id, "sample": sample, **turn}
        with self.lock:
            self.turns.setdefault(sample_key(record_id, sample), {})[turn["turn"]] = row
            self.fresh_turns.append(row)
            self.live.pop(turn_key(record_id, sample, turn["turn"]), None)

    def done_turns(self, record_id: str, sample: int) -> list[dict[str, Any]]:
        """The sample's finished turns from its first on, in order (turns = all)."""
        with self.lock:
            by_turn = self.turns.get(sample_key(record_id, sample), {})
            out = []
            while len(out) in by_turn:
                row = by_turn[len(out)]
                out.append({k: v for k, v in row.items() if k not in ("id", "sample")})
            return out

    def begin(self, record_id: str, sample: int, turn: int = 0) -> LiveSample:
        """A sample (or a turn of it) enters the engine, continuing from its checkpointed prefix
        if it has one."""
        key = turn_key(record_id, sample, turn)
        partial = self.partials.get(key)
        ids = list(partial.ids) if partial else []
        continued = [*partial.continued_at, len(ids)] if partial else []
        live = LiveSample(record_id, sample, ids, len(ids), IdsDigest(ids), continued, turn)
        with self.lock:
            self.live[key] = live
        return live

    def restart(self, live: LiveSample) -> None:
        """A running sample that cannot be continued on this engine starts again from token 0: its
        checkpointed ids are made again (tokens made twice), and its new segments chain from 0."""
        with self.lock:
            live.ids, live.flushed, live.digest, live.continued_at = [], 0, IdsDigest(), []
            self.restarted += 1
        metrics.SAMPLES_RESTARTED.inc()

    def extend(self, live: LiveSample, ids: list[int]) -> None:
        """New output ids of a running sample, as its stream delivers them (engine loop)."""
        with self.lock:
            live.ids.extend(ids)
            first = self.tokens_made == 0 and bool(ids)  # this run's first tokens, for the start clock (startclock)
            self.tokens_made += len(ids)
        metrics.TOKENS_MADE.inc(len(ids))
        if first:
            CLOCK.token(self.started)

    def segments(self) -> list[tuple[LiveSample, Segment]]:
        """What each running sample made since the last flush (not yet marked stored)."""
        with self.lock:
            return [(live, seg) for live in self.live.values() if (seg := live.segment()) is not None]

    def keep_fresh(self, rows: list[dict[str, Any]], turns: Sequence[dict[str, Any]] = ()) -> None:
        """Rows (and finished turns) a failed flush took: they go out with the next one."""
        with self.lock:
            self.fresh[:0] = rows
            self.fresh_turns[:0] = turns

    def take_fresh(self) -> list[dict[str, Any]]:
        with self.lock:
            fresh, self.fresh = self.fresh, []
        return fresh

    def take_fresh_turns(self) -> list[dict[str, Any]]:
        with self.lock:
            fresh, self.fresh_turns = self.fresh_turns, []
        return fresh

    def remaining(self) -> int:
        return max(0, self.expected() - len(self.finished))

    def expected(self) -> int:
        n = self.manifest.config["sampling"]["n"] if self.manifest else 1
        return sum(r.sample_count(n) for r in self.records)

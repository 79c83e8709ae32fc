"""What one run of a chunk came to. The task and the middleware return these instead of
raising control-flow exceptions; `after` hooks read them to decide what to clean up."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.store.results import ChunkStats


@dataclass(frozen=True)
class Committed:
    """This run wrote the chunk's result."""

    stats: ChunkStats


@dataclass(frozen=True)
class Superseded:
    """The chunk's result exists, written by another run (an assist, or a stolen lease)."""

    reason: str


@dataclass(frozen=True)
class HandedBack:
    """This run stops without blame: the owner requeues the chunk (no attempt spent); a
    helper just stops, the owner goes on. `delay_s` keeps a worker that cannot run the
    chunk from taking it straight back; `hold_s` requeues it at once and keeps the slot
    idle after (a worker that must not take chunks now leaves them to the others). `tail`
    requeues it behind every waiting chunk instead of at recovery priority: a worker that
    cannot run it at all (another engine configuration, a store without its manifest) must
    not be the next to take it."""

    reason: str
    delay_s: float = 0.0
    hold_s: float = 0.0
    tail: bool = False


@dataclass(frozen=True)
class Skipped:
    """Nothing to do here: done, or another live worker holds it. Nothing is requeued."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """The run failed; fleet.coord.retry decides from the cause's class what it means."""

    cause: BaseException
    #: seconds the run had held the chunk lease when it failed (the lease clock); None when
    #: it failed before taking it, and then it cannot be charged to the chunk
    leased_s: float | None = None
    #: the run ran alone in its process (fleet.worker.run.middleware.admission): a death is
    #: evidence against this chunk only
    solo: bool = False


Outcome = Committed | Superseded | HandedBack | Skipped | Failed


def result_exists(outcome: Outcome) -> bool:
    """Whether the chunk's result is known to exist: the only time checkpoints may go."""
    return isinstance(outcome, Committed | Superseded)

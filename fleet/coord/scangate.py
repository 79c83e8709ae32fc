"""When the leader's recovery round reads every running chunk's lease (docs/architecture.md, "Scaling").

A chunk lease is live while its process's key lives, so a chunk needs recovering only when a process
died (its key ran out) or a lease was deleted under a live process (let go). The round reads the keys
of the processes that took leases (keys.lease_processes: a thousand workers are one MGET) and the
let-go counter, and scans the running set (a thousand workers at K = 128 are 128,000 leases) only on
a death, a let-go, chunks its last scan left pending (a witness awaited, a holder cut off by a pause, a
recovery that failed and was put back, another store's chunks that store's leader has yet to take), or
every `every` rounds for what none of those shows (processes of an older fleet, which never registered).
A dead process's chunks are still recovered at the first round after their lease ran out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import redis

from fleet.coord import leases

#: a round in this many scans the running set though nothing asked for it
FULL_SCAN_EVERY = 6


class Why(Enum):
    """Why a round scans the running set."""

    FIRST = "first round of this reaper"
    DEATH = "a process that took leases died"
    LET_GO = "a lease was let go"
    PERIODIC = "every few rounds"
    PENDING = "chunks of the last scan still to recover"


@dataclass
class ScanGate:
    """A reaper's state between rounds: which deaths and let-gos it has seen scanned."""

    every: int = FULL_SCAN_EVERY
    #: rounds this reaper ran
    rounds: int = 0
    #: the let-go counter its last scan began at (None: it never scanned)
    let_go_seen: int | None = None
    #: the last scan left chunks for a later round (a witness awaited, a holder cut off by a pause)
    pending: bool = False
    #: why the last round scanned, None if it did not (tests read it)
    why: Why | None = None
    #: the dead processes (each with its last take's stamp) the round about to scan found; they leave the
    #: set once a scan leaves nothing pending
    _dead: dict[str, str] = field(default_factory=dict)
    _let_go: int = 0

    def due(self, r: redis.Redis) -> bool:
        """Whether this round scans; reads the processes' keys and the let-go counter."""
        self._dead, self._let_go = leases.dead_processes(r), leases.lets_go(r)
        first, self.rounds = self.rounds == 0, self.rounds + 1
        self.why = (Why.FIRST if first else Why.DEATH if self._dead else Why.PENDING if self.pending
                    else Why.LET_GO if self._let_go != self.let_go_seen
                    else Why.PERIODIC if (self.rounds - 1) % self.every == 0 else None)
        return self.why is not None

    def scanned(self, r: redis.Redis, pending: int) -> None:
        """The scan this round ran ended, leaving `pending` chunks unrecovered: the deaths it saw are
        done with once nothing is left, and the let-gos it began after are seen."""
        self.let_go_seen, self.pending = self._let_go, pending > 0
        if not pending:
            leases.forget_dead(r, self._dead)

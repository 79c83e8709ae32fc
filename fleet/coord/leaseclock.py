"""The lease clock's timing, in one object: the only reader of the lease settings' timing.

How often a worker beats, how often it renews a lease past its crash window, and so how stale a
live lease's last renewal can be: the heartbeat, the reaper and its lead, the broker-pause judge,
the run's poll and the producer's stale-marker check all read it here, never from the settings, so
changing what a lease means is an edit of this module (docs/architecture.md, "Recovery").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.settings import Settings

#: one beat of the heartbeat in this many is full (fleet.coord.heartbeat): it carries the runs'
#: figures and renews every lease, also those past their crash window (`LeaseClock.renew_s`)
FIGURES_EVERY = 5
#: the leases a process's figures go with every FIGURES_EVERY-th beat; a process holding more (a K
#: set by hand past the derived one's) sends them every other full beat, halving what its figures cost
#: the broker, while its renewals keep their cadence (issue 48: K = 128; docs/architecture.md, "Scaling").
#: No slower: status takes a pace 30 s old for a dead run's (fleet.monitor.status.PACE_STALE_S).
FIGURES_LEASES = 64


def figures_every(leases: int) -> int:
    """Beats between the full beats (figures, looks) of a process holding `leases` leases."""
    return FIGURES_EVERY * (2 if leases > FIGURES_LEASES else 1)


@dataclass(frozen=True)
class LeaseClock:
    #: a lease's time to live unrenewed (settings.lease.ttl_s)
    ttl_s: float
    #: a death this soon after taking a lease is crash evidence (settings.failure.crash_window_s): a lease
    #: this young is renewed every beat, its beat stamp dating the death to the beat's precision
    crash_window_s: float = 10.0
    #: seconds between the recovery rounds (settings.lease.reaper_interval_s)
    reaper_interval_s: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> LeaseClock:
        return cls(settings.lease.ttl_s, settings.failure.crash_window_s, settings.lease.reaper_interval_s)

    @property
    def beat_s(self) -> float:
        """The heartbeat's period. At most 2 s: each renewal stamps the lease beat, which dates a lost
        worker's death for the crash evidence (crash_window_s) to that precision."""
        return max(0.2, min(self.ttl_s / 4, 2.0))

    @property
    def renew_every(self) -> int:
        """Beats between renewals of a lease held past its crash window: its death is no evidence
        any more, so the stamp's precision no longer matters, only that the lease lives. The full
        beats (every 10 s at the defaults, 6 renewals a 60 s TTL), never over a quarter TTL apart."""
        return max(1, min(FIGURES_EVERY, math.floor(self.ttl_s / 4 / self.beat_s + 1e-9)))

    @property
    def renew_s(self) -> float:
        """How stale a live lease's last renewal (its lease-beat stamp) can be: what the broker-pause
        judgement and the reaper lead allow for (docs/architecture.md, "Scaling")."""
        return self.renew_every * self.beat_s

    @property
    def lead_ttl_s(self) -> float:
        """How long the reaper lead lasts unrenewed: two rounds, but never past the lease TTL less a
        renewal interval. A dead leader's own chunk leases run out a TTL after their last renewal (up
        to `renew_s` before its death), and by then another worker's turn can take the lead and
        requeue them: within TTL + one round still."""
        return max(0.1, min(2 * self.reaper_interval_s, self.ttl_s - self.renew_s))

    @property
    def recovery_claim_s(self) -> int:
        """Seconds one reaper's claim of a lost chunk keeps the others off it (whole seconds, at least 5)."""
        return max(5, int(self.ttl_s))

    def lost_after_s(self, leases: float) -> float:
        """A message taken this long ago whose chunk has no lease lost its worker: `leases` TTLs."""
        return leases * self.ttl_s

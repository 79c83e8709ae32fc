"""A broker pause is not a death (docs/architecture.md, "Failures"): which expired leases the
reaper must not read as evidence.

When Redis stops answering (a long fork, a failover, a partition) every lease runs out while
its holder is alive and cut off too. A lease is explained by a pause when it ran out inside a
window in which this reaper could not reach the broker itself (fleet.coord.outages), or when
every holder's leases ran out at once (a reaper that saw nothing, say `fleet enqueue` started
after it). Such a chunk is left to its holder to take back for a while (it retakes its lease
when the broker answers, as after a wipe); one still unleased after that is requeued with no
death, suspicion or bench recorded.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from fleet.coord import leases, suspects
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.outages import Outages, Window
from fleet.settings import Settings

log = logging.getLogger(__name__)

#: seconds a holder needs after the broker answers again before it renews: its client's
#: reconnect backoff (2 s at most) and clock skew between hosts
RECONNECT_S = 3.0


@dataclass(frozen=True)
class Expiry:
    """When a lost chunk's lease ran out (epoch seconds), and whose it was."""

    job: str
    index: int
    last_beat: float
    ran_out: float
    holder: str | None


class PauseJudge:
    """Reads the expired leases of one recovery round against the broker's pauses."""

    def __init__(self, outages: Outages, settings: Settings):
        self.outages = outages
        # A lease past its crash window is renewed only every renew_s (LeaseClock.renew_s), not every
        # beat: a live holder's last renewal may be that old, its leases run out spread over that
        # much, and it finds one gone (and takes it back) up to that long after the broker answers.
        clock = LeaseClock.of(settings)
        self.ttl_s, self.beat_s, self.renew_s = clock.ttl_s, clock.beat_s, clock.renew_s

    @property
    def grace_s(self) -> float:
        """How long after a pause the holders get to take their leases back."""
        return self.ttl_s + self.renew_s + RECONNECT_S

    @property
    def at_once_s(self) -> float:
        """Leases that ran out within this of each other ran out at once: their last renewals lie
        within a renewal interval before the pause, give or take a beat."""
        return self.renew_s + self.beat_s + 1.0

    def expiry(self, r: redis.Redis, job: str, index: int) -> Expiry | None:
        started, beat = leases.lease_clock(r, job, index)
        last = max(started or 0, beat or 0)
        if not last:
            return None  # no clock: nothing says when it ran out
        return Expiry(job, index, last / 1000, last / 1000 + self.ttl_s, suspects.lost_marks(r, job, index).owner)

    def note_round(self, expired: list[Expiry], live: int) -> None:
        """Every holder's leases (two processes at least) ran out at once, none is live: that is
        the broker or the network, not deaths. Remembered as a pause for the rounds after."""
        holders = {e.holder for e in expired if e.holder}
        if live or len(holders) < 2:
            return
        first, last = min(e.ran_out for e in expired), max(e.ran_out for e in expired)
        if last - first > self.at_once_s:
            return  # one after another: deaths
        if self.outages.covering(last, before_s=0.0, after_s=0.0, min_s=self.ttl_s / 2):
            return  # known already (an earlier round, or this process was cut off itself)
        log.warning("every lease (%d chunks of %d processes) ran out at once: a broker or network pause, not "
                    "deaths", len(expired), len(holders))
        self.outages.add(min(e.last_beat for e in expired), last)

    def pause(self, expiry: Expiry | None) -> Window | None:
        """The pause that explains this expiry, if any: one long enough to let a lease run out,
        begun before it ran out (give or take a renewal interval: a live holder's last renewal may
        be that old when the pause begins) and over at most a renewal before."""
        if expiry is None:
            return None
        return self.outages.covering(expiry.ran_out, before_s=self.renew_s + 1.0, after_s=self.renew_s + RECONNECT_S,
                                     min_s=self.ttl_s / 2)

    def holding(self, pause: Window, now: float | None = None) -> bool:
        """Whether the holder may still take its lease back."""
        return (time.time() if now is None else now) < pause.end + self.grace_s

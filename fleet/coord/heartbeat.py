"""The heartbeat: one thread per worker process renewing every lease it holds
(fleet.coord.leases.Lease), so a live worker's leases never expire.

One beat is one round trip at most (fleet.coord.leases.beat), whatever the number of chunks
the process runs (docs/architecture.md, "Scaling"). A lease is renewed at every beat while it
is young (its death would still be crash evidence, dated by the renewal's stamp), and after
that only every `renew_every` beats (the full ones at the defaults): what a running chunk
costs the broker is then a renewal every 10 s, not every 2 s. Every FIGURES_EVERY-th beat
renews every lease and carries each run's figures since the last (tokens made, its pace,
samples not started) and looks whether its chunk was committed elsewhere or is assisted (a
process of more than FIGURES_LEASES leases less often: `figures_every`); a
helper's copy and an assisted chunk look at every beat. A beat with nothing to renew or look
at sends nothing. A renewal is of the process (its key lives a TTL), so a lease the heartbeat
discards without its release reaching the broker is let go once a TTL has passed since its last
renewal, as an unrenewed lease of its own ran out. What a beat reads back waits in the run's
tally for its middleware, which never asks the broker itself.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

from fleet import metrics
from fleet.coord import leases
from fleet.coord.leaseclock import LeaseClock, figures_every
from fleet.coord.leases import Figures, Lease, Look
from fleet.settings import Settings

log = logging.getLogger(__name__)

#: beats whose round trip is kept (the control-plane bench reads their percentiles)
KEPT_BEATS = 512


@dataclass
class Tally:
    """One lease's figures for the next beat, and what the last beat saw."""

    #: output tokens made since the last beat (not yet added to the chunk's count)
    made: int = 0
    pace: dict[str, int] | None = None
    unstarted: int | None = None
    #: the chunk's stats are cached: a run committed it (the progress middleware confirms in the store)
    committed: bool = False
    #: a helper holds the chunk's assist lease (the checkpoint middleware flushes at its cadence)
    assisted: bool = False


class Heartbeat:
    """One thread per worker process renewing every lease it holds, one round trip a beat at most.

    `renew_every`: beats between renewals of a lease no longer young; `young_s`: the crash window
    (the defaults renew every lease at every beat)."""

    def __init__(self, interval_s: float, renew_every: int = 1, young_s: float = math.inf):
        self.interval_s, self.renew_every, self.young_s = interval_s, max(1, renew_every), young_s
        self._tallies: dict[Lease, Tally] = {}
        #: chunk leases discarded, until released or let go (`discard`)
        self._discarded: list[Lease] = []
        self._lock = threading.Lock()
        #: one beat at a time; a run's last figures wait for the beat that carries its others
        self._sending = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-heartbeat", daemon=True)
        self._beats = 0
        #: (epoch seconds, seconds it took) of each recent beat's round trip
        self.round_trips: deque[tuple[float, float]] = deque(maxlen=KEPT_BEATS)

    @classmethod
    def of(cls, settings: Settings) -> Heartbeat:
        """A worker's heartbeat: its beat, the renewal of old leases and the crash window from `settings`."""
        clock = LeaseClock.of(settings)
        return cls(clock.beat_s, clock.renew_every, clock.crash_window_s)

    def start(self) -> None:
        self._thread.start()

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._tallies.setdefault(lease, Tally())

    def discard(self, lease: Lease) -> None:
        """No beat renews the lease from now. Its run releases it next; one whose release never
        reached the broker (it was out) the beats let go a TTL after its last renewal: its process's
        key, which they renew, would keep it live."""
        with self._lock:
            if self._tallies.pop(lease, None) is not None and lease.watched:
                self._discarded.append(lease)

    def held(self, job: str, index: int, assist: bool = False) -> Lease | None:
        """The chunk lease (or, with `assist`, the assist lease) this process holds on the chunk, if any."""
        with self._lock:
            return next((x for x in self._tallies if x.watched != assist and (x.job, x.index) == (job, index)), None)

    def tally(self, lease: Lease) -> Tally | None:
        with self._lock:
            return self._tallies.get(lease)

    def report(self, lease: Lease, made: int, pace: dict[str, int] | None, unstarted: int | None) -> None:
        """A run's figures: `made` more tokens, its pace and unstarted samples now (the next beat carries them)."""
        with self._lock:
            tally = self._tallies.get(lease)
            if tally is not None:
                tally.made += made
                tally.pace, tally.unstarted = pace, unstarted

    def settle(self, lease: Lease) -> int:
        """The run ends: the tokens it made that no beat carried yet; no later beat carries its
        figures (waits for a beat in flight, so an end is never overwritten by it)."""
        with self._sending, self._lock:
            tally = self._tallies.get(lease)
            if tally is None:
                return 0
            made, tally.made, tally.pace, tally.unstarted = tally.made, 0, None, None
            return made

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        """Renew the leases due with their figures, one round trip per broker client (one in a
        worker), none when nothing is due."""
        with self._sending:
            with self._lock:
                full = self._beats % figures_every(len(self._tallies)) == 0
                every = full or self._beats % self.renew_every == 0
                self._beats += 1
                # between renewals only the leases that look or are young go (no Figures made for the
                # rest: a process of 128 leases beats every 2 s)
                taken = [(lease, tally, self._figures(lease, tally, full)) for lease, tally in self._tallies.items()
                         if every or not lease.watched or tally.assisted or lease.young(self.young_s)]
            clients: dict[int, list[tuple[Lease, Tally, Figures]]] = {}
            for entry in taken:
                clients.setdefault(id(entry[0].r), []).append(entry)
            for group in clients.values():
                self._send(group)
            self._let_go()

    def _let_go(self) -> None:
        """Let go each discarded lease that was not released, once a TTL has passed since its last renewal."""
        now = leases.now_ms()
        with self._lock:
            self._discarded = [x for x in self._discarded if not x.released]
            due = [x for x in self._discarded if now >= (x.beat_ms or 0) + x.ttl_ms]
        for lease in due:
            try:
                lease.let_go()
            except Exception as e:  # the next beat tries again
                log.warning("letting go of the lease on %s/%d failed: %s", lease.job, lease.index, e)

    @staticmethod
    def _figures(lease: Lease, tally: Tally, full: bool) -> Figures:
        """What this beat carries for a lease (under the lock): its figures on a full beat (taken
        out of the tally), and what to look at."""
        if not full:
            return Figures(look=Look.COMMITTED if not lease.watched or tally.assisted else Look.NONE)
        fig = Figures(tally.made, tally.pace, tally.unstarted, Look.ASSISTED if lease.watched else Look.COMMITTED)
        tally.made, tally.pace, tally.unstarted = 0, None, None
        return fig

    def _send(self, group: list[tuple[Lease, Tally, Figures]]) -> None:
        began = time.monotonic()
        try:
            seen = leases.beat(group[0][0].r, [g[0] for g in group], [g[2] for g in group])
        except Exception as e:  # a failed beat must not end the thread: every lease would expire
            with self._lock:
                for lease, tally, fig in group:  # the figures go with the next beat
                    if lease in self._tallies:
                        tally.made += fig.made
                        tally.pace = tally.pace if tally.pace is not None else fig.pace
                        tally.unstarted = tally.unstarted if tally.unstarted is not None else fig.unstarted
            log.warning("heartbeat of %d lease(s) failed: %s", len(group), e)
            return
        took = time.monotonic() - began
        self.round_trips.append((time.time(), took))
        metrics.BEAT_SECONDS.observe(took)
        with self._lock:
            for (_, tally, fig), s in zip(group, seen, strict=True):
                if s.looked:
                    tally.committed = s.committed
                if s.looked and fig.look is Look.ASSISTED:
                    tally.assisted = s.assisted

    def _run(self) -> None:
        # A random phase: processes started together (a host's workers) do not beat together.
        if self._stop.wait(random.uniform(0, self.interval_s)):
            return
        self.beat()
        while not self._stop.wait(self.interval_s):
            self.beat()

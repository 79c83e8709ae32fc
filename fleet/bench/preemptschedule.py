"""When interruptible hosts boot and die, drawn from a seed (fleet bench preemption).

Each of H host slots holds one host, two while a notice outlasts the replacement delay. A host's life
is exponential with mean L (a Poisson process of preemptions per host, as spot capacity is reclaimed
without regard to what runs); at its end comes SIGTERM, then SIGKILL after the notice N (N = 0: the
SIGKILL alone), and the slot's next host boots the replacement delay after the SIGTERM: a cloud's
interruption notice is what asks for the replacement (an autoscaling group's rebalance, a managed
instance group's recreate), not the machine's end. Times are the job's own seconds from the first
boot. The lives are drawn per slot from (seed, slot) alone and no time depends on N but the SIGKILL,
so every resume mode and every notice meet the same boots and SIGTERMs: two notices differ only in
how long the preempted host lives on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class HostLife:
    slot: int
    #: the slot's nth host (0: the one there at the start)
    n: int
    boot: float
    #: SIGTERM and SIGKILL; None: the host outlives the horizon
    term: float | None = None
    kill: float | None = None

    @property
    def name(self) -> str:
        return f"h{self.slot}n{self.n}"


def draw(seed: int, hosts: int, lifetime_s: float | None, notice_s: float, replace_s: float,
         horizon_s: float) -> list[HostLife]:  # fmt: skip
    """Every host that boots before `horizon_s`, in boot order; lifetime None: none is preempted."""
    lives: list[HostLife] = []
    for slot in range(hosts):
        rng = random.Random(f"preemption:{seed}:{slot}")
        boot, n = 0.0, 0
        while boot < horizon_s:
            if lifetime_s is None:
                lives.append(HostLife(slot, n, boot))
                break
            term = boot + rng.expovariate(1 / lifetime_s)
            lives.append(HostLife(slot, n, boot, term, term + notice_s))
            boot, n = term + replace_s, n + 1
    return sorted(lives, key=lambda h: (h.boot, h.slot))

"""A zero-overhead model of the same job, to tell fleet's losses from the schedule's own.

Each of W workers has S engine slots and K chunk slots; a chunk's requests join the
worker's engine queue in order (first in, first out) and a freed chunk slot takes the
next chunk from one shared queue at once. Fed the exact output lengths a measured run
produced, it gives the occupancy that schedule would reach with no dequeue, commit or
Python cost at all (docs/architecture.md, "Keeping the engine full").
"""

from __future__ import annotations

import heapq
from collections import deque


def model_occupancy(lengths: list[list[int]], workers: int, slots: int, k: int) -> float:
    """Busy over total slot-time for chunks of request lengths (any unit), FIFO everywhere."""
    pending = deque(range(len(lengths)))
    queues: list[deque[tuple[int, int]]] = [deque() for _ in range(workers)]
    free = [slots] * workers
    left = [len(c) for c in lengths]
    events: list[tuple[float, int, int]] = []  # (end time, worker, chunk)

    def take(w: int) -> None:
        while pending:
            c = pending.popleft()
            if left[c]:
                queues[w].extend((c, n) for n in lengths[c])
                return

    def fill(w: int, now: float) -> None:
        while free[w] and queues[w]:
            c, n = queues[w].popleft()
            free[w] -= 1
            heapq.heappush(events, (now + n, w, c))

    for w in range(workers):
        for _ in range(k):
            take(w)
        fill(w, 0.0)
    now = 0.0
    while events:
        now, w, c = heapq.heappop(events)
        free[w] += 1
        left[c] -= 1
        if left[c] == 0:
            take(w)
        fill(w, now)
    work = sum(sum(c) for c in lengths)
    return work / (workers * slots * now) if now else 0.0

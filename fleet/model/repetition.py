"""The repetition stop: find an exact cycle in a request's output ids while it is generated.

Thinking models fall into exact loops (the same block of a few tokens back to back until
max_tokens); a looping row of the reference job costs 32,768 tokens, 18 times the mean.
`RepetitionWatch` is fed each delta of one request's output ids and reports the first
cycle that covers more tokens than healthy output plausibly does, so the engine can abort
the request (finish reason `repetition`, docs/architecture.md "Repetition stop").

Its settings (thresholds, off) are fleet.settings.repetition, part of the job's configuration.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.settings.repetition import MAX_PERIOD, MIN_REPEATS, MIN_TOKENS, RepetitionSettings

__all__ = ["MAX_PERIOD", "MIN_REPEATS", "MIN_TOKENS", "Cycle", "RepetitionSettings", "RepetitionWatch", "watch_for"]



def watch_for(settings: RepetitionSettings) -> RepetitionWatch | None:
    """A watch for one request, or None when the stop is off."""
    return RepetitionWatch(settings) if settings.enabled else None


@dataclass(frozen=True)
class Cycle:
    """An exact cycle at the end of an output: `tokens` ids from offset `start` repeat a block
    of `period` ids back to back (the last copy may be partial)."""

    period: int
    start: int
    tokens: int


class RepetitionWatch:
    """One request's watch: `feed` each delta of its output ids; the first qualifying cycle.

    For each period p it keeps the run length of the latest positions i with
    ids[i] == ids[i - p]; a run of r means the last r + p ids are p-periodic. Only periods
    where the new id matches are touched: the positions of each id within the last
    max_period are kept, so a token costs the number of its own occurrences there (a few in
    text, at most max_period), not max_period.
    """

    def __init__(self, settings: RepetitionSettings | None = None) -> None:
        self.settings = settings or RepetitionSettings()
        self.max_period = self.settings.max_period
        self.seen = 0
        #: the last max_period ids, and where each of them last occurred within that window
        self.window: deque[int] = deque(maxlen=self.max_period)
        self.positions: dict[int, deque[int]] = {}
        #: period -> length of the current run of matches; absent = 0
        self.runs: dict[int, int] = {}
        self.found: Cycle | None = None
        #: the output's ids until it holds min_tokens: no cycle can cover more ids than the output
        #: has, so they are looked at only then (a shorter output costs nothing; the cycle found,
        #: and where, are the same), None once they were
        self.pending: list[int] | None = []

    def feed(self, new_ids: Sequence[int]) -> Cycle | None:
        """Take the next ids of the output; the first cycle found (again on later calls), else None."""
        if self.found is not None:
            return self.found
        if self.pending is not None:
            self.pending += new_ids
            if len(self.pending) < self.settings.min_tokens:
                return None
            new_ids, self.pending = self.pending, None
        runs, positions, window = self.runs, self.positions, self.window
        for token in new_ids:
            n = self.seen
            at = positions.get(token)
            runs = {n - q: runs.get(n - q, 0) + 1 for q in at} if at else {}
            if len(window) == self.max_period:
                oldest = positions[window[0]]
                oldest.popleft()
                if not oldest:
                    del positions[window[0]]
            window.append(token)
            if token in positions:
                positions[token].append(n)
            else:
                positions[token] = deque((n,))
            self.seen = n + 1
            if runs and self._check(runs):
                break
        self.runs = runs
        return self.found

    def _check(self, runs: dict[int, int]) -> bool:
        """Record the smallest period whose cycle qualifies. A period-3 loop is a period-6 one
        too, covering no more tokens, and what a period must cover never falls as it grows, so
        the smallest period qualifies first (or together)."""
        least, repeats = self.settings.min_tokens, self.settings.min_repeats
        best = None
        for period, run in runs.items():
            if run + period >= least and run + period >= repeats * period and (best is None or period < best):
                best = period
        if best is None:
            return False
        tokens = runs[best] + best
        self.found = Cycle(period=best, start=self.seen - tokens, tokens=tokens)
        return True


def bench(tokens: int = 32_768, vocab: int = 1000, seed: int = 0) -> dict[str, float]:
    """Microseconds per token of one request's watch over `tokens` ids: cycle-free text in
    deltas of one id (the dearest size) and of 64, the worst case (one id over and over, every
    period matching, thresholds out of reach), and a stream that loops after 1,000 ids."""
    import random

    rng = random.Random(seed)
    # Zipf-like ids: frequent ones recur within the window, as spaces and newlines do in text
    text = rng.choices(range(vocab), weights=[1 / (rank + 1) for rank in range(vocab)], k=tokens)
    never = RepetitionSettings(min_repeats=sys.maxsize)  # every period looked at, none ever qualifies
    cases = {
        "text_delta_1": (text, 1, never), "text_delta_64": (text, 64, never), "worst_delta_1": ([5] * tokens, 1, never),
        "looping_delta_1": (text[:1000] + [7, 8, 9] * tokens, 1, RepetitionSettings()),
    }
    out: dict[str, float] = {}
    for name, (ids, delta, settings) in cases.items():
        watch, fed = RepetitionWatch(settings), 0
        began = time.perf_counter()
        while fed < tokens and watch.feed(ids[fed : fed + delta]) is None:
            fed += delta
        out[f"us_per_token_{name}"] = (time.perf_counter() - began) / max(fed, watch.seen) * 1e6
        if watch.found:
            out[f"stopped_after_{name}"] = watch.seen
    return out


if __name__ == "__main__":
    for name, value in bench().items():
        print(f"{name}: {value:.2f}")

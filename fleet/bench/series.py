"""Cumulative series sampled over time (tokens made, CPU seconds used), read at any moment.

The benchmarks count each side over a window of their own choosing, between samples: linear
interpolation between the samples, a chunk's tokens spread evenly over its run.
"""

from __future__ import annotations


def overlap(a: float, b: float, start: float, end: float) -> float:
    """The fraction of [a, b] inside [start, end] (a chunk's tokens spread evenly over its run)."""
    return max(0.0, min(b, end) - max(a, start)) / max(b - a, 1e-9)


def value_at(samples: list[tuple[float, float]], t: float) -> float:
    """A cumulative series at time t, linear between its samples; clamped to its ends."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in zip(samples, samples[1:], strict=False):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-9)
    return samples[-1][1]


def difference(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """How much a cumulative series grew between two times; None without samples covering both."""
    if len(samples) < 2 or samples[0][0] > start or samples[-1][0] < end:
        return None
    return value_at(samples, end) - value_at(samples, start)

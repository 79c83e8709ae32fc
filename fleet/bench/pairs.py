"""Fleet against the bare engine as interleaved pairs: fleet, bare, fleet, bare, ...

Two shared cores move a single run by a third, and the load changes over minutes, so each
side's best run (what the comparisons used before) can pair a quiet minute of one side with a
busy one of the other. A pair runs its two sides back to back under nearly the same load, so
its ratio is the figure; the median of at least three pairs is reported, with whether every
pair lies within `REPEAT_TOLERANCE` of it: if not, the windows are too short for this machine.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.bench.report import Figure, at_least

#: a pair's ratio "repeats" when it lies within this fraction of the median ratio
REPEAT_TOLERANCE = 0.05
MIN_PAIRS = 3

Side = Callable[[int, int], dict[str, Any]]
"""One timed run of one side: (prompts, run index) -> {"tokens", "seconds", "tok_s", ...}."""


@dataclass
class Pairs:
    """The runs of both sides, in the order they ran, and what their ratios say."""

    fleet: list[dict[str, Any]]
    bare: list[dict[str, Any]]
    prompts: int
    #: the bare probe that sized the window (None: the profile's size was used as is)
    probe: dict[str, Any] | None = None

    @property
    def ratios(self) -> list[float]:
        return [f["tok_s"] / b["tok_s"] for f, b in zip(self.fleet, self.bare, strict=True)]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> float:
        """The largest distance of a pair's ratio from the median, as a fraction of it."""
        return spread(self.ratios)

    @property
    def cpu_ratios(self) -> list[float] | None:
        """Fleet's tokens per CPU-second over the bare side's, per pair, where both sides counted
        their CPU: what the machine's other load barely moves, unlike tok/s."""
        if not all(r.get("cpu_s") for r in self.fleet + self.bare):
            return None
        pairs = zip(self.fleet, self.bare, strict=True)
        return [(f["tokens"] / f["cpu_s"]) / (b["tokens"] / b["cpu_s"]) for f, b in pairs]

    @property
    def repeats(self) -> bool:
        return len(self.ratios) >= MIN_PAIRS and self.spread <= REPEAT_TOLERANCE

    def figures(self, what: str, target: float | None, note: str, fleet_name: str, bare_name: str) -> list[Figure]:
        """The median ratio (against its target, if any), the spread, each side's median tok/s."""
        ratio = round(self.median, 4)
        note = f"median of {len(self.ratios)} interleaved pairs; {note}"
        head = at_least(what, ratio, target, note=note) if target is not None else Figure(what, ratio, "x", note=note)
        pairs = ", ".join(f"{r:.3f}" for r in self.ratios)
        verdict = "within" if self.repeats else "NOT within"
        cpu = self.cpu_ratios
        extra = [] if cpu is None else [
            Figure("fleet / bare, tokens per CPU-second", round(statistics.median(cpu), 4), "x",
                   note=f"median; pairs {', '.join(f'{r:.3f}' for r in cpu)}, largest from the median "
                        f"{spread(cpu):.1%}"),
        ]  # fmt: skip
        return [
            head,
            Figure("largest pair ratio from the median", round(self.spread * 100, 2), "%",
                   note=f"pairs {pairs}: {verdict} {REPEAT_TOLERANCE:.0%}"),
            Figure(fleet_name, round(statistics.median(f["tok_s"] for f in self.fleet), 1), "tok/s",
                   note=f"median; {self.fleet[0]['tokens']:,} tokens, {median_seconds(self.fleet):.1f} s windows"),
            Figure(bare_name, round(statistics.median(b["tok_s"] for b in self.bare), 1), "tok/s",
                   note=f"median; {self.bare[0]['tokens']:,} tokens, {median_seconds(self.bare):.1f} s windows"),
            *extra,
        ]  # fmt: skip

    def data(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "ratio": self.median, "ratios": self.ratios, "spread": self.spread,
                "repeats_within": REPEAT_TOLERANCE, "repeats": self.repeats, "order": "fleet, bare, ...",
                "cpu_ratios": self.cpu_ratios, "probe": self.probe, "fleet": self.fleet, "bare": self.bare}  # fmt: skip


def spread(ratios: list[float]) -> float:
    middle = statistics.median(ratios)
    return max(abs(r / middle - 1) for r in ratios)


def median_seconds(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["seconds"] for r in runs)


def window_prompts(prompts: int, seconds: float, min_window_s: float, step: int, cap: int) -> int:
    """Prompts for a window of at least `min_window_s`, from a run of `prompts` that took
    `seconds`: scaled up, whole multiples of `step` (a chunk), never above `cap`."""
    if seconds >= min_window_s:
        return prompts
    wanted = prompts * min_window_s / max(seconds, 1e-3)
    return min(cap, max(prompts, step * math.ceil(wanted / step)))


def run_pairs(fleet: Side, bare: Side, pairs: int, prompts: int, min_window_s: float = 0.0,
              step: int = 1, cap: int = 1 << 20, log: Path | None = None) -> Pairs:  # fmt: skip
    """A bare probe sizes the window (also the untimed warm-up of caches), then `pairs`
    pairs run fleet first, bare second, one after the other. Each run is appended to `log`
    (JSON lines) as it ends: a run that dies an hour in keeps the pairs before it."""

    def logged(side: str, run: dict[str, Any]) -> dict[str, Any]:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                f.write(json.dumps({"side": side, **run}) + "\n")
        return run

    probe = None
    if min_window_s > 0:
        probe = logged("probe", bare(prompts, -1))
        prompts = window_prompts(prompts, probe["seconds"], min_window_s, step, cap)
    fleets, bares = [], []
    for i in range(pairs):
        fleets.append(logged("fleet", fleet(prompts, i)))
        bares.append(logged("bare", bare(prompts, i)))
    return Pairs(fleets, bares, prompts, probe)

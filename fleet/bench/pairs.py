"""Fleet against the bare engine as pairs: both sides at once on a shared core, or one after the other.

Where control groups can be made (fleet.bench.sharedcore), a pair runs fleet and the bare engine
at the same time on one core, each held to half of it, and compares their tok/s over the window
both were running in: fleet's steady state (its first chunk's start to its last chunk's start,
so its queue never ran dry) cut to the bare side's run. The core's own speed, which moves by a
fifth within seconds on a cloud VM, is then the same for both and cancels out of the ratio.
Elsewhere a pair runs fleet, then bare, back to back (the load can change between them).
The median of at least three pairs is reported, with whether every pair lies within
`REPEAT_TOLERANCE` of it: if not, the windows are too short for this machine.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet.bench.report import Figure, at_least
from fleet.bench.series import difference, overlap, value_at
from fleet.bench.sharedcore import Pen, SharedCoreUnavailable, open_pens

#: a pair's ratio "repeats" when it lies within this fraction of the median ratio
REPEAT_TOLERANCE = 0.05
MIN_PAIRS = 3
#: how a pair's two sides ran (fleet.bench.sharedcore)
SHARED = "at once on a shared CPU, each capped at half"
WEIGHED = "at once on a shared CPU, weighed equally"
APART = "one after the other"



@dataclass(frozen=True)
class Lane:
    """Where one run of a side goes: its pen (None: run as is), and for the bare side the file
    whose appearance ends it (None: one pass)."""

    pen: Pen | None = None
    until: Path | None = None

    def prefix(self) -> list[str]:
        """The argv that starts a command in this lane's pen (nothing without one)."""
        return self.pen.prefix() if self.pen is not None else []


ALONE = Lane()

Side = Callable[[int, int, Lane], dict[str, Any]]
"""One timed run of one side: (prompts, run index, lane) -> {"tokens", "seconds", "tok_s", ...}.
Beside the other side, fleet's run also gives "ramps" ([start, finish, tokens] per chunk) and
"cpu_samples" ([epoch, CPU seconds]); the bare run gives "progress" (fleet.bench.feed)."""


@dataclass
class Pairs:
    """The runs of both sides, in the order they ran, and what their ratios say."""

    fleet: list[dict[str, Any]]
    bare: list[dict[str, Any]]
    prompts: int
    #: the bare probe that sized the window (None: the profile's size was used as is)
    probe: dict[str, Any] | None = None
    #: SHARED or WEIGHED: both sides at once on the same CPUs; APART: one after the other
    how: str = APART
    #: why the pairs did not share a core (no control groups here), if they did not
    why_apart: str | None = None
    #: each pair's two raw runs (their whole job and pass) when the figures are from a common window
    raw: list[dict[str, Any]] = field(default_factory=list)
    #: the JSON-lines file every run went to as it ended (run_pairs' `log`), series and all
    log: Path | None = None

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
        how = self.how + (f": {self.why_apart}" if self.why_apart else "")
        note = f"median of {len(self.ratios)} pairs ({how}); {note}"
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
                   note=f"median; {self.fleet[0]['tokens']:,.0f} tokens, {median_seconds(self.fleet):.1f} s windows"),
            Figure(bare_name, round(statistics.median(b["tok_s"] for b in self.bare), 1), "tok/s",
                   note=f"median; {self.bare[0]['tokens']:,.0f} tokens, {median_seconds(self.bare):.1f} s windows"),
            *extra,
        ]  # fmt: skip

    def front_end_figures(self) -> list[Figure]:
        """Each side's front-end CPU per token, at the tokens per request of fleet's whole job."""
        job = self.raw[0]["fleet"] if self.raw else self.fleet[0]
        return front_end_figures(self.fleet, self.bare, job["tokens"] / job["prompts"])

    def data(self) -> dict[str, Any]:
        """The figures' inputs; a run's series (SERIES) only where no log beside it holds them."""
        order = "fleet, bare, ..." if self.how == APART else "fleet and bare at once"
        if self.log is None:
            runs, series = (lambda run: run), {"raw": self.raw}
        else:
            runs, series = summary, {"raw_runs": self.log.name}
        return {"prompts": self.prompts, "ratio": self.median, "ratios": self.ratios, "spread": self.spread,
                "repeats_within": REPEAT_TOLERANCE, "repeats": self.repeats, "how": self.how, "order": order,
                "why_apart": self.why_apart, "cpu_ratios": self.cpu_ratios,
                "probe": self.probe and runs(self.probe), "fleet": [runs(f) for f in self.fleet],
                "bare": [runs(b) for b in self.bare], **series}  # fmt: skip


#: a run's samples over time (fleet.bench.sides): what its log line holds besides its totals
SERIES = ("progress", "cpu_samples", "made_samples", "ramps")


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """A run without its series."""
    return {k: v for k, v in run.items() if k not in SERIES}


def front_end_figures(fleet: list[dict[str, Any]], bare: list[dict[str, Any]],
                      tokens_per_request: float) -> list[Figure]:  # fmt: skip
    """Each side's front-end CPU per output token (medians over the pairs' windows), and what
    fleet adds per token and per request: the worker's own work besides what vLLM's client does
    on both sides."""
    if not all(r.get("cpu_s") for r in fleet + bare):
        return []
    per_token = [[r["cpu_s"] / r["tokens"] * 1e6 for r in runs] for runs in (fleet, bare)]
    extra_us = statistics.median(f - b for f, b in zip(*per_token, strict=True))
    return [
        Figure("fleet worker CPU per output token", round(statistics.median(per_token[0]), 2), "us",
               note=f"median; the worker process over each window, engine processes excluded; runs "
                    f"{', '.join(f'{v:.1f}' for v in per_token[0])}"),
        Figure("bare loop CPU per output token", round(statistics.median(per_token[1]), 2), "us",
               note=f"median; runs {', '.join(f'{v:.1f}' for v in per_token[1])}"),
        Figure("fleet's extra CPU per request", round(extra_us * tokens_per_request / 1e3, 3), "ms",
               note=f"median of the pairs' differences: {extra_us:.1f} us per token, {tokens_per_request:.0f} "
                    "tokens a request"),
    ]  # fmt: skip


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


#: fleet's steady state (until its last chunk starts) counts when it is at least this share of its job
STEADY_SHARE = 0.5
#: where fleet's published token count is read, its window starts this long after its first chunk
PUBLISHED_LAG_S = 2.0


def run_pairs(fleet: Side, bare: Side, pairs: int, prompts: int, min_window_s: float = 0.0,
              step: int = 1, cap: int = 1 << 20, log: Path | None = None, scratch: Path | None = None,
              together: bool = True, capped: bool = True) -> Pairs:  # fmt: skip
    """A bare probe sizes the window (also the untimed warm-up of caches), then `pairs` pairs,
    on a shared CPU where control groups can be made (and `together`, and a `scratch` directory
    for the stop files is given; each side capped at its half, or only weighed equally), else
    fleet first, bare second. Each run is appended to `log`
    (JSON lines) as it ends: a run that dies an hour in keeps the pairs before it."""

    def logged(side: str, run: dict[str, Any]) -> dict[str, Any]:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                f.write(json.dumps({"side": side, **run}) + "\n")
        return run

    if together and scratch is not None:
        try:
            with open_pens(("fleet", "bare"), capped) as (fleet_pen, bare_pen):
                lanes = Lane(fleet_pen), Lane(bare_pen)
                result = _together(fleet, bare, pairs, prompts, min_window_s, step, cap, logged, scratch, lanes, capped)
                return replace(result, log=log)
        except SharedCoreUnavailable as e:
            why = str(e)
    else:
        why = "asked for one after the other" if not together else "no scratch directory for the stop files"
    probe = None
    if min_window_s > 0:
        probe = logged("probe", bare(prompts, -1, ALONE))
        prompts = window_prompts(prompts, probe["seconds"], min_window_s, step, cap)
    fleets, bares = [], []
    for i in range(pairs):
        fleets.append(logged("fleet", fleet(prompts, i, ALONE)))
        bares.append(logged("bare", bare(prompts, i, ALONE)))
    return Pairs(fleets, bares, prompts, probe, why_apart=why, log=log)


def _together(fleet: Side, bare: Side, pairs: int, prompts: int, min_window_s: float, step: int, cap: int,
              logged: Callable[[str, dict[str, Any]], dict[str, Any]], scratch: Path,
              lanes: tuple[Lane, Lane], capped: bool) -> Pairs:  # fmt: skip
    """Each pair: the bare side starts, fleet runs its job beside it, and the bare side stops
    when fleet's job is done; both are counted over the window they shared."""
    fleet_lane, bare_lane = lanes
    probe = None
    if min_window_s > 0:  # alone in its pen: the pace each side gets beside the other
        probe = logged("probe", bare(prompts, -1, bare_lane))
        prompts = window_prompts(prompts, probe["seconds"], min_window_s, step, cap)
    fleets, bares, raw = [], [], []
    for i in range(pairs):
        until = scratch / f"pair-{i}.stop"
        until.unlink(missing_ok=True)
        with ThreadPoolExecutor(2) as pool:
            bare_run = pool.submit(bare, prompts, i, Lane(bare_lane.pen, until))
            try:
                fleet_run = logged("fleet", fleet(prompts, i, fleet_lane))
            finally:
                until.touch()
            bare_done = logged("bare", bare_run.result())
        f, b = common_window(fleet_run, bare_done)
        fleets.append(f)
        bares.append(b)
        raw.append({"fleet": fleet_run, "bare": bare_done})
    return Pairs(fleets, bares, prompts, probe, how=SHARED if capped else WEIGHED, raw=raw)


def common_window(fleet: dict[str, Any], bare: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' tokens, tok/s and CPU over the window they shared: fleet's steady state (first
    chunk start to last chunk start: every chunk slot held) within the bare side's run. A job of
    a few chunks has no steady state worth the name (under STEADY_SHARE of it): its whole run.
    Fleet's tokens are what its worker published as made while they streamed (sampled from the
    broker); without those samples, its chunks' results, each spread evenly over its run."""
    ramps, progress = fleet["ramps"], bare["progress"]
    first, last_start, last_end = min(r[0] for r in ramps), max(r[0] for r in ramps), max(r[1] for r in ramps)
    steady = last_start if last_start - first >= STEADY_SHARE * (last_end - first) else last_end
    # a steady state is read from the count the worker published (about once a second per chunk:
    # from a few seconds in, it lags alike at both ends); a whole job from its results, exactly
    published = [(t, v) for t, v in fleet.get("made_samples") or []] if steady == last_start else []
    first += PUBLISHED_LAG_S if published else 0.0
    start, end = max(first, progress[0][0]), min(steady, progress[-1][0])
    if end <= start:
        raise ValueError("the sides never ran at once: fleet's steady state and the bare run do not overlap")
    seconds = end - start
    made = difference(published, start, end)  # the tokens the worker made, as it published them
    if made is None:  # each chunk's tokens spread evenly over its run: fleet's chunks wait for the
        made = sum(t * overlap(s, e, start, end) for s, e, t in ramps)  # engine, so this counts early
    bare_made = value_at([(p[0], p[1]) for p in progress], end) - value_at([(p[0], p[1]) for p in progress], start)
    bare_cpu = [(p[0], p[2]) for p in progress]
    fleet_cpu = [tuple(x) for x in fleet.get("cpu_samples") or []]
    common = {"window": [start, end], "seconds": seconds}
    return (
        {"prompts": fleet["prompts"], "tokens": made, "tok_s": made / seconds, **common,
         "cpu_s": difference(fleet_cpu, start, end)},
        {"prompts": bare["prompts"], "tokens": bare_made, "tok_s": bare_made / seconds, **common,
         "cpu_s": difference(bare_cpu, start, end)},
    )  # fmt: skip

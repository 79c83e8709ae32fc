"""Figures of a finished job, computed from its results in the store and nothing else.

Each result carries its chunk's wall start and finish and every record's completion
tokens. The sim engine holds a slot for prefill_s + tokens x step_s per request, so a
job's busy slot-seconds are known exactly from its records, whichever worker ran them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.store import Store
from fleet.store.results import read_result


@dataclass
class ChunkTiming:
    index: int
    worker: str
    started: float
    finished: float
    tokens: int
    #: slot-seconds of simulated work in this chunk: sum of prefill_s + tokens x step_s
    work_slot_s: float
    lengths: list[int] = field(default_factory=list)


@dataclass
class JobRun:
    job: str
    chunks: list[ChunkTiming]

    @property
    def first_start(self) -> float:
        return min(c.started for c in self.chunks)

    @property
    def last_finish(self) -> float:
        return max(c.finished for c in self.chunks)

    @property
    def makespan_s(self) -> float:
        """From the first chunk's start to the last result (docs/architecture.md's occupancy window)."""
        return self.last_finish - self.first_start

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def work_slot_s(self) -> float:
        return sum(c.work_slot_s for c in self.chunks)

    @property
    def workers(self) -> set[str]:
        return {c.worker for c in self.chunks}


def read_job(store: Store, job: str, chunks: int, step_s: float = 0.0, prefill_s: float = 0.0) -> JobRun:
    out = []
    for index in range(chunks):
        stats, rows = read_result(store, job, index)
        if stats is None or stats.started is None or stats.finished is None:
            raise ValueError(f"chunk {index} of job {job} has no timed stats header")
        lengths = [int(r.get("completion_tokens") or 0) for r in rows]
        out.append(ChunkTiming(
            index=index,
            worker=stats.worker or "?",
            started=stats.started,
            finished=stats.finished,
            tokens=sum(lengths),
            work_slot_s=sum(prefill_s + n * step_s for n in lengths),
            lengths=lengths,
        ))
    return JobRun(job, out)


def occupancy(run: JobRun, workers: int, slots: int) -> float:
    """Busy slot-seconds over total slot-seconds of the fleet during the job."""
    return run.work_slot_s / (workers * slots * run.makespan_s)


def ideal_makespan_s(run: JobRun, workers: int, slots: int) -> float:
    """Total simulated work over fleet capacity; no schedule can finish sooner, nor before
    its single longest request has run."""
    longest = max((max(c.lengths, default=0) for c in run.chunks), default=0)
    per_token = run.work_slot_s / max(run.tokens, 1)
    return max(run.work_slot_s / (workers * slots), longest * per_token)


def throughput(run: JobRun) -> float:
    """Output tokens per second over the job's window."""
    return run.tokens / run.makespan_s


def timeline(run: JobRun, workers: int, slots: int, bins: int = 120) -> dict[str, list[float]]:
    """Chunk-averaged occupancy and chunks in flight over time, in `bins` equal steps.

    Results record when a chunk started and finished, not when each request held a
    slot, so each chunk's work is spread evenly over its own run. The curve has the
    measured mean exactly, but smooths within a chunk and can locally exceed 1.
    """
    t0, span = run.first_start, run.makespan_s
    width = span / bins
    busy = [0.0] * bins
    flight = [0.0] * bins
    for c in run.chunks:
        a, b = c.started - t0, c.finished - t0
        rate = c.work_slot_s / max(b - a, 1e-9)
        for i in range(max(0, int(a / width)), min(bins, int(b / width) + 1)):
            lo, hi = i * width, (i + 1) * width
            overlap = max(0.0, min(b, hi) - max(a, lo))
            busy[i] += rate * overlap
            flight[i] += overlap / width
    cap = workers * slots * width
    return {
        "t_s": [round((i + 0.5) * width, 4) for i in range(bins)],
        "occupancy": [round(x / cap, 4) for x in busy],
        "chunks_in_flight": [round(x, 3) for x in flight],
    }



def steady_throughput(run: JobRun) -> float | None:
    """Output tok/s while the queue is non-empty: the sum over workers of each one's rate
    from its first chunk start to its last dequeue, when it holds its full K chunks.

    Each chunk's tokens are spread evenly over its run, which undercounts the window's
    end a little; measuring each worker over its own window keeps that bias the same per
    worker, so ratios between fleets of different sizes cancel it.
    """
    total = 0.0
    for worker in run.workers:
        mine = [c for c in run.chunks if c.worker == worker]
        a, b = min(c.started for c in mine), max(c.started for c in mine)
        if b <= a:
            return None
        tokens = sum(c.tokens * max(0.0, min(b, c.finished) - max(a, c.started)) / max(c.finished - c.started, 1e-9)
                     for c in mine)
        total += tokens / (b - a)
    return total

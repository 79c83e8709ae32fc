"""How the CLI shows a fleet.progress callback: a live rich display (count, rate, ETA) on a
terminal; on a pipe or a log file, one plain line when a phase ends, or every
`LINE_INTERVAL_S` during a long one, so logs stay readable and greppable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from fleet.progress import Progress

#: seconds between two lines of a long phase when not on a terminal
LINE_INTERVAL_S = 30.0


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text("" if task.speed is None else f"{task.speed:,.0f} records/s", style="progress.data.speed")


@contextmanager
def live_progress(console: Console, unit: str = "records") -> Iterator[Progress]:
    if console.is_terminal:
        with _rich(console) as report:
            yield report
    else:
        yield _lines(console, unit)


@contextmanager
def _rich(console: Console) -> Iterator[Progress]:
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with RichProgress(*columns, console=console) as bar:
        tasks: dict[str, int] = {}

        def report(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield report


def _lines(console: Console, unit: str) -> Progress:
    started: dict[str, float] = {}
    last: dict[str, float] = {}
    finished: set[str] = set()

    def report(phase: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        began = started.setdefault(phase, now)
        ended = total is not None and done >= total and (done > 0 or total == 0)
        if phase in finished or not (ended or now - last.get(phase, began) >= LINE_INTERVAL_S):
            return
        last[phase] = now
        elapsed = now - began
        rate = f", {done / elapsed:,.0f} {unit}/s" if elapsed > 0 else ""
        of = f"/{total:,}" if total is not None and not ended else ""
        console.print(
            f"{phase}: {done:,}{of} {unit}{rate}, {elapsed:.1f}s{' done' if ended else ''}",
            highlight=False,
            soft_wrap=True,
        )
        if ended:
            finished.add(phase)

    return report

"""Progress reports from long producer/export steps, without any UI: the core functions take
an optional `Progress` callback and the CLI decides how to show it (fleet/cli/liveprogress.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: progress(phase, done, total): `done` items of `total` (None = not known yet) in `phase`.
Progress = Callable[[str, int, int | None], None]

#: Report every this many items: often enough for a live display, cheap for a million records.
EVERY = 1000


def counted(
    items: Iterable[T], progress: Progress | None, phase: str, total: int | None = None, every: int = EVERY
) -> Iterator[T]:
    """`items` unchanged, reporting the running count to `progress` every `every` items and at the end."""
    if progress is None:
        yield from items
        return
    done = 0
    progress(phase, 0, total)
    for item in items:
        yield item
        done += 1
        if done % every == 0:
            progress(phase, done, total)
    progress(phase, done, total if total is not None else done)

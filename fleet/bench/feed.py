"""How the bare sides feed their engine: every prompt at once, each finished request replaced.

One pass (no `until`) submits every prompt at once and ends with the last, as the bare sides
always have. Beside a fleet run on a shared core (fleet.bench.sharedcore) the bare side must
keep going for as long as fleet does, so each finished request is replaced by the next prompt
(cycling) until the file `until` appears: the engine always holds every prompt, as it would
under a fleet whose queue never runs dry. Every request's end is a progress point, so the
benchmark can count the bare side's tokens over exactly the window it counts fleet's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

#: seconds between looks for the `until` file
UNTIL_POLL_S = 0.05


async def feed(one: Callable[[int], Awaitable[int]], count: int, until: Path | None = None) -> dict[str, Any]:
    """Run `one(i)` (output tokens of request i; prompt i % count) for i in 0..count-1 at once,
    and with `until`, i + count, i + 2 count, ... in each one's place until that file exists.

    Returns tokens, seconds, tok_s and this process's CPU seconds over what ran, and
    `progress`: [epoch seconds, tokens so far, CPU seconds so far] at the start and at each end.
    """
    began, cpu0 = time.perf_counter(), time.process_time()
    progress: list[list[float]] = [[time.time(), 0, 0.0]]
    made = 0

    async def lane(i: int) -> None:
        nonlocal made
        while True:
            tokens = await one(i)  # awaited first: `made += await ...` would add to a stale `made`
            made += tokens
            progress.append([time.time(), made, time.process_time() - cpu0])
            i += count
            if until is None or until.exists():
                return

    lanes = [asyncio.ensure_future(lane(i)) for i in range(count)]
    try:
        if until is None:
            await asyncio.gather(*lanes)
        else:
            while not until.exists() and not all(t.done() for t in lanes):
                await asyncio.sleep(UNTIL_POLL_S)
            for t in lanes:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
    finally:
        for t in lanes:
            t.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
    seconds, cpu_s = time.perf_counter() - began, time.process_time() - cpu0
    return {"prompts": count, "tokens": made, "seconds": seconds, "tok_s": made / seconds, "cpu_s": cpu_s,
            "progress": progress}  # fmt: skip

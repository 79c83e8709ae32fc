"""How the bare sides feed their engine: a few times its slots in flight, each end replaced.

One pass (no `until`) runs every prompt once and ends with the last. Beside a fleet run on a
shared CPU (fleet.bench.sharedcore) the bare side must keep going for as long as fleet does, so
it cycles over the prompts until the file `until` appears: the engine always holds more than it
can run, as it would under a fleet whose queue never runs dry. Not every prompt at once: with
1,536 requests in flight this process made 10% fewer tokens per CPU-second than with 64 (two
runs each, one HfEngine of 16 slots, the same CPU), work of the feeder's own that fleet's
worker, which lets S + max(4, S / 4) into the engine, never pays. Every request's end is a
progress point, so the benchmark can count the bare side's tokens over exactly the window it
counts fleet's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

#: seconds between looks for the `until` file
UNTIL_POLL_S = 0.05
#: requests in flight per engine slot
IN_FLIGHT_PER_SLOT = 4


async def feed(one: Callable[[int], Awaitable[int]], count: int, slots: int,
               until: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Run `one(i)` (output tokens of request i; prompt i % count) for i = 0, 1, 2, ... with
    IN_FLIGHT_PER_SLOT x `slots` at once: up to count - 1, or with `until` until that file exists.

    Returns tokens, seconds, tok_s and this process's CPU seconds over what ran, and
    `progress`: [epoch seconds, tokens so far, CPU seconds so far] at the start and at each end.
    """
    began, cpu0 = time.perf_counter(), time.process_time()
    progress: list[list[float]] = [[time.time(), 0, 0.0]]
    made, issued = 0, 0

    async def lane() -> None:
        nonlocal made, issued
        while (until is None and issued < count) or (until is not None and not until.exists()):
            i, issued = issued, issued + 1
            tokens = await one(i)  # awaited first: `made += await ...` would add to a stale `made`
            made += tokens
            progress.append([time.time(), made, time.process_time() - cpu0])

    lanes = [asyncio.ensure_future(lane()) for _ in range(min(count, IN_FLIGHT_PER_SLOT * slots))]
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
            "in_flight": len(lanes), "progress": progress}  # fmt: skip

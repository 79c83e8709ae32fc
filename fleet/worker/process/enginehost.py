"""One long-lived asyncio loop thread that owns the engine.

SGLang's receive loop binds to the first event loop that uses it, and Celery's thread
slots must not each call run_until_complete; so every engine call from every slot is
submitted to this one loop (docs/architecture.md, SGLang facts).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from fleet.engines.base import Engine
from fleet.metrics import ENGINE_MAX_RUNNING
from fleet.worker.process.watchdog import EngineClock

T = TypeVar("T")
log = logging.getLogger(__name__)


def admission_limit(max_running: int) -> int:
    """Requests let into the engine at once: its slots plus a queue that keeps it fed.

    The rest wait here, where fleet can still skip or reorder them (longest first, or
    left to a helper at the end of a job), instead of in the engine's own queue.
    """
    return max_running + max(4, max_running // 4)


class EngineHost:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.gate: asyncio.Semaphore | None = None
        #: when the engine last made a token while it had requests (fleet.worker.process.watchdog)
        self.clock = EngineClock()
        self._thread = threading.Thread(target=self._run, name="fleet-engine-loop", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self, timeout_s: float | None = None) -> None:
        """Start the loop thread and the engine on it; raises what engine.start() raised."""
        self._thread.start()
        self.submit(self._start()).result(timeout=timeout_s)

    async def _start(self) -> None:
        await self.engine.start()
        # After start: SGLang may run fewer requests than were asked (read back by the engine).
        limit = admission_limit(self.engine.max_running)
        self.gate = asyncio.Semaphore(limit)
        log.info("admission gate %d requests (engine runs %d)", limit, self.engine.max_running)
        ENGINE_MAX_RUNNING.set(self.engine.max_running)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout_s: float = 60) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.submit(self.engine.shutdown()).result(timeout=timeout_s)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

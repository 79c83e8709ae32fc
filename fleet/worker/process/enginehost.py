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
from fleet.worker.process.startclock import CLOCK
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
        self._starting: concurrent.futures.Future[None] | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def begin(self) -> None:
        """Start the loop thread and the engine on it, and return at once (once only)."""
        if self._starting is None:
            CLOCK.mark("engine_begun")
            self._thread.start()
            self._starting = self.submit(self._start())

    def start(self, timeout_s: float | None = None) -> None:
        """Start the engine (unless `begin` did) and wait until it is ready; raises what engine.start() raised."""
        self.begin()
        assert self._starting is not None
        self._starting.result(timeout=timeout_s)

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


#: this process's engine, started early by the worker's main module (`start_early`), for its runtime to take
_early: EngineHost | None = None


def start_early(engine: Engine) -> EngineHost:
    """Start this process's engine now, while the rest of the process starts: Celery's imports and setup
    take a second or more that a GPU would otherwise spend waiting for the engine to begin loading. The
    runtime takes it (`take_early`) and waits for it to be ready before it reads the model and before
    Celery consumes (docs/architecture.md, "A worker's start")."""
    global _early
    _early = EngineHost(engine)
    _early.begin()
    return _early


def take_early() -> EngineHost | None:
    """The engine `start_early` started, once; None where none was (a worker started by `celery -A`)."""
    global _early
    host, _early = _early, None
    return host

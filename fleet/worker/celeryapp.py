"""The Celery app of a worker process, wired to fleet's runtime through Celery signals.

`celery -A fleet.worker.celeryapp` and Flower load this module, so it builds the app from the
same settings object as every other process.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals

from fleet.coord.broker import TASK_NAME, make_celery
from fleet.settings import load_settings
from fleet.worker.process.startclock import CLOCK
from fleet.worker.runtime import Runtime

log = logging.getLogger(__name__)

settings = load_settings()
app = make_celery(settings)
CLOCK.mark("imported")
_runtime: Runtime | None = None


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("fleet runtime not started (worker not booted)")
    return _runtime


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def run_chunk_task(self: Any, job: str, index: int, attempt: int = 1) -> dict[str, Any]:
    return runtime().run_chunk(job, index, attempt)


@signals.celeryd_after_setup.connect
def _boot(sender: str, instance: Any, **_: Any) -> None:
    # Load the engine before the consumer starts, so no chunk waits on a cold engine.
    # Celery logs and swallows a receiver's exception; a worker without its engine must
    # not consume chunks, so exit and let the supervisor restart it with backoff.
    global _runtime
    CLOCK.mark("runtime")
    try:
        _runtime = Runtime(settings, app, sender)
        _runtime.start()
    except BaseException:
        log.exception("worker %s failed to start; exiting for restart", sender)
        logging.shutdown()
        os._exit(3)


@signals.worker_ready.connect
def _consuming(**_: Any) -> None:
    CLOCK.mark("consuming")


@signals.worker_shutting_down.connect
def _shutting_down(**_: Any) -> None:
    if _runtime is not None:
        _runtime.begin_shutdown()


@signals.worker_shutdown.connect
def _shutdown(**_: Any) -> None:
    if _runtime is not None:
        _runtime.stop()

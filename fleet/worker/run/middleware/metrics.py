"""Prometheus figures of this worker (fleet.metrics) from each run's outcome."""

from __future__ import annotations

from fleet import metrics
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Committed, Failed, Outcome


class MetricsMiddleware(Middleware[None]):
    order = Order.METRICS

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        metrics.RUNNING_CHUNKS.inc()
        return None

    def after(self, run: ChunkRun, state: None, outcome: Outcome) -> None:
        metrics.RUNNING_CHUNKS.dec()
        if isinstance(outcome, Committed):
            s = outcome.stats
            metrics.observe_chunk(
                s.seconds, prompt_tokens=s.prompt_tokens, completion_tokens=s.completion_tokens,
                records_ok=s.samples - s.errors, records_error=s.errors, accept_length=s.spec_accept_length,
                retractions=s.retractions,
            )
        elif isinstance(outcome, Failed):
            metrics.RUNS_FAILED.inc()
            metrics.count_error(outcome.cause)

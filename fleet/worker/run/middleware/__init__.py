"""Policies around the chunk task, one small middleware each (docs/architecture.md)."""

from __future__ import annotations

from fleet.worker.process.context import WorkerContext
from fleet.worker.run.middleware.admission import AdmissionMiddleware
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.middleware.checkpoint import CheckpointMiddleware
from fleet.worker.run.middleware.configmatch import ConfigGate
from fleet.worker.run.middleware.crash import CrashMiddleware
from fleet.worker.run.middleware.gates import ManifestGate, ResultGate, StopGate
from fleet.worker.run.middleware.lease import AssistLeaseMiddleware, LeaseMiddleware
from fleet.worker.run.middleware.limits import LimitsGate
from fleet.worker.run.middleware.metrics import MetricsMiddleware
from fleet.worker.run.middleware.retry import RetryMiddleware
from fleet.worker.run.middleware.runprogress import ProgressMiddleware
from fleet.worker.run.middleware.stats import StatsMiddleware

__all__ = ["Middleware", "Order", "assist_stack", "owner_stack"]


def owner_stack(ctx: WorkerContext) -> list[Middleware]:
    """A delivered chunk: the only stack that requeues or quarantines."""
    return [MetricsMiddleware(ctx), StatsMiddleware(ctx), RetryMiddleware(ctx), CrashMiddleware(ctx),
            ResultGate(ctx), StopGate(ctx), ManifestGate(ctx), ConfigGate(ctx), LimitsGate(ctx), LeaseMiddleware(ctx),
            AdmissionMiddleware(ctx), ProgressMiddleware(ctx), CheckpointMiddleware(ctx)]


def assist_stack(ctx: WorkerContext) -> list[Middleware]:
    """An end-of-job helper: never requeues, never quarantines; the owner stays responsible. It
    helps a chunk that is running, so a job's limits do not stop it (running chunks finish)."""
    return [MetricsMiddleware(ctx), StatsMiddleware(ctx), CrashMiddleware(ctx), ResultGate(ctx), StopGate(ctx),
            ManifestGate(ctx), ConfigGate(ctx), AssistLeaseMiddleware(ctx), AdmissionMiddleware(ctx),
            ProgressMiddleware(ctx), CheckpointMiddleware(ctx)]

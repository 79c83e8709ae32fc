"""The error tree. A class decides recovery; code never matches message text."""

from __future__ import annotations


class FleetError(Exception):
    """Root of every error fleet raises on purpose."""


class ConfigError(FleetError):
    """Settings or a job configuration that cannot work; fix and rerun."""


class JobConflict(ConfigError):
    """The job name exists with a different output-shaping configuration."""


class InputError(FleetError):
    """The input file has bad lines; nothing was enqueued."""

    def __init__(self, problems: list[str], total_bad: int | None = None):
        self.problems = problems
        self.total_bad = total_bad if total_bad is not None else len(problems)
        shown = "\n".join(f"  {p}" for p in problems)
        more = self.total_bad - len(problems)
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{self.total_bad} bad input line(s), nothing enqueued:\n{shown}{tail}")


class StoreError(FleetError):
    """The store failed after botocore's own retries; the chunk attempt fails, nothing is lost."""


class ObjectMissing(StoreError):
    """A key that should exist does not."""


class ChunkCorrupt(FleetError):
    """A chunk object cannot be decoded: retrying will not help, quarantine it."""


class RecordError(FleetError):
    """One record fails alone (prompt too long, rejected by the engine); the chunk goes on."""


class EngineError(FleetError):
    """The engine is gone or broken: release the chunk, requeue it, let the supervisor restart."""


class ChunkReleased(FleetError):
    """The worker is stopping: finished records were checkpointed and the chunk handed back."""


class ChunkSuperseded(FleetError):
    """Another worker committed this chunk first (end-of-job assist): drop this copy."""


class BrokerMissing(FleetError):
    """A local redis-server was needed but is not installed."""


class ServiceUnreachable(FleetError):
    """The broker or the store cannot be reached (or refuses the login): nothing was
    written; the message names the redacted URL, what failed and what to check."""


class BrokerUnreachable(ServiceUnreachable):
    """The Redis broker does not answer."""


class StoreUnreachable(ServiceUnreachable, StoreError):
    """The S3 endpoint does not answer; a StoreError too, so a worker treats it as one."""

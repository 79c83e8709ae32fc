"""The error tree. A class decides recovery; code never matches message text.

Each class states whose fault it is (`fault`); fleet.coord.retry reads only that.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class Fault(Enum):
    #: the chunk itself fails: spend an attempt
    CHUNK = "chunk"
    #: retrying cannot help (the chunk object is broken): quarantine now
    HOPELESS = "hopeless"
    #: the process running it died (engine death, worker loss): blamed only on evidence
    CRASH = "crash"
    #: store, broker or network: never the chunk's fault; requeue with backoff
    INFRA = "infra"


class FleetError(Exception):
    """Root of every error fleet raises on purpose."""

    #: an unknown failure is the chunk's until shown otherwise
    fault: ClassVar[Fault] = Fault.CHUNK


class ConfigError(FleetError):
    """Settings or a job configuration that cannot work; fix and rerun."""


class JobConflict(ConfigError):
    """The job name exists with a different output-shaping configuration."""


class InputError(FleetError):
    """The input file has bad lines (or rows: `unit`, the input format's word); nothing was enqueued."""

    def __init__(self, problems: list[str], total_bad: int | None = None, unit: str = "line"):
        self.problems, self.unit = problems, unit
        self.total_bad = total_bad if total_bad is not None else len(problems)
        shown = "\n".join(f"  {p}" for p in problems)
        more = self.total_bad - len(problems)
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{self.total_bad} bad input {unit}(s), nothing enqueued:\n{shown}{tail}")


class InputUnusable(InputError):
    """The input as a whole holds nothing to read (empty, compressed, UTF-16): no line is to
    blame, so it counts no bad line and says what the file is instead."""

    def __init__(self, reason: str, unit: str = "line"):
        FleetError.__init__(self, f"{reason}; nothing enqueued")
        self.problems, self.total_bad, self.unit = [reason], 0, unit


class StoreError(FleetError):
    """The store failed after botocore's own retries; the chunk attempt fails, nothing is lost."""

    fault = Fault.INFRA


class ObjectMissing(StoreError):
    """A key that should exist does not (a chunk object lost under its manifest: hopeless)."""

    fault = Fault.HOPELESS


class ChunkCorrupt(FleetError):
    """A chunk object cannot be decoded: retrying will not help, quarantine it."""

    fault = Fault.HOPELESS


class AccessRefused(ConfigError):
    """A service refuses fleet itself: its key (401), its permission (403), the model or path it
    names (404). No retry passes it: a job's start fails with what to fix, and a chunk that meets it
    mid-run is quarantined at once (`fleet enqueue --retry-failed` once the settings are fixed)."""

    fault = Fault.HOPELESS


class RecordError(FleetError):
    """One record fails alone (prompt too long, rejected by the engine); the chunk goes on."""


class EngineError(FleetError):
    """The engine is gone or broken: release the chunk, requeue it, let the supervisor restart."""

    fault = Fault.CRASH


class EngineUnavailable(FleetError):
    """The engine cannot be reached for now (a lost server connection, a blip) but nothing says it
    is broken: an infrastructure fault, requeued with backoff; no attempt spent, no death counted,
    the worker not restarted."""

    fault = Fault.INFRA


class WorkerLost(FleetError):
    """A chunk's lease expired with no result: its worker died (SIGKILL, OOM, host loss)."""

    fault = Fault.CRASH


class BrokerMissing(FleetError):
    """A local redis-server was needed but is not installed."""


class ExportMismatch(FleetError):
    """An export's records disagree with the manifest (count, duplicate or order): not written."""


class TargetUnwritable(FleetError):
    """An export's target cannot be written (a directory, read-only, a file as parent, a full
    disk, a missing bucket): nothing was left there; the message names the target and why."""


class ServiceUnreachable(FleetError):
    """The broker or the store cannot be reached (or refuses the login): nothing was
    written; the message names the redacted URL, what failed and what to check."""


class BrokerUnreachable(ServiceUnreachable):
    """The Redis broker does not answer."""


class StoreUnreachable(ServiceUnreachable, StoreError):
    """The S3 endpoint does not answer; a StoreError too, so a worker treats it as one."""

"""A job's options: what a user sets per job and may change later without it becoming another job.

They live beside the manifest (`<job>/options.json`), outside the configuration hash, so changing
one never changes the job's identity. An unset option (None) falls back to the worker's settings,
as dramatiq's message options fall back to actor options, then to defaults: the fleet-wide policy
stays in the settings, and a job overrides only what it names (docs/architecture.md, "Job options").

Readers: the retry policy (the worker's retry middleware and the reaper, `RetryPolicy.for_job`),
the chunk queue (a job's priority decides which job's chunks a worker takes first), the worker's
limits gate (a deadline or token budget holds a job's chunks that have not started, `JobOptions.held`),
`fleet status`.
Writers: `fleet enqueue` and `fleet job set` (fleet.producer.jobset).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.errors import ConfigError, ObjectMissing
from fleet.store import Store
from fleet.store.layout import options_key

log = logging.getLogger(__name__)
#: a job's priority: higher runs first; 0 is every job's unless set (fleet.coord.broker maps it to a message priority)
MIN_PRIORITY, MAX_PRIORITY = -3, 5
#: seconds a worker or reaper trusts its copy of a job's options before reading them again: how soon
#: a `fleet job set` reaches the retry policy of a running fleet
OPTIONS_MAX_AGE_S = 5.0
#: a deadline given as a duration from now: 90m, 6h, 2d
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class JobOptions(BaseModel):
    """One field per option. A new option is a field here plus its readers; None = the fleet's setting."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    priority: int = Field(
        0, ge=MIN_PRIORITY, le=MAX_PRIORITY,
        description=f"which job's chunks workers take first, {MIN_PRIORITY} to {MAX_PRIORITY}, higher first; "
        "chunks handed back after a lost or stopping worker still come before every job's fresh ones",
    )
    max_attempts: int | None = Field(
        None, ge=1, description="failed attempts before a chunk is quarantined (unset: the fleet's max_attempts)"
    )
    max_crashes: int | None = Field(
        None, ge=1, description="deaths of processes that ran a chunk alone, on one host, that quarantine it "
        "(unset: the fleet's max_crashes)"
    )
    deadline: datetime | None = Field(
        None, description="no chunk of the job starts after this time (UTC; ISO 8601, or a duration from now "
        "such as 90m, 6h, 2d); chunks running then finish, the rest wait until it is moved or unset"
    )
    token_budget: int | None = Field(
        None, ge=1, description="output tokens the engines may make for the job, every run counted (what the "
        "GPUs were paid for); once made, no further chunk starts, running ones finish"
    )
    #: when the options were last written (for people; no reader decides by it)
    updated: str | None = None

    @field_validator("priority", mode="before")
    @classmethod
    def _unset_priority(cls, value: object) -> object:
        """`priority=` sets it back to every job's, 0."""
        return 0 if value is None else value

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_from_now(cls, value: object) -> object:
        """A duration (`6h`) is from now; a time without a zone is UTC."""
        if isinstance(value, str) and (m := _DURATION.match(value)):
            return datetime.now(UTC) + timedelta(seconds=float(m[1]) * _UNIT_S[m[2]])
        return value

    @field_validator("deadline")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def held(self, made_tokens: int | None, now: datetime | None = None) -> str | None:
        """Why no further chunk of the job may start (None: they may): its deadline has passed, or
        the engines made `made_tokens` (every run of the job's chunks) of its budget or more. The
        one decision, read by the worker's limits gate and by `fleet status`."""
        if self.deadline is not None and (now or datetime.now(UTC)) >= self.deadline:
            return (f"past its deadline {self.deadline:%Y-%m-%d %H:%M:%S} UTC: chunks not started wait "
                    "(`fleet job set --job JOB deadline=...` moves it)")
        if self.token_budget is not None and made_tokens is not None and made_tokens >= self.token_budget:
            return (f"its token budget is spent ({made_tokens:,} of {self.token_budget:,} output tokens made): "
                    "chunks not started wait (`fleet job set --job JOB token_budget=...` raises it)")
        return None

    def to_bytes(self) -> bytes:
        return self.model_dump_json(indent=2).encode()

    def changed(self, assignments: dict[str, object]) -> JobOptions:
        """These options with `assignments` (name -> value, strings as typed) applied; ConfigError
        naming the field when a name is unknown or a value invalid."""
        unknown = sorted(set(assignments) - set(settable()))
        if unknown:
            raise ConfigError(f"unknown job option {unknown[0]!r}: the options are {', '.join(settable())}")
        values = {**self.model_dump(), **{k: none_of(v) for k, v in assignments.items()}}
        values["updated"] = datetime.now(UTC).isoformat()
        try:
            return JobOptions.model_validate(values)
        except ValidationError as e:
            err = e.errors()[0]
            raise ConfigError(f"job option {'.'.join(str(p) for p in err['loc'])}="
                              f"{assignments.get(str(err['loc'][0]))}: {err['msg']}") from None

    def summary(self) -> str:
        """One line for `fleet status`: every option, unset ones as the fleet's."""
        shown = {**self.model_dump(exclude={"updated"}),
                 "deadline": None if self.deadline is None else f"{self.deadline:%Y-%m-%dT%H:%M:%SZ}"}
        return ", ".join(f"{name} {UNSET.get(name, '(fleet setting)') if value is None else value}"
                         for name, value in shown.items())


#: how `summary` names an unset option that has no fleet setting behind it
UNSET = {"deadline": "(none)", "token_budget": "(none)"}


def settable() -> list[str]:
    return [name for name in JobOptions.model_fields if name != "updated"]


def none_of(value: object) -> object:
    """`name=` or `name=none` unsets an option (back to the fleet's setting)."""
    return None if isinstance(value, str) and value.strip().lower() in ("", "none", "default") else value


def parse_assignments(items: list[str]) -> dict[str, object]:
    """`name=value` words (the CLI's) as a dict; ConfigError naming the word without a `=`."""
    out: dict[str, object] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"{item!r}: write a job option as NAME=VALUE (options: {', '.join(settable())})")
        out[name.strip().replace("-", "_")] = value.strip()
    return out


def load_options(store: Store, job: str) -> JobOptions:
    """The job's options; the defaults when none were written (every job enqueued before options)."""
    try:
        raw = store.get(options_key(job))
    except ObjectMissing:
        return JobOptions()
    try:
        return JobOptions.model_validate_json(raw)
    except ValidationError as e:
        raise ConfigError(f"{options_key(job)} in {store.url} is not valid job options: "
                          f"{e.errors()[0]['msg']}") from None


def write_options(store: Store, job: str, options: JobOptions) -> None:
    store.put(options_key(job), options.to_bytes())


class OptionsCache:
    """The one reader of job options in a long-lived process (a worker, its reaper): each job's
    options read again after `max_age_s`, so a change reaches a running fleet without a restart. A
    store that cannot be read keeps the last copy (or the defaults): options never stop a run."""

    def __init__(self, store: Store, max_age_s: float = OPTIONS_MAX_AGE_S):
        self.store = store
        self.max_age_s = max_age_s
        self._options: dict[str, tuple[float, JobOptions]] = {}
        self._lock = threading.Lock()

    def get(self, job: str) -> JobOptions:
        now = time.monotonic()
        with self._lock:
            cached = self._options.get(job)
            if cached is not None and now - cached[0] < self.max_age_s:
                return cached[1]
        try:
            found = load_options(self.store, job)
        except Exception as e:  # a store outage or a bad file: the last copy, and the next read tries again
            log.warning("job %s: its options could not be read (%s); using %s", job, e,
                        "the last copy" if cached is not None else "the defaults")
            return cached[1] if cached is not None else JobOptions()
        with self._lock:
            self._options[job] = (now, found)
        return found

"""The job claim: one job name is one input and one configuration, decided before any write.

`fleet enqueue` writes <job>/claim.json with a conditional put before the first chunk
object. Whoever loses the put compares identities: the same identity joins (its chunks
are byte-equal, so rewriting them is safe, and the manifest still goes last), another
one is refused before it writes anything. A claimer that died before its manifest leaves
a claim that the next enqueue of the same identity completes; a Hub dataset's input is read
at the commit that claim pinned (fleet.producer.enqueue.prepare_job), as a manifest's would be.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from fleet.errors import JobConflict, ObjectMissing
from fleet.store import Store
from fleet.store.layout import claim_key
from fleet.store.manifest import Manifest, config_diff


class JobIdentity(BaseModel):
    """What makes a job: its configuration, the engine it needs and its input's digest."""

    job: str
    config: dict[str, Any]
    config_hash: str
    engine_identity: dict[str, Any]
    engine_identity_hash: str
    input_digest: str
    #: where the input was read from: for messages, not compared (a copy elsewhere is the same job)
    input: str
    records: int
    #: the job whose unfinished rows this one generates again (fleet.producer.redo)
    redo_of: str | None = None
    claimed_at: float = Field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(indent=2).encode()


def differences(stored: JobIdentity | Manifest, new: JobIdentity) -> list[str]:
    """What differs (stored -> new); fields an older manifest lacks are not compared."""
    out: list[str] = []
    if stored.config_hash != new.config_hash:
        out += config_diff(stored.config, new.config)
    if stored.engine_identity is not None and stored.engine_identity_hash != new.engine_identity_hash:
        out += [f"engine.{d}" for d in config_diff(stored.engine_identity, new.engine_identity)]
    if stored.input_digest is not None and stored.input_digest != new.input_digest:
        out.append(
            f"input: {stored.input!r} ({stored.input_digest}) -> {new.input!r} ({new.input_digest}): "
            "the records differ"
        )
    if stored.redo_of != new.redo_of:
        out.append(f"redo of: {stored.redo_of!r} -> {new.redo_of!r}")
    return out


def _conflict(job: str, what: str, diff: list[str]) -> JobConflict:
    shown = "\n  ".join(diff)
    return JobConflict(
        f"job {job!r} {what} with another input or configuration; nothing was written. "
        f"Start a new job with another --job name, or enqueue the original input with the "
        f"original settings. Differences (stored -> new):\n  {shown}"
    )


def check_same_job(existing: Manifest, new: JobIdentity) -> None:
    diff = differences(existing, new)
    if diff:
        raise _conflict(existing.job, "exists", diff)


def load_claim(store: Store, job: str) -> JobIdentity | None:
    """The claim on `job`, None if there is none; JobConflict if this fleet cannot read it."""
    try:
        raw = store.get(claim_key(job))
    except ObjectMissing:
        return None
    try:
        return JobIdentity.model_validate_json(raw)
    except ValidationError as e:  # written by another fleet version, or not by fleet at all
        raise JobConflict(
            f"job {job!r} holds a claim object ({claim_key(job)}) this fleet cannot read "
            f"({e.error_count()} problem(s)); nothing was written. Use another --job name."
        ) from None


def claim_job(store: Store, new: JobIdentity) -> bool:
    """Claim the job name for `new`: True if this call claimed it, False if it joins an
    equal claim; JobConflict if another identity holds it."""
    if store.put_if_absent(claim_key(new.job), new.to_bytes()):
        return True
    held = load_claim(store, new.job)
    if held is None:  # deleted since the put (by hand): claim it again
        return claim_job(store, new)
    diff = differences(held, new)
    if diff:
        age = max(0.0, time.time() - held.claimed_at)
        raise _conflict(
            new.job,
            f"was claimed {age:.0f}s ago (object {claim_key(new.job)}, no manifest yet: being "
            f"written, or its enqueue died) by an enqueue of {held.input!r}",
            diff,
        )
    return False

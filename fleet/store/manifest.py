"""The job manifest: what a job is, and a hash of everything that shapes its output.

Enqueueing the same job name with another configuration is refused, naming the settings
that differ, so a resumed job can never mix outputs of two configurations.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from fleet import __version__
from fleet.errors import JobConflict, ObjectMissing
from fleet.store import Store
from fleet.store.layout import manifest_key


def config_hash(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = flatten(old), flatten(new)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


class Manifest(BaseModel):
    job: str
    input: str
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    chunk_size: int
    chunks: int
    records: int
    #: outputs per record summed over the input (n samples)
    samples: int
    config: dict[str, Any]
    config_hash: str
    #: what a worker's engine must match to run this job (fleet.engines.identity), and its hash
    engine_identity: dict[str, Any] | None = None
    engine_identity_hash: str | None = None
    #: blake2b of the canonical records (fleet.producer.digest): a changed input is refused
    input_digest: str | None = None
    #: the job whose unfinished rows this job generates again (`--redo`); None for a job of an input
    redo_of: str | None = None
    fleet_version: str = __version__

    def to_bytes(self) -> bytes:
        return self.model_dump_json(indent=2).encode()


def load_manifest(store: Store, job: str) -> Manifest | None:
    try:
        return Manifest.model_validate_json(store.get(manifest_key(job)))
    except ObjectMissing:
        return None


def require_manifest(store: Store, job: str) -> Manifest:
    manifest = load_manifest(store, job)
    if manifest is None:
        raise ObjectMissing(f"job {job!r} has no manifest in {store.url}: run `fleet enqueue` first")
    return manifest


def check_compatible(existing: Manifest, config: dict[str, Any]) -> None:
    """Refuse a second configuration under one job name, saying what differs."""
    if existing.config_hash == config_hash(config):
        return
    diff = "\n  ".join(config_diff(existing.config, config))
    raise JobConflict(
        f"job {existing.job!r} exists with a different configuration; "
        f"use another --job name or the original settings. Differences (stored -> new):\n  {diff}"
    )

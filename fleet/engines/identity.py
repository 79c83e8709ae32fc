"""The output-shaping identity of an engine: what a worker must share with the job to run it.

The job's sampling, seed and thinking switch travel in the manifest and every worker uses
those; what a worker brings itself is its engine: the model files, dtype, context length,
engine kwargs and, for the simulator, its length distribution. Two workers with equal
identities produce the same records from one chunk, so only they may share a job and
resume each other's checkpoints. A setting is left out only when it changes speed, never
tokens (slots, memory fractions, cache sizes) or when it is a fault-test switch.
"""

from __future__ import annotations

from typing import Any

from fleet.engines.specs import spec_for
from fleet.settings import Settings
from fleet.store.manifest import Manifest, config_diff, config_hash


def engine_identity(settings: Settings) -> dict[str, Any]:
    """The settings of this process's engine that shape its output (reads model files);
    each engine's spec says which of its settings those are."""
    return {"engine": settings.engine} | spec_for(settings).identity(settings)


def _canonical(value: Any) -> Any:
    """256 and 256.0 are one setting: pydantic keeps an unvalidated int default where a worker,
    handed the same value through its environment, parses a float."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def identity_hash(identity: dict[str, Any]) -> str:
    return config_hash(_canonical(identity))


def config_mismatch(settings_or_identity: Settings | dict[str, Any], manifest: Manifest) -> list[str] | None:
    """The differing fields ("path: job's -> worker's"), or None when this engine may run the job.

    A manifest written before identities were recorded has none, and nothing to compare.
    """
    if manifest.engine_identity is None:
        return None
    mine = (
        engine_identity(settings_or_identity)
        if isinstance(settings_or_identity, Settings)
        else settings_or_identity
    )
    if identity_hash(mine) == manifest.engine_identity_hash:
        return None
    return config_diff(manifest.engine_identity, mine) or [
        f"engine_identity_hash: {manifest.engine_identity_hash} -> {identity_hash(mine)}"
    ]

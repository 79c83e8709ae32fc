"""Checkpoint objects (<job>/partial/<index>/...) stamped with the engine identity hash.

A checkpoint holds finished records of an unfinished chunk; resuming it under another
engine configuration would commit one result mixing two configurations. So the first
line of every checkpoint names the identity hash it was made under, and a reader keeps
only those of its own: a foreign or unstamped checkpoint costs a regeneration, never a
mixed result.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleet.store.layout import decode_lines, encode_lines

#: marks the header line; never a field of a result row
HEADER_FIELD = "fleet_checkpoint"
VERSION = 1


def encode_checkpoint(rows: Iterable[dict[str, Any]], identity_hash: str) -> bytes:
    header = {HEADER_FIELD: VERSION, "identity_hash": identity_hash}
    return encode_lines([header, *rows])


def checkpoint_hash(data: bytes, what: str) -> str | None:
    """The identity hash a checkpoint was made under; None for one without a header."""
    for first in decode_lines(data, what):
        return first.get("identity_hash") if HEADER_FIELD in first else None
    return None


def decode_checkpoint(data: bytes, what: str, identity_hash: str) -> list[dict[str, Any]] | None:
    """The rows of a checkpoint made under `identity_hash`, or None for any other one.

    ChunkCorrupt (from decode_lines) when the object cannot be decoded at all.
    """
    rows = list(decode_lines(data, what))
    if not rows or HEADER_FIELD not in rows[0] or rows[0].get("identity_hash") != identity_hash:
        return None
    return rows[1:]

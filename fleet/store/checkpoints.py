"""Checkpoint objects (<job>/partial/<index>/...) stamped with the engine identity hash.

A checkpoint holds what a run of an unfinished chunk made since its last flush: finished
records, and for each sample still running the output ids it made since then (a segment).
Segments chain: each names the digest of every id before it, so a reader rebuilds each
sample's longest valid prefix from any mix of runs, workers and helpers, and a later run
continues from it (docs/architecture.md, "Tokens as they are made"). A 32K-token sample is written once
in pieces, never again whole at every flush.

Resuming under another engine configuration would commit one result mixing two
configurations. So the first line names the identity hash the checkpoint was made under,
and a reader keeps only those of its own: a foreign or unstamped checkpoint costs a
regeneration, never a mixed result. Version 2 (with segments) stamps it as `identity`, not
version 1's `identity_hash`: a fleet that knows only version 1 then ignores these objects
as foreign instead of reading segments as finished records.

With `turns = all` (fleet/model/turns.py) a sample is a conversation of turns run one after
another: each turn the sample finished is a line of its own (`fleet_turn`) until the sample
is done, and a running turn's segments name their turn, so a later run starts at the first
unfinished turn and continues its ids.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.store.layout import decode_lines, encode_lines

#: marks the header line; never a field of a result row
HEADER_FIELD = "fleet_checkpoint"
#: marks a segment line
SEGMENT_FIELD = "fleet_partial"
#: marks a finished turn of a sample still running (turns = all)
TURN_FIELD = "fleet_turn"
VERSION = 2


class IdsDigest:
    """A running digest of a sample's output ids: what a segment's `prev` names."""

    def __init__(self, ids: Iterable[int] = ()):
        self._hash = hashlib.blake2b(digest_size=8)
        self.update(ids)

    def update(self, ids: Iterable[int]) -> None:
        self._hash.update("".join(f"{i}," for i in ids).encode())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def copy(self) -> IdsDigest:
        new = IdsDigest()
        new._hash = self._hash.copy()
        return new


@dataclass(frozen=True)
class Segment:
    """Output ids of one running sample, made by one run since its last flush."""

    id: str
    sample: int
    #: offset of ids[0] in the sample's output
    start: int
    #: IdsDigest of the sample's output before `start`
    prev: str
    ids: list[int]
    #: output positions where the run's lineage continued from checkpointed ids
    continued_at: list[int] = field(default_factory=list)
    #: the conversation turn the ids belong to (turns = all); 0 for a sample of one turn
    turn: int = 0

    def row(self) -> dict[str, Any]:
        row = {SEGMENT_FIELD: 1, "id": self.id, "sample": self.sample, "start": self.start, "prev": self.prev,
               "continued_at": self.continued_at, "ids": self.ids}  # fmt: skip
        return row | {"turn": self.turn} if self.turn else row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Segment:
        return cls(row["id"], int(row["sample"]), int(row["start"]), str(row["prev"]), list(row["ids"]),
                   list(row.get("continued_at") or []), int(row.get("turn") or 0))  # fmt: skip


@dataclass(frozen=True)
class Partial:
    """A sample's longest valid prefix over every checkpoint: where a new run continues."""

    ids: list[int]
    continued_at: list[int]


@dataclass
class Checkpoint:
    rows: list[dict[str, Any]]
    segments: list[Segment]
    #: finished turns of unfinished samples: {"id", "sample", "turn", ...the turn's fields}
    turns: list[dict[str, Any]] = field(default_factory=list)


def encode_checkpoint(
    rows: Iterable[dict[str, Any]], identity_hash: str, segments: Iterable[Segment] = (),
    turns: Iterable[dict[str, Any]] = (),
) -> bytes:
    header = {HEADER_FIELD: VERSION, "identity": identity_hash}
    return encode_lines([header, *rows, *({TURN_FIELD: 1} | t for t in turns), *(s.row() for s in segments)])


def _stamp(header: dict[str, Any]) -> str | None:
    return header.get("identity", header.get("identity_hash"))


def checkpoint_hash(data: bytes, what: str) -> str | None:
    """The identity hash a checkpoint was made under; None for one without a header."""
    for first in decode_lines(data, what):
        return _stamp(first) if HEADER_FIELD in first else None
    return None


def read_checkpoint(data: bytes, what: str, identity_hash: str) -> Checkpoint | None:
    """Finished rows and segments of a checkpoint made under `identity_hash`, or None for any
    other one. ChunkCorrupt (from decode_lines) when the object cannot be decoded at all."""
    lines = list(decode_lines(data, what))
    if not lines or HEADER_FIELD not in lines[0] or _stamp(lines[0]) != identity_hash:
        return None
    out = Checkpoint([], [])
    for line in lines[1:]:
        if SEGMENT_FIELD in line:
            out.segments.append(Segment.from_row(line))
        elif TURN_FIELD in line:
            out.turns.append({k: v for k, v in line.items() if k != TURN_FIELD})
        else:
            out.rows.append(line)
    return out


def decode_checkpoint(data: bytes, what: str, identity_hash: str) -> list[dict[str, Any]] | None:
    """The finished rows of a checkpoint made under `identity_hash`, or None for any other one."""
    found = read_checkpoint(data, what, identity_hash)
    return None if found is None else found.rows


def longest_prefixes(segments: Iterable[Segment]) -> dict[tuple[str, int, int], Partial]:
    """Each (sample, turn)'s longest chain of segments from output position 0, each segment
    following exactly the ids before it. Where two runs wrote copies (a restart, an assist), the
    longest valid one wins, never the oldest; a segment whose `prev` matches nothing is ignored."""
    by_sample: dict[tuple[str, int, int], list[Segment]] = defaultdict(list)
    for seg in segments:
        by_sample[(seg.id, seg.sample, seg.turn)].append(seg)
    return {key: p for key, segs in by_sample.items() if (p := _longest(segs)) is not None}


def _longest(segments: list[Segment]) -> Partial | None:
    following: dict[tuple[int, str], list[Segment]] = defaultdict(list)
    for seg in segments:
        if seg.ids:
            following[(seg.start, seg.prev)].append(seg)
    best: Partial | None = None
    stack: list[tuple[list[int], IdsDigest, list[int]]] = [([], IdsDigest(), [])]
    seen: set[tuple[int, str]] = set()  # copies of one segment (a retried put) are walked once
    while stack:
        ids, digest, continued = stack.pop()
        state = (len(ids), digest.hexdigest())
        if state in seen:
            continue
        seen.add(state)
        if ids and (best is None or len(ids) > len(best.ids)):
            best = Partial(ids, continued)
        for seg in following.get(state, []):
            nxt = digest.copy()
            nxt.update(seg.ids)
            stack.append((ids + seg.ids, nxt, seg.continued_at))
    return best

"""fleet's own record shape (fleet.records.OutputRecord), one JSON object per line.

Input passthrough fields (metadata, source...) follow the record's own fields at top level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.export.formats.base import ExportRow, JsonLinesWriter, LeftOut
from fleet.records import EXPORT_FIELDS
from fleet.store.manifest import Manifest

#: run facts that differ between two runs of one job (`--stable` leaves them out); where a sample was
#: continued depends on when its workers stopped, not on what it holds
VOLATILE_FIELDS = ("worker", "latency_s", "continued_at")


def export_fields(stable: bool) -> list[str]:
    return [f for f in EXPORT_FIELDS if not (stable and f in VOLATILE_FIELDS)]


def turns_of(row: dict[str, Any], fields: list[str]) -> list[dict[str, Any]] | None:
    """A record's generated turns (turns = all), each with the export's fields only."""
    turns = row.get("turns")
    return [{k: v for k, v in t.items() if k == "turn" or k in fields} for t in turns] if turns else None


def flat_record(row: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """The record's fields, its generated turns where it has them (turns = all), then passthrough."""
    turns = {"turns": turns_of(row, fields)} if row.get("turns") else {}
    return {**{k: row.get(k) for k in fields}, **turns, **(row.get("extra") or {})}


class JsonlWriter(JsonLinesWriter):
    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.fields = export_fields(stable)

    def line(self, row: ExportRow) -> dict[str, Any]:
        return flat_record(row.out, self.fields)

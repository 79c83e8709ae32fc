"""fleet's record shape as Parquet (zstd), one row group per chunk.

Passthrough input fields have no fixed schema, so they travel as one JSON string column,
`extra`. A job that generated every turn of its conversations (`turns = all`) has a `turns`
column too: a list of structs, one per generated turn (fleet.records.TURN_FIELDS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleet.export.formats.base import ExportRow, LeftOut, Writer
from fleet.export.formats.jsonl import export_fields, turns_of
from fleet.records import EXPORT_FIELDS, TURN_FIELDS
from fleet.store.manifest import Manifest

PARQUET_SCHEMA = pa.schema([
    ("id", pa.string()), ("sample", pa.int32()), ("output", pa.string()),
    ("reasoning", pa.string()), ("output_ids", pa.list_(pa.int32())),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()),
    ("finish_reason", pa.string()), ("in_thinking", pa.bool_()), ("error", pa.string()), ("chunk", pa.int32()),
    ("worker", pa.string()), ("model", pa.string()), ("cached_tokens", pa.int32()),
    ("spec_accept_length", pa.float64()), ("spec_verify_ct", pa.int32()), ("latency_s", pa.float64()),
    ("retractions", pa.int32()), ("prompt_digest", pa.string()),
    ("continued_at", pa.list_(pa.int32())), ("repetition_period", pa.int32()),
])  # fmt: skip
assert PARQUET_SCHEMA.names == EXPORT_FIELDS
EXTRA_COLUMN = pa.field("extra", pa.string())


def turns_column(fields: list[str]) -> pa.Field:
    """A list of one struct per generated turn, with the export's fields of TURN_FIELDS."""
    kept = [PARQUET_SCHEMA.field(f) for f in TURN_FIELDS[1:] if f in fields]
    return pa.field("turns", pa.list_(pa.struct([("turn", pa.int32()), *kept])))


class ParquetWriter(Writer):
    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.fields = export_fields(stable)
        turns = [turns_column(self.fields)] if manifest.config.get("turns") == "all" else []
        self.schema = pa.schema([*(PARQUET_SCHEMA.field(f) for f in self.fields), *turns, EXTRA_COLUMN])
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")

    def table(self, rows: list[ExportRow]) -> pa.Table:
        table = [
            {**{k: r.out.get(k) for k in self.fields}, "turns": turns_of(r.out, self.fields),
             "extra": json.dumps(r.out["extra"], ensure_ascii=False) if r.out.get("extra") else None}
            for r in rows
        ]  # fmt: skip
        return pa.Table.from_pylist(table, schema=self.schema)

    def write(self, rows: list[ExportRow]) -> int:
        self.writer.write_table(self.table(rows))
        return len(rows)

    def close(self) -> None:
        self.writer.close()

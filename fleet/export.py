"""Write a job's results in input order, as JSONL or Parquet, streaming chunk by chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleet.chunkstate import done_indexes
from fleet.errors import FleetError
from fleet.manifest import require_manifest
from fleet.progress import Progress
from fleet.records import EXPORT_FIELDS
from fleet.results import read_result
from fleet.store import Store

PARQUET_SCHEMA = pa.schema([
    ("id", pa.string()), ("sample", pa.int32()), ("output", pa.string()),
    ("reasoning", pa.string()), ("output_ids", pa.list_(pa.int32())),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()),
    ("finish_reason", pa.string()), ("error", pa.string()), ("chunk", pa.int32()),
    ("worker", pa.string()), ("model", pa.string()), ("cached_tokens", pa.int32()),
    ("spec_accept_length", pa.float64()), ("spec_verify_ct", pa.int32()), ("latency_s", pa.float64()),
])
assert PARQUET_SCHEMA.names == EXPORT_FIELDS


#: run facts that differ between two runs of the same job; `stable` exports leave them out
VOLATILE_FIELDS = ("worker", "latency_s")


def export_job(
    store: Store, job: str, out: Path, fmt: str | None = None, partial: bool = False, stable: bool = False,
    progress: Progress | None = None,
) -> int:
    """Returns the number of records written; refuses an unfinished job unless `partial`.

    `stable` leaves out the volatile run facts, so two runs of one job export the same bytes.
    """
    manifest = require_manifest(store, job)
    done = done_indexes(store, job)
    missing = [i for i in range(manifest.chunks) if i not in done]
    if missing and not partial:
        head = ", ".join(map(str, missing[:10]))
        raise FleetError(
            f"job {job!r} has {len(missing)} of {manifest.chunks} chunks without a result "
            f"(first: {head}); wait for them, or pass --partial"
        )
    fmt = fmt or ("parquet" if out.suffix == ".parquet" else "jsonl")
    indexes = [i for i in range(manifest.chunks) if i in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    count = 0
    total = None if missing else manifest.samples  # one exported row per sample
    report = progress or (lambda phase, done, total: None)
    report("export", 0, total)
    fields = [f for f in EXPORT_FIELDS if not (stable and f in VOLATILE_FIELDS)]
    if fmt == "parquet":
        schema = pa.schema([PARQUET_SCHEMA.field(f) for f in fields])
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for index in indexes:
                rows = [{k: r.get(k) for k in fields} for r in read_result(store, job, index)[1]]
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                count += len(rows)
                report("export", count, total)
    elif fmt == "jsonl":
        with open(tmp, "w", encoding="utf-8") as f:
            for index in indexes:
                for r in read_result(store, job, index)[1]:
                    f.write(json.dumps({k: r.get(k) for k in fields}, ensure_ascii=False) + "\n")
                    count += 1
                report("export", count, total)
    else:
        raise FleetError(f"unknown export format {fmt!r}: use jsonl or parquet")
    tmp.replace(out)
    report("export", count, count)
    return count

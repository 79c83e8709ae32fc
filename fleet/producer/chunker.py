"""Cut validated records into chunk objects in the store, streaming (memory bounded by a chunk)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.records import InputRecord
from fleet.store import Store
from fleet.store.layout import chunk_key, encode_lines


@dataclass
class ChunkCounts:
    chunks: int = 0
    records: int = 0
    samples: int = 0


def write_chunks(
    store: Store, job: str, records: Iterable[InputRecord], chunk_size: int, default_n: int
) -> ChunkCounts:
    counts = ChunkCounts()
    batch: list[dict] = []

    def flush() -> None:
        store.put(chunk_key(job, counts.chunks), encode_lines(batch))
        counts.chunks += 1
        batch.clear()

    for record in records:
        batch.append(record.model_dump(mode="json", exclude_none=True))
        counts.records += 1
        counts.samples += record.sample_count(default_n)
        if len(batch) >= chunk_size:
            flush()
    if batch:
        flush()
    return counts

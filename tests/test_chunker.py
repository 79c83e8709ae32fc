"""The chunker: validated records cut into chunk objects of C records, counted as chunks,
records and samples (n per record, from the record's sampling or the job default)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet.producer.chunker import ChunkCounts, write_chunks
from fleet.records import InputRecord
from fleet.store.layout import chunk_key, decode_lines
from fleet.store.local import LocalStore


def records(count: int, n_of=lambda pos: None) -> Iterator[InputRecord]:
    for pos in range(count):
        n = n_of(pos)
        yield InputRecord(
            pos=pos,
            line=pos + 1,
            id=f"id-{pos}",
            messages=[{"role": "user", "content": f"q{pos}"}] if pos % 2 else None,
            prompt=None if pos % 2 else f"raw {pos}",
            sampling={"n": n} if n else None,
        )


def read_chunk(store: LocalStore, job: str, index: int) -> list[dict]:
    key = chunk_key(job, index)
    return list(decode_lines(store.get(key), key))


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.mark.parametrize(
    ("count", "size", "chunks", "last"),
    [(10, 4, 3, 2), (8, 4, 2, 4), (1, 256, 1, 1), (5, 1, 5, 1), (256, 256, 1, 256)],
)
def test_chunk_counts_and_boundaries(store, count, size, chunks, last):
    # Given `count` records and a chunk size
    # When they are chunked
    counts = write_chunks(store, "j", records(count), size, default_n=1)
    # Then there are ceil(count / size) chunks, all full but the last
    assert counts == ChunkCounts(chunks=chunks, records=count, samples=count)
    assert list(store.list("j/chunks/")) == [chunk_key("j", i) for i in range(chunks)]
    sizes = [len(read_chunk(store, "j", i)) for i in range(chunks)]
    assert sizes == [size] * (chunks - 1) + [last]
    # And the chunks hold the records in input order, each exactly once
    positions = [row["pos"] for i in range(chunks) for row in read_chunk(store, "j", i)]
    assert positions == list(range(count))


def test_no_records_writes_no_chunk(store):
    assert write_chunks(store, "j", iter([]), 4, 1) == ChunkCounts(0, 0, 0)
    assert list(store.list("j/")) == []


def test_chunk_rows_round_trip_to_input_records(store):
    # Given records of both forms with and without sampling
    given = list(records(5, n_of=lambda pos: 3 if pos == 2 else None))
    write_chunks(store, "j", iter(given), 2, 1)
    # When the chunk rows are read back
    rows = [row for i in range(3) for row in read_chunk(store, "j", i)]
    # Then they validate to the same records, without null fields stored
    assert [InputRecord.model_validate(r) for r in rows] == given
    assert "messages" not in rows[0] and "prompt" not in rows[1] and "sampling" not in rows[0]


def test_samples_count_n_per_record(store):
    # Given 6 records, two asking for 4 samples each, the rest using the job's n = 2
    counts = write_chunks(
        store, "j", records(6, n_of=lambda pos: 4 if pos in (1, 4) else None), 4, 2
    )
    # Then samples = 4 + 4 + 4 x 2
    assert counts == ChunkCounts(chunks=2, records=6, samples=16)


def test_rewriting_a_job_overwrites_its_chunks(store):
    write_chunks(store, "j", records(3), 2, 1)
    write_chunks(store, "j", records(3), 2, 1)
    assert list(store.list("j/chunks/")) == [chunk_key("j", 0), chunk_key("j", 1)]


def test_chunking_streams(store):
    # Given a generator whose records are consumed lazily
    seen: list[int] = []

    def lazy() -> Iterator[InputRecord]:
        for rec in records(9):
            seen.append(rec.pos)
            yield rec

    class Watching(LocalStore):
        writes: list[int] = []

        def put(self, key: str, data: bytes) -> None:
            self.writes.append(len(seen))
            super().put(key, data)

    w = Watching(store.root)
    write_chunks(w, "j", lazy(), 3, 1)
    # Then each chunk is written as soon as it is full, before later records are read
    assert w.writes == [3, 6, 9]

"""Store layout and codecs (docs/architecture.md, Store layout): the keys tools rely on, zstd JSON lines that
round-trip or fail as ChunkCorrupt, and result objects (header + records in input order)."""

from __future__ import annotations

import json

import pytest
import zstandard

from fleet.errors import ChunkCorrupt
from fleet.store.layout import (
    checkpoint_key,
    checkpoint_prefix,
    chunk_key,
    decode_lines,
    encode_lines,
    failed_key,
    failed_prefix,
    idx,
    index_of,
    manifest_key,
    result_key,
    results_prefix,
)
from fleet.store.local import LocalStore
from fleet.store.results import HEADER, ChunkStats, decode_result, encode_result, iter_records, read_result

# -- keys --------------------------------------------------------------------------------


def test_keys_follow_the_documented_layout():
    assert idx(7) == "000007" and idx(123456) == "123456"
    assert manifest_key("j") == "j/manifest.json"
    assert chunk_key("j", 3) == "j/chunks/000003"
    assert result_key("j", 3) == "j/results/000003"
    assert results_prefix("j") == "j/results/"
    assert failed_key("j", 12) == "j/failed/000012.json"
    assert failed_prefix("j") == "j/failed/"
    assert checkpoint_prefix("j", 3) == "j/partial/000003/"


def test_zero_padding_keeps_lexicographic_equal_to_numeric_order():
    keys = [result_key("j", i) for i in (10, 2, 100, 1, 99999)]
    assert sorted(keys) == [result_key("j", i) for i in (1, 2, 10, 100, 99999)]


def test_partial_key_is_one_safe_path_segment_per_worker():
    key = checkpoint_key("j", 3, 12, "gpu0@host/a")
    assert key == "j/partial/000003/000012-gpu0_at_host_a"
    assert key.startswith(checkpoint_prefix("j", 3))
    assert key.count("/") == 3


def test_index_of_reads_results_and_failed_keys():
    assert index_of(result_key("j", 42)) == 42
    assert index_of(failed_key("job/with/slash", 7)) == 7


# -- JSON-lines codec --------------------------------------------------------------------


ROWS = [
    {"id": "a", "n": 1, "text": "héllo\nwörld", "nested": {"x": [1, 2]}},
    {"id": "b", "n": 2, "text": "", "none": None},
    {"id": "c", "emoji": "🙂", "quote": '"\\'},
]


def test_encode_decode_round_trip():
    data = encode_lines(ROWS)
    assert list(decode_lines(data, "chunk 0")) == ROWS


def test_encoded_lines_are_zstd_json_lines():
    # Tools may read objects with zstd + a JSON parser alone
    text = zstandard.ZstdDecompressor().decompressobj().decompress(encode_lines(ROWS)).decode()
    assert [json.loads(line) for line in text.splitlines()] == ROWS
    assert text.endswith("\n") and text.count("\n") == len(ROWS)


def test_encode_of_nothing_decodes_to_nothing():
    assert list(decode_lines(encode_lines([]), "x")) == []


@pytest.mark.parametrize(
    "data",
    [
        b"not zstd at all",
        pytest.param(encode_lines(ROWS)[:-7]),  # truncated frame
        zstandard.ZstdCompressor().compress(b'{"id": "a"}\n{"id": \n'),  # bad JSON line
        zstandard.ZstdCompressor().compress(b"\xff\xfe\n"),  # not UTF-8
    ],
    ids=["garbage", "truncated", "bad-json", "bad-utf8"],
)
def test_corrupt_bytes_raise_chunk_corrupt_naming_the_object(data):
    with pytest.raises(ChunkCorrupt) as info:
        list(decode_lines(data, "j/chunks/000009"))
    assert "j/chunks/000009" in str(info.value)


def test_truncated_frame_is_not_silently_accepted():
    # A half-written object must never decode to fewer rows than were written
    data = encode_lines([{"i": i, "pad": "x" * 50} for i in range(200)])
    cut = data[: len(data) // 2]
    try:
        rows = list(decode_lines(cut, "r"))
    except ChunkCorrupt:
        return
    pytest.fail(f"half a frame decoded to {len(rows)} rows instead of raising ChunkCorrupt")


# -- result objects ----------------------------------------------------------------------


def out(pos: int, sample: int, rid: str | None = None) -> dict:
    return {
        "id": rid or f"r{pos}",
        "pos": pos,
        "sample": sample,
        "output": f"{pos}.{sample}",
        "completion_tokens": pos + sample,
        "finish_reason": "stop",
    }


def test_result_header_is_separate_from_records():
    # Given stats and rows
    stats = ChunkStats(records=2, samples=3, completion_tokens=7, worker="gpu0@h")
    rows = [out(0, 0), out(0, 1), out(1, 0)]
    # When encoded and decoded
    header, records = decode_result(encode_result(stats, rows), "r")
    # Then the header is the stats alone and the records carry no header marker
    assert header == stats
    assert records == rows
    assert all(HEADER not in r for r in records)


def test_result_records_are_ordered_by_pos_then_sample():
    # Given rows in the order samples finished
    rows = [out(2, 1), out(0, 1), out(2, 0), out(1, 0), out(0, 0), out(10, 0)]
    # When encoded
    _, records = decode_result(encode_result(ChunkStats(), rows), "r")
    # Then they come back in input order, samples ascending
    assert [(r["pos"], r["sample"]) for r in records] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
        (2, 1),
        (10, 0),
    ]


def test_a_headerless_result_decodes_as_records_only():
    _, records = decode_result(encode_lines([out(0, 0)]), "r")
    assert decode_result(encode_lines([out(0, 0)]), "r")[0] is None
    assert records == [out(0, 0)]


def test_read_result_and_iter_records_from_a_store(tmp_path):
    # Given two result objects in a store
    store = LocalStore(tmp_path)
    store.put(result_key("j", 0), encode_result(ChunkStats(chunk=0), [out(1, 0), out(0, 0)]))
    store.put(result_key("j", 1), encode_result(ChunkStats(chunk=1), [out(2, 0)]))
    # Then read_result splits header and records, iter_records follows the given index order
    assert read_result(store, "j", 1) == (ChunkStats(chunk=1), [out(2, 0)])
    assert [r["pos"] for r in iter_records(store, "j", [1, 0])] == [2, 0, 1]


def test_corrupt_result_in_store_names_its_key(tmp_path):
    store = LocalStore(tmp_path)
    store.put(result_key("j", 4), b"\x28\xb5\x2f\xfdjunk")
    with pytest.raises(ChunkCorrupt, match="j/results/000004"):
        read_result(store, "j", 4)


def test_records_are_zstd_json_lines_and_the_small_documents_plain_json(tmp_path, clean_env):
    """docs/architecture.md, Store layout: which objects are compressed and which people read."""
    from fleet.coord.chunkstate import Quarantine
    from fleet.producer.enqueue import prepare_job
    from fleet.settings import Settings
    from tests.fleetproc import write_prompts

    # Given a job written by the producer, with one quarantined chunk
    store = LocalStore(tmp_path / "store")
    settings = Settings(store_url=str(tmp_path / "store"), chunk_size=4)
    prepare_job(settings, store, str(write_prompts(tmp_path / "p.jsonl", 6)), "j")
    Quarantine(index=1, error="x", error_type="RuntimeError", attempts=3).write(store, "j")
    # Then the chunk objects are zstd frames, and the claim, manifest and quarantine record plain JSON
    zstd_magic = b"\x28\xb5\x2f\xfd"
    assert all(store.get(k).startswith(zstd_magic) for k in store.list("j/chunks/"))
    for key in ("j/claim.json", "j/manifest.json", "j/failed/000001.json"):
        assert isinstance(json.loads(store.get(key)), dict), key

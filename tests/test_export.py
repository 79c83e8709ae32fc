"""`fleet export` (docs/architecture.md, Records): results in input order, as JSONL or Parquet, with
exactly the exported fields; an unfinished job is refused, naming missing chunks, unless
--allow-incomplete."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fleet.coord.chunkstate import Quarantine
from fleet.errors import FleetError
from fleet.export.writer import VOLATILE_FIELDS, export_job
from fleet.records import EXPORT_FIELDS, OutputRecord
from fleet.store.layout import manifest_key, result_key
from fleet.store.local import LocalStore
from fleet.store.manifest import Manifest, config_hash
from fleet.store.results import ChunkStats, encode_result

JOB = "j"
CHUNK = 3


def output(pos: int, sample: int, chunk: int) -> dict:
    return OutputRecord(
        id=f"rec-{pos}",
        sample=sample,
        output=f"answer {pos}.{sample} ✓",
        reasoning=f"think {pos}",
        output_ids=[pos, sample, 7] if pos % 2 else None,
        prompt_tokens=5 + pos,
        completion_tokens=10 * pos + sample,
        finish_reason="error" if pos == 4 else "stop",
        error="too long" if pos == 4 else None,
        chunk=chunk,
        worker=f"gpu{chunk}@h",
        model="sim",
        latency_s=0.5,
        pos=pos,
    ).model_dump(mode="json")


def build_job(
    store: LocalStore, records: int, samples: dict[int, int], done: list[int]
) -> list[tuple[str, int]]:
    """A job of `records` records in chunks of 3; results written for the `done` chunks, rows
    shuffled as workers finish them. Returns (id, sample) in input order for the done chunks."""
    chunks = -(-records // CHUNK)
    config = {"engine": "sim"}
    total = sum(samples.get(p, 1) for p in range(records))
    m = Manifest(
        job=JOB,
        input="in.jsonl",
        chunk_size=CHUNK,
        chunks=chunks,
        records=records,
        samples=total,
        config=config,
        config_hash=config_hash(config),
    )
    store.put(manifest_key(JOB), m.to_bytes())
    expected = []
    rng = random.Random(1)
    for c in range(chunks):
        rows = [
            output(p, s, c)
            for p in range(c * CHUNK, min(records, (c + 1) * CHUNK))
            for s in range(samples.get(p, 1))
        ]
        if c in done:
            expected += [(r["id"], r["sample"]) for r in rows]
            rng.shuffle(rows)
            store.put(result_key(JOB, c), encode_result(ChunkStats(chunk=c, records=len(rows)), rows))
    return expected


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_jsonl_in_input_order_with_exactly_the_export_fields(store, tmp_path):
    # Given a finished job of 8 records, record 1 with three samples, rows stored shuffled
    expected = build_job(store, 8, {1: 3}, done=[0, 1, 2])
    out = tmp_path / "out" / "result.jsonl"
    # When it is exported as JSONL
    n = export_job(store, JOB, out)
    # Then every record is there once, in input order, samples ascending
    rows = read_jsonl(out)
    assert n == len(rows) == 10
    assert [(r["id"], r["sample"]) for r in rows] == expected
    assert expected[:4] == [("rec-0", 0), ("rec-1", 0), ("rec-1", 1), ("rec-1", 2)]
    # And each line has exactly the exported fields, in order, without the internal pos
    assert all(list(r) == EXPORT_FIELDS for r in rows)
    assert "pos" not in EXPORT_FIELDS
    # And the values survive, unicode and nulls included
    r1 = rows[1]
    assert (r1["output"], r1["output_ids"], r1["chunk"], r1["worker"]) == (
        "answer 1.0 ✓",
        [1, 0, 7],
        0,
        "gpu0@h",
    )
    assert rows[0]["output_ids"] is None
    r4 = next(r for r in rows if r["id"] == "rec-4")
    assert (r4["finish_reason"], r4["error"]) == ("error", "too long")
    assert "✓" in out.read_text(encoding="utf-8")  # not \u-escaped


def test_parquet_in_input_order_with_exactly_the_export_fields(store, tmp_path):
    # Given the same finished job
    expected = build_job(store, 8, {1: 3}, done=[0, 1, 2])
    out = tmp_path / "result.parquet"
    # When exported to a .parquet path (format from the suffix)
    n = export_job(store, JOB, out)
    # Then the table has exactly the export columns and the rows in input order
    table = pq.read_table(out)
    assert table.column_names == [*EXPORT_FIELDS, "extra"]
    rows = table.to_pylist()
    assert n == len(rows) == 10
    assert [(r["id"], r["sample"]) for r in rows] == expected
    assert rows[1]["output_ids"] == [1, 0, 7] and rows[0]["output_ids"] is None
    assert rows[1]["latency_s"] == 0.5 and rows[1]["spec_accept_length"] is None


def test_jsonl_and_parquet_carry_the_same_records(store, tmp_path):
    build_job(store, 7, {}, done=[0, 1, 2])
    export_job(store, JOB, tmp_path / "a.jsonl")
    export_job(store, JOB, tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert all(r.pop("extra") is None for r in table)  # no passthrough fields in this job
    assert read_jsonl(tmp_path / "a.jsonl") == table


def test_explicit_format_wins_over_the_suffix(store, tmp_path):
    build_job(store, 3, {}, done=[0])
    out = tmp_path / "data.out"
    export_job(store, JOB, out, fmt="parquet")
    assert pq.read_table(out).num_rows == 3


def test_unknown_format_is_refused(store, tmp_path):
    build_job(store, 3, {}, done=[0])
    with pytest.raises(FleetError, match="csv"):
        export_job(store, JOB, tmp_path / "x.csv", fmt="csv")
    assert not (tmp_path / "x.csv").exists()


def test_unfinished_job_is_refused_naming_missing_chunks(store, tmp_path):
    # Given a job of 5 chunks where 1 and 3 have no result (3 was quarantined)
    build_job(store, 15, {}, done=[0, 2, 4])
    Quarantine(index=3, error="x", error_type="EngineError", attempts=3).write(store, JOB)
    out = tmp_path / "out.jsonl"
    # When exported without --allow-incomplete
    with pytest.raises(FleetError) as info:
        export_job(store, JOB, out)
    # Then the refusal names the missing chunks and the way out, and writes nothing
    text = str(info.value)
    assert "2 of 5 chunks" in text and "1, 3" in text and "--allow-incomplete" in text
    assert not out.exists()
    assert list(tmp_path.glob("out.jsonl*")) == []


def test_an_incomplete_export_has_the_done_chunks_in_order(store, tmp_path):
    # Given chunks 0, 2 and 4 of 5 done
    expected = build_job(store, 14, {6: 2}, done=[0, 2, 4])
    # When exported with --allow-incomplete
    n = export_job(store, JOB, tmp_path / "p.jsonl", allow_incomplete=True)
    # Then the done chunks' records come out in input order, and only those
    rows = read_jsonl(tmp_path / "p.jsonl")
    assert n == len(rows) == 3 + 4 + 2
    assert [(r["id"], r["sample"]) for r in rows] == expected
    assert sorted({r["chunk"] for r in rows}) == [0, 2, 4]
    export_job(store, JOB, tmp_path / "p.parquet", allow_incomplete=True)
    pq_rows = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert [(r["id"], r["sample"]) for r in pq_rows] == expected


def test_an_incomplete_export_of_a_job_with_nothing_done_is_empty(store, tmp_path):
    build_job(store, 6, {}, done=[])
    assert export_job(store, JOB, tmp_path / "e.jsonl", allow_incomplete=True) == 0
    assert (tmp_path / "e.jsonl").read_text() == ""
    assert export_job(store, JOB, tmp_path / "e.parquet", allow_incomplete=True) == 0
    assert pq.read_table(tmp_path / "e.parquet").column_names == [*EXPORT_FIELDS, "extra"]


def test_export_replaces_an_old_file_whole(store, tmp_path):
    build_job(store, 3, {}, done=[0])
    out = tmp_path / "o.jsonl"
    out.write_text("stale\n" * 100)
    export_job(store, JOB, out)
    assert [r["id"] for r in read_jsonl(out)] == ["rec-0", "rec-1", "rec-2"]
    assert not (tmp_path / "o.jsonl.tmp").exists()


def test_stable_export_leaves_out_run_facts(store, tmp_path):
    build_job(store, 3, {}, done=[0])
    export_job(store, JOB, tmp_path / "s.jsonl", stable=True)
    rows = read_jsonl(tmp_path / "s.jsonl")
    assert set(VOLATILE_FIELDS) == {"worker", "latency_s", "continued_at"}
    assert all(list(r) == [f for f in EXPORT_FIELDS if f not in VOLATILE_FIELDS] for r in rows)
    export_job(store, JOB, tmp_path / "s.parquet", stable=True)
    assert "worker" not in pq.read_table(tmp_path / "s.parquet").column_names


@pytest.mark.parametrize("flag", ["--allow-incomplete", "--partial"])
def test_the_cli_exports_an_incomplete_job_under_the_new_flag_and_its_old_name(store, tmp_path, clean_env, flag):
    from typer.testing import CliRunner

    from tests.cliload import cli_app

    # Given chunks 0, 2 and 4 of 5 done
    expected = build_job(store, 14, {}, done=[0, 2, 4])
    out = tmp_path / "c.jsonl"
    # When exported from the CLI, with the flag or with --partial (its old, hidden name); --allow-defects:
    # build_job's manifest sets no limits, so its made-up rows cannot be checked (fleet.audit)
    res = CliRunner().invoke(cli_app(), ["export", "--job", JOB, "--out", str(out), "--store-url", str(store.root),
                                         flag, "--allow-defects"])
    # Then the done chunks come out, and only the new name is in the help
    assert res.exit_code == 0, res.output
    assert [(r["id"], r["sample"]) for r in read_jsonl(out)] == expected
    help_text = CliRunner().invoke(cli_app(), ["export", "--help"]).output
    assert "--allow-incomplete" in help_text and "--partial" not in help_text

"""An export is checked against the manifest before its rename (fleet.export.check): a wrong
count, a duplicate id or a record out of input order is refused and nothing is written;
concurrent `fleet export` processes to one path each use their own temp file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet.errors import ExportMismatch
from fleet.export.writer import export_job
from fleet.store.layout import result_key
from fleet.store.local import LocalStore
from fleet.store.results import ChunkStats, encode_result
from tests.conftest import fleet_cmd
from tests.test_export import CHUNK, JOB, build_job, output, read_jsonl


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_result_with_a_record_too_many_is_refused(store, tmp_path):
    # Given a finished 9-record job whose last result holds a fourth record (another chunk size)
    build_job(store, 9, {}, done=[0, 1, 2])
    rows = [output(p, 0, 2) for p in range(6, 10)]
    store.put(result_key(JOB, 2), encode_result(ChunkStats(chunk=2), rows))
    out = tmp_path / "out.jsonl"
    # When it is exported, Then the count is refused and no file is written
    with pytest.raises(ExportMismatch, match=r"10 records, the manifest says 9.*was not written"):
        export_job(store, JOB, out)
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_duplicate_id_is_refused(store, tmp_path):
    build_job(store, 9, {}, done=[0, 1, 2])
    rows = [output(p, 0, 1) for p in range(3, 6)]
    rows[2] = {**rows[2], "id": "rec-0"}
    store.put(result_key(JOB, 1), encode_result(ChunkStats(chunk=1), rows))
    with pytest.raises(ExportMismatch, match="'rec-0' appears twice.*was not written"):
        export_job(store, JOB, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_records_out_of_input_order_are_refused(store, tmp_path):
    build_job(store, 9, {}, done=[0, 1, 2])
    # Chunk 1's result holds the records of chunk 0's positions under new ids
    rows = [{**output(p, 0, 1), "id": f"x{p}"} for p in range(0, 3)]
    store.put(result_key(JOB, 1), encode_result(ChunkStats(chunk=1), rows))
    with pytest.raises(ExportMismatch, match="out of input order"):
        export_job(store, JOB, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists() and leftovers(tmp_path) == []


def test_a_missing_sample_is_refused(store, tmp_path):
    build_job(store, 6, {1: 3}, done=[0, 1])
    rows = [output(p, 0, 0) for p in range(0, CHUNK)]  # record 1 lost samples 1 and 2
    store.put(result_key(JOB, 0), encode_result(ChunkStats(chunk=0), rows))
    with pytest.raises(ExportMismatch, match="6 samples, the manifest says 8"):
        export_job(store, JOB, tmp_path / "out.jsonl")


def test_an_incomplete_export_checks_the_records_of_its_chunks(store, tmp_path):
    build_job(store, 8, {1: 3}, done=[0, 2])
    assert export_job(store, JOB, tmp_path / "p.jsonl", allow_incomplete=True) == 3 + 2 + 2
    rows = [output(p, 0, 2) for p in range(6, 8)][:1]
    store.put(result_key(JOB, 2), encode_result(ChunkStats(chunk=2), rows))
    with pytest.raises(ExportMismatch, match="4 records, the manifest says 5"):
        export_job(store, JOB, tmp_path / "p2.jsonl", allow_incomplete=True)


@pytest.mark.slow
def test_concurrent_exports_to_one_path(store, tmp_path):
    # Given a finished job with many results
    expected = build_job(store, 600, {5: 2}, done=list(range(200)))
    out = tmp_path / "shared" / "out.jsonl"
    out.parent.mkdir()
    # When six `fleet export` processes write the same path at once (--allow-defects: build_job's manifest
    # sets no limits, so its made-up rows cannot be checked)
    env = {**os.environ, "FLEET_STORE_URL": store.url, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen(fleet_cmd("export", "--job", JOB, "--out", str(out), "--allow-defects"), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    # Then each succeeds, and the file is one complete export with no temp file left
    assert all(rc == 0 for rc, _ in results), results
    assert [(r["id"], r["sample"]) for r in read_jsonl(out)] == expected
    assert leftovers(out.parent) == []

"""Parquet input (docs/architecture.md, Records): every form reads as its JSONL line would,
bad rows are named by row before anything is written, the format is picked by name or by
"PAR1", s3:// works through a real S3 endpoint, `fleet validate` / `fleet enqueue` / `fleet run`
take it, and the export of a Parquet job equals the JSONL job's byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.errors import InputError
from fleet.producer.digest import InputDigest
from fleet.producer.formats import input_format
from fleet.producer.inputs import read_records, validate
from fleet.producer.source import local_input
from fleet.store import open_store
from fleet.store.local import LocalStore
from tests.conftest import ROOT, run_fleet
from tests.fleetproc import FAST_SIM

#: One record of every form, as Hugging Face would write them to Parquet (string contents,
#: ShareGPT from/value turns), with partial sampling and passthrough columns.
ROWS: list[dict] = [
    {"id": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}],
     "source": "wiki"},
    {"id": "p", "prompt": "def main():", "sampling": {"temperature": 0.5, "max_tokens": 16, "stop": ["\n\n"]},
     "meta": {"k": 1}},
    {"id": "t", "input_ids": [5, 6, 7, 8], "sampling": {"n": 2}},
    {"id": "c", "conversations": [{"from": "system", "value": "hi"}, {"from": "human", "value": "q1"},
                                  {"from": "gpt", "value": "a1"}, {"from": "human", "value": "q2"},
                                  {"from": "gpt", "value": "old"}], "source": "sharegpt"},
    {"id": "n", "messages": [{"role": "user", "content": "named", "name": "ann"}], "meta": {"k": 2, "j": "x"}},
]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> Path:
    """One column per key any row has (nulls where a row lacks it), as `datasets` writes them."""
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), path, row_group_size=row_group_size)
    return path


def problems_of(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        validate(path)
    return info.value


def digest_of(path: Path) -> str:
    d = InputDigest()
    validate(path, on_record=d.update)
    return d.hexdigest()


# -- every form reads as its JSONL line ---------------------------------------------------


def test_every_form_reads_as_the_same_jsonl_line(tmp_path):
    # Given the same records as JSONL and as Parquet (every column present in every row)
    jsonl = write_jsonl(tmp_path / "in.jsonl", ROWS)
    parquet = write_parquet(tmp_path / "in.parquet", ROWS, row_group_size=2)
    assert pq.ParquetFile(parquet).metadata.num_row_groups == 3
    assert pq.read_schema(parquet).field("sampling").type.num_fields == 4  # nulls where a row lacks one
    # Then they read to equal records: nulls in structs are unset fields, not values
    assert validate(parquet) == len(ROWS)
    records = list(read_records(parquet))
    assert records == list(read_records(jsonl))
    p, t, c, n = records[1], records[2], records[3], records[4]
    assert p.sampling.model_dump(exclude_none=True) == {"temperature": 0.5, "max_tokens": 16, "stop": ["\n\n"]}
    assert t.input_ids == [5, 6, 7, 8] and t.sample_count(1) == 2
    assert [(m.role, m.content) for m in c.messages] == [
        ("system", "hi"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    assert n.messages[0].model_dump(exclude_none=True) == {"role": "user", "content": "named", "name": "ann"}
    assert records[0].messages[0].model_extra == {}  # no "name": None from the other row's struct
    assert (p.extra, n.extra, c.extra) == ({"meta": {"k": 1}}, {"meta": {"k": 2, "j": "x"}}, {"source": "sharegpt"})
    assert [(r.pos, r.line) for r in records] == [(i, i + 1) for i in range(len(ROWS))]
    # And the job identity is the same digest, stable from one read to the next
    assert digest_of(parquet) == digest_of(jsonl) == digest_of(parquet)


def test_integer_and_null_ids_as_in_jsonl(tmp_path):
    path = write_parquet(tmp_path / "ids.pq", [{"id": 7, "prompt": "a"}, {"id": None, "prompt": "b"}])
    assert [r.id for r in read_records(path)] == ["7", "2"]  # a missing id is the row number


# -- bad rows are named by row ----------------------------------------------------------


def test_bad_rows_are_reported_by_row_number(tmp_path):
    # Given wrong types, a missing prompt and a duplicate id among good rows
    rows = [
        {"id": "a", "prompt": "fine"},
        {"id": "b", "prompt": "p", "sampling": {"temperature": "hot"}},
        {"id": "c"},
        {"id": "d", "input_ids": [1, -2]},
        {"id": "a", "prompt": "again"},
        {"id": "e", "prompt": ""},
        {"id": "f", "prompt": "p", "sampling": {"top_p": float("nan")}},
        {"id": "g", "prompt": "fine"},
    ]
    err = problems_of(write_parquet(tmp_path / "bad.parquet", rows))
    # Then every bad row is named by its number and field, and nothing else
    assert err.problems == [
        "row 2: sampling.temperature: Input should be a valid number",
        "row 3: none of messages, prompt, input_ids, conversations or body (an OpenAI batch line); one is needed",
        "row 4: input_ids[1]: must be a non-negative integer (got -2)",
        "row 5: duplicate id 'a' (first on row 1)",
        "row 6: prompt: must be a non-empty string (got string)",
        "row 7: sampling.top_p: nan is not a number JSON can hold",
    ]
    assert str(err).startswith("6 bad input row(s), nothing enqueued")
    with pytest.raises(InputError, match="^1 bad input row"):
        list(read_records(tmp_path / "bad.parquet"))


def test_a_column_type_json_cannot_hold_is_named(tmp_path):
    when = pa.array([{"at": 1}], pa.struct([("at", pa.timestamp("ms"))]))
    table = pa.table({"id": ["a"], "prompt": ["p"], "meta": when, "blob": pa.array([b"\x00"], pa.binary())})
    pq.write_table(table, tmp_path / "t.parquet")
    err = problems_of(tmp_path / "t.parquet")
    assert err.problems == ["column meta.at: type timestamp[ms] has no JSON form; cast it to a string or a number",
                            "column blob: type binary has no JSON form; cast it to a string or a number"]


# -- the format is picked by name, then by its bytes --------------------------------------


def test_parquet_named_jsonl_is_read_as_parquet(tmp_path):
    # Given a Parquet file where JSONL is assumed (named .jsonl, or no extension at all)
    for name in ("in.jsonl", "in"):
        path = write_parquet(tmp_path / name, ROWS)
        # Then it is read as Parquet: no "not UTF-8" line errors
        assert input_format(path).unit == "row"
        assert validate(path) == len(ROWS)
    assert input_format(write_jsonl(tmp_path / "x", ROWS)).unit == "line"


def test_a_broken_parquet_file_says_so(tmp_path):
    whole = write_parquet(tmp_path / "whole.parquet", ROWS).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.pq").write_text('{"id": "a", "prompt": "p"}\n')
    for name in ("cut.parquet", "text.pq"):
        err = problems_of(tmp_path / name)
        assert err.problems[0].startswith(f"{tmp_path / name}: not a readable Parquet file ("), err.problems


# -- s3:// and gs:// input through real endpoints --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_remote_parquet_input_reads_as_the_local_file(tmp_path, scheme, request):
    bucket = request.getfixturevalue(f"{scheme}_bucket")
    local = write_parquet(tmp_path / "in.parquet", ROWS)
    key = "data/train-00000-of-00001.parquet"
    open_store(f"{scheme}://{bucket}").upload(local, key)
    with local_input(f"{scheme}://{bucket}/{key}", tmp_dir=tmp_path) as fetched:
        path = fetched.path
        assert path.suffix == ".parquet" and fetched.pinned == f"{scheme}://{bucket}/{key}"
        assert validate(path) == len(ROWS)
        assert list(read_records(path)) == list(read_records(local))
    assert not fetched.path.exists()


# -- through the CLI -----------------------------------------------------------------------

NOTHING_RUNNING = {"FLEET_BROKER_URL": "redis://127.0.0.1:1/0", "FLEET_STORE_URL": "s3://no-such-bucket/x"}


@pytest.mark.slow
def test_fleet_validate_takes_parquet(tmp_path, clean_env):
    good = run_fleet("validate", str(write_parquet(tmp_path / "in.parquet", ROWS)), "--json", env=NOTHING_RUNNING)
    assert good.returncode == 0, good.stderr
    report = json.loads(good.stdout)
    assert (report["ok"], report["records"], report["samples"], report["unit"]) == (True, 5, 6, "row")
    assert report["forms"] == {"messages": 2, "prompt": 1, "input_ids": 1, "conversations": 1}
    # And a bad file is refused, every bad row named as a row
    rows = [{"id": "a", "prompt": "p"}, {"id": "b"}, {"id": "a", "prompt": "q"}]
    bad = run_fleet("validate", str(write_parquet(tmp_path / "bad.parquet", rows)), env=NOTHING_RUNNING)
    assert bad.returncode == 1
    assert "2 bad row(s)" in bad.stdout and "  row 2: none of messages, prompt" in bad.stdout
    assert "  row 3: duplicate id 'a' (first on row 1)" in bad.stdout
    good_text = run_fleet("validate", str(tmp_path / "in.parquet"), env=NOTHING_RUNNING)
    assert "5 records (6 samples), no bad rows" in good_text.stdout


@pytest.mark.slow
def test_fleet_enqueue_refuses_bad_rows_and_is_idempotent(tmp_path, redis_server, clean_env):
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store"),
           "FLEET_CHUNK_SIZE": "2"}
    # Given a Parquet input with a wrong type, a missing prompt and a duplicate id
    bad = write_parquet(tmp_path / "bad.parquet", [*ROWS, {"id": "x", "prompt": "p", "sampling": {"seed": 1.5}},
                                                   {"id": "y"}, {"id": "m", "prompt": "dup"}])
    out = run_fleet("enqueue", str(bad), "--job", "pq", env=env)
    # Then it is refused by row, with nothing written
    assert out.returncode != 0
    text = " ".join(out.stderr.split())
    assert "3 bad input row(s), nothing enqueued" in text, out.stderr
    assert "row 6: sampling.seed: Input should be a valid integer" in text
    assert "row 7: none of messages, prompt" in text and "row 8: duplicate id 'm' (first on row 1)" in text
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "store").exists() or list(LocalStore(tmp_path / "store").list("")) == []
    # And a good one enqueues, and enqueued again joins the same job (its digest is stable)
    good = write_parquet(tmp_path / "good.parquet", ROWS)
    first = run_fleet("enqueue", str(good), "--job", "pq", env=env)
    assert first.returncode == 0, first.stderr
    assert "3 chunks; enqueued 3" in first.stderr
    again = run_fleet("enqueue", str(good), "--job", "pq", env=env)
    assert again.returncode == 0, again.stderr
    assert "enqueued 0" in again.stderr and "already queued 3" in again.stderr


def export_of(tmp: Path, input_url: str, env: dict[str, str], name: str) -> bytes:
    run_env = {**FAST_SIM, **env, "FLEET_DATA_DIR": str(tmp / name), "FLEET_CHUNK_SIZE": "3"}
    done = run_fleet("run", input_url, "--job", "same", "--workers", "1", env=run_env, cwd=tmp)
    assert done.returncode == 0, done.stderr
    out = tmp / f"{name}.jsonl"
    exported = run_fleet("export", "--job", "same", "--out", str(out), "--stable", env=run_env, cwd=tmp)
    assert exported.returncode == 0, exported.stderr
    return out.read_bytes()


@pytest.mark.e2e
def test_parquet_and_jsonl_jobs_export_the_same_bytes(tmp_path, s3_bucket, s3_env, clean_env):
    # Given the same 30 records as JSONL, as local Parquet (many row groups) and as Parquet in S3
    rows = [{**ROWS[i % len(ROWS)], "id": f"r{i:03d}"} for i in range(30)]
    jsonl = write_jsonl(tmp_path / "in.jsonl", rows)
    parquet = write_parquet(tmp_path / "in.parquet", rows, row_group_size=7)
    boto3.client("s3").upload_file(str(parquet), s3_bucket, "in/train.parquet")
    url = f"s3://{s3_bucket}/in/train.parquet"
    # When a sim job runs on each
    reference = export_of(tmp_path, str(jsonl), s3_env, "jsonl")
    # Then the exports are byte for byte the same
    assert len(reference.splitlines()) == 36  # 30 records, 6 of them with n=2
    assert export_of(tmp_path, str(parquet), s3_env, "local") == reference
    assert export_of(tmp_path, url, s3_env, "s3") == reference
    # And a second run on the S3 Parquet joins the finished job: nothing to do
    again = run_fleet("run", url, "--job", "same", "--workers", "1",
                      env={**FAST_SIM, **s3_env, "FLEET_DATA_DIR": str(tmp_path / "s3"), "FLEET_CHUNK_SIZE": "3"})
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stderr


# -- memory stays flat --------------------------------------------------------------------

MEASURE = """
import json, sys
from pathlib import Path
import pyarrow as pa
from fleet.producer.inputs import validate
import fleet.producer.formats  # noqa: F401 (imports counted before the baseline)

def status(name):  # kB; VmHWM is this process's own peak (ru_maxrss would carry the parent's over exec)
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith(name + ":")) * 1024

before = status("VmRSS")
records = validate(Path(sys.argv[1]))
growth, arrow = status("VmHWM") - before, pa.default_memory_pool().max_memory()
print(json.dumps({"records": records, "growth": growth, "arrow": arrow}))
"""


@pytest.mark.slow
def test_a_large_parquet_file_validates_in_flat_memory(tmp_path):
    # Given 200,000 rows of ~300 characters in 100 row groups (~60 MB of text once decoded)
    n, group = 200_000, 2_000
    filler = "lorem ipsum dolor sit amet " * 11
    path = tmp_path / "big.parquet"
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(pa.struct([("role", pa.string()),
                                                                              ("content", pa.string())])))])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, n, group):
            ids = [f"record-{i:07d}" for i in range(start, start + group)]
            msgs = [[{"role": "user", "content": f"{filler} {i}"}] for i in range(start, start + group)]
            writer.write_table(pa.table({"id": ids, "messages": msgs}, schema=schema))
    assert pq.ParquetFile(path).metadata.num_row_groups == n // group
    # When a fresh process validates it
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    print(f"parquet {n:,} rows, {path.stat().st_size / 1e6:.1f} MB file: peak RSS growth "
          f"{figures['growth'] / 1e6:.1f} MB, Arrow pool peak {figures['arrow'] / 1e6:.1f} MB")
    # Then memory grew by a batch and the id table, far from the whole file as Python
    # objects (~300 MB); the bound is loose on purpose
    assert figures["records"] == n
    assert figures["growth"] < 100_000_000, figures

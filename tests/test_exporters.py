"""The training export formats on a job built directly in a store (sim engine, so no
tokenizer): OpenAI Batch grouping of n samples and error lines, SpecForge's skips, the
token rows' checks (digest, missing ids, sim text prompts), --only-finished, s3:// targets,
and the per-chunk truncation counts that `fleet status` sums."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from fleet.engines.sim.tokenchain import SimVocab
from fleet.errors import FleetError
from fleet.export.formats import LeftOut
from fleet.export.writer import export_job
from fleet.monitor.status import job_status
from fleet.records import InputRecord, OutputRecord, prompt_digest
from fleet.store.layout import chunk_key, encode_lines, manifest_key, result_key
from fleet.store.local import LocalStore
from fleet.store.manifest import Manifest, config_hash
from fleet.store.results import ChunkStats, encode_result, sample_counts

JOB = "t"
USER = [{"role": "user", "content": "hi"}]


def rec(pos: int, **form) -> InputRecord:
    return InputRecord(pos=pos, line=pos + 1, id=f"r{pos}", **form)


def out(record: InputRecord, sample: int = 0, finish: str = "stop", **fields) -> dict:
    base = dict(output=f"answer {record.pos}", reasoning=f"think {record.pos}", output_ids=[7, 8, 9],
                prompt_tokens=3, completion_tokens=3)
    if record.input_ids is not None:
        base["prompt_digest"] = prompt_digest(record.input_ids)
    base |= fields
    return OutputRecord(id=record.id, sample=sample, finish_reason=finish, chunk=0, worker="w", model="sim",
                        pos=record.pos, extra=record.extra, **base).model_dump(mode="json")  # type: ignore[arg-type]


def build(store: LocalStore, records: list[InputRecord], rows: list[dict]) -> None:
    # No max tokens: rows made up to test the formats' own rules are not what any engine made, and the
    # audit (tests/test_audit.py) leaves a job whose manifest sets no limits unchecked
    config = {"engine": "sim", "model": {"name": "sim"}, "sampling": {}}
    store.put(manifest_key(JOB), Manifest(job=JOB, input="x", chunk_size=len(records), chunks=1,
                                          records=len(records), samples=len(rows), config=config,
                                          config_hash=config_hash(config)).to_bytes())
    store.put(chunk_key(JOB, 0), encode_lines(r.model_dump(mode="json", exclude_none=True) for r in records))
    store.put(result_key(JOB, 0), encode_result(ChunkStats(records=len(records), **sample_counts(rows)), rows))


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_openai_groups_samples_as_choices_and_failed_records_as_errors(store, tmp_path):
    # Given a chat record with two samples, a failed record and a raw prompt
    chat, failed, raw = rec(0, messages=USER), rec(1, messages=USER), rec(2, prompt="p")
    rows = [out(chat, 0), out(chat, 1, "length", completion_tokens=5), out(failed, 0, "error", error="too long",
            completion_tokens=0, prompt_tokens=0), out(raw)]  # fmt: skip
    build(store, [chat, failed, raw], rows)
    # When exported as OpenAI Batch output
    n = export_job(store, JOB, tmp_path / "b.jsonl", fmt="openai")
    a, b, c = lines(tmp_path / "b.jsonl")
    # Then one line per record: n samples are n choices with summed usage
    assert n == 3 and [x["custom_id"] for x in (a, b, c)] == ["r0", "r1", "r2"]
    body = a["response"]["body"]
    assert body["object"] == "chat.completion" and [ch["finish_reason"] for ch in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    assert body["choices"][1]["message"] == {"role": "assistant", "content": "answer 0", "reasoning_content": "think 0"}
    # And a failed record is response null with an error object; a raw prompt a text completion
    # whose text is all it generated: its ids as its engine decodes them (the sim's vocabulary)
    assert b["response"] is None and b["error"] == {"code": "record_error", "message": "too long"}
    text = c["response"]["body"]
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == SimVocab().decode([7, 8, 9])
    # And a second export is byte-identical (ids derive from job and record)
    export_job(store, JOB, tmp_path / "b2.jsonl", fmt="openai")
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "b2.jsonl").read_bytes()


def test_specforge_skips_what_it_cannot_hold_and_counts_it(store, tmp_path):
    # Given a good chat record with metadata, one with a think marker left in the answer,
    # a failed one, and a pre-tokenized one
    good = rec(0, messages=[{"role": "system", "content": "s"}, *USER], extra={"metadata": {"k": 1}})
    marker, failed, tok = rec(1, messages=USER), rec(2, messages=USER), rec(3, input_ids=[1, 2])
    rows = [out(good), out(good, 1), out(marker, output="a </think> b"), out(failed, 0, "error", error="x"), out(tok)]
    build(store, [good, marker, failed, tok], rows)
    left_out = LeftOut()
    # When exported for SpecForge
    n = export_job(store, JOB, tmp_path / "s.jsonl", fmt="specforge", left_out=left_out)
    first, second = lines(tmp_path / "s.jsonl")
    # Then only the good record's samples are written, messages plus the assistant turn
    assert n == 2 and first == {"id": "r0", "conversations": [
        {"role": "system", "content": "s"}, *USER,
        {"role": "assistant", "content": "answer 0", "reasoning_content": "think 0"}], "metadata": {"k": 1}}
    assert second["sample"] == 1 and "sample" not in first
    # And every other row is counted by reason
    assert left_out.total == 3 and any("input_ids" in k for k in left_out.reasons)


def test_tokens_from_given_ids_and_refusals(store, tmp_path):
    # Given a pre-tokenized record on the sim engine, and a failed one
    tok, failed = rec(0, input_ids=[5, 6], extra={"source": "s3"}), rec(1, input_ids=[1])
    build(store, [tok, failed], [out(tok), out(failed, 0, "error", error="x", output_ids=None)])
    left_out = LeftOut()
    # Then its token row is the given ids, then the output ids, masked over the output
    assert export_job(store, JOB, tmp_path / "t.jsonl", fmt="tokens", left_out=left_out) == 1
    assert lines(tmp_path / "t.jsonl") == [{"id": "r0", "input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1],
                                            "source": "s3"}]
    assert left_out.reasons == {"error records": 1}
    # And ids that are not what the engine saw (digest differs) fail the export, leaving no file
    build(store, [tok], [out(tok, prompt_digest="0" * 16)])
    with pytest.raises(FleetError, match="differ from those the engine saw"):
        export_job(store, JOB, tmp_path / "bad.jsonl", fmt="tokens")
    assert not (tmp_path / "bad.jsonl").exists()
    # And a job without output ids, or a text prompt on the sim engine, is refused clearly
    build(store, [tok], [out(tok, output_ids=None)])
    with pytest.raises(FleetError, match="return_output_ids"):
        export_job(store, JOB, tmp_path / "x.jsonl", fmt="tokens")
    chat = rec(0, messages=USER)
    build(store, [chat], [out(chat)])
    with pytest.raises(FleetError, match="sim engine, which has no tokenizer"):
        export_job(store, JOB, tmp_path / "y.jsonl", fmt="tokens")


def test_a_passthrough_field_never_replaces_what_the_format_computes(store, tmp_path):
    # Given a pre-tokenized record that carries its own (shorter) loss_mask as metadata
    tok = rec(0, input_ids=[1, 2, 3], extra={"loss_mask": [0, 0, 1], "source": "ds"})
    build(store, [tok], [out(tok)])
    # When it is exported as tokens
    export_job(store, JOB, tmp_path / "t.jsonl", fmt="tokens")
    # Then the mask is the one fleet computed over prompt + output; other metadata passes through
    [row] = lines(tmp_path / "t.jsonl")
    assert row["loss_mask"] == [0, 0, 0, 1, 1, 1] and len(row["loss_mask"]) == len(row["input_ids"])
    assert row["source"] == "ds"


def test_only_finished_and_status_agree_on_truncation(store, tmp_path):
    # Given rows that stopped, were cut in the answer, cut inside the thinking, failed, ended
    # inside the thinking, closed the thinking with an empty answer, and one written before
    # the in_thinking flag existed that ended with reasoning only
    records = [rec(i, prompt="p") for i in range(7)]
    legacy = out(records[6], 0, "stop", output="", reasoning="old thought")
    del legacy["in_thinking"]
    rows = [out(records[0]), out(records[1], 0, "length"),
            out(records[2], 0, "length", output="", reasoning="half a thought", in_thinking=True),
            out(records[3], 0, "error", error="x", reasoning=None, output=""),
            out(records[4], 0, "stop", output="", reasoning="a whole thought", in_thinking=True),
            out(records[5], 0, "stop", output="", reasoning="closed, then nothing"), legacy]  # fmt: skip
    build(store, records, rows)
    # Then the chunk's stats count both cuts, one inside the thinking, and the two rows ended there
    stats = sample_counts(rows)
    assert (stats["records_truncated"], stats["records_truncated_in_thinking"], stats["records_ended_in_thinking"]) \
        == (2, 1, 2)
    st = job_status(store, None, JOB)
    assert (st.records_truncated, st.records_truncated_in_thinking, st.records_ended_in_thinking, st.record_errors) \
        == (2, 1, 2, 1)
    # And --only-finished keeps exactly the rows that stopped on their own after their thinking
    assert export_job(store, JOB, tmp_path / "f.jsonl", only_finished=True) == 2
    assert [r["id"] for r in lines(tmp_path / "f.jsonl")] == ["r0", "r5"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "openai", "parquet"])
def test_export_to_s3_equals_the_local_file(store, tmp_path, s3_bucket, fmt):
    # Given a finished job
    records = [rec(i, messages=USER) for i in range(5)]
    build(store, records, [out(r) for r in records])
    # When exported to a local path and to an s3:// URL
    export_job(store, JOB, tmp_path / "local", fmt=fmt, stable=True)
    assert export_job(store, JOB, f"s3://{s3_bucket}/exports/out", fmt=fmt, stable=True) == 5
    # Then the object holds the same bytes
    body = boto3.client("s3").get_object(Bucket=s3_bucket, Key="exports/out")["Body"].read()
    assert body == (tmp_path / "local").read_bytes()

"""`fleet validate`: enqueue's checks with nothing running (no broker, no store), every bad
line listed, and the figures the planner needs, on a local file and on s3://."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import boto3
import pytest

from fleet.model.rendering import load_tokenizer
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, read_jsonl
from tests.modelkit import tiny_model_fixture  # noqa: F401

#: Services that do not exist: validate must never try them.
NOTHING_RUNNING = {"FLEET_BROKER_URL": "redis://127.0.0.1:1/0", "FLEET_STORE_URL": "s3://no-such-bucket/x"}


def good_lines() -> list[dict]:
    return [
        {"id": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]},
        {"id": "p", "prompt": "def main():"},
        {"id": "t", "input_ids": [5, 6, 7, 8], "sampling": {"n": 3}},
        {"id": "c", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
        {"custom_id": "b", "body": {"messages": [{"role": "user", "content": "Tell me more, please."}]}},
    ]


def write(path: Path, lines: list[dict | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.mark.slow
def test_a_good_input_gives_the_planners_figures_with_the_models_tokenizer(tmp_path: Path, tiny_model: Path,
                                                                           clean_env):
    # Given one record of every form
    src = write(tmp_path / "in.jsonl", good_lines())
    # When it is validated with the model, with no broker and no store anywhere
    res = run_fleet("validate", str(src), "--engine", "hf", "--model", str(tiny_model), "--json",
                    env=NOTHING_RUNNING)
    # Then it passes and counts records, samples and forms
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert (report["ok"], report["records"], report["samples"], report["bad_lines"]) == (True, 5, 7, 0)
    assert report["forms"] == {"messages": 1, "prompt": 1, "input_ids": 1, "conversations": 1,
                               "openai batch (messages)": 1}  # fmt: skip
    # And the prompt tokens are what the chat template renders each record to (given ids as given)
    tok = load_tokenizer(str(tiny_model))

    def chat(messages: list[dict]) -> int:
        return len(tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True,
                                           return_dict=True)["input_ids"])  # fmt: skip

    lengths = [chat(good_lines()[0]["messages"]), len(tok("def main():")["input_ids"]), 4,
               chat([{"role": "user", "content": "Hi"}]), chat(good_lines()[4]["body"]["messages"])]  # fmt: skip
    assert report["prompt_tokens"] == {
        "mean": round(sum(lengths) / 5, 1), "p50": nearest_rank(lengths, 0.5), "p99": max(lengths),
        "max": max(lengths), "total": sum(lengths),
    }  # fmt: skip
    assert (report["context"], report["over_context"], report["rejected"]) == (2048, 0, [])


def test_every_bad_line_is_listed_with_nothing_running(tmp_path: Path, clean_env):
    # Given 150 bad lines of several kinds among good ones (enqueue shows the first 100)
    bad: list[dict | str] = []
    for i in range(50):
        bad += ["{not json", {"id": f"x{i}", "prompt": 7}, {"id": "m", "prompt": "a duplicate id"}]
    src = write(tmp_path / "in.jsonl", [*good_lines(), *bad])
    # When it is validated without a model
    res = run_fleet("validate", str(src), env=NOTHING_RUNNING)
    out = " ".join(res.stdout.split())
    # Then it fails and names every bad line with its number, and still counts what is good
    assert res.returncode == 1, res.stderr
    listed = [x for x in res.stdout.splitlines() if x.startswith("  line ")]
    assert "150 bad line(s)" in out and len(listed) == 150
    assert "line 6: not JSON" in out and "line 7: prompt: must be a non-empty string (got number)" in out
    assert "line 155: duplicate id 'm' (first on line 1)" in out
    assert "prompt tokens: give --model" in out


def test_an_s3_input_is_read_like_a_local_one(tmp_path: Path, s3_bucket: str, s3_env: dict, clean_env):
    # Given the input as an S3 object, its fourth line pre-tokenized past the model's vocabulary
    lines = good_lines()
    lines[2] = {"id": "t", "input_ids": [1, 10**6]}
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="in/p.jsonl",
                                  Body="".join(json.dumps(x) + "\n" for x in lines).encode())
    # When it is validated for the sim engine (vocabulary from its settings)
    env = {**s3_env, **NOTHING_RUNNING, "FLEET_SIM__VOCAB_SIZE": "1000"}
    res = run_fleet("validate", f"s3://{s3_bucket}/in/p.jsonl", "--json", env=env)
    # Then the object is checked as enqueue would check it
    report = json.loads(res.stdout)
    assert res.returncode == 1 and report["records"] == 4 and report["bad_lines"] == 1
    assert report["problems"][0].startswith("line 3: input_ids[1]: token id 1000000 is outside")


@pytest.mark.slow
def test_prompts_that_fill_the_context_are_counted(tmp_path: Path, tiny_model: Path, clean_env):
    # Given a prompt longer than the tiny model's 2048-token context, beside a short one
    src = write(tmp_path / "in.jsonl", [{"id": "long", "prompt": "word " * 3000}, {"id": "short", "prompt": "hi"}])
    # When it is validated with the model
    res = run_fleet("validate", str(src), "--engine", "hf", "--model", str(tiny_model), env=NOTHING_RUNNING)
    # Then the input is well formed, and the prompt that would fail alone is counted
    assert res.returncode == 0, res.stderr
    assert "1 prompt(s) fill the context of 2,048 tokens and would fail alone" in res.stdout


# -- one parser, one verdict: what validate refuses, enqueue refuses, and the reverse ----------


def nested(levels: int) -> dict:
    value: dict | str = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value  # type: ignore[return-value]


@pytest.mark.slow
def test_validate_and_enqueue_refuse_the_same_lines(tmp_path: Path, redis_server, clean_env):
    # Given lines no chunk encoder could hold as written: metadata 300 levels deep (pydantic's
    # serializer, which digests the input, stops at 255), a number no float holds, a NUL byte
    # (a stray binary), a raw control character and an integer of 5,000 digits
    src = write(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "fine"},
        {"id": "deep", "prompt": "p", "metadata": nested(300)},
        '{"id": "huge", "prompt": "p", "metadata": {"score": 1e400}}',
        '{"id": "nul", "prompt": "p\x00"}',
        '{"id": "ctl", "prompt": "p\x01"}',
        '{"id": "long", "prompt": "p", "n": 1' + "0" * 5000 + "}",
    ])  # fmt: skip
    # When validated, and then enqueued
    checked = run_fleet("validate", str(src), "--json", env=NOTHING_RUNNING)
    store = tmp_path / "store"
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(store)}
    enqueued = run_fleet("enqueue", str(src), "--job", "v", env=env)
    # Then validate names each line with what is wrong
    report = json.loads(checked.stdout)
    assert checked.returncode == 1 and report["records"] == 1 and report["bad_lines"] == 5
    assert report["problems"] == [
        "line 2: metadata: nests deeper than 128 levels of objects and arrays",
        "line 3: not JSON: the number 1e400 is out of range (beyond a 64-bit float)",
        "line 4: NUL byte at column 27: binary data, not a line of JSON text",
        "line 5: not JSON: Invalid control character at column 27",
        "line 6: not JSON: an integer has more than 4300 digits",
    ]
    # And enqueue refuses exactly those lines, without a traceback, writing nothing
    assert enqueued.returncode == 2, enqueued.stderr
    assert "5 bad input line(s), nothing enqueued" in enqueued.stderr and "Traceback" not in enqueued.stderr
    assert [x.strip() for x in enqueued.stderr.splitlines() if x.strip().startswith("line ")] == report["problems"]
    assert not store.exists() or list(store.rglob("*")) == []


@pytest.mark.slow
def test_a_record_at_the_limits_passes_both_and_exports_unchanged(tmp_path: Path, clean_env):
    # Given a record nesting exactly 128 levels, with the largest float and integers past 64 bits
    metadata = {"tree": nested(126), "f": 1.5e308, "big": -(2**70), "long": int("9" * 4300)}
    src = write(tmp_path / "in.jsonl", [{"id": "edge", "prompt": "p", "metadata": metadata},
                                        {"id": "plain", "prompt": "q"}])  # fmt: skip
    # When it is validated, then run and exported through enqueue, a sim worker and the exporter
    checked = run_fleet("validate", str(src), env=NOTHING_RUNNING)
    env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data")}
    ran = run_fleet("run", str(src), "--job", "edge", "--workers", "1", env=env)
    out = tmp_path / "out.jsonl"
    exported = run_fleet("export", "--job", "edge", "--out", str(out), env=env)
    # Then each step accepts it, and the export holds the metadata exactly as written
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert exported.returncode == 0, exported.stderr
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["edge", "plain"]
    assert rows[0]["metadata"] == metadata and rows[0]["finish_reason"] in ("stop", "length")


@pytest.mark.slow
def test_an_empty_or_compressed_input_says_what_it_is(tmp_path: Path, redis_server, clean_env):
    # Given an empty file, and a good input gzip-compressed
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(write(tmp_path / "in.jsonl", good_lines()).read_bytes()))
    for path, says in ((empty, "no records (the input is empty or only blank lines)"),
                       (packed, "gzip-compressed (decompress it first: gunzip); fleet reads JSONL text")):
        # When each is validated and enqueued
        checked = run_fleet("validate", str(path), env=NOTHING_RUNNING)
        as_json = json.loads(run_fleet("validate", str(path), "--json", env=NOTHING_RUNNING).stdout)
        env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "s")}
        enqueued = run_fleet("enqueue", str(path), "--job", "e", env=env)
        # Then both say what the file is, once, and count no bad line
        assert checked.returncode == 1 and "bad line" not in checked.stdout
        assert f"  {path}: {says}" in checked.stdout.splitlines()
        assert (as_json["ok"], as_json["bad_lines"], as_json["problems"]) == (False, 0, [f"{path}: {says}"])
        assert enqueued.returncode == 2 and "Traceback" not in enqueued.stderr
        assert f"{path}: {says}; nothing enqueued" in " ".join(enqueued.stderr.split())

"""Input reading and validation (docs/architecture.md, Records): the three forms, every malformed
case with its line and field, duplicate ids, s3:// input through a real S3 endpoint,
and flat memory on a large input."""

from __future__ import annotations

import gzip
import json
import socket
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import zstandard

from fleet.errors import ConfigError, InputError, InputUnusable
from fleet.producer.inputs import read_records, validate
from fleet.producer.reader import MAX_DEPTH
from fleet.producer.seen import SeenIds
from fleet.producer.source import local_input

USER = [{"role": "user", "content": "hi"}]


def write(tmp_path: Path, *lines: str | bytes | dict, name: str = "in.jsonl") -> Path:
    path = tmp_path / name
    raw = [
        line
        if isinstance(line, bytes)
        else (json.dumps(line) if isinstance(line, dict) else line).encode()
        for line in lines
    ]
    path.write_bytes(b"\n".join(raw) + b"\n")
    return path


def problems_of(path: Path, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        validate(path, **kwargs)
    return info.value


# -- the three valid forms ---------------------------------------------------------------


def test_messages_form(tmp_path):
    path = write(
        tmp_path,
        {
            "id": "a",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
        },
    )
    assert validate(path) == 1
    [rec] = list(read_records(path))
    assert (rec.pos, rec.line, rec.id, rec.prompt, rec.sampling) == (0, 1, "a", None, None)
    assert [m.role for m in rec.messages] == ["system", "user"]
    assert rec.messages[1].content == [{"type": "text", "text": "hi"}]


def test_prompt_form_with_sampling(tmp_path):
    path = write(
        tmp_path,
        {
            "id": 7,
            "prompt": "raw text",
            "sampling": {"temperature": 0, "max_tokens": 16, "stop": "END"},
        },
    )
    [rec] = list(read_records(path))
    assert rec.id == "7" and rec.prompt == "raw text" and rec.messages is None
    assert rec.sampling.temperature == 0.0
    assert rec.sampling.max_tokens == 16
    assert rec.sampling.stop == ["END"]


def test_openai_batch_form(tmp_path):
    line = {
        "custom_id": "req-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-x",
            "messages": USER,
            "max_completion_tokens": 64,
            "temperature": 0.6,
            "top_p": 0.95,
            "stop": ["\n\n"],
            "n": 2,
            "seed": 3,
        },
        "sampling": {"top_k": 20},
    }
    path = write(tmp_path, line, {"custom_id": 9, "body": {"prompt": "p", "max_tokens": 5}})
    assert validate(path) == 2
    first, second = read_records(path)
    assert first.id == "req-1" and first.messages[0].content == "hi"
    s = first.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.stop, s.n, s.seed, s.top_k) == (
        64,
        0.6,
        0.95,
        ["\n\n"],
        2,
        3,
        20,
    )
    assert first.sample_count(1) == 2
    assert second.id == "9" and second.prompt == "p" and second.sampling.max_tokens == 5


def test_defaults_blank_lines_bom_and_crlf(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"prompt": "one"}\r\n\r\n   \n{"messages": [{"role": "user", '
        b'"content": "two"}], "id": null}\r\n\n{"id": "x", "prompt": "three"}'
    )
    assert validate(path) == 3
    recs = list(read_records(path))
    assert [(r.pos, r.line, r.id) for r in recs] == [(0, 1, "1"), (1, 4, "4"), (2, 6, "x")]


def test_extra_top_level_keys_are_passed_through(tmp_path):
    path = write(tmp_path, {"id": "a", "prompt": "p", "source": "wiki", "meta": {"k": 1}})
    [rec] = list(read_records(path))
    assert rec.id == "a" and rec.prompt == "p"
    assert rec.extra == {"source": "wiki", "meta": {"k": 1}}


def test_pre_tokenized_form_checked_against_the_vocabulary(tmp_path):
    # Given pre-tokenized records, one with an id past a 1,024-token vocabulary
    path = write(tmp_path, {"id": "t", "input_ids": [1, 2, 1023], "sampling": {"max_tokens": 4}},
                 {"id": "u", "input_ids": [5, 1024]})
    # Then without a known vocabulary both read, with one the second is refused by line
    assert validate(path) == 2
    err = problems_of(path, vocab=1024)
    assert err.problems == ["line 2: input_ids[1]: token id 1024 is outside the model's vocabulary of 1024"]
    [rec, _] = list(read_records(path))
    assert rec.input_ids == [1, 2, 1023] and rec.messages is None and rec.sampling.max_tokens == 4


def test_conversation_rows_prompt_up_to_the_last_user_turn(tmp_path):
    # Given a ShareGPT row ending in an assistant turn and a role/content row
    sharegpt = {"id": "s", "conversations": [
        {"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"},
        {"from": "gpt", "value": "hello"}, {"from": "human", "value": "again"},
        {"from": "gpt", "value": "old answer"}]}
    plain = {"id": "p", "conversations": [{"role": "user", "content": "q"}], "source": "x"}
    path = write(tmp_path, sharegpt, plain)
    # Then the prompt keeps every turn up to the last user one, roles normalised
    s, p = read_records(path)
    assert [(m.role, m.content) for m in s.messages] == [
        ("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "again")]
    assert [(m.role, m.content) for m in p.messages] == [("user", "q")] and p.extra == {"source": "x"}


# -- every malformed case names its line and what is wrong --------------------------------

GOOD = {"id": "ok", "prompt": "fine"}


def nested(levels: int) -> dict:
    """A value of `levels` objects, one inside the other."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


def _sampled(**sampling) -> dict:
    return {"prompt": "p", "sampling": sampling}


def _batch(body, **extra) -> dict:
    return {"custom_id": "b", "body": body, **extra}


MALFORMED = [
    (b'{"id": "\xff\xfe", "prompt": "p"}', "not UTF-8: byte 0xff at column 9"),
    ('{"id": "a", "prompt": ', "not JSON: Expecting value at column 23"),
    ("{'id': 'single quotes'}", "not JSON: Expecting property name"),
    ('{"prompt": "p", "sampling": {"temperature": NaN}}', "not JSON: NaN is not valid"),
    ("[1, 2]", "not a JSON object (got array)"),
    ('"just a string"', "not a JSON object (got string)"),
    ({"id": "x"}, "none of messages, prompt, input_ids, conversations or body (an OpenAI batch line)"),
    ({"id": "x", "messages": USER, "prompt": "p"}, "both messages and prompt; give one"),
    ({"messages": "hi"}, "messages: must be a non-empty array of messages (got string)"),
    ({"messages": []}, "messages: must be a non-empty array of messages (got an empty"),
    ({"messages": ["hi"]}, "messages[0]: must be an object with role and content (got s"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role: must be a non-empty string (got null)"),
    ({"messages": [{"role": 1, "content": "x"}]}, "messages[0].role: must be a non-empty string"),
    (
        {"messages": [USER[0], {"role": "user", "content": 5}]},
        "messages[1].content: must be a string or an array (got number)",
    ),
    ({"messages": [{"role": "user"}]}, "messages[0].content: missing"),
    ({"prompt": 5}, "prompt: must be a non-empty string (got number)"),
    ({"prompt": ""}, "prompt: must be a non-empty string (got string)"),
    ({"id": 1.5, "prompt": "p"}, "id: must be a string or an integer (got number)"),
    ({"id": True, "prompt": "p"}, "id: must be a string or an integer (got boolean)"),
    ({"id": ["a"], "prompt": "p"}, "id: must be a string or an integer (got array)"),
    ({"id": "", "prompt": "p"}, "id: must not be empty"),
    (_batch({"prompt": "p"}, custom_id={}), "custom_id: must be a string or an integer (got o"),
    ({"prompt": "p", "sampling": [1]}, "sampling: must be an object (got array)"),
    (_sampled(temperature="hot"), "sampling.temperature: Input should be a valid number"),
    (_sampled(temperature="0.7"), "sampling.temperature: Input should be a valid number"),
    (_sampled(temperature=-1), "sampling.temperature: Input should be greater than or equal to 0"),
    (_sampled(max_tokens=1.5), "sampling.max_tokens: Input should be a valid integer"),
    (_sampled(seed=True), "sampling.seed: Input should be a valid integer"),
    (_sampled(stop=["a", 1]), "sampling.stop[1]: Input should be a valid string"),
    (_sampled(temp=1), "sampling.temp: not a sampling field (known: temperature"),
    ({"prompt": "p", "temperature": 1}, 'temperature: sampling fields go inside "sampling"'),
    (_batch("hi"), "body: must be an object (got string)"),
    (_batch({"model": "m"}), "body has no messages or prompt; one is needed"),
    (
        _batch({"messages": [{"role": None, "content": "x"}]}),
        "body.messages[0].role: must be a non-empty string (got null)",
    ),
    (
        _batch({"prompt": "p", "temperature": "x"}),
        "body.temperature: Input should be a valid number",
    ),
    (
        _batch({"prompt": "p", "max_completion_tokens": 0}),
        "body.max_completion_tokens: Input should be greater than or equal to 1",
    ),
    (_batch({"prompt": "p", "logprobs": True}), "body.logprobs: not supported (sampling fields: "),
    (
        _batch({"prompt": "p", "temperature": 1}, sampling={"temperature": 0}),
        "sampling.temperature: also given as body.temperature; give it once",
    ),
    (_batch({"prompt": "p"}, messages=USER), "messages: give it inside body, not beside it"),
    ({"input_ids": []}, "input_ids: must be a non-empty array of token ids"),
    ({"input_ids": "1 2"}, "input_ids: must be a non-empty array of token ids"),
    ({"input_ids": [1, -2]}, "input_ids[1]: must be a non-negative integer (got -2)"),
    ({"input_ids": [1, 2.0]}, "input_ids[1]: must be a non-negative integer (got 2.0)"),
    ({"input_ids": [True]}, "input_ids[0]: must be a non-negative integer (got True)"),
    ({"input_ids": [1], "prompt": "p"}, "both prompt and input_ids; give one"),
    ({"conversations": []}, "conversations: must be a non-empty array of turns"),
    ({"conversations": [{"from": "gpt", "value": "hi"}]}, "conversations: no user turn, so nothing to answer"),
    ({"conversations": [{"from": "bot", "value": "hi"}]}, "conversations[0].from: must be human, gpt or system"),
    ({"conversations": [{"role": "user", "content": 5}]}, "conversations[0].content: must be a string or an"),
    ({"prompt": "p", "output": "x"}, "output: an output field has this name; put it under another key"),
    (b'{"id": "n", "prompt": "p\x00"}', "NUL byte at column 25: binary data, not a line of JSON text"),
    (b'{"id": "c", "prompt": "p\x01"}', "not JSON: Invalid control character at column 25"),
    ('{"prompt": "p", "m": 1e400}', "not JSON: the number 1e400 is out of range (beyond a 64-bit float)"),
    ('{"prompt": "p", "sampling": {"temperature": -1e400}}', "not JSON: the number -1e400 is out of range"),
    ('{"prompt": "p", "m": 1' + "0" * 5000 + "}", "not JSON: an integer has more than 4300 digits"),
    ({"prompt": "p", "metadata": nested(MAX_DEPTH)}, f"metadata: nests deeper than {MAX_DEPTH} levels of objects"),
    ('{"prompt": "p", "m": ' + "[" * 5000 + "]" * 5000 + "}", f"nests deeper than {MAX_DEPTH} levels of objects"),
]


@pytest.mark.parametrize(("bad", "expected"), MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_line_is_reported_with_line_and_field(tmp_path, bad, expected):
    path = write(tmp_path, GOOD, bad, {"id": "later", "prompt": "also fine"})
    err = problems_of(path)
    assert err.total_bad == 1
    [problem] = err.problems
    assert problem.startswith(f"line 2: {expected}"), problem
    assert "1 bad input line(s), nothing enqueued" in str(err)
    # Reading goes through the same parser, so it refuses the same line.
    with pytest.raises(InputError, match="^1 bad input line"):
        list(read_records(path))


def test_several_problems_on_one_line_are_all_named(tmp_path):
    path = write(
        tmp_path, {"id": False, "messages": [{"role": 1, "content": 2}], "sampling": {"top_p": 2}}
    )
    [problem] = problems_of(path).problems
    assert problem.startswith("line 1: id: must be a string or an integer (got boolean); ")
    assert "messages[0].role: must be a non-empty string" in problem
    assert "messages[0].content: must be a string or an array (got number)" in problem


def test_every_bad_line_is_reported_in_order(tmp_path):
    path = write(tmp_path, GOOD, "nope", "", {"id": "y"}, {"id": "z", "prompt": "p"}, "[]")
    err = problems_of(path)
    assert err.total_bad == 3
    assert [p.split(":")[0] for p in err.problems] == ["line 2", "line 4", "line 6"]


def test_report_is_capped_but_all_bad_lines_are_counted(tmp_path):
    path = write(tmp_path, *(["{bad"] * 250))
    err = problems_of(path, max_report=10)
    assert err.total_bad == 250 and len(err.problems) == 10
    assert err.problems[-1].startswith("line 10: not JSON")
    assert "... and 240 more" in str(err)


# -- duplicate ids ------------------------------------------------------------------------


def test_duplicate_id_names_the_earlier_line(tmp_path):
    path = write(
        tmp_path,
        {"id": "a", "prompt": "p"},
        {"id": "b", "prompt": "p"},
        "",
        {"id": "a", "prompt": "q"},
        {"id": "a", "messages": USER},
    )
    err = problems_of(path)
    assert err.problems == [
        "line 4: duplicate id 'a' (first on line 1)",
        "line 5: duplicate id 'a' (first on line 1)",
    ]


def test_duplicate_across_forms_and_types(tmp_path):
    # The output id is a string: 5 and "5" are the same record, and so is a batch custom_id,
    # and a record without id takes its line number.
    path = write(
        tmp_path,
        {"id": 5, "prompt": "p"},
        {"custom_id": "5", "body": {"prompt": "p"}},
        {"id": "1", "prompt": "p"},
    )
    err = problems_of(path)
    assert err.problems == ["line 2: duplicate id '5' (first on line 1)"]
    path = write(tmp_path, {"prompt": "no id"}, {"id": "1", "prompt": "p"}, name="b.jsonl")
    assert problems_of(path).problems == ["line 2: duplicate id '1' (first on line 1)"]


def test_seen_ids_grows_and_remembers_first_lines():
    seen = SeenIds(capacity=4)
    for i in range(50_000):
        assert seen.add(f"id-{i}", i + 1) is None
    assert len(seen) == 50_000
    assert seen.add("id-0", 99) == 1
    assert seen.add("id-49999", 99) == 50_000
    assert seen.add("id-50000", 99) is None


# -- empty input ----------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\n\n  \n\t\n"])
def test_input_without_records_is_an_error_that_blames_no_line(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    err = problems_of(path)
    assert isinstance(err, InputUnusable) and err.total_bad == 0
    assert err.problems == [f"{path}: no records (the input is empty or only blank lines)"]
    assert str(err) == f"{path}: no records (the input is empty or only blank lines); nothing enqueued"


@pytest.mark.parametrize(("pack", "named"), [
    (gzip.compress, "gzip-compressed (decompress it first: gunzip)"),
    (lambda b: zstandard.ZstdCompressor().compress(b), "zstd-compressed (decompress it first: zstd -d)"),
    (lambda b: b.decode().encode("utf-16"), "UTF-16 text (save it as UTF-8)"),
])  # fmt: skip
def test_a_compressed_or_utf16_input_is_named_once(tmp_path, pack, named):
    # Given a good JSONL file of 50 lines, compressed (or saved as UTF-16)
    good = write(tmp_path, *[{"id": i, "prompt": "p"} for i in range(50)])
    path = tmp_path / "in.jsonl.packed"
    path.write_bytes(pack(good.read_bytes()))
    # Then validating and reading it say what the file is, once, blaming no line
    err = problems_of(path)
    assert isinstance(err, InputUnusable) and err.total_bad == 0
    assert err.problems == [f"{path}: {named}; fleet reads JSONL text"]
    with pytest.raises(InputUnusable, match="fleet reads JSONL text"):
        list(read_records(path))


def test_the_largest_values_the_encoders_hold_are_read_unchanged(tmp_path):
    # Given a line at the nesting limit, with the largest float and integers past 64 bits
    extra = {"metadata": nested(MAX_DEPTH - 1), "f": 1.5e308, "big": -(2**70), "long": int("9" * 4300)}
    path = write(tmp_path, {"id": "edge", "prompt": "p", **extra})
    # Then it is one good record, and its fields come back as written
    assert validate(path) == 1
    [rec] = list(read_records(path))
    assert rec.extra == extra


# -- where the input comes from -------------------------------------------------------------


def test_local_input_paths(tmp_path):
    path = write(tmp_path, GOOD)
    with local_input(str(path)) as p:
        assert p.path == path and p.pinned == str(path)
    with local_input(f"file://{path}") as p:
        assert p.path == path and validate(p.path) == 1
    with pytest.raises(ConfigError, match="does not exist"), local_input(str(tmp_path / "no")):
        pass
    with local_input(str(tmp_path)) as p:  # a folder is a dataset (tests/test_datasets.py)
        assert p.path == tmp_path and p.pinned == f"{tmp_path}?split=train"
    with pytest.raises(ConfigError, match="unknown scheme http://; use a local path"), local_input("http://x/in.jsonl"):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, monkeypatch, tmp_path):
    import boto3

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.session.Session().client("s3")
    bucket = f"in-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


@pytest.mark.slow
def test_s3_input_is_downloaded_read_and_removed(s3, tmp_path):
    client, bucket = s3
    lines = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(1000)]
    body = "\n".join(json.dumps(x) for x in lines).encode() + b"\n"
    client.put_object(Bucket=bucket, Key="jobs/in.jsonl", Body=body)
    spool = tmp_path / "spool"
    spool.mkdir()
    with local_input(f"s3://{bucket}/jobs/in.jsonl", tmp_dir=spool) as fetched:
        path = fetched.path
        assert path.parent.parent == spool and path.name == "in.jsonl" and path.read_bytes() == body
        assert validate(path) == 1000
        assert [r.id for r in read_records(path)] == [x["id"] for x in lines]
    assert not path.exists() and list(spool.iterdir()) == []


@pytest.mark.slow
def test_s3_input_temp_file_removed_when_the_caller_fails(s3, tmp_path):
    client, bucket = s3
    client.put_object(Bucket=bucket, Key="in.jsonl", Body=b"not json\n")
    with (
        pytest.raises(InputError, match="line 1: not JSON"),
        local_input(f"s3://{bucket}/in.jsonl", tmp_dir=tmp_path) as fetched,
    ):
        validate(fetched.path)
    assert not fetched.path.exists()


@pytest.mark.slow
def test_s3_input_missing(s3, tmp_path):
    _, bucket = s3
    for url in (f"s3://{bucket}/nothing.jsonl", "s3://no-such-bucket-fleet/in.jsonl"):
        with pytest.raises(ConfigError, match="does not exist"), local_input(url, tmp_dir=tmp_path):
            pass
    with pytest.raises(ConfigError, match="names no object"), local_input(f"s3://{bucket}"):
        pass
    assert list(tmp_path.glob("fleet-input-*")) == []


# -- memory stays flat in the input size ------------------------------------------------------


@pytest.mark.slow
def test_large_input_validates_in_bounded_memory(tmp_path):
    n = 100_000  # tracemalloc slows allocation ~5x; this size keeps the test to seconds
    path = tmp_path / "big.jsonl"
    filler = "lorem ipsum dolor sit amet " * 14
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "id": f"record-{i:07d}",
                        "messages": [{"role": "user", "content": f"{filler} {i}"}],
                    }
                )
                + "\n"
            )
    size = path.stat().st_size
    assert size > 40_000_000
    tracemalloc.start()
    try:
        assert validate(path) == n
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The id table is 12 bytes a slot, ~5 MB here with the old table alive while it
    # grows; keeping every line would cost the input's size (40 MB) and more.
    assert peak < 10_000_000, (
        f"validate peaked at {peak / 1e6:.1f} MB on a {size / 1e6:.0f} MB input"
    )

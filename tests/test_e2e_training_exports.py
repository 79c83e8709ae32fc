"""From a mixed input straight to training data, on the hf engine with the tiny model:
messages, raw prompts, OpenAI batch lines, conversation rows and pre-tokenized records go
through `fleet run`; the specforge, tokens and openai exports are checked against the
records and against the model's own chat template; truncation is counted by status and
filtered by --only-finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.model.endings import trim_at_stop
from fleet.model.reasoning import THINK_CLOSE, THINK_OPEN
from fleet.model.rendering import load_tokenizer
from tests.conftest import run_fleet
from tests.fleetproc import read_jsonl
from tests.modelkit import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.e2e

SYSTEM = {"role": "system", "content": "Answer briefly."}
STOPS = {"stop": ["e", "a"]}  # noise text hits one within a few tokens: rows that finish


def mixed_input(tokenizer) -> list[dict]:
    ids = tokenizer("def main():\n    return 1")["input_ids"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Why?"}], add_generation_prompt=True,
                                             return_dict=True)["input_ids"]  # opens <think>: a completion that reasons
    return [
        {"id": "chat", "messages": [SYSTEM, {"role": "user", "content": "Explain binary search."}],
         "metadata": {"split": "train", "n": 1}},
        {"id": "chat-stop", "messages": [{"role": "user", "content": "Name a colour."}], "sampling": STOPS},
        {"id": "raw", "prompt": "def fibonacci(n):", "source": "code"},
        {"custom_id": "batch", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 8}},
        {"id": "sharegpt", "conversations": [
            {"from": "system", "value": "Be kind."}, {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Hi there"}, {"from": "human", "value": "Tell me a joke."},
            {"from": "gpt", "value": "an old answer to be regenerated"}]},
        {"id": "conv", "conversations": [{"role": "user", "content": "Count to three."}], "sampling": STOPS},
        {"id": "tok", "input_ids": ids, "metadata": {"origin": "s3"}},
        {"id": "tok-stop", "input_ids": ids[:4], "sampling": STOPS},
        {"id": "tok-chat", "input_ids": list(rendered), "sampling": {"max_tokens": 200}},
    ]


def prompt_messages(line: dict) -> list[dict] | None:
    if "messages" in line:
        return line["messages"]
    if "body" in line:
        return line["body"].get("messages")
    if "conversations" in line:
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        turns = [{"role": roles.get(t.get("from"), t.get("role")), "content": t.get("value", t.get("content"))}
                 for t in line["conversations"]]
        last_user = max(i for i, t in enumerate(turns) if t["role"] == "user")
        return turns[: last_user + 1]
    return None


def expected_prompt_ids(tokenizer, line: dict) -> list[int]:
    messages = prompt_messages(line)
    if messages is not None:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
    if "input_ids" in line:
        return line["input_ids"]
    return list(tokenizer(line["prompt"])["input_ids"])


def export(env: dict, fmt: str, out: Path, *extra: str) -> str:
    res = run_fleet("export", "--job", "mix", "--format", fmt, "--out", str(out), *extra, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return " ".join(res.stderr.split())


def test_mixed_input_to_training_exports(tmp_path: Path, tiny_model: Path, clean_env):
    # Given every input form, with passthrough metadata, in one job
    tokenizer = load_tokenizer(str(tiny_model))
    lines = mixed_input(tokenizer)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data")}  # default settings: output ids are stored
    # When it runs on the hf engine with rows cut at 12 tokens and rows stopped by a stop string
    run = run_fleet("run", str(prompts), "--job", "mix", "--engine", "hf", "--model", str(tiny_model),
                    "--chunk-size", "3", "--max-tokens", "12", env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((tmp_path / "data" / "store" / "mix" / "manifest.json").read_text())
    assert (manifest["config"]["sampling"]["max_tokens"], manifest["config"]["max_tokens_from"]) == (12, "job setting")
    export(env, "jsonl", tmp_path / "all.jsonl")
    records = {r["id"]: r for r in read_jsonl(tmp_path / "all.jsonl")}
    ids = [x.get("id", x.get("custom_id")) for x in lines]
    assert list(records) == ids and all(r["finish_reason"] != "error" for r in records.values())
    # Then passthrough fields come back unchanged
    assert records["chat"]["metadata"] == {"split": "train", "n": 1} and records["raw"]["source"] == "code"
    assert records["tok"]["metadata"] == {"origin": "s3"} and "metadata" not in records["batch"]
    assert records["tok-chat"]["reasoning"] and not records["tok-chat"]["in_thinking"], "a row that reasons, answers"

    # specforge: input messages plus one assistant turn matching the record, no think markers
    said = "left out 4: records without messages (raw prompt or input_ids): use --format tokens"
    specforge = {r["id"]: r for r in read_jsonl_out(env, "specforge", tmp_path / "sf.jsonl", said=said)}
    assert list(specforge) == [i for i, x in zip(ids, lines, strict=True) if prompt_messages(x) is not None]
    for rid, row in specforge.items():
        line, rec = lines[ids.index(rid)], records[rid]
        *given, answer = row["conversations"]
        assert given == prompt_messages(line)
        assert answer == {"role": "assistant", "content": rec["output"], "reasoning_content": rec["reasoning"]}
        assert THINK_OPEN not in answer["content"] and THINK_CLOSE not in answer["content"]
    assert specforge["chat"]["metadata"] == {"split": "train", "n": 1}

    # tokens: the chat template's (or the given) ids, then the output ids; the mask counts the completion
    tokens = {r["id"]: r for r in read_jsonl_out(env, "tokens", tmp_path / "tok.jsonl")}
    assert list(tokens) == ids
    for rid, row in tokens.items():
        rec, prompt = records[rid], expected_prompt_ids(tokenizer, lines[ids.index(rid)])
        assert row["input_ids"] == prompt + rec["output_ids"]
        assert row["loss_mask"] == [0] * len(prompt) + [1] * rec["completion_tokens"]
        assert sum(row["loss_mask"]) == rec["completion_tokens"] and len(prompt) == rec["prompt_tokens"]

    # openai: custom ids in input order, usage and content as the records say
    batch = read_jsonl_out(env, "openai", tmp_path / "oa.jsonl")
    assert [b["custom_id"] for b in batch] == ids
    for b in batch:
        rec, body = records[b["custom_id"]], b["response"]["body"]
        assert b["error"] is None and b["response"]["status_code"] == 200
        assert body["usage"] == {"prompt_tokens": rec["prompt_tokens"], "completion_tokens": rec["completion_tokens"],
                                 "total_tokens": rec["prompt_tokens"] + rec["completion_tokens"]}
        [choice] = body["choices"]
        assert choice["finish_reason"] == rec["finish_reason"]
        if body["object"] == "chat.completion":
            assert choice["message"]["content"] == rec["output"]
            assert choice["message"]["reasoning_content"] == rec["reasoning"]
        else:  # a completion's text is all it generated, reasoning and </think> included
            assert b["custom_id"] in ("raw", "tok", "tok-stop", "tok-chat")
            assert choice["text"] == generated_text(tokenizer, rec, lines[ids.index(b["custom_id"])])

    # status counts the rows cut at max tokens and those ended inside the thinking (a stop
    # string hit there), and --only-finished drops exactly those
    cut = {rid for rid, r in records.items() if r["finish_reason"] == "length"}
    cut_inside = {rid for rid in cut if records[rid]["in_thinking"]}
    ended_inside = {rid for rid, r in records.items() if r["finish_reason"] == "stop" and r["in_thinking"]}
    assert cut and ended_inside and cut | ended_inside != set(ids), "the job must have cut, ended and finished rows"
    assert all(records[r]["output"] == "" and records[r]["reasoning"] is not None for r in cut_inside | ended_inside)
    st = json.loads(run_fleet("status", "--job", "mix", "--json", env=env).stdout)
    assert (st["records_truncated"], st["records_truncated_in_thinking"], st["records_ended_in_thinking"]) == (
        len(cut), len(cut_inside), len(ended_inside))
    finished = [r["id"] for r in read_jsonl_out(env, "jsonl", tmp_path / "fin.jsonl", "--only-finished")]
    assert finished == [i for i in ids if i not in cut | ended_inside]


def generated_text(tokenizer, rec: dict, line: dict) -> str:
    """The whole text a sample generated: its ids decoded without special tokens (the eos),
    cut at the record's stop string, as the engine cut it."""
    text = tokenizer.decode(rec["output_ids"], skip_special_tokens=True)
    stops = (line.get("sampling") or {}).get("stop") or []
    return trim_at_stop(text, tuple(stops))[0]


def read_jsonl_out(env: dict, fmt: str, out: Path, *extra: str, said: str = "") -> list[dict]:
    assert said in export(env, fmt, out, *extra)
    return read_jsonl(out)


def test_enqueue_refuses_ids_outside_the_models_vocabulary(tmp_path: Path, tiny_model: Path, redis_server,
                                                            clean_env):
    # Given a pre-tokenized line whose last id is one past the tiny model's tokens
    vocab = len(load_tokenizer(str(tiny_model)))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(f'{{"id": "ok", "input_ids": [1, {vocab - 1}]}}\n{{"id": "bad", "input_ids": [3, {vocab}]}}\n')
    # When it is enqueued for the hf engine
    res = run_fleet("enqueue", str(prompts), "--job", "v", "--engine", "hf", "--model", str(tiny_model),
                    "--store-url", str(tmp_path / "store"), env={"FLEET_BROKER_URL": redis_server.url})
    # Then nothing is written and the error names the line and the id
    assert res.returncode != 0
    said = f"line 2: input_ids[1]: token id {vocab} is outside the model's vocabulary of {vocab}"
    assert said in " ".join(res.stderr.split())
    assert not (tmp_path / "store" / "v").exists()

"""SpecForge's own data code on fleet's training exports, as a user would feed them to it.

A job runs with default settings on the hf engine and the tiny model (which speaks the
Qwen3.6 format); `--format specforge --only-finished` goes through SpecForge 0.2.0's
`prepare_prompt_tasks` with its registered `qwen3.5` template (render with the model's
chat template, find the spans by the assistant header, drop rows with nothing to train),
and `--format tokens --only-finished` through its pre-tokenized path. SpecForge is installed
--no-deps by ops/setup.sh: its data modules need torch, transformers and datasets only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.model.reasoning import THINK_CLOSE
from fleet.model.rendering import load_tokenizer
from tests.conftest import run_fleet
from tests.fleetproc import read_jsonl
from tests.modelkit import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.e2e

MAX_TOKENS = 200
HEADER = "<|im_start|>assistant\n<think>\n"


def prompts() -> list[dict]:
    """Chat records with and without a system prompt, and multi-turn conversation rows whose
    earlier assistant turns (with and without reasoning) are context, not training targets."""
    chats = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i} times {i + 3}?"}]}
             for i in range(14)]  # fmt: skip
    system = [{"id": f"s{i}", "messages": [{"role": "system", "content": "Answer in one word."},
                                           {"role": "user", "content": f"Name a colour, take {i}."}]}
              for i in range(6)]  # fmt: skip
    multi = [{"id": f"m{i}", "conversations": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there", "reasoning_content": "a greeting"},
        {"role": "user", "content": f"Tell me fact {i}."}]} for i in range(4)]  # fmt: skip
    return chats + system + multi


def export(env: dict, fmt: str, out: Path, *extra: str) -> list[dict]:
    res = run_fleet("export", "--job", "sf", "--format", fmt, "--out", str(out), *extra, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return read_jsonl(out)


def trained_span(reasoning: str, answer: str) -> str:
    """What the Qwen3.6 format renders after the assistant header for one generated turn."""
    return f"{reasoning.strip()}\n{THINK_CLOSE}\n\n{answer.strip()}<|im_end|>\n"


def specforge_tasks(path: Path, tokenizer) -> list[dict]:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    tasks = prepare_prompt_tasks(
        path, tokenizer, chat_template="qwen3.5", max_length=4096, is_preformatted=False,
        train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None,
    )  # fmt: skip
    return [{k: list(map(int, v)) for k, v in t["payload"].items()} for t in tasks]


def test_specforge_trains_exactly_reasoning_and_answer(tmp_path: Path, tiny_model: Path, clean_env):
    # Given a job run with default settings (output ids stored) on the tiny model
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in prompts()))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data")}
    run = run_fleet("run", str(src), "--job", "sf", "--engine", "hf", "--model", str(tiny_model),
                    "--chunk-size", "6", "--max-tokens", str(MAX_TOKENS), env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    records = {r["id"]: r for r in export(env, "jsonl", tmp_path / "all.jsonl")}
    finished = [i for i, r in records.items() if r["finish_reason"] == "stop" and not r["in_thinking"]]
    ended_inside = [i for i, r in records.items() if r["finish_reason"] == "stop" and r["in_thinking"]]
    cut = [i for i, r in records.items() if r["finish_reason"] == "length"]
    # and the job has every kind of row: answered, ended inside the thinking, cut
    assert len(finished) >= len(records) // 2 and ended_inside and cut, (finished, ended_inside, cut)
    status = json.loads(run_fleet("status", "--job", "sf", "--json", env=env).stdout)
    assert (status["records_ended_in_thinking"], status["records_truncated"]) == (len(ended_inside), len(cut))

    # When the finished rows are exported for SpecForge and prepared by SpecForge's own code
    tokenizer = load_tokenizer(str(tiny_model))
    rows = export(env, "specforge", tmp_path / "sf.jsonl", "--only-finished")
    tasks = specforge_tasks(tmp_path / "sf.jsonl", tokenizer)

    # Then every finished row is exported and SpecForge keeps every one
    assert [r["id"] for r in rows] == finished
    assert len(tasks) == len(rows)
    by_ids = {tuple(t["input_ids"]): t["loss_mask"] for t in tasks}
    for row in rows:
        rec = records[row["id"]]
        rendered = tokenizer.apply_chat_template(row["conversations"], tokenize=False)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        mask = by_ids[tuple(ids)]  # SpecForge tokenized the model's own rendering of the row
        start = mask.index(1)
        trained = ids[start:]
        # and it trains one span: the generated turn, to the end of the sequence
        assert mask == [0] * start + [1] * (len(ids) - start), row["id"]
        # which is exactly the record's reasoning, </think> and answer, token for token
        span = trained_span(rec["reasoning"], rec["output"])
        assert rendered.endswith(HEADER + span), row["id"]
        if rec["reasoning"]:
            assert trained == tokenizer(span, add_special_tokens=False)["input_ids"], row["id"]
            assert tokenizer.decode(ids[:start]).endswith(HEADER)
        else:  # an empty reasoning: BPE may merge the header's newline with the span's into one token
            assert tokenizer.decode(trained) in (span, span[1:]), row["id"]
        # and the earlier assistant turns of a conversation are context, never trained
        assert rendered.count(HEADER) == 1

    # And the token rows go through SpecForge's pre-tokenized path unchanged
    token_rows = export(env, "tokens", tmp_path / "tok.jsonl", "--only-finished")
    assert [r["id"] for r in token_rows] == finished
    assert specforge_tasks(tmp_path / "tok.jsonl", tokenizer) == [
        {"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in token_rows
    ]
    for r in token_rows:
        assert r["input_ids"][-sum(r["loss_mask"]):] == records[r["id"]]["output_ids"]

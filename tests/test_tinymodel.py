"""The offline tiny model: real files, a working template, deterministic bytes, and fast."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.model.tinymodel import build_tiny_model
from tests.modelkit import tiny_model_fixture  # noqa: F401

FILES = (
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja",
)  # fmt: skip


def digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_the_model_has_a_production_models_files(tiny_model: Path) -> None:
    # Given the tiny model
    names = {p.name for p in tiny_model.iterdir()}
    config = json.loads((tiny_model / "config.json").read_text())
    gen = json.loads((tiny_model / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)

    # Then it is a Qwen3 causal LM with Qwen's special tokens and sampling defaults
    assert set(FILES) <= names
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["vocab_size"] >= len(tok)
    assert (gen["temperature"], gen["top_k"], gen["top_p"]) == (1.0, 20, 0.95)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert sorted(gen["eos_token_id"]) == sorted([im_end, eot])
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        assert tok.convert_tokens_to_ids(token) >= 0
        assert tok(token, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(token)]
    assert 1000 <= len(tok) <= 2100


def test_template_honours_enable_thinking(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

    on = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True, tokenize=False)
    off = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, tokenize=False)
    default = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert on == head + "<think>\n"
    assert off == head + "<think>\n\n</think>\n\n"
    assert default == on


def test_the_weights_generate_real_tokens(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 7)


def test_same_seed_same_bytes_other_seed_other_weights(tiny_model: Path, tmp_path: Path) -> None:
    # When the model is built again, with the same seed and with another one
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)

    # Then the same seed gives the same files byte for byte
    assert digests(again) == digests(tiny_model)
    # and another seed changes the weights only
    changed = {k for k, v in digests(other).items() if digests(tiny_model)[k] != v}
    assert changed == {"model.safetensors"}


def test_cli_builds_the_model(tmp_path: Path) -> None:
    from fleet.cli import app

    result = CliRunner().invoke(app, ["tiny-model", str(tmp_path / "m"), "--seed", "3"])

    assert result.exit_code == 0, result.output
    assert str(tmp_path / "m") in result.output
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_template_renders_the_qwen36_format(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    # Given a multi-turn conversation whose assistant turns carry reasoning_content
    messages = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "a greeting"},
        {"role": "user", "content": [{"type": "text", "text": "A joke?"}]},
        {"role": "assistant", "content": " A joke.\n", "reasoning_content": "\nthink hard "},
    ]  # fmt: skip

    text = tok.apply_chat_template(messages, tokenize=False)
    kept = tok.apply_chat_template(messages, tokenize=False, preserve_thinking=True)
    inline = tok.apply_chat_template(
        [*messages[:4], {"role": "assistant", "content": "<think>\nthink hard</think>\n\nA joke."}], tokenize=False
    )

    # Then the turn after the last user turn has its think block, trimmed; earlier ones only
    # their answer unless preserve_thinking is on; a think block inside content is split out
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    last = "<|im_start|>user\nA joke?<|im_end|>\n<|im_start|>assistant\n"
    last += "<think>\nthink hard\n</think>\n\nA joke.<|im_end|>\n"
    assert text == head + "Hello!<|im_end|>\n" + last
    assert kept == head + "<think>\na greeting\n</think>\n\nHello!<|im_end|>\n" + last
    assert inline == text


@pytest.mark.slow
def test_sampled_rows_think_answer_end_and_run_on(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # Given 24 chat prompts sampled with the model's own generation config, 300 tokens at most
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    chats = [[{"role": "user", "content": f"What is {i} times 7?"}] for i in range(24)]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"] for c in chats]
    width = max(map(len, prompts))
    pad, close, end = tok.convert_tokens_to_ids(["<|endoftext|>", "</think>", "<|im_end|>"])
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig.from_pretrained(tiny_model, max_new_tokens=300)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()

    # Then there are rows of every kind a thinking model produces
    kinds = {"answered": 0, "ended in thinking": 0, "cut": 0}
    answers = []
    for row in rows:
        row = row[: row.index(end) + 1] if end in row else row
        assert row.count(close) <= 1 and pad not in row
        kinds["cut" if end not in row else "answered" if close in row else "ended in thinking"] += 1
        if close in row and end in row:
            answers.append(tok.decode(row[row.index(close) + 1 : -1]))
    assert kinds["answered"] >= len(rows) // 2 and kinds["ended in thinking"] >= 1 and kinds["cut"] >= 1, kinds
    # and an answer is words (rarely none: the model may end right after </think>)
    assert all(w.isalpha() for a in answers for w in a.split())
    assert sum(1 for a in answers if a.strip()) >= len(answers) * 3 // 4

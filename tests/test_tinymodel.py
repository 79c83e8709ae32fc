"""The offline tiny model: real files, a working template, deterministic bytes, and fast."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

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
    began = time.monotonic()
    again = build_tiny_model(tmp_path / "again", seed=0)
    took = time.monotonic() - began
    other = build_tiny_model(tmp_path / "other", seed=1)

    # Then the same seed gives the same files byte for byte, in seconds
    assert digests(again) == digests(tiny_model)
    assert took < 30
    # and another seed changes the weights only
    changed = {k for k, v in digests(other).items() if digests(tiny_model)[k] != v}
    assert changed == {"model.safetensors"}


def test_cli_builds_the_model(tmp_path: Path) -> None:
    from fleet.cli import app

    result = CliRunner().invoke(app, ["tiny-model", str(tmp_path / "m"), "--seed", "3"])

    assert result.exit_code == 0, result.output
    assert str(tmp_path / "m") in result.output
    assert (tmp_path / "m" / "model.safetensors").is_file()

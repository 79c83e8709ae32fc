"""Prompts rendered by the model's own files; reasoning split; model facts for the manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from fleet.engines.specs import job_config
from fleet.errors import ConfigError, RecordError
from fleet.model.endings import trim_at_stop
from fleet.model.facts import model_facts
from fleet.model.promptlimits import check_length
from fleet.model.reasoning import ended_in_thinking, split_reasoning
from fleet.model.rendering import decode_ids, given_prompt, load_tokenizer, opens_think, own_decoder, render_ids
from fleet.model.revision import model_revision
from fleet.records import Message
from fleet.settings import Settings
from tests.modelkit import chat, raw, tiny_model_fixture  # noqa: F401


def settings_for(model: Path, **kw) -> Settings:
    return Settings(engine="hf", model=str(model), **kw)


# -- rendering ---------------------------------------------------------------------------------


def test_thinking_on_opens_the_think_block(tiny_model: Path) -> None:
    tok = load_tokenizer(str(tiny_model))

    ids = render_ids(tok, chat("a", "What is 2+2?", thinking=True))

    text = tok.decode(ids)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert opens_think(tok, ids)


def test_thinking_off_closes_an_empty_think_block(tiny_model: Path) -> None:
    tok = load_tokenizer(str(tiny_model))

    ids = render_ids(tok, chat("a", "What is 2+2?", thinking=False))

    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_think(tok, ids)


def test_chat_ids_are_the_templates_own(tiny_model: Path) -> None:
    tok = load_tokenizer(str(tiny_model))
    request = chat("a", "Hi")
    request.messages = [Message(role="system", content="Be brief."), *request.messages]

    ids = render_ids(tok, request)

    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids  # special tokens are tokens, not text


def test_content_parts_render_their_text(tiny_model: Path) -> None:
    tok = load_tokenizer(str(tiny_model))
    request = chat("a")
    request.messages = [Message(role="user", content=[{"type": "text", "text": "part one"}])]

    assert "user\npart one<|im_end|>" in tok.decode(render_ids(tok, request))


def test_raw_prompts_are_tokenized_as_they_are(tiny_model: Path) -> None:
    tok = load_tokenizer(str(tiny_model))
    prompt = "  Raw text, no template:\n\tkeep ‘spaces’ and ünïcode  "

    ids = render_ids(tok, raw("r", prompt))

    assert tok.decode(ids) == prompt
    assert not opens_think(tok, ids)


def test_a_record_without_prompt_fails_alone(tiny_model: Path) -> None:
    request = chat("a")
    request.messages = []
    with pytest.raises(RecordError, match="neither messages nor prompt"):
        render_ids(load_tokenizer(str(tiny_model)), request)


def test_over_length_prompt_is_a_record_error() -> None:
    request = chat("long", max_tokens=100)

    with pytest.raises(RecordError, match="50 tokens after templating, the context is 50"):
        check_length(request, 50, 50)
    assert check_length(request, 10, 50) == 40  # max_tokens shrinks to fit the context
    assert check_length(request, 10, 1000) == 100
    assert check_length(request, 10, None) == 100


def test_tokenizer_is_loaded_once_per_model(tiny_model: Path) -> None:
    assert load_tokenizer(str(tiny_model)) is load_tokenizer(str(tiny_model))


# -- splitting ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "opened", "reasoning", "answer"),
    [
        ("thinking hard\n</think>\n\nThe answer.", True, "thinking hard", "The answer."),
        ("<think>\nmodel opened it</think>Answer", False, "model opened it", "Answer"),
        ("cut off while thinking", True, "cut off while thinking", ""),
        ("<think>never closed", False, "never closed", ""),
        ("no thinking at all", False, None, "no thinking at all"),
        ("a</think>b</think>c", True, "a", "b</think>c"),
    ],
)
def test_split_reasoning(text: str, opened: bool, reasoning: str | None, answer: str) -> None:
    assert split_reasoning(text, opened) == (reasoning, answer)


@pytest.mark.parametrize(
    ("text", "opened", "inside"),
    [
        ("thinking hard\n</think>\n\nThe answer.", True, False),
        ("thinking hard\n</think>", True, False),
        ("cut off while thinking", True, True),
        ("", True, True),
        ("  <think>never closed", False, True),
        ("no thinking at all", False, False),
    ],
)
def test_ended_in_thinking(text: str, opened: bool, inside: bool) -> None:
    assert ended_in_thinking(text, opened) is inside


def test_trim_at_the_earliest_stop() -> None:
    assert trim_at_stop("abc STOP def END", ("END", "STOP")) == ("abc ", True)
    assert trim_at_stop("abc", ("x",)) == ("abc", False)
    assert trim_at_stop("abc", None) == ("abc", False)


# -- model facts ----------------------------------------------------------------------------------


def test_sampling_defaults_come_from_generation_config(tiny_model: Path) -> None:
    facts = model_facts(settings_for(tiny_model))

    tok = load_tokenizer(str(tiny_model))
    assert facts["sampling"] == {
        "temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "max_tokens": 32768, "n": 1, "stop": None,
        "eos_token_ids": sorted(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])),
    }  # fmt: skip
    template_sha = hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert facts["model"]["chat_template_sha256"] == template_sha
    assert facts["max_tokens_from"] == "recommended thinking length for qwen3"
    assert facts["model"]["path"] == str(tiny_model)
    assert facts["model"]["name"] == tiny_model.name
    assert facts["model"]["revision"].startswith("sha256:")


def test_job_settings_override_the_model(tiny_model: Path) -> None:
    settings = settings_for(
        tiny_model, sampling={"temperature": 0.3, "min_p": 0.05, "max_tokens": 64, "n": 2, "stop": ["\n\n"]}
    )

    sampling = model_facts(settings)["sampling"]

    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (0.3, 0.95, 20)
    assert (sampling["min_p"], sampling["max_tokens"], sampling["n"]) == (0.05, 64, 2)
    assert sampling["stop"] == ["\n\n"]


def test_the_manifest_config_holds_the_model_facts(tiny_model: Path) -> None:
    config = job_config(settings_for(tiny_model))

    assert config["sampling"]["top_k"] == 20
    assert config["model"]["revision"] == model_revision(tiny_model)
    json.dumps(config)  # it goes into manifest.json


def test_revision_follows_the_files_that_shape_output(tiny_model: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_model, tmp_path / "copy"))
    assert model_revision(copy) == model_revision(tiny_model)

    gen = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**gen, "top_k": 40}))
    assert model_revision(copy) != model_revision(tiny_model)
    assert model_facts(settings_for(copy))["sampling"]["top_k"] == 40


def test_penalties_come_from_generation_config_and_the_job(tiny_model: Path, tmp_path: Path) -> None:
    # Given a model whose generation_config.json sets penalties (Qwen3.6 ships presence_penalty)
    copy = Path(shutil.copytree(tiny_model, tmp_path / "pen"))
    gen = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**gen, "repetition_penalty": 1.05,
                                                             "presence_penalty": 1.5}))  # fmt: skip

    sampling = model_facts(settings_for(copy, sampling={"frequency_penalty": 0.2}))["sampling"]

    # Then the manifest's effective sampling carries all three
    assert (sampling["repetition_penalty"], sampling["presence_penalty"], sampling["frequency_penalty"]) == (
        1.05, 1.5, 0.2,
    )  # fmt: skip


def test_a_git_checkout_is_identified_by_its_commit(tiny_model: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_model, tmp_path / "git"))
    (copy / ".git" / "refs" / "heads").mkdir(parents=True)
    (copy / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (copy / ".git" / "refs" / "heads" / "main").write_text("a" * 40 + "\n")

    assert model_revision(copy) == "a" * 40


def test_a_missing_model_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError):
        model_facts(settings_for(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="needs a model"):
        model_facts(Settings(engine="hf"))


def test_decode_ids_is_the_tokenizers_own_decode(tiny_model: Path) -> None:
    """The one-call decode gives what transformers' decode gives, special tokens kept or skipped, on ids
    that split multi-byte characters and hold the end and think ids; a tokenizer that cleans up spaces
    after decoding keeps its own decode."""
    import random

    tok = load_tokenizer(str(tiny_model))
    specials = [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>")] + list(tok.all_special_ids)
    draw = random.Random(7)
    cases = [draw.choices(range(len(tok)), k=draw.randint(0, 40)) for _ in range(200)]
    cases += [c + [draw.choice(specials)] + c for c in cases[:50]] + [[], specials]
    assert any(tok.decode(c, skip_special_tokens=True) != tok.decode(c, skip_special_tokens=False) for c in cases)
    for ids in cases:
        for skip in (True, False):
            assert decode_ids(tok, ids, skip) == tok.decode(ids, skip_special_tokens=skip), ids

    class Cleaning:
        clean_up_tokenization_spaces = True
        _tokenizer = None

        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return f"own {ids} {skip_special_tokens}"

    assert decode_ids(Cleaning(), (1, 2)) == "own [1, 2] True"


def test_an_engines_own_decode_is_the_tokenizers_and_holds_while_another_thread_renders(tiny_model: Path) -> None:
    """own_decoder decodes as the tokenizer does, takes a pre-tokenized prompt as render does, and runs
    on one thread while another renders chat prompts through the shared tokenizer (which encoding
    borrows mutably) without either failing."""
    import random
    import threading

    tok = load_tokenizer(str(tiny_model))
    decode = own_decoder(tok)
    assert decode is not None
    draw = random.Random(3)
    cases = [draw.choices(range(len(tok)), k=draw.randint(0, 60)) for _ in range(200)]
    for ids in cases:
        assert decode(ids, True) == tok.decode(ids, skip_special_tokens=True)
        assert decode(ids, False) == tok.decode(ids, skip_special_tokens=False)
    for thinking in (True, False):
        ids = render_ids(tok, chat("p", "hi", thinking=thinking))
        assert given_prompt(ids, decode).opened_think == opens_think(tok, ids) == thinking
    failures: list[BaseException] = []
    stop = threading.Event()

    def render_loop() -> None:
        try:
            while not stop.is_set():
                render_ids(tok, chat("q", "a longer question " * draw.randint(1, 20)))
                tok(["x " * draw.randint(1, 50), "y"], padding=True, truncation=True, max_length=draw.randint(4, 40))
        except BaseException as e:  # noqa: BLE001 - the test reports whatever the thread met
            failures.append(e)

    thread = threading.Thread(target=render_loop)
    thread.start()
    try:
        for ids in cases * 5:
            decode(ids, True)
    finally:
        stop.set()
        thread.join()
    assert failures == []

"""Prompts rendered by the model's own tokenizer.

Token ids, not text, go to the engine: the chat template is applied here once with the
model's tokenizer, so prompt token counts are exact and SGLang, transformers and the
manifest all see the same prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fleet.errors import ConfigError, RecordError
from fleet.model.modeldir import resolve_model_dir
from fleet.model.reasoning import THINK_OPEN
from fleet.records import GenRequest, InputRecord, Message, Sampling


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    """The model's tokenizer, loaded once per model path for the life of the process."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the tokenizer of {model!r}: {e}") from e


def decode_ids(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """`tokenizer.decode(ids, skip_special_tokens=...)`'s text in one call into a fast tokenizer's own
    backend: transformers' decode first walks every id in Python (to_py_obj), which cost more than
    the decode itself on every record the audit and the engines decode. Any other tokenizer, or one
    that cleans up spaces after decoding, goes through its own decode."""
    backend = decoding_backend(tokenizer)
    if backend is None:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


def decoding_backend(tokenizer: Any) -> Any | None:
    """A fast tokenizer's backend where its one decode call gives what the tokenizer's own decode
    gives; None for any other tokenizer, or one that cleans up spaces after decoding."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return getattr(tokenizer, "_tokenizer", None)


#: ids to text, special tokens skipped or kept
SpecialDecode = Callable[[Sequence[int], bool], str]


def own_decoder(tokenizer: Any) -> SpecialDecode | None:
    """A decode that gives what `decode_ids(tokenizer, ...)` gives and that any thread may call while
    another renders: a copy of a fast tokenizer's backend that only ever decodes (rendering mutates
    the shared one: transformers sets its truncation and padding on each encode, and a tokenizer
    borrowed mutably by one thread refuses every other). None where there is no backend to copy or
    the tokenizer cleans up spaces after decoding."""
    backend = decoding_backend(tokenizer)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    return lambda ids, skip_special_tokens=True: own.decode(list(ids), skip_special_tokens=skip_special_tokens)


def render_ids(tokenizer: Any, request: GenRequest) -> list[int]:
    """Token ids of the prompt: pre-tokenized ids as given, chat records through the
    template, raw prompts as they are.

    A raw prompt gets what the tokenizer adds by default (a BOS where the model has one),
    as SGLang and vLLM do with a text prompt; Qwen tokenizers add nothing.
    """
    if request.input_ids is not None:
        return list(request.input_ids)
    if request.prompt is not None:
        return list(tokenizer(request.prompt)["input_ids"])
    if not request.messages:
        raise RecordError(f"record {request.record_id!r} has neither messages nor prompt")
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    try:
        encoded = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            enable_thinking=request.enable_thinking,
            tokenize=True,
            return_dict=True,
        )
    except Exception as e:  # jinja raises for messages the template rejects
        raise RecordError(f"chat template rejected record {request.record_id!r}: {e}") from e
    return list(encoded["input_ids"])


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: token ids, and whether they end inside an open think block."""

    ids: list[int]
    opened_think: bool


def record_prompt_ids(tokenizer: Any, record: InputRecord, enable_thinking: bool,
                      messages: list[Message] | None = None) -> list[int]:
    """A record's prompt ids as the worker renders them (`messages`: one turn's prompt instead of the
    record's), for counting and rebuilding prompts; rendering reads no sampling, so its request's is a stand-in."""
    request = GenRequest(
        record_id=record.id, chunk=0, sample=0, sampling=Sampling(max_tokens=1, seed=0),
        messages=messages or record.messages, prompt=record.prompt, enable_thinking=enable_thinking,
    )  # fmt: skip
    return render_ids(tokenizer, request)


def render(tokenizer: Any, request: GenRequest) -> Prompt:
    """Render once and decide the reasoning split then, so results never touch the tokenizer."""
    ids = render_ids(tokenizer, request)
    return Prompt(ids, opens_think(tokenizer, ids))


def opens_think(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """True when the rendered prompt ends inside an open think block (Qwen 3.5/3.6 thinking)."""
    return think_opened(decode_ids(tokenizer, prompt_ids[-8:], skip_special_tokens=False))


def given_prompt(ids: Sequence[int], decode: SpecialDecode) -> Prompt:
    """The prompt of pre-tokenized ids, as `render` makes it, with a decode of the caller's own."""
    return Prompt(list(ids), think_opened(decode(ids[-8:], False)))


def think_opened(tail: str) -> bool:
    """A prompt's last few tokens' text (specials kept) leaves a think block open."""
    return tail.rstrip().endswith(THINK_OPEN)

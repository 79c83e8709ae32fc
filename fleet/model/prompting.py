"""Prompts rendered by the model's own files, and the facts about a model that shape outputs.

Token ids, not text, go to the engine: the chat template is applied here once with the
model's tokenizer, so prompt token counts are exact and SGLang, transformers and the
manifest all see the same prompt. The effective sampling defaults come from the model's
`generation_config.json` because SGLang's Engine path does not apply it (docs/architecture.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.errors import ConfigError, RecordError
from fleet.model.outputlen import context_of, default_max_tokens
from fleet.records import GenRequest, Sampling
from fleet.settings import Settings

log = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: Files that decide how text becomes tokens and back; hashed into the model revision.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "added_tokens.json",
)  # fmt: skip
CONFIG_FILES = ("config.json", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
#: Only what `model_facts` reads is fetched for a hub id: never the weights.
HUB_PATTERNS = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
#: Values that make a sampler a no-op, used when neither settings nor the model set one.
NEUTRAL = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
}  # fmt: skip


# -- the model's files -----------------------------------------------------------------------


def require_model(settings: Settings) -> str:
    if not settings.model:
        raise ConfigError(f"engine {settings.engine!r} needs a model: set --model or FLEET_MODEL")
    return settings.model


@lru_cache(maxsize=8)
def resolve_model_dir(model: str) -> Path:
    """A local directory holding the model's config and tokenizer files.

    A hub id resolves to its snapshot directory (config and tokenizer files only), which
    honours HF_HUB_OFFLINE; that directory's name is the hub commit.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, bad id: all mean "not usable"
        raise ConfigError(f"model {model!r} is not a directory and not on the hub: {e}") from e


@lru_cache(maxsize=8)
def load_tokenizer(model: str) -> Any:
    """The model's tokenizer, loaded once per model path for the life of the process."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the tokenizer of {model!r}: {e}") from e


def read_config(model: str) -> dict[str, Any]:
    """The model's config.json as a dict ({} when the model is not at hand)."""
    try:
        path = resolve_model_dir(model) / "config.json"
        return json.loads(path.read_text())
    except (ConfigError, OSError, ValueError):
        return {}


def context_length_of(model: str) -> int | None:
    """max_position_embeddings of the text model (nested under text_config in VL configs)."""
    return context_of(read_config(model))


def vocab_size_of(model: str) -> int | None:
    """Rows of the text model's embedding (config.json vocab_size), None when unknown."""
    config = read_config(model)
    size = (config.get("text_config") or config).get("vocab_size") or config.get("vocab_size")
    return int(size) if size else None


def check_vocab(request: GenRequest, ids: list[int], vocab: int | None) -> None:
    """RecordError for a token id the model has no embedding row for. SGLang 0.5.23 does not
    check: its scheduler dies on the embedding lookup and takes the worker with it."""
    if vocab is None:
        return
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RecordError(
            f"record {request.record_id!r} has token ids outside the model's vocab size ({vocab}): {bad[:5]}"
        )


# -- rendering ---------------------------------------------------------------------------------


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


def render(tokenizer: Any, request: GenRequest) -> Prompt:
    """Render once and decide the reasoning split then, so results never touch the tokenizer."""
    ids = render_ids(tokenizer, request)
    return Prompt(ids, opens_think(tokenizer, ids))


def check_length(request: GenRequest, prompt_len: int, context: int | None) -> int:
    """Max new tokens after the request's prefix ids that fit the context (0 or less: none
    fit, the sample ends at "length"); RecordError when the prompt alone does not fit."""
    max_new = request.remaining_tokens
    if context is None:
        return max_new
    if prompt_len >= context:
        raise RecordError(
            f"prompt of record {request.record_id!r} is {prompt_len} tokens after templating, "
            f"the context is {context}"
        )
    return min(max_new, context - prompt_len - len(request.prefix_ids))


def opens_think(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """True when the rendered prompt ends inside an open think block (Qwen 3.5/3.6 thinking)."""
    tail = tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
    return tail.rstrip().endswith(THINK_OPEN)


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str]:
    """(reasoning, answer) split at the first `</think>`.

    When the prompt opened the think block, the output holds only its end; an output
    without `</think>` then is all reasoning (cut by max_tokens). When the model opens the
    block itself, the leading `<think>` is dropped.
    """
    head, sep, tail = text.partition(THINK_CLOSE)
    stripped = head.lstrip()
    if sep:
        return stripped.removeprefix(THINK_OPEN).strip(), tail.lstrip()
    if opened:
        return head.strip(), ""
    if stripped.startswith(THINK_OPEN):
        return stripped.removeprefix(THINK_OPEN).strip(), ""
    return None, text


def ended_in_thinking(text: str, opened: bool) -> bool:
    """True when the output ends inside its think block (opened by the prompt or by the
    model, never closed): reasoning with no answer, whatever the finish reason says."""
    if THINK_CLOSE in text:
        return False
    return opened or text.lstrip().startswith(THINK_OPEN)


def trim_at_stop(text: str, stops: tuple[str, ...] | None) -> tuple[str, bool]:
    """Text up to the earliest stop string (excluded, as OpenAI and SGLang do) and whether one hit."""
    cut = min((i for i in (text.find(s) for s in stops or ()) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


# -- what shapes the output ------------------------------------------------------------------


def fill_sampling(sampling: Sampling, defaults: dict[str, Any]) -> Sampling:
    """The request's sampling with unset fields taken from `model_facts(...)["sampling"]`."""
    from dataclasses import replace

    # .get: a manifest written before the penalties existed has none; unset means neutral.
    missing = {k: defaults.get(k) for k in NEUTRAL if getattr(sampling, k) is None}
    if sampling.stop is None and defaults.get("stop"):
        missing["stop"] = tuple(defaults["stop"])
    return replace(sampling, **missing)


def model_facts(settings: Settings) -> dict[str, Any]:
    """Model identity and effective sampling for the job manifest (and its config hash)."""
    model = require_model(settings)
    return copy.deepcopy(_model_facts(model, settings.sampling.model_dump_json()))


@lru_cache(maxsize=8)
def _model_facts(model: str, sampling_json: str) -> dict[str, Any]:
    model_dir = resolve_model_dir(model)
    tokenizer = load_tokenizer(model)
    template = tokenizer.chat_template
    if template is not None and not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    job = json.loads(sampling_json)
    max_tokens, max_tokens_from = default_max_tokens(model_dir, job["max_tokens"])
    return {
        "model": {
            "path": model,
            "name": Path(model).name or model,
            "revision": model_revision(model_dir),
            "chat_template_sha256": _sha256(template) if template else None,
        },
        "sampling": effective_sampling(model_dir, tokenizer, job, max_tokens),
        "max_tokens_from": max_tokens_from,
    }


def effective_sampling(model_dir: Path, tokenizer: Any, job: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """generation_config.json values, overridden by the job's non-None settings; `max_tokens`
    is the one fleet.model.outputlen resolved."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:  # no generation_config.json: the model sets no defaults
        gen = GenerationConfig()
    out: dict[str, Any] = {}
    for key, neutral in NEUTRAL.items():
        value = job.get(key)
        if value is None:
            value = getattr(gen, key, None)
        out[key] = neutral if value is None else value
    if job.get("temperature") is None and gen.do_sample is False:
        out["temperature"] = 0.0  # the model asks for greedy decoding
    eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
    out.update(
        max_tokens=max_tokens,
        n=job["n"],
        stop=job.get("stop"),
        eos_token_ids=sorted({eos} if isinstance(eos, int) else set(eos or ())),
    )
    return out


def model_revision(model_dir: Path) -> str:
    """A git commit or hub snapshot name when there is one, else a hash of the model's files.

    The hash covers config, generation config, tokenizer files and the weight files' names
    and sizes (reading every weight byte of a 27B model at enqueue would take minutes).
    """
    commit = _git_commit(model_dir)
    if commit:
        return commit
    if model_dir.parent.name == "snapshots" and len(model_dir.name) == 40:
        return model_dir.name
    digest = hashlib.sha256()
    for name in (*CONFIG_FILES, *TOKENIZER_FILES):
        path = model_dir / name
        if path.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(path.read_bytes())
    for path in sorted(model_dir.iterdir()):
        if path.name.endswith(WEIGHT_SUFFIXES) and path.is_file():
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
    return "sha256:" + digest.hexdigest()


def _git_commit(model_dir: Path) -> str | None:
    head = model_dir / ".git" / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text().strip()
    if not ref.startswith("ref: "):
        return ref or None
    ref_path = model_dir / ".git" / ref[5:]
    if ref_path.is_file():
        return ref_path.read_text().strip()
    packed = model_dir / ".git" / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref[5:]:
                return sha
    return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

"""A model's files: where they are (a directory or a hub snapshot) and what its config says.

Only what fleet reads of a model is fetched for a hub id (`HUB_PATTERNS`): never the weights.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.errors import ConfigError
from fleet.model.outputlen import context_of
from fleet.settings import Settings

#: Files that decide how text becomes tokens and back; hashed into the model revision.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "added_tokens.json",
)  # fmt: skip
CONFIG_FILES = ("config.json", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
#: Only what fleet.model.facts.model_facts reads is fetched for a hub id: never the weights.
HUB_PATTERNS = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def require_model(settings: Settings) -> str:
    if not settings.model:
        raise ConfigError(f"engine {settings.engine!r} needs a model: set --model or FLEET_MODEL")
    return settings.model


def check_model(model: str) -> Path | None:
    """The model's directory where `model` names one; None for a hub id (ORG/NAME or NAME). A
    path that cannot be a hub id (absolute, ./ or ~/, more than one /) must be a directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        what = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError(f"model {model!r} {what} (a hub id is ORG/NAME)")
    return None


@lru_cache(maxsize=8)
def resolve_model_dir(model: str) -> Path:
    """A local directory holding the model's config and tokenizer files.

    A hub id resolves to its snapshot directory (config and tokenizer files only), which
    honours HF_HUB_OFFLINE; that directory's name is the hub commit.
    """
    local = check_model(model)
    if local is not None:
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, bad id: all mean "not usable"
        raise ConfigError(f"model {model!r} is not a directory and not on the hub: {e}") from e


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

"""The max_tokens a job gets when it sets none: long enough not to cut thinking short.

A fixed 2048 stops a large share of reasoning traces mid-thought (the reference job's
completions average ~1,818 tokens with a long tail), and a cut trace trains a drafter on
text the model never finishes. Qwen3 model repos ship no length in generation_config.json;
the recommended thinking-mode output length (32,768 tokens) is in their model cards, so it
is kept here in a table keyed by config.json's model_type. Order of the rule:

1. `sampling.max_tokens` when the job sets it;
2. generation_config.json's `max_new_tokens`, where the model's own files say it;
3. the table below, for model families whose card recommends a thinking-mode length;
4. generation_config.json's `max_length` (prompt + output; the context still caps it);
5. the model's context length (each request is then capped at context minus its prompt);
6. FALLBACK_MAX_TOKENS, for the sim engine and models that state nothing at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FALLBACK_MAX_TOKENS = 2048
#: Recommended thinking-mode output length by model_type, from the Qwen3 / Qwen3.5 /
#: Qwen3.6 model cards ("an output length of 32,768 tokens for most queries").
THINKING_OUTPUT_TOKENS = {
    "qwen3": 32_768,
    "qwen3_moe": 32_768,
    "qwen3_next": 32_768,
    "qwen3_5": 32_768,
    "qwen3_5_moe": 32_768,
    "qwen3_5_text": 32_768,
    "qwen3_5_moe_text": 32_768,
}


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_types(config: dict[str, Any]) -> list[str]:
    """model_type of the model and of its text model (VL configs nest it in text_config)."""
    sections = (config, config.get("text_config") or {})
    return [s["model_type"] for s in sections if isinstance(s.get("model_type"), str)]


def context_of(config: dict[str, Any]) -> int | None:
    """max_position_embeddings of the text model (nested under text_config in VL configs)."""
    for section in (config, config.get("text_config") or {}):
        if isinstance(section.get("max_position_embeddings"), int):
            return section["max_position_embeddings"]
    return None


def default_max_tokens(model_dir: Path | None, job_value: int | None) -> tuple[int, str]:
    """(max_tokens, where it came from), by the rule in this module's docstring."""
    if job_value is not None:
        return job_value, "job setting"
    if model_dir is None:
        return FALLBACK_MAX_TOKENS, "fallback (no model files)"
    config = _json(model_dir / "config.json")
    gen = _json(model_dir / "generation_config.json")
    if isinstance(gen.get("max_new_tokens"), int):
        return gen["max_new_tokens"], "generation_config.json max_new_tokens"
    for model_type in _model_types(config):
        if model_type in THINKING_OUTPUT_TOKENS:
            return THINKING_OUTPUT_TOKENS[model_type], f"recommended thinking length for {model_type}"
    if isinstance(gen.get("max_length"), int):
        return gen["max_length"], "generation_config.json max_length"
    context = context_of(config)
    if context is not None:
        return context, "context length (capped per request at context minus prompt)"
    return FALLBACK_MAX_TOKENS, "fallback (the model states no length)"

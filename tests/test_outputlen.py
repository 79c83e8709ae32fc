"""The default max_tokens: the model's own files first, then the thinking-length table,
then the context; never a fixed 2048 that cuts a reasoning trace short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.model.outputlen import FALLBACK_MAX_TOKENS, default_max_tokens


def model_dir(tmp_path: Path, config: dict, gen: dict | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "gen", "expected"),
    [
        # Qwen3.6-27B: a VL config whose text model is qwen3_5, generation_config without a length
        ({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "max_position_embeddings": 262144}},
         {"temperature": 0.6, "top_k": 20}, (32768, "recommended thinking length for qwen3_5")),
        ({"model_type": "qwen3_moe", "max_position_embeddings": 40960}, {},
         (32768, "recommended thinking length for qwen3_moe")),
        ({"model_type": "llama", "max_position_embeddings": 8192}, {"max_new_tokens": 1000},
         (1000, "generation_config.json max_new_tokens")),
        ({"model_type": "qwen3"}, {"max_new_tokens": 4096}, (4096, "generation_config.json max_new_tokens")),
        ({"model_type": "llama", "max_position_embeddings": 8192}, {"max_length": 4096},
         (4096, "generation_config.json max_length")),
        ({"model_type": "llama", "max_position_embeddings": 8192}, None,
         (8192, "context length (capped per request at context minus prompt)")),
        ({"model_type": "gpt2"}, None, (FALLBACK_MAX_TOKENS, "fallback (the model states no length)")),
    ],
)
def test_default_follows_the_model_files(tmp_path, config, gen, expected):
    assert default_max_tokens(model_dir(tmp_path, config, gen), None) == expected


def test_a_job_setting_wins_and_sim_falls_back(tmp_path):
    assert default_max_tokens(model_dir(tmp_path, {"model_type": "qwen3"}), 64) == (64, "job setting")
    assert default_max_tokens(None, None) == (FALLBACK_MAX_TOKENS, "fallback (no model files)")

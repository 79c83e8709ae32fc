"""Engine registry: the worker builds its one engine from the settings by name.

Heavy engines (hf, sglang) are imported lazily, so the package installs and imports
without torch or sglang.
"""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine
from fleet.model.outputlen import default_max_tokens
from fleet.settings import Settings


def build_engine(settings: Settings) -> Engine:
    if settings.engine == "sim":
        from fleet.engines.sim import SimEngine

        return SimEngine(settings.sim)
    if settings.engine == "hf":
        from fleet.engines.hf import HfEngine

        return HfEngine(settings)
    if settings.engine == "sglang":
        from fleet.engines.sglang import SglangEngine

        return SglangEngine(settings)
    raise ValueError(f"unknown engine {settings.engine!r}")


def job_config(settings: Settings) -> dict[str, Any]:
    """What shapes the output for this engine; hashed into the job manifest.

    For model engines this reads the model's own files (chat template, generation config),
    so the effective sampling values land in the manifest.
    """
    base: dict[str, Any] = {
        "engine": settings.engine,
        "chunk_size": settings.chunk_size,
        "seed": settings.seed,
        "sampling": settings.sampling.model_dump(),
        "enable_thinking": settings.enable_thinking,
        "return_output_ids": settings.return_output_ids,
    }
    if settings.engine == "sim":
        base["sampling"]["max_tokens"], base["max_tokens_from"] = default_max_tokens(
            None, settings.sampling.max_tokens
        )
        base["model"] = {
            "name": "sim",
            "mean_output_tokens": settings.sim.mean_output_tokens,
            "sigma": settings.sim.sigma,
        }
        return base
    from fleet.model.prompting import model_facts

    facts = model_facts(settings)
    base["model"] = facts["model"]
    base["sampling"] = facts["sampling"]
    base["max_tokens_from"] = facts["max_tokens_from"]
    return base


def input_vocab(settings: Settings) -> int | None:
    """Token ids a pre-tokenized input may hold: the tokenizer's size (padded embedding
    rows are not tokens), the sim engine's setting, or None where nothing is known."""
    if settings.engine == "sim":
        return settings.sim.vocab_size
    from fleet.model.prompting import load_tokenizer, require_model

    return len(load_tokenizer(require_model(settings)))

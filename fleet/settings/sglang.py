"""The sglang engine's settings (FLEET_SGLANG__*).

One section of the settings part, beside the others: fleet.settings composes it, and the
sglang engine (fleet.engines.sglang) reads it, so the settings never import the engines.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fleet.settings.engine import EngineSettings

#: S for sglang where neither the setting nor a known GPU sizes it.
DEFAULT_SGLANG_RUNNING = 256
#: the prefix cache's modes (`radix_cache`, `fleet plan --radix`)
RadixCache = Literal["auto", "on", "off"]

class SglangSettings(EngineSettings):
    """Kwargs for the embedded `sglang.Engine` (docs/architecture.md, SGLang facts)."""

    dtype: str = Field("bfloat16", description="weights and activations dtype")
    mtp: bool = Field(True, description="multi-token-prediction speculative decoding (NEXTN)")
    speculative_num_steps: int = Field(3, ge=1, description="MTP: draft steps per decode step")
    speculative_eagle_topk: int = Field(1, ge=1, description="MTP: draft candidates kept per step")
    speculative_num_draft_tokens: int = Field(
        4, ge=1, description="MTP: draft tokens verified per decode step (reserved per request)"
    )
    max_running_requests: int | None = Field(
        None, ge=1,
        description="requests the engine runs at once; unset: the most that fit this model on this GPU "
        "(fleet.model.capacity), else 256 where no GPU is known. Always passed: SGLang caps it at 48 with MTP",
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, lt=1,
        description="fraction of GPU memory for weights + KV + state; unset: SGLang's own headroom for "
        "this GPU, passed explicitly so SGLang does not cut it for a vision tower fleet never feeds",
    )
    radix_cache: RadixCache = Field(
        "auto",
        description="prefix cache. auto: off for hybrid (mamba-state) models unless prompts share prefixes "
        "or n > 1, since with it on SGLang keeps 5 state slots per request instead of 1",
    )
    shared_prefixes: bool = Field(False, description="prompts share long prefixes (radix_cache auto turns it on)")
    mamba_full_memory_ratio: float = Field(
        0.9, gt=0, description="radix on: state pool / KV pool memory ratio (SGLang's default 0.9)"
    )
    context_tokens: int = Field(
        4096, ge=1, description="tokens, prompt + output, one running request holds; sizes the batch"
    )
    log_level: str = Field("warning", description="SGLang's log level (its own default, error, hides its warnings)")
    language_model_only: bool | None = Field(
        None,
        description="load only the language model of a vision-language checkpoint (no vision tower, no "
        "multimodal reserve); unset: on for such checkpoints where SGLang takes it (fleet's records carry "
        "no images); SGLang 0.5.23 refuses it for Qwen3.5/3.6",
    )
    context_length: int | None = Field(
        None, ge=1, description="tokens, prompt + output, SGLang accepts per request; unset: the model's"
    )
    chunked_prefill_size: int | None = Field(
        None, description="tokens of prompt prefilled per step; unset: SGLang's default for the GPU"
    )
    tp_size: int = Field(1, ge=1, description="GPUs one engine spans (tensor parallel)")
    enable_hierarchical_cache: bool = Field(False, description="spill the prefix cache to host memory (HiCache)")
    hicache_ratio: float | None = Field(None, gt=0, description="HiCache: host cache size as a ratio of the GPU cache")
    hicache_size: int | None = Field(None, ge=0, description="GB of host memory for the cache")
    hicache_write_policy: str | None = Field(
        None, description="HiCache: when GPU cache pages are written to host (SGLang's write_through, ...)"
    )
    deterministic: bool = Field(False, description="enable_deterministic_inference (needed for seeds)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed through as is")

    def requests_at_once(self) -> int:
        """S: the setting (planned by the launcher where a GPU is known), else the default."""
        return self.max_running_requests or DEFAULT_SGLANG_RUNNING

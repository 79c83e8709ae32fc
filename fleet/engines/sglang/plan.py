"""The SGLang choices fleet makes before the engine starts: radix cache, memory, batch.

Pure (never imports sglang): the launcher sizes K from it before any worker starts, and
`fleet engine-args` shows it on a laptop. The engine reads back what SGLang really runs
after start (fleet.engines.sglang); this is the plan that read-back is checked against.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.errors import ConfigError
from fleet.model.capacity import Capacity, Serving, capacity, sglang_mem_fraction
from fleet.model.config import is_hybrid, local_config
from fleet.model.gpus import gpu_memory_mib
from fleet.settings import Settings

log = logging.getLogger(__name__)

#: Architectures whose vision tower SGLang 0.5.23 can leave out (`ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES`);
#: it refuses `language_model_only` for any other, Qwen3.5/3.6 included.
LANGUAGE_MODEL_ONLY_ARCHITECTURES = frozenset(
    {"DeepseekV4ForCausalLM", "MuseGlimmerForConditionalGeneration", "Cosmos3ForConditionalGeneration",
     "Cosmos3EdgeForConditionalGeneration"}
)  # fmt: skip
def radix_on(settings: Settings, config: dict[str, Any]) -> bool:
    """auto: keep SGLang's prefix cache except where it costs a hybrid model 5x the state."""
    s = settings.sglang
    if s.radix_cache != "auto":
        return s.radix_cache == "on"
    return not is_hybrid(config) or s.shared_prefixes or settings.sampling.n > 1


def check_choices(settings: Settings, config: dict[str, Any]) -> None:
    """Refuse at start what SGLang refuses (arg_groups/kv_cache_hook.py)."""
    if settings.sglang.enable_hierarchical_cache and not radix_on(settings, config):
        raise ConfigError(
            "sglang.enable_hierarchical_cache needs the radix cache, which is off "
            f"(sglang.radix_cache={settings.sglang.radix_cache!r}): set sglang.radix_cache=on "
            "or turn the hierarchical cache off"
        )


def language_model_only(settings: Settings, config: dict[str, Any]) -> bool:
    """Whether SGLang skips the vision tower: only a vision-language checkpoint has one, and
    fleet's records carry no images, so unset means on wherever SGLang takes the flag."""
    flag = settings.sglang.language_model_only
    if not config.get("vision_config") or flag is False:
        return False
    supported = bool(set(config.get("architectures") or ()) & LANGUAGE_MODEL_ONLY_ARCHITECTURES)
    if flag and not supported:
        raise ConfigError(
            f"sglang.language_model_only: SGLang 0.5.23 refuses it for {config.get('architectures')} "
            f"(it takes it for {sorted(LANGUAGE_MODEL_ONLY_ARCHITECTURES)}): leave it unset"
        )
    return supported


def mem_fraction(settings: Settings, gpu_mib: float | None) -> float | None:
    """The setting, else SGLang's own headroom for the card; None where the card is unknown."""
    s = settings.sglang
    return s.mem_fraction_static or (sglang_mem_fraction(gpu_mib) if gpu_mib else None)


def serving(settings: Settings, config: dict[str, Any], gpu_mib: float | None) -> Serving:
    s = settings.sglang
    return Serving(
        mtp=s.mtp,
        radix=radix_on(settings, config),
        mem_fraction_static=mem_fraction(settings, gpu_mib),
        mamba_full_memory_ratio=s.mamba_full_memory_ratio,
        draft_tokens=s.speculative_num_draft_tokens,
        max_running_requests=s.max_running_requests,
        context_tokens=float(s.context_tokens),
        language_model_only=language_model_only(settings, config),
        tp=s.tp_size,
    )


def plan_capacity(settings: Settings, gpu: str | None = None, *, config: dict[str, Any] | None = None,
                  gpu_mib: float | None = None) -> Capacity | None:
    """The batch this model gets on the named GPU (else this host's); None if either is unknown.
    A caller that has read config.json or probed the GPU already passes what it found."""
    config = local_config(settings.model or "") if config is None else config
    gpu_mib = gpu_memory_mib(gpu) if gpu_mib is None else gpu_mib
    if not gpu_mib or not config.get("text_config", config).get("hidden_size"):
        return None
    return capacity(config, gpu_mib, serving(settings, config, gpu_mib))


def job_capacity(
    settings: Settings, gpu: str, context_tokens: float, *, mtp: bool | None = None, radix: str | None = None,
    gpus: int | None = None,
) -> Capacity | None:
    """`plan_capacity` for a job whose requests hold `context_tokens` each, on a named GPU (`gpus` of them
    per engine: tensor parallel)."""
    update: dict[str, Any] = {"context_tokens": max(1, round(context_tokens))}
    if gpus is not None:
        update["tp_size"] = gpus
    if mtp is not None:
        update["mtp"] = mtp
    if radix is not None:
        update["radix_cache"] = radix
    sglang = settings.sglang.model_copy(update=update)
    return plan_capacity(settings.model_copy(update={"sglang": sglang}), gpu)


def with_planned_running(settings: Settings, gpu: str | None = None, *, config: dict[str, Any] | None = None,
                         gpu_mib: float | None = None) -> Settings:
    """Settings whose sglang.max_running_requests is the planned batch, so K and every worker
    agree on S before any engine starts; unchanged when it is set or cannot be planned."""
    if settings.engine != "sglang" or settings.sglang.max_running_requests or not settings.model:
        return settings
    cap = plan_capacity(settings, gpu, config=config, gpu_mib=gpu_mib)
    if cap is None:
        return settings
    return settings.model_copy(
        update={"sglang": settings.sglang.model_copy(update={"max_running_requests": max(1, cap.batch)})}
    )

"""How many requests SGLang 0.5.23 really runs at once on one GPU, from config.json alone.

A hybrid model (Qwen3.5/3.6: Gated-DeltaNet layers with a recurrent state) is capped by
its state pool long before its KV cache: the scheduler lowers max_running_requests to
what the pool holds, silently at fleet's log level. This module redoes SGLang's sizing
by hand so fleet can ask for what fits. Paths cite the sglang 0.5.23 wheel:

- budget: `sglang/srt/mem_cache/kv_cache_configurator.py` KVCacheConfigurator
  `_profile_available_bytes` (rest = free - free_before_load x (1 - mem_fraction_static)
  - the multimodal reservation of `mm_runtime_reservation_gb`);
- state pool: `_handle_max_mamba_cache` (the pool gets r/(1+r) of the rest, r =
  `mamba_full_memory_ratio`, or exactly max_running_requests + 1 slots with the radix cache
  off; MTP adds per-request intermediate copies, one per draft token);
- slots per request: `_calculate_mamba_ratio` (1 with radix off, else 3 + the tracking
  slots of `sglang/srt/mem_cache/allocation_sizing.py` get_mamba_tracking_slots: 2 for
  `extra_buffer` under the overlap scheduler);
- running requests: `resolve_max_num_reqs` (min of what was asked, KV tokens / 2, and
  state slots / slots per request);
- KV cell: `sglang/srt/model_executor/pool_configurator.py` (full-attention layers only;
  the NEXTN draft layer's term is skipped for Qwen3.5/3.6, whose target config has no
  `num_nextn_predict_layers`: its one-layer pool is allocated after, outside the budget);
- MTP weights: the NEXTN draft (`sglang/srt/models/qwen3_5_mtp.py`) builds its own embedding
  and lm_head and drops them for the target's only in `init_lm_head()`
  (`sglang/srt/speculative/eagle_worker_v2.py`), after the target's pools were sized: they are
  resident when the budget is taken;
- `language_model_only` (a vision-language checkpoint without its vision tower): no tower
  weights and no multimodal reserve (`sglang/srt/configs/model_config.py` is_multimodal);
- state slot: `sglang/srt/configs/mamba_utils.py` BaseLinearStateParams.mamba_cache_per_req.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleet.errors import ConfigError
from fleet.model.config import mtp_layers

GIB = 1 << 30
MIB = 1 << 20
#: What the CUDA context and torch hold before the weights load (an estimate).
CUDA_CONTEXT_MIB = 1024
#: `SGLANG_VLM_CACHE_SIZE_MB` default, reserved out of the KV budget for multimodal models.
VLM_CACHE_MIB = 100
#: `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` in kv_cache_configurator.py.
MAMBA_BASE_SLOTS = 3
#: `mamba_full_memory_ratio` fallback in sglang/srt/arg_groups/fields/schedule.py.
MAMBA_FULL_MEMORY_RATIO = 0.9
#: Floor of SGLang's runtime reserve on cards over 60 GiB (arg_groups/memory_hook.py).
RESERVE_FLOOR_MIB = 10 * 1024
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class Serving:
    """The SGLang choices capacity depends on."""

    mtp: bool = True
    radix: bool = False
    mem_fraction_static: float | None = None  #: None: SGLang's headroom, without its VLM cut
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    draft_tokens: int = 4  #: speculative_num_draft_tokens
    overlap: bool = True  #: overlap scheduler (radix on: extra_buffer, 2 tracking slots)
    max_running_requests: int | None = None  #: asked; None: the largest that fits
    context_tokens: float = 4096.0  #: KV tokens one running request holds (prompt + output)
    language_model_only: bool = False  #: a vision-language checkpoint loaded without its tower
    tp: int = 1  #: GPUs one engine spans (tensor parallel): each holds 1/tp of the weights, KV heads and state


@dataclass(frozen=True)
class Capacity:
    """One engine's running batch, with the figures it is made of (GiB/KiB/MiB are binary); memory
    figures are per GPU where the engine spans `gpus` of them."""

    gpu_gib: float
    mem_fraction_static: float
    weights_gib: float
    kv_kib_per_token: float
    state_mib_per_slot: float
    state_slots_per_request: int
    state_slots: int  #: max_mamba_cache_size
    state_pool_gib: float
    kv_tokens: int  #: max_total_num_tokens
    max_running_requests: int  #: SGLang's effective value (resolve_max_num_reqs)
    kv_bound_requests: int  #: requests whose context_tokens fit in the KV pool
    batch: int  #: what really runs at once: the lower of the two
    draft_kv_gib: float = 0.0  #: the MTP draft layer's KV pool, allocated outside the budget
    gpus: int = 1  #: GPUs the engine spans; the batch runs on all of them at once

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


def full_and_linear_layers(cfg: dict[str, Any]) -> tuple[int, int]:
    layers = int(cfg.get("num_hidden_layers", 0))
    if cfg.get("layer_types"):
        full = sum(1 for t in cfg["layer_types"] if "full" in str(t) or str(t) == "attention")
        return full, len(cfg["layer_types"]) - full
    if cfg.get("full_attention_interval") and cfg.get("linear_num_value_heads"):
        full = layers // int(cfg["full_attention_interval"])
        return full, layers - full
    return layers, 0


def _head_dim(cfg: dict[str, Any]) -> int:
    heads = int(cfg.get("num_attention_heads", 1))
    return int(cfg.get("head_dim") or int(cfg.get("hidden_size", 0)) // max(heads, 1))


def kv_bytes_per_token(config: dict[str, Any], *, mtp: bool = False, kv_bytes: int = 2) -> int:
    """K and V of every full-attention layer (and of the MTP draft layers with MTP on);
    MLA models cache one compressed latent per layer."""
    cfg = text_config(config)
    full, _ = full_and_linear_layers(cfg)
    layers = full + (mtp_layers(config) if mtp else 0)
    if cfg.get("kv_lora_rank"):
        return layers * (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))) * kv_bytes
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.get("num_attention_heads", 1))
    return 2 * layers * kv_heads * _head_dim(cfg) * kv_bytes


def state_bytes_per_slot(config: dict[str, Any]) -> int:
    """One state slot: per GDN layer an nv x dk x dv SSM state plus the conv window."""
    cfg = text_config(config)
    _, linear = full_and_linear_layers(cfg)
    nv = int(cfg.get("linear_num_value_heads", 0))
    if not linear or not nv:
        return 0
    nk = int(cfg.get("linear_num_key_heads", nv))
    dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    ssm_bytes = DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype", "float32")), 4)
    conv_dim = 2 * nk * dk + nv * dv  # conv over cat(q, k, v): Mamba2StateShape.create
    conv = conv_dim * (int(cfg.get("linear_conv_kernel_dim", 4)) - 1) * 2  # bf16 conv state
    return linear * (nv * dk * dv * ssm_bytes + conv)


def _mlp_params(cfg: dict[str, Any], hidden: int) -> float:
    if cfg.get("num_experts"):
        experts = int(cfg["num_experts"]) * 3 * hidden * int(cfg["moe_intermediate_size"])
        shared = 3 * hidden * int(cfg.get("shared_expert_intermediate_size", 0))
        return experts + shared + hidden * int(cfg["num_experts"])
    return 3 * hidden * int(cfg.get("intermediate_size", 4 * hidden))


def _full_attention_params(cfg: dict[str, Any], hidden: int) -> float:
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    hd = _head_dim(cfg)
    gate = 2 if cfg.get("attn_output_gate") else 1  # Qwen3.5 gates the output: q_proj is 2x
    return hidden * heads * hd * gate + 2 * hidden * kv_heads * hd + heads * hd * hidden


def _linear_attention_params(cfg: dict[str, Any], hidden: int) -> float:
    nv, nk = int(cfg["linear_num_value_heads"]), int(cfg.get("linear_num_key_heads", cfg["linear_num_value_heads"]))
    key, value = nk * int(cfg["linear_key_head_dim"]), nv * int(cfg["linear_value_head_dim"])
    kernel = int(cfg.get("linear_conv_kernel_dim", 4))
    return hidden * (2 * key + 2 * value + 2 * nv) + (2 * key + value) * kernel + value * hidden


def _vision_params(config: dict[str, Any]) -> float:
    vc = config.get("vision_config") or {}
    if not vc:
        return 0.0
    h = int(vc.get("hidden_size", 1024))
    depth = int(vc.get("depth") or vc.get("num_hidden_layers", 24))
    inter = int(vc.get("intermediate_size", 4 * h))
    merged = h * int(vc.get("spatial_merge_size", 2)) ** 2
    merger = merged * merged + merged * int(vc.get("out_hidden_size", h))
    return depth * (4 * h * h + 2 * h * inter) + merger


def draft_vocab_params(config: dict[str, Any]) -> float:
    """The NEXTN draft's own embedding and lm_head (one matrix when tied), resident until
    init_lm_head() swaps in the target's: after the budget was taken."""
    cfg = text_config(config)
    vocab = int(cfg.get("vocab_size", config.get("vocab_size", 0)))
    tied = bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    return vocab * int(cfg["hidden_size"]) * (1 if tied else 2)


def weight_bytes(
    config: dict[str, Any], *, mtp: bool = False, vision: bool = True, weight_bytes_per_param: float = 2.0
) -> float:
    """Parameters resident when SGLang takes its budget: text layers, embeddings and lm_head,
    the vision tower (unless language_model_only), and with MTP the draft layer with its own
    embedding and lm_head."""
    cfg = text_config(config)
    hidden = int(cfg["hidden_size"])
    full, linear = full_and_linear_layers(cfg)
    vocab = int(cfg.get("vocab_size", config.get("vocab_size", 0)))
    tied = bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    mlp, attn = _mlp_params(cfg, hidden), _full_attention_params(cfg, hidden)
    params = vocab * hidden * (1 if tied else 2) + full * (attn + mlp) + (_vision_params(config) if vision else 0)
    if linear:
        params += linear * (_linear_attention_params(cfg, hidden) + mlp)
    if mtp and mtp_layers(config):  # a full-attention decoder layer, the fc joining embedding and
        params += mtp_layers(config) * (attn + mlp + 2 * hidden * hidden)  # hidden state, and the
        params += draft_vocab_params(config)  # draft's own embedding and lm_head
    return params * weight_bytes_per_param


def sglang_mem_fraction(gpu_mib: float) -> float:
    """SGLang's own mem_fraction_static for tp=1 (memory_hook.handle_gpu_memory_settings),
    without `adjust_mem_fraction_for_vlm`: fleet never sends images, so the vision cut
    (x0.91 for a 27-layer 1152-wide tower) only shrinks the pools."""
    big = gpu_mib >= 160 * 1024
    chunked_prefill, decode_bs = (16384, 512) if big else (8192, 256)
    reserved = 512 + chunked_prefill * 1.5 + 1024 / 8 + decode_bs * 2 + 256  # 256: prefill graphs
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, RESERVE_FLOOR_MIB)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def slots_per_request(serving: Serving, hybrid: bool) -> int:
    """_calculate_mamba_ratio: radix off 1; on, 3 + extra_buffer's tracking slots."""
    if not hybrid or not serving.radix:
        return 1
    return MAMBA_BASE_SLOTS + (2 if serving.overlap else 0)


def tp_shares(config: dict[str, Any], tp: int) -> tuple[int, int]:
    """(KV, state) shards under tensor parallelism: attention's KV heads are split over the GPUs (a GPU
    holds at least one head: fewer heads than GPUs are replicated; MLA's latent is replicated), and so
    are the linear-attention value heads of the recurrent state."""
    cfg = text_config(config)
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads", 1)
    kv_heads = 1 if cfg.get("kv_lora_rank") else int(heads)
    value_heads = int(cfg.get("linear_num_value_heads") or tp)
    return max(1, min(tp, kv_heads)), max(1, min(tp, value_heads))


def capacity(config: dict[str, Any], gpu_mib: float, serving: Serving) -> Capacity:
    """The running batch SGLang settles on for this model on a GPU of `gpu_mib` MiB (on each of `serving.tp`
    such GPUs, each holding its share of the weights and of every request's KV and state; SGLang's headroom
    is taken as for one GPU)."""
    mfs = serving.mem_fraction_static or sglang_mem_fraction(gpu_mib)
    kv_shards, state_shards = tp_shares(config, serving.tp)
    weights = weight_bytes(config, mtp=serving.mtp, vision=not serving.language_model_only) / serving.tp
    cell = kv_bytes_per_token(config) / kv_shards  # the budget's per-token cost: the target's layers only
    draft_cell = kv_bytes_per_token(config, mtp=True) / kv_shards - cell if serving.mtp else 0
    slot = state_bytes_per_slot(config) / state_shards
    multimodal = bool(config.get("vision_config")) and not serving.language_model_only
    pre_load = (gpu_mib - CUDA_CONTEXT_MIB) * MIB
    rest = pre_load * mfs - weights - (VLM_CACHE_MIB * MIB if multimodal else 0)
    if rest <= 0:
        raise ConfigError(f"the weights ({weights / GIB:.1f} GiB) leave no memory at mem_fraction_static={mfs}")
    ratio = slots_per_request(serving, slot > 0)
    copies = serving.draft_tokens if serving.mtp else 0  # intermediate states per request
    per_req_kv = cell * serving.context_tokens
    asked = serving.max_running_requests
    if not slot:
        state_slots, state_bytes = 0, 0.0
        want = asked or int(rest // (per_req_kv or 1))
    elif not serving.radix:
        # Radix off with max_running_requests set: exactly that many slots (+1 padding),
        # each with its draft-token copies; the rest is KV. Pick the M that fills both.
        want = asked or int((rest - slot * (1 + copies)) // (slot * (1 + copies) + per_req_kv))
        if want < 1:
            raise ConfigError("no room for a single request's state: lower mtp or raise mem_fraction_static")
        state_slots, state_bytes = want, (want + 1) * slot * (1 + copies)
    else:
        budget = rest * serving.mamba_full_memory_ratio / (1 + serving.mamba_full_memory_ratio)
        if copies:
            state_slots = int((budget - slot * (1 + copies)) // (slot * (1 + copies / ratio)))
        else:
            state_slots = int((budget - slot) // slot)
        want = min(asked or state_slots // ratio, state_slots // ratio)
        state_bytes = (state_slots + 1) * slot + slot * (want + 1) * copies
    kv_tokens = int((rest - state_bytes) // cell)
    if kv_tokens <= 0:  # SGLang fails to start here ("Not enough GPU memory for ... state cache")
        raise ConfigError(
            f"the state pool ({state_bytes / GIB:.1f} GiB for {want} requests) leaves no room for KV: "
            "lower sglang.max_running_requests or leave it unset"
        )
    running = max(0, min(want, kv_tokens // 2, state_slots // ratio if slot else want))
    kv_bound = int(kv_tokens // serving.context_tokens)
    return Capacity(
        gpu_gib=gpu_mib / 1024,
        mem_fraction_static=mfs,
        weights_gib=weights / GIB,
        kv_kib_per_token=cell / 1024,
        state_mib_per_slot=slot / MIB,
        state_slots_per_request=ratio + copies if slot else 0,
        state_slots=state_slots,
        state_pool_gib=state_bytes / GIB,
        kv_tokens=kv_tokens,
        max_running_requests=running,
        kv_bound_requests=kv_bound,
        batch=max(1, min(running, kv_bound)) if running else 0,
        draft_kv_gib=kv_tokens * draft_cell / GIB,
        gpus=serving.tp,
    )

"""How vLLM and SGLang take a request's sampling: their own parameter names and values, every one
explicit (neither applies generation_config.json on these paths). The sampling comes final
(fleet.records.record_sampling): only names and the engines' encodings of "off" change here. Shared
by their embedded engines and by the server engine, which speaks their HTTP APIs (docs/architecture.md,
"Engines").
"""

from __future__ import annotations

from typing import Any

from fleet.records import Sampling

#: tokens of the context SGLang's scheduler never gives a request, embedded or behind its server: it clips
#: max_new_tokens silently to max_req_len - prompt - 1, with max_req_len = context - 1
#: (init_req_max_new_tokens), so fleet asks for no more (the engines' context_budget)
SGLANG_SCHEDULER_MARGIN = 2


def vllm_sampling(s: Sampling, max_new: int, eos_ids: list[int]) -> dict[str, Any]:
    """vLLM SamplingParams, every value explicit (AsyncLLM applies no generation_config)."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else 0,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_tokens": max_new,
        "stop_token_ids": list(eos_ids),
        "seed": s.seed,
        # vLLM's incremental detokenizer steps once per token in the worker's process; fleet decodes a
        # record's text from its ids once, at its end (ModelEngine.assemble), so it asks for vLLM's
        # text only where vLLM must match stop strings in it
        "detokenize": bool(s.stop),
    }
    if s.stop:
        params["stop"] = list(s.stop)
    return params


def sglang_sampling(s: Sampling, max_new: int, eos_ids: list[int], seeded: bool) -> dict[str, Any]:
    """SGLang sampling params, every value explicit: the Engine path ignores generation_config."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else -1,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_new_tokens": max_new,
        "stop_token_ids": eos_ids,
    }
    if s.stop:
        params["stop"] = list(s.stop)
    if seeded:
        params["sampling_seed"] = s.seed  # honoured only with enable_deterministic_inference
    return params

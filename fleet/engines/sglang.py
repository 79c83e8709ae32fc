"""The embedded SGLang engine: one `sglang.Engine` per worker process, on the engine loop.

`engine_kwargs` is pure (it never imports sglang) so `fleet engine-args` can show a
deployment's exact kwargs on a laptop. `SglangEngine` imports sglang only in `start()`,
which runs on the worker's long-lived loop thread: the engine's receive loop binds to the
first event loop that uses it (docs/architecture.md), so every request must come from that loop.

We pass token ids (the prompt is templated once, by `fleet.prompting`) but keep SGLang's
tokenizer (`skip_tokenizer_init` stays False): stop strings and detokenisation need it,
and detokenising in SGLang's own process keeps that work off the worker's loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleet.engines.base import GenRequest, GenResult, Sampling, prompt_digest
from fleet.engines.model import ModelEngine
from fleet.errors import EngineError, RecordError
from fleet.prompting import (
    Prompt,
    check_length,
    context_length_of,
    fill_sampling,
    render,
    require_model,
    split_reasoning,
)
from fleet.settings import Settings

log = logging.getLogger(__name__)

#: Architectures SGLang serves with a mamba (linear-attention) state, from sglang 0.5.23's
#: `_MAMBA_RADIX_CACHE_ARCHS`; `extra_buffer` is refused for any other model.
HYBRID_ARCHITECTURES = frozenset(
    {
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
        "KimiLinearForCausalLM", "NemotronHForCausalLM", "FalconH1ForCausalLM",
        "JetNemotronForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
        "BailingMoeV2_5ForCausalLM",
    }
)  # fmt: skip
#: Layer kinds that carry recurrent state in hybrid configs (`layer_types`); this also covers
#: architectures that are hybrid only in some configs (GraniteMoeHybrid).
STATEFUL_LAYERS = frozenset({"linear_attention", "mamba", "gated_deltanet"})
FINISH_TYPES = {"stop": "stop", "length": "length"}
#: (record field, meta_info key): what SGLang reports per request that lands in the record.
META_FIELDS = (
    ("cached_tokens", "cached_tokens"),
    ("spec_accept_length", "spec_accept_length"),
    ("spec_verify_ct", "spec_verify_ct"),
    ("latency_s", "e2e_latency"),
)


def is_hybrid(config: dict[str, Any]) -> bool:
    """Whether a model's config.json describes a model with mamba / linear-attention state."""
    for section in (config, config.get("text_config") or {}):
        if set(section.get("architectures") or ()) & HYBRID_ARCHITECTURES:
            return True
        if set(section.get("layer_types") or ()) & STATEFUL_LAYERS:
            return True
    return False


def engine_kwargs(settings: Settings) -> dict[str, Any]:
    """The exact kwargs the worker passes to `sglang.Engine` (docs/architecture.md, SGLang facts)."""
    model = require_model(settings)
    s = settings.sglang
    local = Path(model).expanduser()
    kw: dict[str, Any] = {
        # engine-args on a laptop may name a directory that exists only on the GPU host
        "model_path": str(local.resolve()) if local.is_dir() else model,
        "dtype": s.dtype,
        "tp_size": s.tp_size,
        # With speculation on and this unset, SGLang silently caps it at 48.
        "max_running_requests": s.max_running_requests,
    }
    if s.mtp:
        kw.update(
            speculative_algorithm="NEXTN",
            speculative_num_steps=s.speculative_num_steps,
            speculative_eagle_topk=s.speculative_eagle_topk,
            speculative_num_draft_tokens=s.speculative_num_draft_tokens,
        )
        if is_hybrid(local_config(model)):
            kw["mamba_radix_cache_strategy"] = "extra_buffer"
    for name in ("mem_fraction_static", "context_length", "chunked_prefill_size"):
        if getattr(s, name) is not None:
            kw[name] = getattr(s, name)
    if s.enable_hierarchical_cache:
        kw["enable_hierarchical_cache"] = True
        for name in ("hicache_ratio", "hicache_size", "hicache_write_policy"):
            if getattr(s, name) is not None:
                kw[name] = getattr(s, name)
    if s.deterministic:
        kw["enable_deterministic_inference"] = True
    kw.update(s.engine_kwargs)
    return kw


def local_config(model: str) -> dict[str, Any]:
    """config.json from the model directory or the local hub cache; {} if neither has it.

    Never downloads: engine-args must answer on a machine without the model or a network.
    """
    path: Path | str | None = Path(model).expanduser() / "config.json"
    if not Path(path).is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a valid repo id either
            path = None
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        log.warning("no config.json for %r: assuming a model without mamba state", model)
        return {}
    return json.loads(Path(path).read_text())


def sampling_params(s: Sampling, max_new: int, eos_ids: list[int], seeded: bool) -> dict[str, Any]:
    """SGLang sampling params, every value explicit: the Engine path ignores generation_config."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else -1,
        "min_p": s.min_p,
        "max_new_tokens": max_new,
        "stop_token_ids": eos_ids,
    }
    if s.stop:
        params["stop"] = list(s.stop)
    if seeded and s.seed is not None:
        params["sampling_seed"] = s.seed  # honoured only with enable_deterministic_inference
    return params


def finish_reason(meta: dict[str, Any]) -> str:
    """stop | length from SGLang's finish_reason; an abort fails the record alone."""
    raw = meta.get("finish_reason")
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind in FINISH_TYPES:
        return FINISH_TYPES[kind]
    message = raw.get("message") if isinstance(raw, dict) else None
    raise RecordError(f"sglang finished the request with {kind!r}: {message or raw}")


class SglangEngine(ModelEngine):
    name = "sglang"

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.kwargs = engine_kwargs(settings)
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: EngineError | None = None
        #: one thread: the tokenizer is only ever used from it once the engine runs
        self._render = ThreadPoolExecutor(1, thread_name_prefix="fleet-render")

    @property
    def max_running(self) -> int:
        return self.settings.sglang.max_running_requests

    async def start(self) -> None:
        """Build the engine on this (the worker's) loop; blocks it while the weights load."""
        self._loop = asyncio.get_running_loop()
        self.load_model_files()
        try:
            import sglang
        except ImportError as e:
            raise EngineError(f"engine 'sglang' needs the sglang package: {e}") from e
        try:
            self._engine = sglang.Engine(**self.kwargs)
        except Exception as e:
            raise EngineError(f"sglang.Engine failed to start: {type(e).__name__}: {e}") from e
        manager = getattr(self._engine, "tokenizer_manager", None)
        self.context = (
            getattr(manager, "context_len", None)
            or self.settings.sglang.context_length
            or context_length_of(self.model_path)
        )

    async def generate(self, request: GenRequest) -> GenResult:
        if self._dead is not None:
            raise self._dead
        if self._engine is None:
            raise EngineError("sglang engine is not running (not started, or shut down)")
        if asyncio.get_running_loop() is not self._loop:
            raise EngineError("sglang engine called from a loop other than the one it started on")
        # Templating is pure Python: off the loop, which also carries SGLang's own output path.
        prompt = await asyncio.get_running_loop().run_in_executor(self._render, render, self.tokenizer, request)
        max_new = check_length(request, len(prompt.ids), self.context)
        sampling = fill_sampling(request.sampling, self.defaults)
        eos_ids = self.defaults["eos_token_ids"]
        params = sampling_params(sampling, max_new, eos_ids, self.settings.sglang.deterministic)
        out = await self._call(request, prompt.ids, params)
        return self._result(request, prompt, out)

    async def _call(self, request: GenRequest, prompt_ids: list[int], params: dict) -> dict:
        try:
            return await self._engine.async_generate(input_ids=prompt_ids, sampling_params=params)
        except ValueError as e:  # request validation in SGLang's tokenizer manager
            raise RecordError(f"sglang rejected record {request.record_id!r}: {e}") from e
        except Exception as e:  # anything else means the engine itself is gone
            self._dead = EngineError(f"sglang engine failed: {type(e).__name__}: {e}")
            raise self._dead from e

    def _result(self, request: GenRequest, prompt: Prompt, out: dict) -> GenResult:
        meta = out.get("meta_info") or {}
        reason = finish_reason(meta)
        output_ids = list(out.get("output_ids") or [])
        reasoning, answer = split_reasoning(out.get("text") or "", prompt.opened_think)
        return GenResult(
            text=answer,
            reasoning=reasoning,
            completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
            prompt_tokens=int(meta.get("prompt_tokens", len(prompt.ids))),
            finish_reason=reason,
            output_ids=output_ids if request.return_output_ids else None,
            meta={ours: meta[theirs] for ours, theirs in META_FIELDS if meta.get(theirs) is not None}
            | {"prompt_digest": prompt_digest(prompt.ids)},
        )

    async def shutdown(self) -> None:
        """Stop SGLang; note that it kills every child process of this process."""
        engine, self._engine = self._engine, None
        self._render.shutdown(wait=False, cancel_futures=True)
        if engine is not None:
            engine.shutdown()

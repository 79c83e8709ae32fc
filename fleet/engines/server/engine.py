"""The server engine: each request goes to an inference server over HTTP and streams back, through
the one stream loop every engine fed one request at a time shares (fleet.engines.stream).

Prompts are rendered by fleet with the model's own files (FLEET_MODEL), as for the embedded engines,
and sent as token ids where the server takes them (vLLM, SGLang): a stopped record then continues
exactly as it does on them. The openai API takes text and gives text: its samples restart from token
0 instead (`restart_reason`), counted in the chunk's `samples_restarted`. A request is aborted by
closing its connection. Errors are sorted as the embedded engines' are: a request the server refuses
fails its record alone (RecordError); a server that cannot be reached, or answers 5xx past its
retries, is down (EngineUnavailable: the chunk is requeued with backoff, nothing counted against it);
a server that refuses fleet itself (401, 403, 404: the key, its permission, the model) fails with
what to fix (AccessRefused: the job's start, or the chunk at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from fleet.engines.server.api import REFUSING_STATUSES, RETRIED_STATUSES, Reader, ServerRefused, call
from fleet.engines.server.client import headers, stream_lines, timeout
from fleet.engines.server.limits import server_limits
from fleet.engines.server.refusal import refusal
from fleet.engines.server.served import ServerFacts, wait_for_server
from fleet.engines.stream import Step, StreamEngine
from fleet.engines.wire import SGLANG_SCHEDULER_MARGIN
from fleet.errors import EngineError, EngineUnavailable, FleetError, RecordError
from fleet.model.modeldir import context_length_of
from fleet.records import GenRequest, Sampling
from fleet.settings import Settings

log = logging.getLogger(__name__)
#: what each API's engine counts over output ids only (a continued request's prefix is prompt to it)
OUTPUT_ONLY = {"vllm": ("presence_penalty", "frequency_penalty"),
               "sglang": ("repetition_penalty", "presence_penalty", "frequency_penalty")}


class ServerEngine(StreamEngine):
    name = "server"

    def __init__(self, settings: Settings):
        super().__init__(settings, {})
        self.server = settings.server
        self.facts: ServerFacts | None = None

    @property
    def asked_running(self) -> int:
        return self.server.max_running

    @property
    def context_budget(self) -> int | None:
        """Prompt + output tokens the server really runs a request to: SGLang's, as its Engine, two short of
        its context (its scheduler's clip); fleet asks for no more, so a length cut is what it asked."""
        short = SGLANG_SCHEDULER_MARGIN if self.facts is not None and self.facts.api == "sglang" else 0
        return None if self.context is None else self.context - short

    @property
    def output_only(self) -> tuple[str, ...]:  # type: ignore[override]
        return OUTPUT_ONLY.get(self.facts.api if self.facts else "", ())

    async def launch(self) -> Any:
        """Wait for the server to answer (off the loop), learn what it serves; the client is the engine."""
        self.facts = await asyncio.to_thread(wait_for_server, self.server)
        self.context = self.facts.context or context_length_of(self.model_path)
        assert self.server.base_url is not None
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=self.server.max_running)
        return httpx.AsyncClient(base_url=self.server.base_url.rstrip("/"), headers=headers(self.server),
                                 timeout=timeout(self.server), limits=limits)

    async def read_back(self) -> None:
        """What the server runs at once, where its API tells it (fleet.engines.server.limits): a worker
        keeps no more requests in flight there than the server runs for all its clients together."""
        assert self.facts is not None
        limits = await asyncio.to_thread(server_limits, self.server, self.facts.api)
        self.kv_tokens = limits.kv_tokens
        if limits.running is None and limits.source:
            log.info("the server at %s told its KV tokens (%s), not what it runs at once", self.server.base_url,
                     limits.source)
        self.settle_running(limits.running, f"the server at {self.server.base_url} runs {limits.running} at once for "
                            f"all its clients ({limits.source}): lower FLEET_SERVER__MAX_RUNNING, or raise the "
                            "server's own limit")

    def restart_reason(self, request: GenRequest) -> str | None:
        if self.facts is not None and self.facts.api == "openai":
            return "the server takes and gives text, not token ids: a continued sample would be text encoded again"
        return super().restart_reason(request)

    async def submit(self, request: GenRequest, ids: list[int], sampling: Sampling, max_new: int) -> AsyncIterator[Any]:
        assert self.facts is not None
        api, eos = self.facts.api, self.eos_ids
        text = await self.off_loop(self.tokenizer.decode, ids, False) if api == "openai" else None
        wire = call(api, self.facts.model, ids, text, sampling, max_new, eos, request.request_id,
                    self.server.stream_interval)
        return self._steps(request, stream_lines(self._engine, self.server, wire.path, wire.body), Reader(api, eos))

    async def _steps(self, request: GenRequest, lines: AsyncIterator[dict[str, Any]], reader: Reader
                     ) -> AsyncIterator[Step]:
        """The server's lines read as Steps (text-only answers encoded off the loop, where the tokenizer lives)."""
        try:
            async for line in lines:
                step = reader.read(line, request.record_id)
                if step is not None and step.ids is None:
                    step.ids = await self.off_loop(self.encoded, step.text or "", step.reason, reader)
                    step.text = None  # the record's text is its ids', decoded at its end
                if step is not None:
                    yield step
        finally:
            await lines.aclose()  # closes the request's connection: the server aborts it

    def encoded(self, text: str, reason: str | None, reader: Reader) -> list[int]:
        """Text-only answers: the ids are the text encoded by the model's tokenizer, and a stop that is not
        a stop string is the model's end id, which the text leaves out."""
        ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        if reason == "stop" and not reader.stopped_by_string and reader.eos_ids:
            ids.append(reader.eos_ids[0])
        return ids

    def unpack(self, request: GenRequest, out: Any) -> Step:
        return out

    def sort_error(self, request: GenRequest, error: Exception) -> FleetError:
        where = f"the server at {self.server.base_url}"
        if isinstance(error, ServerRefused):
            if error.status in REFUSING_STATUSES:  # the key, its permission, the model: the job's settings
                assert self.facts is not None
                path = "/generate" if self.facts.api == "sglang" else "/v1/completions"
                return refusal(self.server, error.status, path, error.message, self.facts.model)
            if error.status >= 500 or error.status in RETRIED_STATUSES:
                return EngineUnavailable(f"{where} answered {error.status} (after {self.server.retries} retries): "
                                         f"{error.message}")
            return RecordError(f"{where} refused record {request.record_id!r} ({error.status}): {error.message}")
        if isinstance(error, httpx.TransportError | ValueError):  # down, or a stream cut short or garbled
            return EngineUnavailable(f"{where} is out of reach: {type(error).__name__}: {error}")
        return EngineError(f"server engine failed: {type(error).__name__}: {error}")

    async def close(self, engine: Any) -> None:
        await engine.aclose()

"""A simulated GPU for tests and benchmarks: continuous batching without a GPU.

Each request holds one of `max_running` slots for prefill_s + (prompt + prefix tokens) x
prefill_s_per_token + tokens x step_s, which is exactly a continuous-batching engine whose step
time does not depend on the batch; a continued sample pays for prefilling its prefix again, as on a
GPU. Its meters (`fleet_sim_*`, in the worker's metrics) are what a GPU's counters would say.
Output length is log-normal, derived from (seed, record id, sample); every output id depends
on the seed, its position and the ids before it, and the text is what those ids decode to
(fleet.engines.sim.tokenchain), so a rerun produces byte-identical records and a continuation from a
wrong prefix does not.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from prometheus_client import Counter

from fleet.engines.base import Engine
from fleet.engines.sim.tokenchain import SimVocab, natural_length, sim_text_of, sim_tokens
from fleet.errors import EngineError, RecordError
from fleet.records import GenDelta, GenRequest, GenResult, prompt_digest
from fleet.settings import SimSettings

#: the simulated GPU's own meters, served with the worker's metrics (fleet bench preemption reads them)
PREFILLED = Counter("fleet_sim_prefilled_tokens", "Tokens the sim engine prefilled: prompts and continued prefixes")


async def _until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


def sim_length(cfg: SimSettings, seed: int) -> int:
    """Heavy-tailed output length with the configured mean (fleet.engines.sim.tokenchain)."""
    return natural_length(cfg.mean_output_tokens, cfg.sigma, seed)


def prompt_size(request: GenRequest) -> int:
    if request.input_ids is not None:
        return len(request.input_ids)
    if request.prompt is not None:
        return max(1, len(request.prompt.split()))
    total = 0
    for m in request.messages or []:
        total += 4 + (len(m.content.split()) if isinstance(m.content, str) else 8)
    return max(1, total)


class SimEngine(Engine):
    name = "sim"

    def __init__(self, cfg: SimSettings):
        self.cfg = cfg
        self.vocab = SimVocab.of(cfg.vocab_size)
        self._slots: asyncio.Semaphore | None = None
        self.running = 0
        #: slot-seconds of simulated work done, for occupancy benchmarks
        self.busy_slot_s = 0.0
        self._started = time.monotonic()

    @property
    def max_running(self) -> int:
        return self.cfg.max_running

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.cfg.max_running)
        await asyncio.sleep(self.cfg.start_s)
        self._started = time.monotonic()
        if self.cfg.leak_process:
            # Out of the worker's session and never waited for: only its launcher can end it.
            subprocess.Popen(["sleep", "3600"], start_new_session=True)

    def model_name(self) -> str:
        return f"sim-m{self.cfg.mean_output_tokens:g}-s{self.cfg.sigma:g}"

    def predict_tokens(self, request: GenRequest) -> float | None:
        # The simulated length is a function of the seed: a perfect predictor, which
        # stands in for a learned one (or a length hint) on real engines.
        return min(sim_length(self.cfg, request.sampling.seed), request.sampling.max_tokens)

    def _trace(self, request: GenRequest, tokens: int) -> None:
        """One line per finished sample (the tokens this process made of it), appended to this
        process's own file."""
        line = json.dumps({"pid": os.getpid(), "chunk": request.chunk, "id": request.record_id,
                           "sample": request.sample, "tokens": tokens})
        with open(Path(self.cfg.trace_dir or ".") / f"{os.getpid()}.jsonl", "a") as f:
            f.write(line + "\n")

    def end_ids(self) -> frozenset[int]:
        return frozenset((self.vocab.eos,))

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocab.decode(ids)

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        """Every id is a function of (seed, position, the ids before it): a sample continued after its
        own prefix ends exactly as one generated in one go, and one continued after any other prefix
        does not (the chaos tests compare exports with a clean run, ids included)."""
        if request.chunk in self.cfg.kill_chunks:
            os.kill(os.getpid(), signal.SIGKILL)  # a poison chunk: the process dies on it, no error raised
        if request.chunk in self.cfg.engine_error_chunks:
            raise EngineError(f"sim engine dies on chunk {request.chunk} (engine_error_chunks)")
        if request.chunk in self.cfg.fault_chunks:
            raise RuntimeError(f"sim engine fails chunk {request.chunk} (fault_chunks)")
        if request.record_id in self.cfg.fail_ids:
            raise RecordError(f"sim engine rejects record {request.record_id!r} (fail_ids)")
        seed = request.sampling.seed
        ids, reason = sim_tokens(self.vocab, seed, sim_length(self.cfg, seed), request.sampling.max_tokens,
                                 request.prefix_ids, request.sampling.stop)
        done = sent = sent_before = len(request.prefix_ids)
        tokens = len(ids)
        assert self._slots is not None, "start() not called"
        async with self._slots:
            self.running += 1
            began = time.monotonic()
            try:
                prefill = prompt_size(request) + len(request.prefix_ids)
                PREFILLED.inc(prefill)
                # Each step sleeps to its own deadline, so a busy event loop that wakes a request late
                # does not slow it for good: a request holds its slot for its stated time
                decode_from = began + self.cfg.prefill_s + prefill * self.cfg.prefill_s_per_token
                await _until(decode_from)
                while done < tokens:
                    step = min(self.cfg.stream_interval, tokens - done)
                    await _until(decode_from + (done + step - sent_before) * self.cfg.step_s)
                    await self._hang_if_stalled()
                    done += step
                    if done < tokens:
                        yield GenDelta(ids[sent:done])
                        sent = done
            finally:
                self.running -= 1
                self.busy_slot_s += time.monotonic() - began
        if self.cfg.trace_dir:
            self._trace(request, tokens - len(request.prefix_ids))
        yield GenDelta(ids[sent:tokens], self._result(request, ids, reason))

    async def _hang_if_stalled(self) -> None:
        """`stall_after_s`: the engine stops without dying; its requests wait forever (the loop,
        the heartbeat and the process stay alive, as with a stuck collective on a GPU)."""
        after = self.cfg.stall_after_s
        if after is not None and time.monotonic() - self._started >= after:
            await asyncio.Event().wait()

    async def cut(self, request: GenRequest, new_ids: list[int], reason: str) -> GenResult:
        return self._result(request, request.prefix_ids + new_ids, reason)

    def _result(self, request: GenRequest, ids: list[int], reason: str) -> GenResult:
        reasoning, answer, in_thinking = sim_text_of(self.vocab, ids, request.sampling.stop)
        return GenResult(
            text=answer,
            reasoning=reasoning,
            in_thinking=in_thinking,
            completion_tokens=len(ids),
            prompt_tokens=prompt_size(request),
            finish_reason=reason,
            output_ids=ids,
            meta={"prompt_digest": prompt_digest(request.input_ids)} if request.input_ids else {},
        )

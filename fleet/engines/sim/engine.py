"""A simulated GPU for tests and benchmarks: continuous batching without a GPU.

Each request holds one of `max_running` slots for prefill_s + tokens x step_s, which is
exactly a continuous-batching engine whose step time does not depend on the batch.
Output length is log-normal and, like the text, derived from (seed, record id, sample),
so a rerun produces byte-identical records.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fleet.engines.base import Engine
from fleet.errors import EngineError, RecordError
from fleet.records import GenDelta, GenRequest, GenResult, derive_seed, prompt_digest
from fleet.settings import SimSettings

_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by",
    "this", "are", "or", "from", "at", "which", "an", "not", "have", "has", "we", "can", "all", "more",
    "one", "will", "if", "their", "but", "when", "there", "so", "what", "about", "into", "than",
    "them", "token", "batch", "chunk", "lease", "store", "worker", "engine", "broker", "prompt",
    "answer", "reason", "step", "think",
)

#: Output ids range over this many tokens when `sim.vocab_size` is unset (Qwen3's is 151,936).
SIM_VOCAB = 151_936


def sim_length(cfg: SimSettings, seed: int) -> int:
    """Heavy-tailed output length with the configured mean: log-normal, mu = ln(m) - s^2/2."""
    rng = random.Random(seed)
    mu = math.log(cfg.mean_output_tokens) - cfg.sigma**2 / 2
    return max(1, round(rng.lognormvariate(mu, cfg.sigma)))


def sim_text(seed: int, tokens: int) -> str:
    rng = random.Random(seed ^ 0x5EED)
    words = [rng.choice(_WORDS) for _ in range(tokens)]
    cut = max(1, tokens // 3)
    return "<think>" + " ".join(words[:cut]) + "</think>" + " ".join(words[cut:])


def sim_ids(seed: int, tokens: int, vocab: int | None) -> list[int]:
    """Stand-in output ids, one per simulated token, within the configured vocabulary."""
    rng = random.Random(seed ^ 0x1D5)
    return [rng.randrange(vocab or SIM_VOCAB) for _ in range(tokens)]


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
        self._started = time.monotonic()
        if self.cfg.leak_process:
            # Out of the worker's session and never waited for: only its launcher can end it.
            subprocess.Popen(["sleep", "3600"], start_new_session=True)

    def model_name(self) -> str:
        return f"sim-m{self.cfg.mean_output_tokens:g}-s{self.cfg.sigma:g}"

    def predict_tokens(self, request: GenRequest) -> float | None:
        # The simulated length is a function of the seed: a perfect predictor, which
        # stands in for a learned one (or a length hint) on real engines.
        seed = request.sampling.seed if request.sampling.seed is not None else derive_seed(0, request.record_id, 0)
        return min(sim_length(self.cfg, seed), request.sampling.max_tokens)

    def _trace(self, request: GenRequest, tokens: int) -> None:
        """One line per finished sample (the tokens this process made of it), appended to this
        process's own file."""
        line = json.dumps({"pid": os.getpid(), "chunk": request.chunk, "id": request.record_id,
                           "sample": request.sample, "tokens": tokens})
        with open(Path(self.cfg.trace_dir or ".") / f"{os.getpid()}.jsonl", "a") as f:
            f.write(line + "\n")

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        """Every token is a function of (seed, position), so a sample continued after its prefix
        ids ends exactly as one generated in one go (the chaos tests compare exports with a clean run)."""
        if request.chunk in self.cfg.kill_chunks:
            os.kill(os.getpid(), signal.SIGKILL)  # a poison chunk: the process dies on it, no error raised
        if request.chunk in self.cfg.engine_error_chunks:
            raise EngineError(f"sim engine dies on chunk {request.chunk} (engine_error_chunks)")
        if request.chunk in self.cfg.fault_chunks:
            raise RuntimeError(f"sim engine fails chunk {request.chunk} (fault_chunks)")
        if request.record_id in self.cfg.fail_ids:
            raise RecordError(f"sim engine rejects record {request.record_id!r} (fail_ids)")
        seed = request.sampling.seed
        if seed is None:
            seed = derive_seed(0, request.record_id, request.sample)
        natural = sim_length(self.cfg, seed)
        tokens = min(natural, request.sampling.max_tokens)
        ids = sim_ids(seed, tokens, self.cfg.vocab_size)
        done = len(request.prefix_ids)
        if request.prefix_ids != ids[:done]:
            # a prefix this engine never made (another seed or configuration): as a real engine
            # would, it continues after it, here with its own tokens
            ids = request.prefix_ids + ids[done:]
        assert self._slots is not None, "start() not called"
        sent = done
        async with self._slots:
            self.running += 1
            began = time.monotonic()
            try:
                await asyncio.sleep(self.cfg.prefill_s)
                while done < tokens:
                    step = min(self.cfg.stream_interval, tokens - done)
                    await asyncio.sleep(step * self.cfg.step_s)
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
        yield GenDelta(ids[sent:tokens], self._result(request, seed, natural, tokens, ids))

    async def _hang_if_stalled(self) -> None:
        """`stall_after_s`: the engine stops without dying; its requests wait forever (the loop,
        the heartbeat and the process stay alive, as with a stuck collective on a GPU)."""
        after = self.cfg.stall_after_s
        if after is not None and time.monotonic() - self._started >= after:
            await asyncio.Event().wait()

    async def cut(self, request: GenRequest, new_ids: list[int], reason: str) -> GenResult:
        seed = request.sampling.seed if request.sampling.seed is not None else derive_seed(0, request.record_id,
                                                                                            request.sample)
        ids = request.prefix_ids + new_ids
        result = self._result(request, seed, len(ids), len(ids), ids)
        result.finish_reason = reason
        return result

    def _result(self, request: GenRequest, seed: int, natural: int, tokens: int, ids: list[int]) -> GenResult:
        text = sim_text(seed, tokens)
        reasoning, _, answer = text.removeprefix("<think>").partition("</think>")
        return GenResult(
            text=answer,
            reasoning=reasoning,
            completion_tokens=tokens,
            prompt_tokens=prompt_size(request),
            finish_reason="length" if natural > tokens else "stop",
            output_ids=ids[:tokens],
            meta={"prompt_digest": prompt_digest(request.input_ids)} if request.input_ids else {},
        )

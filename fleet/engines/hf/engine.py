"""transformers engine: micro-batched `generate` with left padding, on a CPU or a GPU.

Concurrent requests from K chunk slots are gathered into batches of up to `hf.max_batch`
(waiting at most `hf.batch_wait_s` for a batch to fill) and run one batch at a time in a
worker thread, so the engine loop stays free for heartbeats and new requests.

Sampling is done per row by `RowSampler` (temperature, top-k, top-p, min-p, temperature 0
= greedy) and stopping per row by `RowStopper` (eos ids from generation_config.json, the
row's max_tokens, its stop strings), so requests with different settings share a batch.

Seeds: the uniform that picks a row's token at output position p is `draw(seed, p)`
(fleet.records), a function of the sample's seed and the position alone: a request's random
stream never depends on its batch neighbours, and a sample continued after p ids draws what its
uninterrupted run drew at p, never its first draws again. A regenerated or continued record
therefore gets the same tokens whenever its logits are the same; they are bit-identical for the
same batch composition on the same device and dtype, and across batch compositions (or a
re-prefill of a continued prefix) they can differ in the last float bits, which can flip a
near-tie. Greedy decoding has no randomness.

A row's result is handed to its stream the step it finishes, together with its last ids, not when
the batch ends: a hand-over in between then finds the row finished, never ids ending in an end token
with no record (docs/architecture.md, "Tokens as they are made").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fleet.engines.model import ModelEngine
from fleet.errors import EngineError
from fleet.model.modeldir import context_length_of, resolve_model_dir
from fleet.model.rendering import Prompt, decode_ids, render
from fleet.records import GenDelta, GenRequest, GenResult, Sampling, draw
from fleet.settings import Settings

#: Tokens of decoded tail, beyond the longest stop string, checked for a stop each step.
STOP_TAIL_SLACK = 4


class RowSampler:
    """A logits processor that picks each row's next token with that row's own sampling.

    It returns scores that are -inf except at the chosen token, so `generate` runs with
    do_sample=False and its argmax takes exactly the token chosen here.
    """

    def __init__(self, samplings: list[Sampling], vocab: int, device: Any, prefixes: list[int] | None = None):
        import torch

        def column(name: str) -> Any:
            return torch.tensor([getattr(s, name) for s in samplings], device=device)

        self.vocab = vocab
        self.temp = column("temperature").float()
        self.top_k = column("top_k").long()
        self.top_p = column("top_p").float()
        self.min_p = column("min_p").float()
        self.repetition = column("repetition_penalty").float()
        self.presence = column("presence_penalty").float()
        self.frequency = column("frequency_penalty").float()
        #: any row penalised at all; else the per-step vocabulary-sized penalty tensors are skipped
        self.penalised = bool(
            (self.repetition != 1).any() | (self.presence != 0).any() | (self.frequency != 0).any()
        )
        self.prompt_width: int | None = None  #: input width at the first step: the padded prompts
        #: output ids each row already had before this run (a continued sample's prefix): penalised too
        self.prefixes = torch.tensor(prefixes or [0] * len(samplings), device=device)
        self.greedy = self.temp <= 0
        self.seeds = [s.seed for s in samplings]
        #: output position of each row's next token: its prefix, then one more each step
        self.starts = list(prefixes or [0] * len(samplings))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        scores = scores.float()
        if scores.shape[-1] > self.vocab:  # padded embedding rows are not tokens
            scores[:, self.vocab :] = float("-inf")
        if input_ids is not None and self.prompt_width is None:
            self.prompt_width = input_ids.shape[1]
        if input_ids is not None and self.penalised:
            first = self.prompt_width - int(self.prefixes.max())
            scores = self._penalise(scores, input_ids[:, first:], self.prompt_width - self.prefixes - first)
        choice = scores.argmax(-1)
        if not bool(self.greedy.all()):
            step = input_ids.shape[1] - self.prompt_width if input_ids is not None and self.prompt_width else 0
            choice = torch.where(self.greedy, choice, self._sample(scores, step))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, choice[:, None], 0.0)

    def _penalise(self, scores: Any, generated: Any, starts: Any) -> Any:
        """SGLang's penalties over the tokens generated so far (its penaltylib counts outputs):
        repetition divides a seen token's positive logit (multiplies a negative one);
        frequency and presence subtract per occurrence and once. Row i's output begins at
        column starts[i] of `generated` (rows continued from a prefix begin earlier)."""
        import torch

        if generated.shape[1] == 0:
            return scores
        columns = torch.arange(generated.shape[1], device=generated.device)[None, :]
        weights = (columns >= starts[:, None]).to(scores.dtype)
        counts = torch.zeros_like(scores).scatter_add_(1, generated, weights)
        seen = counts > 0
        rep = self.repetition[:, None].expand_as(scores)
        penalised = torch.where(scores > 0, scores / rep, scores * rep)
        scores = torch.where(seen, penalised, scores)
        return scores - self.frequency[:, None] * counts - self.presence[:, None] * seen.to(scores.dtype)

    def _sample(self, scores: Any, step: int) -> Any:
        import torch

        temp = torch.where(self.greedy, torch.ones_like(self.temp), self.temp)
        width = scores.shape[-1]
        # Every row with a top-k needs only the k best, far cheaper than sorting the vocab.
        keep = int(self.top_k.max()) if bool((self.top_k > 0).all()) else width
        logits, order = (scores / temp[:, None]).topk(min(keep, width), dim=-1)
        width = logits.shape[-1]
        ranks = torch.arange(width, device=logits.device)[None, :]
        k = torch.where(self.top_k > 0, self.top_k, torch.full_like(self.top_k, width))
        probs = logits.masked_fill(ranks >= k[:, None], float("-inf")).softmax(-1)
        # top-p keeps the smallest prefix reaching p; min-p drops tokens below min_p x max.
        probs = probs.masked_fill(probs.cumsum(-1) - probs > self.top_p[:, None], 0.0)
        probs = probs.masked_fill(probs < self.min_p[:, None] * probs[:, :1], 0.0)
        cdf = probs.cumsum(-1)
        draws = torch.tensor([draw(seed, start + step) for seed, start in zip(self.seeds, self.starts, strict=True)],
                             dtype=cdf.dtype, device=cdf.device)
        pos = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None]).clamp(max=width - 1)
        return order.gather(1, pos).squeeze(1)


@dataclass
class RowStopper:
    """A stopping criterion per row: eos id, the row's max_tokens, its stop strings, an abort;
    every `interval` steps it hands each row's new ids to its stream (`emit`).

    `finished[i]` records (generated length, "eos" | "stop" | "length" | "abort") the first time
    row i stops; `generate` pads the row afterwards, and those pad tokens are ignored.
    """

    prompt_width: int
    max_new: list[int]
    eos_ids: frozenset[int]
    stops: list[tuple[str, ...]]
    tokenizer: Any
    #: per row: output ids before this run (a continued sample's prefix): stop strings may span them
    prefixes: list[int] = field(default_factory=list)
    #: per row: called with a list of new ids, from the generating thread
    emit: list[Any] = field(default_factory=list)
    #: per row: called with the row's generated ids and why it stopped, the step it stops
    finish: list[Any] = field(default_factory=list)
    #: per row: the stream was closed (aborted or cancelled): stop generating it
    aborted: list[Any] = field(default_factory=list)
    interval: int = 1
    finished: dict[int, tuple[int, str]] = field(default_factory=dict)
    emitted: dict[int, int] = field(default_factory=dict)
    #: generate() pads finished rows only when a criterion has this attribute
    eos_token_id: list[int] = field(default_factory=list)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        n = input_ids.shape[1] - self.prompt_width
        last = input_ids[:, -1].tolist()
        for i, token in enumerate(last):
            if i in self.finished:
                continue
            if self.aborted and self.aborted[i]():
                self.finished[i] = (n, "abort")
            elif token in self.eos_ids:
                self.finished[i] = (n, "eos")
            elif self._hit_stop(input_ids[i], i):
                self.finished[i] = (n, "stop")
            elif n >= self.max_new[i]:
                self.finished[i] = (n, "length")
            else:
                continue
            if self.finish and self.finished[i][1] != "abort":
                self.finish[i](input_ids[i, self.prompt_width : self.prompt_width + n].tolist(), self.finished[i][1])
        if self.emit and (n % self.interval == 0):
            self._emit(input_ids, n)
        done = [i in self.finished for i in range(len(last))]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _emit(self, input_ids: Any, n: int) -> None:
        for i, send in enumerate(self.emit):
            if i in self.finished and self.finish:  # its last ids went out with its result
                continue
            upto = self.finished[i][0] if i in self.finished else n
            sent = self.emitted.get(i, 0)
            if upto > sent:
                send(input_ids[i, self.prompt_width + sent : self.prompt_width + upto].tolist())
                self.emitted[i] = upto

    def _hit_stop(self, row: Any, i: int) -> bool:
        if not self.stops[i]:
            return False
        width = max(len(s) for s in self.stops[i]) + STOP_TAIL_SLACK
        prefix = self.prefixes[i] if self.prefixes else 0
        new = row[self.prompt_width - prefix :][-width:].tolist()
        tail = decode_ids(self.tokenizer, new)
        return any(s in tail for s in self.stops[i])


@dataclass
class _Pending:
    request: GenRequest
    prompt: Prompt
    max_new: int
    sampling: Sampling
    #: what the generating thread hands the stream: lists of new ids, then a GenResult or an error
    deltas: asyncio.Queue
    queued_at: float
    #: the stream was closed (aborted, or its chunk cancelled): the batch stops generating it
    closed: bool = False

    def put(self, loop: asyncio.AbstractEventLoop, item: Any) -> None:
        """From any thread."""
        loop.call_soon_threadsafe(self.deltas.put_nowait, item)


class HfEngine(ModelEngine):
    name = "hf"

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.model: Any = None
        self.device: str | None = None
        self.batches = 0  #: batches started
        self._queue: asyncio.Queue[_Pending] | None = None
        self._batcher: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._broken: EngineError | None = None
        #: running requests by request id, for abort
        self._pending: dict[str, _Pending] = {}

    @property
    def max_running(self) -> int:
        return self.settings.hf.max_batch

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.load_model_files()
        self.context = self.settings.hf.context_length or context_length_of(self.model_path)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fleet-hf")
        try:
            self.model = await loop.run_in_executor(self._executor, self._load)
        except Exception as e:
            raise EngineError(f"cannot load {self.model_path!r} with transformers: {e}") from e
        self._queue = asyncio.Queue()
        self._batcher = loop.create_task(self._batch_loop(), name="fleet-hf-batcher")

    def _load(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        wanted = self.settings.hf.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if wanted == "auto" else wanted
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        threads = getattr(self.settings.hf, "threads", None)
        if threads and self.device == "cpu":
            # Several CPU workers with torch's default threads each oversubscribe the cores,
            # and OpenMP's spinning then costs far more than the lost parallelism gains.
            torch.set_num_threads(threads)
        path = str(resolve_model_dir(self.model_path))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()
        # Sampling is ours (RowSampler); the model's defaults must not add warpers.
        model.generation_config = GenerationConfig()
        return model

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        if self._broken is not None:
            raise self._broken
        if self._queue is None:
            raise EngineError("hf engine used before start()")
        prompt = render(self.tokenizer, request)
        max_new, filled = await self.room(request, prompt)
        if filled is not None:
            yield GenDelta([], filled)
            return
        loop = asyncio.get_running_loop()
        pending = _Pending(request, prompt, max_new, request.sampling, asyncio.Queue(), loop.time())
        self._pending[request.request_id] = pending
        await self._queue.put(pending)
        streamed = 0
        try:
            while True:
                item = await pending.deltas.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, GenResult):
                    new = (item.output_ids or [])[len(request.prefix_ids) + streamed :]
                    yield GenDelta(new, item)
                    return
                streamed += len(item)
                yield GenDelta(item)
        finally:
            pending.closed = True
            self._pending.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        pending = self._pending.get(request_id)
        if pending is not None:
            pending.closed = True

    async def shutdown(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
            self._batcher = None
        if self._executor is not None:
            # A running batch finishes in its thread; wait for it without blocking the loop.
            stop = partial(self._executor.shutdown, wait=True, cancel_futures=True)
            await asyncio.get_running_loop().run_in_executor(None, stop)
            self._executor = None
        self.model = None

    # -- batching ------------------------------------------------------------------------

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Pending] = []
        try:
            while True:
                batch = await self._next_batch()
                if not batch:
                    continue
                self.batches += 1  # counted as it starts: its rows' results reach their streams before it returns
                await loop.run_in_executor(self._executor, self._run_batch, batch, loop)
                batch = []
        except asyncio.CancelledError:
            self._fail_all(batch, EngineError("hf engine shut down"))
            raise
        except Exception as e:  # a failed generate() leaves torch in an unknown state
            self._broken = EngineError(f"hf generate failed: {type(e).__name__}: {e}")
            self._fail_all(batch, self._broken)

    async def _next_batch(self) -> list[_Pending]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        cfg = self.settings.hf
        # Requests freed by the last batch reach the queue within a few loop turns: take
        # those turns before paying batch_wait_s, which is for a genuinely thin stream.
        for _ in range(4):
            if self._queue.qsize() >= cfg.max_batch - 1:
                break
            await asyncio.sleep(0)
        if self._queue.qsize() < cfg.max_batch - 1 and cfg.batch_wait_s > 0:
            await asyncio.sleep(cfg.batch_wait_s)
        while len(batch) < cfg.max_batch and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return [p for p in batch if not p.closed]  # streams closed meanwhile

    def _fail_all(self, batch: list[_Pending], error: EngineError) -> None:
        waiting = list(batch)
        while self._queue is not None and not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for pending in waiting:
            pending.deltas.put_nowait(error)

    # -- one batch, in the worker thread ----------------------------------------------------

    def _run_batch(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        """Generate one batch; each row's result goes to its stream the step the row finishes, and
        the rows still running when the batch ends get theirs at the end (max tokens)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else min(self.eos_ids)
        inputs = [p.prompt.ids + p.request.prefix_ids for p in batch]
        prefixes = [len(p.request.prefix_ids) for p in batch]
        width = max(len(ids) for ids in inputs)
        rows = [[pad] * (width - len(ids)) + ids for ids in inputs]
        mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in inputs]
        eos = sorted(self.eos_ids)
        size = len(batch)
        delivered: set[int] = set()

        def finish(i: int, generated: list[int], why: str) -> None:
            delivered.add(i)
            batch[i].put(loop, self._result(batch[i], generated, why, size))

        stopper = RowStopper(
            width, [p.max_new for p in batch], self.end_ids(), [p.sampling.stop or () for p in batch],
            self.tokenizer, prefixes=prefixes, emit=[partial(p.put, loop) for p in batch],
            finish=[partial(finish, i) for i in range(size)],
            aborted=[partial(getattr, p, "closed") for p in batch], interval=self.settings.hf.stream_interval,
            eos_token_id=eos,
        )  # fmt: skip
        sampler = RowSampler([p.sampling for p in batch], len(self.tokenizer), self.device, prefixes)
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(p.max_new for p in batch),
            eos_token_id=eos,
            pad_token_id=pad,
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=torch.tensor(rows, device=self.device),
                attention_mask=torch.tensor(mask, device=self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=StoppingCriteriaList([stopper]),
            )
        new = out[:, width:].tolist()
        for i, p in enumerate(batch):
            if i not in delivered and not p.closed:
                p.put(loop, self._result(p, new[i][: p.max_new], "length", size))

    def _result(self, p: _Pending, generated: list[int], why: str, size: int) -> GenResult:
        reason = "length" if why == "length" else "stop"
        facts = {"batch_size": size, "latency_s": time.monotonic() - p.queued_at}
        return self.assemble(p.request, p.prompt, generated, reason, None, facts)

"""A stand-in `sglang` with sglang 0.5.23's embedded-engine contract, for tests without a GPU.

Same surface, and the same sharp edges, as the real thing (paths inside the 0.5.23 wheel):
- `Engine(**server_args)` binds to the running loop; unknown server args raise TypeError;
  `log_level` defaults to "error" and `configure_logger` (sglang/srt/utils/common.py) calls
  `logging.basicConfig(level, force=True)`, wiping the host's handlers
  (sglang/srt/entrypoints/engine.py Engine.__init__);
- hierarchical cache with the radix cache disabled is a ValueError
  (sglang/srt/arg_groups/kv_cache_hook.py);
- the scheduler runs at most its *effective* max_running_requests, which it may set below
  the one asked (kv_cache_configurator.py resolve_max_num_reqs); the rest queue inside;
  `await tokenizer_manager.get_internal_state()` reports it as
  `effective_max_running_requests_per_dp` (scheduler_components/internal_state.py), and
  `get_server_info()` runs `loop.run_until_complete`, so it fails on a running loop;
- with EAGLE/NEXTN the tokenizer manager adds `num_reserved_tokens` to every prompt and
  refuses prompt + reserved >= context or prompt + reserved + max_new > context with
  ValueError (managers/tokenizer_manager.py `_validate_one_request`, managers/utils.py
  compute_num_reserved_tokens);
- the scheduler then refuses a prompt of max_req_len - 5 tokens or more (ValueError: a 400 abort),
  max_req_len = min(context, KV tokens) - 1, and cuts max_new_tokens to max_req_len - prompt - 1,
  finishing such a request with "length" two tokens short of the context (managers/scheduler.py
  init_req_max_new_tokens, managers/utils.py validate_input_length, tp_worker.py);
- sampling params are checked as SamplingParams.verify does (sampling/sampling_params.py):
  top_k 0 and out-of-range penalties are ValueError; unknown ones TypeError;
- a non-stream abort with an HTTP status >= 400 other than 400 raises
  `fastapi.HTTPException` (tokenizer_manager.py `_handle_abort_finish_reason`);
- `async_generate(..., stream=True, rid=...)` returns an async generator; a request's
  validation errors come from iterating it, not from the call (tokenizer_manager.py
  `generate_request` is itself a generator). Without `incremental_streaming_output` each
  output carries the *whole* output so far (a reference to one growing list) and intermediate
  texts are rebuilt; with it, only the new ids and text of that step (`_handle_batch_output`).
  An output comes every `stream_interval` tokens. `tokenizer_manager.abort_request(rid=...)`
  ends a stream with an abort finish reason, and closing a stream aborts the request
  (`_release_req_states_on_failure`);
- a stop string ends the output at the id that completes it, checked after every token in the text
  of the last few ids (`_check_str_based_finish`); the finish reason names it
  ({"type": "stop", "matched": ...}) and the last text is cut before its first place
  (detokenizer_manager.py `trim_matched_stop`); max_new_tokens is checked first;
- an input id past config.json's vocab_size is not checked at all: the scheduler dies on the
  embedding lookup (IndexError) and SIGQUITs the host process, which dies with it
  (shown on the real engine by tests/test_sglang_real.py's probe script).

Kwargs starting with `fake_` steer it: `fake_step_s` (seconds per token), `fake_tokens`
(natural output length), `fake_fail_start`, `fake_abort_over` (prompt length above which a
request is aborted with HTTP 500), `fake_effective_running` (what the scheduler settles on),
`fake_retractions` (times each request was retracted, meta_info `num_retractions`).
Output ids are a function of the context's first four ids and the absolute position, so a
request continued from prompt + the ids made so far goes on and ends as the uninterrupted one
would (as a greedy model does). Texts are what the detokenizer makes of those ids with the
model's own tokenizer (managers/detokenizer_manager.py): skip_special_tokens by default, and an
incremental step's text holds back a character still incomplete at its end ("\ufffd").
`crash(message)` makes every request from then on raise. With FAKE_SGLANG_JOURNAL set, each
engine start and each request appends a JSON line there, for tests that run real worker
processes and cannot see `instances`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

__version__ = "0.5.23+fake"

#: ServerArgs fields fleet passes; anything else is refused, as ServerArgs(**kwargs) does.
SERVER_ARGS = frozenset({
    "model_path", "dtype", "tp_size", "max_running_requests", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "mamba_radix_cache_strategy", "mem_fraction_static", "context_length", "chunked_prefill_size",
    "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
    "enable_deterministic_inference", "log_level", "random_seed", "skip_tokenizer_init",
    "disable_radix_cache", "mamba_full_memory_ratio", "incremental_streaming_output", "stream_interval",
})
#: SamplingParams fields (sglang/srt/sampling/sampling_params.py) that fleet may send.
SAMPLING_PARAMS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "sampling_seed", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n",
    "repetition_penalty", "presence_penalty", "frequency_penalty",
})
EOS = 2
TOKEN_CAPACITY = 100_000  #: the KV pool the stand-in reports
EAGLE_ALIASES = {"EAGLE", "EAGLE3", "NEXTN"}

#: every Engine built in this process, newest last
instances: list[Engine] = []


def journal(entry: dict[str, Any]) -> None:
    path = os.environ.get("FAKE_SGLANG_JOURNAL")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


class HTTPException(Exception):
    """fastapi.HTTPException's shape: a status code and a detail."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


def verify_sampling(params: dict[str, Any]) -> None:
    top_k = params.get("top_k", -1)
    if top_k < 1 and top_k != -1:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= params.get(name, 0.0) <= 2.0:
            raise ValueError(f"{name} must be in [-2, 2], got {params[name]}.")
    if not 0.0 < params.get("repetition_penalty", 1.0) <= 2.0:
        raise ValueError(f"repetition_penalty must be in (0, 2], got {params['repetition_penalty']}.")


class TokenizerManager:
    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        if not abort_all and not rid:
            return  # the real one logs a warning: an empty rid would match every request
        self.aborted.add(rid)

    def __init__(self, context_len: int, reserved: int, engine: Engine):
        self.aborted: set[str] = set()
        self.context_len = context_len
        self.num_reserved_tokens = reserved
        self._engine = engine
        self.token_capacity = TOKEN_CAPACITY

    async def get_internal_state(self) -> list[dict[str, Any]]:
        e = self._engine
        return [{"effective_max_running_requests_per_dp": e.effective,
                 "memory_usage": {"token_capacity": self.token_capacity}}]  # fmt: skip

    def validate(self, input_ids: list[int], params: dict[str, Any]) -> None:
        context, n = self.context_len, len(input_ids) + self.num_reserved_tokens
        if n >= context:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length ({context} tokens).")
        max_new = params.get("max_new_tokens")
        if max_new is not None and max_new + n > context:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {max_new + n} tokens: {n} tokens from the input messages and "
                f"{max_new} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )

    def max_req_len(self) -> int:
        return min(self.context_len, self.token_capacity) - 1

    def scheduler_validate(self, input_ids: list[int]) -> None:
        limit = self.max_req_len() - 5
        if len(input_ids) >= limit:
            raise ValueError(
                f"Input length ({len(input_ids)} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )


def reserved_tokens(kwargs: dict[str, Any]) -> int:
    if str(kwargs.get("speculative_algorithm", "")).upper() not in EAGLE_ALIASES:
        return 0
    return max(
        kwargs.get("speculative_eagle_topk", 1) * kwargs.get("speculative_num_steps", 1),
        kwargs.get("speculative_num_draft_tokens", 1),
    )


class Engine:
    def __init__(self, **kwargs: Any):
        fake = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("fake_")}
        unknown = set(kwargs) - SERVER_ARGS
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        if kwargs.get("enable_hierarchical_cache") and kwargs.get("disable_radix_cache"):
            raise ValueError(
                "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive"
            )
        level = kwargs.get("log_level", "error")
        logging.basicConfig(level=getattr(logging, level.upper()), format="[sglang] %(message)s", force=True)
        if fake.get("fake_fail_start"):
            raise RuntimeError("Initialization failed. scheduler died: CUDA out of memory")
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        if visible and kwargs.get("tp_size", 1) > len(visible):  # a tensor-parallel rank without its GPU
            raise RuntimeError(f"Initialization failed. scheduler died: tp_size {kwargs['tp_size']} but "
                               f"{len(visible)} GPU(s) visible (CUDA error: invalid device ordinal)")
        self.kwargs = kwargs
        self.thread = threading.current_thread()
        self.loop = asyncio.get_running_loop()  # the real engine binds to the first loop too
        self.step_s = float(fake.get("fake_step_s", 0.001))
        self.natural_tokens = int(fake.get("fake_tokens", 16))
        self.abort_over = fake.get("fake_abort_over")
        self.retractions = int(fake.get("fake_retractions", 0))
        asked = kwargs["max_running_requests"]
        self.effective = min(asked, int(fake.get("fake_effective_running", asked)))
        self.tokenizer_manager = TokenizerManager(kwargs.get("context_length") or 2048, reserved_tokens(kwargs), self)
        self.slots = asyncio.Semaphore(self.effective)
        self.running = self.peak = self.calls = 0
        self.requests: list[dict[str, Any]] = []
        self.dead: BaseException | None = None
        self.shut_down = False
        self.inside = 0  #: requests inside async_generate: running plus queued in the scheduler
        self._tokenizer: Any = None
        instances.append(self)
        journal({"event": "start", "pid": os.getpid(), "kwargs": kwargs, "effective": self.effective,
                 "visible": os.environ.get("CUDA_VISIBLE_DEVICES")})

    def get_server_info(self) -> dict[str, Any]:
        state = self.loop.run_until_complete(self.tokenizer_manager.get_internal_state())
        return {"max_total_num_tokens": TOKEN_CAPACITY, "internal_states": state}

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.kwargs["model_path"]))
        return self._tokenizer

    def detokenize(self, ids: list[int], params: dict[str, Any]) -> str:
        return self.tokenizer().decode(ids, skip_special_tokens=params.get("skip_special_tokens", True))

    @functools.cached_property
    def vocab_size(self) -> int | None:
        """config.json's vocab_size, read once: the embedding rows (SGLang itself never checks input ids
        against it)."""
        path = Path(str(self.kwargs.get("model_path", ""))) / "config.json"
        return json.loads(path.read_text()).get("vocab_size") if path.is_file() else None

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        stream: bool = False,
        rid: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("Task got Future attached to a different loop")
        gen = self._generate(prompt, sampling_params, input_ids, stream, rid or f"fake-{self.calls}")
        if stream:
            return gen
        async for out in gen:
            return out

    async def _generate(
        self, prompt: Any, sampling_params: dict[str, Any] | None, input_ids: list[int] | None, stream: bool, rid: str
    ) -> Any:
        params = dict(sampling_params or {})
        unknown = set(params) - SAMPLING_PARAMS
        if unknown:
            raise TypeError(f"SamplingParams.__init__() got unexpected keyword arguments {sorted(unknown)}")
        assert prompt is None and input_ids, "fleet sends token ids, never text"
        self.tokenizer_manager.validate(input_ids, params)
        verify_sampling(params)
        vocab = self.vocab_size
        if vocab is not None and any(not 0 <= i < vocab for i in input_ids):
            # No check in 0.5.23: F.embedding raises IndexError in the scheduler, whose death
            # SIGQUITs the process that started the engine.
            journal({"event": "scheduler_died", "pid": os.getpid(), "reason": "index out of range in self"})
            os.kill(os.getpid(), signal.SIGQUIT)
        if self.dead is not None:
            raise self.dead
        self.tokenizer_manager.scheduler_validate(input_ids)
        self.calls += 1
        self.requests.append({"input_ids": list(input_ids), "sampling_params": params, "rid": rid})
        began = time.monotonic()
        max_new = min(params.get("max_new_tokens", 128), self.tokenizer_manager.max_req_len() - len(input_ids) - 1)
        # the sample ends where an uninterrupted one would: natural_tokens after the output began
        left = self.natural_tokens - (len(input_ids) - self._output_start(input_ids))
        n = max(0, min(left, max_new))  # the scheduler runs to max_new, whatever was sent
        self.inside += 1
        journal({"event": "request", "pid": os.getpid(), "prompt": len(input_ids), "inside": self.inside,
                 "reserved": self.tokenizer_manager.num_reserved_tokens, "sampling_params": params})  # fmt: skip
        incremental = bool(self.kwargs.get("incremental_streaming_output"))
        interval = int(self.kwargs.get("stream_interval", 1))
        ids = self._ids(input_ids, n, params)
        stop = self._stop_string(ids, params)
        matched = None
        if stop is not None:
            n, matched = stop
            ids = ids[:n]
        made: list[int] = []
        sent = 0
        said = ""  #: the text streamed so far
        try:
            async with self.slots:  # queued inside beyond the effective limit, as the scheduler does
                self.running += 1
                self.peak = max(self.peak, self.running)
                try:
                    while len(made) < n:
                        step = min(interval, n - len(made))
                        await asyncio.sleep(step * self.step_s)
                        made.extend(ids[len(made) : len(made) + step])
                        if rid in self.tokenizer_manager.aborted:
                            yield self._abort(rid, made, sent, said, params, incremental)
                            return
                        if stream and len(made) < n:
                            new = made[sent:]
                            sent = len(made)
                            text = self.detokenize(made, params)
                            if text.endswith("\ufffd"):  # an incomplete character waits for its next bytes
                                text = said
                            # not incremental: the whole output so far, by reference, as the real one passes it
                            yield {"text": text[len(said):] if incremental else text,
                                   "output_ids": new if incremental else made, "meta_info": {"finish_reason": None}}
                            said = text
                finally:
                    self.running -= 1
        finally:
            self.inside -= 1
        if self.dead is not None:
            raise self.dead
        if self.abort_over is not None and len(input_ids) > self.abort_over:
            if stream:
                out = self._output(input_ids, {**params, "max_new_tokens": max_new}, n, 0.0, ids)
                message = "Out of memory even after retracting all requests (fake abort)"
                out["meta_info"]["finish_reason"] = {"type": "abort", "status_code": 500, "message": message}
                yield out
                return
            raise HTTPException(500, "Out of memory even after retracting all requests (fake abort)")
        out = self._output(input_ids, {**params, "max_new_tokens": max_new}, n, time.monotonic() - began, ids, matched)
        if stream and incremental:
            out["output_ids"] = out["output_ids"][sent:]
            out["text"] = out["text"][len(said):]
        try:
            yield out
        except GeneratorExit:
            # closed at its finished output instead of run out: SGLang's generate_request takes that close
            # through its failed-request clean-up (`except BaseException`) and leaves its inner generator to
            # the event loop's finalizer, a cross-thread wake-up and a task per request
            journal({"event": "closed_after_finish", "pid": os.getpid(), "rid": rid})
            raise

    @staticmethod
    def _output_start(input_ids: list[int]) -> int:
        """Where the ids this fake made begin in a continued request's input (its own output follows
        a rule of position; a prompt's ids do not): the input's length when it made none."""
        seed = sum(input_ids[:4]) * 7
        start = len(input_ids)
        while start > 4 and input_ids[start - 1] == (seed + start - 1) % 1000 + 10:
            start -= 1
        return start

    def _ids(self, input_ids: list[int], n: int, params: dict[str, Any]) -> list[int]:
        """A greedy model's output: each id a function of the context's start and its position."""
        seed = sum(input_ids[:4]) * 7
        return [(seed + len(input_ids) + i) % 1000 + 10 for i in range(n)]

    def _stop_string(self, ids: list[int], params: dict[str, Any]) -> tuple[int, str] | None:
        """Where a stop string ends the output, as the scheduler checks it after every token
        (managers/schedule_batch.py `_check_str_based_finish`): the stop string in the text of the
        last stop_str_max_len + 1 ids (specials kept), stop_str_max_len being the longest stop
        string's length in tokens (sampling/sampling_params.py normalize); the output then ends with
        the id that completed it. None: no stop string is hit."""
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not stops:
            return None
        tok = self.tokenizer()
        width = max(len(tok.encode(s, add_special_tokens=False)) for s in stops) + 1
        for k in range(1, len(ids) + 1):
            if k >= params.get("max_new_tokens", 128):
                return None  # the length check comes first (Req.check_finished)
            tail = tok.decode(ids[max(0, k - width) : k])
            hit = next((s for s in stops if s in tail), None)
            if hit is not None:
                return k, hit
        return None

    def _abort(
        self, rid: str, made: list[int], sent: int, said: str, params: dict[str, Any], incremental: bool
    ) -> dict[str, Any]:
        text = self.detokenize(made, params)
        return {"text": text[len(said):] if incremental else text,
                "output_ids": made[sent:] if incremental else list(made),
                "meta_info": {"finish_reason": {"type": "abort", "message": f"Abort request {rid}"},
                              "completion_tokens": len(made)}}

    def _output(
        self, input_ids: list[int], params: dict[str, Any], n: int, latency: float, ids: list[int],
        matched: str | None = None,
    ) -> dict[str, Any]:
        if matched is not None:
            finish: dict[str, Any] = {"type": "stop", "matched": matched}
        elif n >= params.get("max_new_tokens", 128):
            finish = {"type": "length", "length": n}
        else:
            finish = {"type": "stop", "matched": EOS}
        ids = list(ids)
        if matched is None and finish["type"] == "stop":  # a natural end: the model's end id
            ids[-1] = EOS
        text = self.detokenize(ids, params)
        if matched is not None and matched in text:  # the detokenizer's trim_matched_stop (no_stop_trim off)
            text = text[: text.find(matched)]
        return {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "id": f"req-{self.calls}",
                "finish_reason": finish,
                "prompt_tokens": len(input_ids),
                "completion_tokens": n,
                "cached_tokens": len(input_ids) // 2,
                "spec_accept_length": 2.5,
                "spec_verify_ct": max(1, n * 2 // 5),
                "e2e_latency": latency,
                "num_retractions": self.retractions,
            },
        }

    def crash(self, message: str = "scheduler process exited") -> None:
        self.dead = RuntimeError(message)

    def shutdown(self) -> None:
        self.shut_down = True

"""A stand-in `sglang` with sglang 0.5.23's embedded-engine contract, for tests without a GPU.

Same surface as the real thing: `Engine(**server_args)` built on the caller's event loop
(it binds to the running loop, like the real receive loop), `await
engine.async_generate(input_ids=..., sampling_params=...)` returning `text`, `output_ids`
and `meta_info`, `engine.tokenizer_manager.context_len`, and `engine.shutdown()`.
Unknown server args or sampling params raise TypeError, a prompt over the context raises
ValueError, as in SGLang, and so does an input id past config.json's vocab_size.
Continuous batching is a `max_running_requests` semaphore.

Kwargs starting with `fake_` steer it: `fake_step_s` (seconds per token), `fake_tokens`
(natural output length), `fake_fail_start`, `fake_abort_over` (prompt length above which a
request is aborted). `crash(message)` makes every request from then on raise.
"""

from __future__ import annotations

import asyncio
import json
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
})
#: SamplingParams fields (sglang/srt/sampling/sampling_params.py) that fleet may send.
SAMPLING_PARAMS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "sampling_seed", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n",
})
EOS = 2

#: every Engine built in this process, newest last
instances: list[Engine] = []


class TokenizerManager:
    def __init__(self, context_len: int):
        self.context_len = context_len


class Engine:
    def __init__(self, **kwargs: Any):
        fake = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("fake_")}
        unknown = set(kwargs) - SERVER_ARGS
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        if fake.get("fake_fail_start"):
            raise RuntimeError("Initialization failed. scheduler died: CUDA out of memory")
        self.kwargs = kwargs
        self.thread = threading.current_thread()
        self.loop = asyncio.get_running_loop()  # the real engine binds to the first loop too
        self.step_s = float(fake.get("fake_step_s", 0.001))
        self.natural_tokens = int(fake.get("fake_tokens", 16))
        self.abort_over = fake.get("fake_abort_over")
        self.tokenizer_manager = TokenizerManager(kwargs.get("context_length") or 2048)
        self.slots = asyncio.Semaphore(kwargs["max_running_requests"])
        self.running = self.peak = self.calls = 0
        self.requests: list[dict[str, Any]] = []
        self.dead: BaseException | None = None
        self.shut_down = False
        instances.append(self)

    def vocab_size(self) -> int | None:
        """config.json's vocab_size (the embedding rows), which SGLang checks input ids against."""
        path = Path(str(self.kwargs.get("model_path", ""))) / "config.json"
        return json.loads(path.read_text()).get("vocab_size") if path.is_file() else None

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("Task got Future attached to a different loop")
        params = dict(sampling_params or {})
        unknown = set(params) - SAMPLING_PARAMS
        if unknown:
            raise TypeError(f"SamplingParams.__init__() got unexpected keyword arguments {sorted(unknown)}")
        assert prompt is None and input_ids, "fleet sends token ids, never text"
        context = self.tokenizer_manager.context_len
        if len(input_ids) >= context:
            raise ValueError(
                f"The input ({len(input_ids)} tokens) is longer than the model's context length ({context} tokens)."
            )
        vocab = self.vocab_size()
        if vocab is not None and any(i >= vocab for i in input_ids):  # TokenizerManager._validate_input_ids_in_vocab
            raise ValueError(f"The input_ids {input_ids} contains values greater than the vocab size ({vocab}).")
        if self.dead is not None:
            raise self.dead
        self.calls += 1
        self.requests.append({"input_ids": list(input_ids), "sampling_params": params})
        began = time.monotonic()
        n = min(self.natural_tokens, params.get("max_new_tokens", 128))
        async with self.slots:
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                await asyncio.sleep(n * self.step_s)
            finally:
                self.running -= 1
        if self.dead is not None:
            raise self.dead
        return self._output(input_ids, params, n, time.monotonic() - began)

    def _output(self, input_ids: list[int], params: dict[str, Any], n: int, latency: float) -> dict[str, Any]:
        if self.abort_over is not None and len(input_ids) > self.abort_over:
            finish: dict[str, Any] = {"type": "abort", "message": "fake abort", "status_code": 400}
            n = 0
        elif n >= params.get("max_new_tokens", 128):
            finish = {"type": "length", "length": n}
        else:
            finish = {"type": "stop", "matched": EOS}
        ids = [(sum(input_ids) + i) % 1000 + 10 for i in range(n)]
        if finish["type"] == "stop":
            ids[-1] = EOS
        return {
            "text": f"fake reasoning over {len(input_ids)} tokens\n</think>\n\nfake answer of {n} tokens",
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
            },
        }

    def crash(self, message: str = "scheduler process exited") -> None:
        self.dead = RuntimeError(message)

    def shutdown(self) -> None:
        self.shut_down = True

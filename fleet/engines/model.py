"""What the model engines (hf, sglang, vllm) share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json
gives the sampling defaults; both engines read them the same way, through fleet.model.prompting.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from fleet.engines.base import Engine, EngineSpec
from fleet.errors import EngineError
from fleet.model.prompting import (
    Prompt,
    ended_in_thinking,
    load_tokenizer,
    model_facts,
    render,
    require_model,
    resolve_model_dir,
    split_reasoning,
    trim_at_stop,
)
from fleet.records import GenRequest, GenResult, prompt_digest
from fleet.settings import Settings

T = TypeVar("T")


class ModelEngine(Engine):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.model_path = require_model(settings)
        self.tokenizer: Any = None
        #: effective sampling defaults, eos ids included (model_facts)
        self.defaults: dict[str, Any] = {}
        #: prompt + output token limit, known once the engine has started
        self.context: int | None = None

    def model_name(self) -> str:
        return resolve_model_dir(self.model_path).name

    def load_model_files(self) -> None:
        """Tokenizer and sampling defaults; called at the start of `start()`."""
        self.tokenizer = load_tokenizer(self.model_path)
        self.defaults = model_facts(self.settings)["sampling"]

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run tokenizer work where this engine keeps it (hf: inline, as its stream renders)."""
        return fn(*args)

    async def prompt_of(self, request: GenRequest) -> Prompt:
        return render(self.tokenizer, request)

    async def whole(
        self, request: GenRequest, prompt: Prompt, new_ids: list[int], reason: str, engine_text: str | None,
        facts: dict[str, Any],
    ) -> GenResult:
        """`assemble`, decoding where this engine keeps its tokenizer work when it must decode."""
        if request.prefix_ids or engine_text is None:
            return await self.off_loop(self.assemble, request, prompt, new_ids, reason, engine_text, facts)
        return self.assemble(request, prompt, new_ids, reason, engine_text, facts)

    def assemble(
        self, request: GenRequest, prompt: Prompt, new_ids: list[int], reason: str, engine_text: str | None,
        facts: dict[str, Any],
    ) -> GenResult:
        """The sample's result over its prefix ids and the new ones. A continued sample's text is
        decoded here from all its ids at once, never joined from two texts: the seam may fall
        inside a multi-byte character, `</think>` or a stop string (docs/architecture.md, "Tokens as they are made")."""
        ids = request.prefix_ids + new_ids
        if request.prefix_ids or engine_text is None:
            ids, text, stopped = self.decode_output(ids, reason, request.sampling.stop)
            reason = "stop" if stopped else reason
        else:
            text = engine_text
        reasoning, answer = split_reasoning(text, prompt.opened_think)
        return GenResult(
            text=answer,
            reasoning=reasoning,
            in_thinking=ended_in_thinking(text, prompt.opened_think),
            completion_tokens=len(ids),
            prompt_tokens=len(prompt.ids),
            finish_reason=reason,
            output_ids=ids,  # the worker keeps them only where the job asks (to_output)
            meta=facts | {"prompt_digest": prompt_digest(prompt.ids)},
        )

    async def cut(self, request: GenRequest, new_ids: list[int], reason: str) -> GenResult:
        prompt = await self.prompt_of(request)
        return await self.whole(request, prompt, new_ids, reason, None, {})

    def decode_output(self, ids: list[int], reason: str, stops: tuple[str, ...] | None) -> tuple[list[int], str, bool]:
        """(ids, text, stopped by a string) as the engines report them: the text without its end-of-
        sequence token or special tokens, cut before the first stop string; the ids then end with
        the token that completed that string."""
        eos = set(self.defaults.get("eos_token_ids") or ())
        body = ids[:-1] if reason == "stop" and ids and ids[-1] in eos else ids
        text, hit = trim_at_stop(self.decode(body), stops)
        if hit:
            lo, hi = 1, len(body)  # the shortest prefix whose text holds a stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if trim_at_stop(self.decode(body[:mid]), stops)[1]:
                    hi = mid
                else:
                    lo = mid + 1
            ids = body[:lo]
        return ids, text, hit

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def seam_window(self, request: GenRequest) -> int:
        """New tokens during which a stop string may still span the seam of a continued sample:
        the engine checks stop strings in its own output only, so fleet checks these."""
        if not request.prefix_ids or not request.sampling.stop:
            return 0
        return max(len(s) for s in request.sampling.stop) + 4

    async def seam_stopped(self, request: GenRequest, new_ids: list[int]) -> bool:
        return await self.off_loop(self._seam_stopped, request, list(new_ids))

    def _seam_stopped(self, request: GenRequest, new_ids: list[int]) -> bool:
        """A stop string that begins in the prefix and ends in the new ids."""
        window = self.seam_window(request)
        tail = request.prefix_ids[-window:]
        head = self.decode(tail)
        whole = self.decode(tail + new_ids[:window])
        return any(s in whole and s not in head for s in request.sampling.stop or ())


class EmbeddedEngine(ModelEngine):
    """An engine library embedded in the worker (sglang, vllm): built on the worker's one
    engine loop, which every request must then use; its real batch read back after start."""

    def __init__(self, settings: Settings, kwargs: dict[str, Any]):
        super().__init__(settings)
        self.kwargs = kwargs
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set once the engine is found broken: every later request gets it
        self._dead: EngineError | None = None
        #: what the engine really runs, read back after start (None until then)
        self.effective_running: int | None = None
        self.kv_tokens: int | None = None
        #: one thread: the tokenizer is only ever used from it once the engine runs
        self._render = ThreadPoolExecutor(1, thread_name_prefix="fleet-render")

    def bind_loop(self) -> None:
        """Called first in `start()`: the engine's receive path binds to this loop."""
        self._loop = asyncio.get_running_loop()

    async def render_prompt(self, request: GenRequest) -> Prompt:
        """The request's prompt ids, rendered off the loop (templating is pure Python and the
        loop carries the engine's own output path), once the engine is known to be usable."""
        if self._dead is not None:
            raise self._dead
        if self._engine is None:
            raise EngineError(f"{self.name} engine is not running (not started, or shut down)")
        if asyncio.get_running_loop() is not self._loop:
            raise EngineError(f"{self.name} engine called from a loop other than the one it started on")
        return await asyncio.get_running_loop().run_in_executor(self._render, render, self.tokenizer, request)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """On the render thread: once the engine runs, only that thread touches the tokenizer."""
        return await asyncio.get_running_loop().run_in_executor(self._render, partial(fn, *args))

    async def prompt_of(self, request: GenRequest) -> Prompt:
        return await self.render_prompt(request)

    def release(self) -> Any:
        """Forget the engine and stop rendering; returns the engine for the caller to shut down."""
        engine, self._engine = self._engine, None
        self._render.shutdown(wait=False, cancel_futures=True)
        return engine


class ModelEngineSpec(EngineSpec):
    """What the model engines (hf, sglang, vllm) share: a model directory and its files."""

    def model_identity(self, settings: Settings) -> dict[str, Any]:
        """Model files by revision, not by path: hosts may keep one snapshot in other directories."""
        facts = model_facts(settings)["model"]
        # Not the directory name either: one snapshot copied to /models/qwen on one host and
        # /data/Qwen3.6-27B on another is one model.
        return {k: facts.get(k) for k in ("revision", "chat_template_sha256")}

    def identity(self, settings: Settings) -> dict[str, Any]:
        return {"model": self.model_identity(settings), self.name: self.shaping(settings)}

    @abstractmethod
    def shaping(self, settings: Settings) -> dict[str, Any]:
        """This engine's settings that change tokens (not speed, memory or logging)."""

    def job_model(self, settings: Settings) -> dict[str, Any]:
        facts = model_facts(settings)
        return {"model": facts["model"], "sampling": facts["sampling"], "max_tokens_from": facts["max_tokens_from"]}

    def input_vocab(self, settings: Settings) -> int | None:
        return len(load_tokenizer(require_model(settings)))

"""What the model engines (hf, sglang, vllm) share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json
gives the sampling defaults; both engines read them the same way, through fleet.model.prompting.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleet.engines.base import Engine, EngineSpec
from fleet.errors import EngineError
from fleet.model.prompting import Prompt, load_tokenizer, model_facts, render, require_model, resolve_model_dir
from fleet.records import GenRequest
from fleet.settings import Settings


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

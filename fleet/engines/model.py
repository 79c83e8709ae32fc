"""What the model engines (hf, sglang, vllm) share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json
gives the sampling defaults; both engines read them the same way, through fleet.model.prompting.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from fleet.engines.base import Engine, EngineSpec
from fleet.model.prompting import load_tokenizer, model_facts, require_model, resolve_model_dir
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

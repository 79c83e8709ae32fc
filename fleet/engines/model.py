"""What the hf and sglang engines share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json
gives the sampling defaults; both engines read them the same way, through fleet.model.prompting.
"""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine
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

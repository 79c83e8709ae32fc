"""What the model engines' specs (hf, sglang, vllm, server) share: a model directory and what its files say.

The job's model and sampling come from here at enqueue (fleet.model.facts); the engines themselves
(fleet.engines.model) take a request's sampling as it comes.
"""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod
from typing import Any

from fleet.engines.base import EngineSpec
from fleet.errors import ConfigError, FleetError
from fleet.model.facts import model_facts, model_fingerprint
from fleet.model.modeldir import require_model
from fleet.model.rendering import load_tokenizer
from fleet.settings import Settings


class ModelEngineSpec(EngineSpec):
    """What the model engines (hf, sglang, vllm, server) share: a model directory and its files."""

    def model_identity(self, settings: Settings) -> dict[str, Any]:
        """Model files by revision, not by path: hosts may keep one snapshot in other directories."""
        facts = model_fingerprint(require_model(settings))
        # Not the directory name either: one snapshot copied to /models/qwen on one host and
        # /data/Qwen3.6-27B on another is one model.
        return {k: facts.get(k) for k in ("revision", "chat_template_sha256")}

    def identity(self, settings: Settings) -> dict[str, Any]:
        return {"model": self.model_identity(settings), self.name: self.shaping(settings)}

    @abstractmethod
    def shaping(self, settings: Settings) -> dict[str, Any]:
        """This engine's settings that change tokens (not speed, memory or logging)."""

    #: the engine section's tensor-parallel setting (a GPU engine that spans GPUs), or None
    tensor_parallel: str | None = None

    def gpus_per_worker(self, settings: Settings) -> int:
        return getattr(getattr(settings, self.name), self.tensor_parallel) if self.tensor_parallel else 1

    def spanning(self, settings: Settings, gpus: int) -> Settings:
        """The engine's tensor parallelism set to `gpus`; a different one set by hand is refused."""
        if self.tensor_parallel is None:
            return super().spanning(settings, gpus)
        section = getattr(settings, self.name)
        asked = getattr(section, self.tensor_parallel)
        if self.tensor_parallel in section.model_fields_set and asked != gpus:
            raise ConfigError(f"{self.name}.{self.tensor_parallel} is {asked} but each worker gets {gpus} GPU(s) "
                              "(--gpus-per-worker): leave it unset or make them equal")
        return settings.model_copy(update={self.name: section.model_copy(update={self.tensor_parallel: gpus})})

    def job_model(self, settings: Settings) -> dict[str, Any]:
        facts = model_facts(settings)
        return {"model": facts["model"], "sampling": facts["sampling"], "max_tokens_from": facts["max_tokens_from"]}

    def input_vocab(self, settings: Settings) -> int | None:
        return len(load_tokenizer(require_model(settings)))

    def job_tokenizer(self, config: dict[str, Any], job: str) -> Any:
        """The tokenizer of the job's model, refused when its chat template is not the job's."""
        model = config.get("model") or {}
        if not model.get("path"):
            return super().job_tokenizer(config, job)
        tokenizer = load_tokenizer(model["path"])
        template = tokenizer.chat_template
        if template is not None and not isinstance(template, str):
            template = json.dumps(template, sort_keys=True)
        sha = hashlib.sha256(template.encode()).hexdigest() if template else None
        if model.get("chat_template_sha256") not in (None, sha):
            raise FleetError(
                f"the chat template at {model['path']!r} is not the one job {job!r} ran with "
                "(sha256 differs from the manifest's)"
            )
        return tokenizer

"""What the model engines (hf, sglang, vllm, server) share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json
gives the sampling defaults; both engines read them the same way, through fleet.model.facts.
"""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, TypeVar

from fleet.engines.base import Engine, EngineSpec
from fleet.errors import ConfigError, FleetError
from fleet.model.endings import reported_text
from fleet.model.facts import fill_sampling, model_facts
from fleet.model.modeldir import require_model, resolve_model_dir
from fleet.model.promptlimits import check_length
from fleet.model.reasoning import ended_in_thinking, split_reasoning
from fleet.model.rendering import Prompt, load_tokenizer, render
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

    def end_ids(self) -> frozenset[int]:
        return frozenset(self.defaults.get("eos_token_ids") or ())

    @property
    def context_budget(self) -> int | None:
        return self.context

    def stops_of(self, request: GenRequest) -> tuple[str, ...] | None:
        return fill_sampling(request.sampling, self.defaults).stop

    async def prompt_of(self, request: GenRequest) -> Prompt:
        return render(self.tokenizer, request)

    async def room(self, request: GenRequest, prompt: Prompt) -> tuple[int, GenResult | None]:
        """The new tokens the context leaves this request (its max tokens less its prefix, clipped; a
        prompt over the context fails its record), and the result of one whose checkpointed ids already
        fill it (then nothing is generated)."""
        max_new = check_length(request, len(prompt.ids), self.context_budget)
        if max_new > 0:
            return max_new, None
        return max_new, await self.whole(request, prompt, [], "length", None, {})

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
        """(ids, text, stopped by a string) as the engines report them (fleet.model.endings)."""
        return reported_text(ids, reason, self.end_ids(), stops, self.decode)

    def decode(self, ids: Sequence[int]) -> str:
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


class ModelEngineSpec(EngineSpec):
    """What the model engines (hf, sglang, vllm, server) share: a model directory and its files."""

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

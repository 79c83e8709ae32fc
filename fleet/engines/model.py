"""What the model engines (hf, sglang, vllm, server) share: a model directory and what its files say.

The tokenizer renders prompts (so token counts are exact) and generation_config.json gives the
end ids; each engine reads them the same way, through fleet.model.facts. The sampling defaults of
generation_config.json are the job's, resolved at enqueue: a request comes with its final sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from fleet.engines.base import Engine
from fleet.model.endings import reported_text
from fleet.model.facts import model_end_ids
from fleet.model.modeldir import require_model, resolve_model_dir
from fleet.model.promptlimits import check_length
from fleet.model.reasoning import ended_in_thinking, split_reasoning
from fleet.model.rendering import Prompt, SpecialDecode, decode_ids, load_tokenizer, own_decoder, render
from fleet.records import GenRequest, GenResult, prompt_digest
from fleet.settings import Settings

T = TypeVar("T")


class ModelEngine(Engine):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.model_path = require_model(settings)
        self.tokenizer: Any = None
        #: a decode no other thread's rendering can disturb (fleet.model.rendering.own_decoder): with it a
        #: result is assembled, and a pre-tokenized prompt taken, where the engine is, with no hop to the
        #: thread that renders; None: the tokenizer has none, and its work stays on that thread
        self.own_decode: SpecialDecode | None = None
        #: the ids that end a sample (model_end_ids)
        self.eos_ids: list[int] = []
        #: prompt + output token limit, known once the engine has started
        self.context: int | None = None

    def model_name(self) -> str:
        return resolve_model_dir(self.model_path).name

    def load_model_files(self) -> None:
        """Tokenizer and end ids; called at the start of `start()`."""
        self.tokenizer = load_tokenizer(self.model_path)
        self.own_decode = own_decoder(self.tokenizer)
        self.eos_ids = list(model_end_ids(self.model_path))

    def end_ids(self) -> frozenset[int]:
        return frozenset(self.eos_ids)

    @property
    def context_budget(self) -> int | None:
        return self.context

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
        if (request.prefix_ids or engine_text is None) and self.own_decode is None:
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
        return self.own_decode(ids, True) if self.own_decode is not None else decode_ids(self.tokenizer, ids)

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

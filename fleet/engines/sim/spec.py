"""What fleet asks of the sim engine: no model, no GPU; its length distribution is its identity."""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine, EngineSpec, PromptCount
from fleet.engines.sim.tokenchain import SimVocab
from fleet.model.endings import Decode
from fleet.model.facts import job_sampling
from fleet.records import GenRequest, InputRecord, Message, Sampling
from fleet.settings import Settings

#: how sim ids are made (fleet.engines.sim.tokenchain): 2, each id chained to the ids before it
TOKENS_VERSION = 2


class SimSpec(EngineSpec):
    name = "sim"
    needs_model = False
    ends_before_length = True  # sim_tokens ends at its end id or a stop string before its max tokens

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.sim.engine import SimEngine

        return SimEngine(settings.sim)

    def identity(self, settings: Settings) -> dict[str, Any]:
        # Speed and fault-test switches do not change tokens; the vocabulary and the token chain do.
        return {"sim": self._model(settings) | {"tokens": TOKENS_VERSION}}

    @staticmethod
    def _model(settings: Settings) -> dict[str, Any]:
        return {"mean_output_tokens": settings.sim.mean_output_tokens, "sigma": settings.sim.sigma,
                "vocab_size": SimVocab.of(settings.sim.vocab_size).size}

    def job_model(self, settings: Settings) -> dict[str, Any]:
        # resolved as every engine's is (fleet.model.facts.job_sampling), with no model defaults
        sampling, max_tokens_from = job_sampling(settings.sampling.model_dump(), None, None,
                                                 [SimVocab.of(settings.sim.vocab_size).eos])
        return {"sampling": sampling, "max_tokens_from": max_tokens_from,
                "model": {"name": "sim", **self._model(settings)}}

    def decoder(self, config: dict[str, Any], job: str) -> Decode:
        return SimVocab.of((config.get("model") or {}).get("vocab_size")).decode

    def prompt_counter(self, config: dict[str, Any], job: str) -> PromptCount:
        from fleet.engines.sim.engine import prompt_size

        thinking = config.get("enable_thinking", True)

        def count(record: InputRecord, messages: list[Message] | None = None) -> int:
            return prompt_size(GenRequest(
                record_id=record.id, chunk=0, sample=0, sampling=Sampling(max_tokens=1, seed=0),
                messages=messages or record.messages, prompt=record.prompt, input_ids=record.input_ids,
                enable_thinking=thinking,
            ))  # fmt: skip

        return count

    def input_vocab(self, settings: Settings) -> int | None:
        return settings.sim.vocab_size


SPEC = SimSpec()

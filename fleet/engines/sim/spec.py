"""What fleet asks of the sim engine: no model, no GPU; its length distribution is its identity."""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine, EngineSpec
from fleet.model.outputlen import default_max_tokens
from fleet.settings import Settings


class SimSpec(EngineSpec):
    name = "sim"

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.sim.engine import SimEngine

        return SimEngine(settings.sim)

    def identity(self, settings: Settings) -> dict[str, Any]:
        # Speed and fault-test switches do not change tokens.
        return {"sim": {"mean_output_tokens": settings.sim.mean_output_tokens, "sigma": settings.sim.sigma}}

    def job_model(self, settings: Settings) -> dict[str, Any]:
        sampling = settings.sampling.model_dump()
        sampling["max_tokens"], max_tokens_from = default_max_tokens(None, settings.sampling.max_tokens)
        model = {"name": "sim", "mean_output_tokens": settings.sim.mean_output_tokens, "sigma": settings.sim.sigma}
        return {"sampling": sampling, "max_tokens_from": max_tokens_from, "model": model}

    def input_vocab(self, settings: Settings) -> int | None:
        return settings.sim.vocab_size


SPEC = SimSpec()

"""What fleet asks of the hf engine (transformers on a CPU or GPU)."""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine
from fleet.engines.modelspec import ModelEngineSpec
from fleet.settings import Settings


class HfSpec(ModelEngineSpec):
    name = "hf"
    ends_before_length = True  # its RowStopper takes an end id, then a stop string, then the length

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.hf.engine import HfEngine

        return HfEngine(settings)

    def cpu_threads(self, settings: Settings) -> int | None:
        return settings.hf.threads

    def shaping(self, settings: Settings) -> dict[str, Any]:
        # HfEngine picks bfloat16 on CUDA and float32 on CPU: the device is the dtype.
        return {"device": settings.hf.device, "context_length": settings.hf.context_length}


SPEC = HfSpec()

"""The hf engine's settings (FLEET_HF__*).

One section of the settings part, beside the others: fleet.settings composes it, and the
hf engine (fleet.engines.hf) reads it, so the settings never import the engines.
"""

from __future__ import annotations

from pydantic import Field

from fleet.settings.engine import EngineSettings


class HfSettings(EngineSettings):
    """transformers on a CPU or GPU: batched generate with left padding."""

    device: str = Field("auto", description="'auto', 'cpu' or 'cuda'")
    max_batch: int = Field(16, ge=1, description="requests per generate() call (the engine's slots)")
    batch_wait_s: float = Field(0.01, ge=0, description="seconds to wait for a batch to fill")
    context_length: int | None = Field(None, description="prompt + output limit; default from model config")
    threads: int | None = Field(None, ge=1, description="torch CPU threads per worker; default cores / workers")

    def requests_at_once(self) -> int:
        """S: one generate() call's batch."""
        return self.max_batch

"""The engine protocol: one request in, one sample out, on one long-lived asyncio loop.

A worker process owns one engine; K chunk slots submit requests to it concurrently and
the engine batches them (continuous batching in SGLang and sim, micro-batches in hf).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from fleet.records import GenRequest, GenResult


class Engine(ABC):
    """Lifecycle: `await start()` once on the engine loop, `generate` many times, `shutdown`."""

    name: str = "engine"

    @property
    @abstractmethod
    def max_running(self) -> int:
        """S, the requests the engine runs at once (used to derive K)."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model; called once on the engine loop before any request."""

    @abstractmethod
    async def generate(self, request: GenRequest) -> GenResult:
        """Generate one sample. Raise RecordError for this record alone, EngineError if broken."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release the model."""

    def model_name(self) -> str | None:
        return None

    def predict_tokens(self, request: GenRequest) -> float | None:
        """Expected output length, if this engine can predict it (longest-first ordering)."""
        return None

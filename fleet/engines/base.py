"""The engine protocol: one request in, one sample out, on one long-lived asyncio loop.

A worker process owns one engine; K chunk slots submit requests to it concurrently and
the engine batches them (continuous batching in SGLang and sim, micro-batches in hf).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from fleet.records import GenRequest, GenResult

if TYPE_CHECKING:
    from fleet.settings import Settings


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


class EngineSpec(ABC):
    """Everything fleet asks of one engine besides running it: one instance per engine
    package (`fleet.engines.<name>.spec.SPEC`), found by name in fleet.engines.registry.

    Methods never import the engine's own heavy package (sglang, vllm, torch): the launcher,
    the producer and `fleet doctor` call them on machines without it.
    """

    name: str = "engine"
    #: `fleet doctor` lists the GPUs for this engine
    needs_gpu: bool = False

    @abstractmethod
    def build(self, settings: Settings) -> Engine:
        """The engine this worker runs (not started)."""

    @abstractmethod
    def identity(self, settings: Settings) -> dict[str, Any]:
        """What, besides the engine's name, shapes its output (fleet.engines.identity)."""

    @abstractmethod
    def job_model(self, settings: Settings) -> dict[str, Any]:
        """The job config's model, effective sampling and max_tokens_from (fleet.engines.specs.job_config)."""

    @abstractmethod
    def input_vocab(self, settings: Settings) -> int | None:
        """Token ids a pre-tokenized input may hold, or None where nothing is known."""

    def planned(self, settings: Settings, gpu: str | None = None) -> Settings:
        """Settings whose S is what this engine can run on `gpu` (this host's by default), so the
        launcher's K and every worker agree before any engine starts."""
        return settings

    def engine_args(self, settings: Settings, gpu: str | None = None) -> dict[str, Any] | None:
        """The kwargs the worker passes to the engine (`fleet engine-args`); None: it takes none."""
        return None

    def validate_args(self, settings: Settings) -> str | None:
        """Check the engine args with the engine's own validation where it is installed; the
        detail for `fleet doctor`, None when there is nothing to validate. Raises on refusal."""
        return None

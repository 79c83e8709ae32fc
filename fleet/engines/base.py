"""The engine protocol: one request in, its tokens streamed out as they are made, on one
long-lived asyncio loop.

A worker process owns one engine; K chunk slots submit requests to it concurrently and
the engine batches them (continuous batching in SGLang, vLLM and sim, micro-batches in hf).
Streaming is what makes the token, not the record, the unit of progress: the worker
checkpoints each running request's ids and a later run continues from them
(docs/architecture.md, "Tokens as they are made").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fleet.errors import RecordError
from fleet.records import GenDelta, GenRequest, GenResult

if TYPE_CHECKING:
    from fleet.settings import Settings


class Engine(ABC):
    """Lifecycle: `await start()` once on the engine loop, `stream` many times, `shutdown`.

    The stream contract, for every engine: `stream(request)` yields `GenDelta`s whose ids,
    joined, are the output after `request.prefix_ids`; the last delta carries the whole
    result, whose `output_ids` (and text) cover prefix and new ids alike. `abort(request_id)`
    ends one running request early (the worker stops reading its stream first).
    """

    name: str = "engine"

    @property
    @abstractmethod
    def max_running(self) -> int:
        """S, the requests the engine runs at once (used to derive K)."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model; called once on the engine loop before any request."""

    @abstractmethod
    def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        """Generate one sample as deltas. Raise RecordError for this record alone, EngineError
        if the engine is broken, EngineUnavailable if it cannot be reached for now."""

    async def abort(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """End one running request inside the engine (its stream has been closed)."""

    @abstractmethod
    async def cut(self, request: GenRequest, new_ids: list[int], reason: str) -> GenResult:
        """The result of a request the worker ended itself after `new_ids` (the repetition stop):
        what it made, whole (prefix included), with `reason` as its finish reason."""

    async def generate(self, request: GenRequest) -> GenResult:
        """One sample, whole: the stream read to its end (benchmarks, bare comparisons)."""
        result = None
        async for delta in self.stream(request):
            result = delta.result or result
        if result is None:
            raise RecordError(f"{self.name} engine ended record {request.record_id!r} without a result")
        return result

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

"""The engine protocol: one request in, one sample out, on one long-lived asyncio loop.

A worker process owns one engine; K chunk slots submit requests to it concurrently and
the engine batches them (continuous batching in SGLang and sim, micro-batches in hf).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from fleet.records import Message


@dataclass(frozen=True)
class Sampling:
    """Effective sampling for one request: manifest defaults with the record's overrides."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int = 2048
    stop: tuple[str, ...] | None = None
    seed: int | None = None


@dataclass
class GenRequest:
    record_id: str
    chunk: int
    sample: int
    sampling: Sampling
    messages: list[Message] | None = None
    prompt: str | None = None
    #: pre-tokenized prompt: sent to the engine as is
    input_ids: list[int] | None = None
    #: chat template's enable_thinking (job setting)
    enable_thinking: bool = True
    #: put token ids in the output record
    return_output_ids: bool = False


@dataclass
class GenResult:
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str  # stop | length | error
    output_ids: list[int] | None = None
    error: str | None = None
    #: reasoning split at </think> when the engine knows the template opened it
    reasoning: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


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


def prompt_digest(ids: list[int]) -> str:
    """A short fingerprint of the prompt ids an engine saw, stored on the record so an
    export that rebuilds the ids (re-rendering the template) can prove it got them exactly."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def derive_seed(job_seed: int, record_id: str, sample: int) -> int:
    """A per-request seed that a regenerated chunk asks for again (stable across processes)."""
    digest = hashlib.blake2b(f"{job_seed}\x00{record_id}\x00{sample}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & 0x7FFFFFFF

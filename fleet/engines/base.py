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
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.errors import ConfigError, FleetError, RecordError
from fleet.model.endings import Decode, prefix_ending
from fleet.model.rendering import decode_ids, record_prompt_ids
from fleet.records import Ending, GenDelta, GenRequest, GenResult, InputRecord, Message

T = TypeVar("T")
#: a record's prompt tokens, or one turn's (its prompt's messages), as the job's worker counted them
PromptCount = Callable[[InputRecord, "list[Message] | None"], int]

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

    # -- what the ids say, for continuation and the audit (docs/architecture.md, "Audit") --

    def end_ids(self) -> frozenset[int]:
        """The ids that end a sample (end of sequence)."""
        return frozenset()

    @property
    def context_budget(self) -> int | None:
        """Prompt + output tokens the engine really runs a request to: fleet asks for no more, and the audit
        takes a length cut there as a filled context (docs/architecture.md, "Audit"); None: no limit."""
        return None

    def decode(self, ids: Sequence[int]) -> str:
        """Output ids as text, special tokens skipped, as the engine reports a record's text."""
        raise NotImplementedError

    def stops_of(self, request: GenRequest) -> tuple[str, ...] | None:
        """The stop strings the engine ends this request at."""
        return request.sampling.stop

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run tokenizer work where this engine keeps it (inline unless the engine says otherwise)."""
        return fn(*args)

    async def ended(self, request: GenRequest) -> Ending | None:
        """Where the request's prefix ids already end its sample (an end id, a stop string, its max
        tokens): such a sample is finished and is never continued, since an engine given those ids
        as a prompt would go on past their end."""
        if not request.prefix_ids:
            return None
        return await self.off_loop(prefix_ending, list(request.prefix_ids), self.end_ids(), self.stops_of(request),
                                   request.sampling.max_tokens, self.decode)

    def restart_reason(self, request: GenRequest) -> str | None:
        """Why this request's sampling cannot cross a seam on this engine (then its sample starts again
        from token 0 instead of being continued), or None when it can."""
        return None

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
    #: an end id or stop string on the last id its max tokens (or the context) allows ends a sample as
    #: `stop` (the sim and hf check them first); False: either reason may stand there (vLLM and SGLang
    #: check the length first), so the audit takes either (docs/architecture.md, "Audit")
    ends_before_length: bool = False
    #: `fleet doctor` lists the GPUs for this engine
    needs_gpu: bool = False
    #: its start may run beside the rest of the worker's start (fleet.worker.main): it forks no Python process
    #: (a child forked while another thread imports keeps that import's lock, held for ever; spawn is safe)
    starts_early: bool = True
    #: it reads a model directory (FLEET_MODEL): the tokenizer, the chat template, generation_config.json
    needs_model: bool = True

    @abstractmethod
    def build(self, settings: Settings) -> Engine:
        """The engine this worker runs (not started)."""

    @abstractmethod
    def identity(self, settings: Settings) -> dict[str, Any]:
        """What, besides the engine's name, shapes its output (fleet.engines.identity)."""

    @abstractmethod
    def job_model(self, settings: Settings) -> dict[str, Any]:
        """The job config's model, its resolved sampling (every value the requests get unless a record sets
        its own) and max_tokens_from (fleet.engines.specs.job_config)."""

    @abstractmethod
    def input_vocab(self, settings: Settings) -> int | None:
        """Token ids a pre-tokenized input may hold, or None where nothing is known."""

    def job_tokenizer(self, config: dict[str, Any], job: str) -> Any:
        """The tokenizer a job ran with (its manifest's config), for exports that rebuild prompt ids."""
        raise FleetError(
            f"job {job!r} ran on the {self.name} engine, which has no tokenizer: only pre-tokenized (input_ids) "
            "records have exact prompt ids"
        )

    def decoder(self, config: dict[str, Any], job: str) -> Decode:
        """Output ids to text as this engine reported a job's records (its manifest's config): what
        the audit (fleet.audit) and the exports decode a record's ids with."""
        tokenizer = self.job_tokenizer(config, job)
        return lambda ids: decode_ids(tokenizer, ids)

    def prompt_counter(self, config: dict[str, Any], job: str) -> PromptCount:
        """Prompt tokens as this engine's worker counted a record's (`messages`: one turn's prompt instead of
        the record's): pre-tokenized ids as given, else the prompt rendered by the job's tokenizer; the audit
        holds each record's prompt_tokens to it (fleet.audit.prompts)."""
        tokenizer = self.job_tokenizer(config, job)
        thinking = config.get("enable_thinking", True)

        def count(record: InputRecord, messages: list[Message] | None = None) -> int:
            if record.input_ids is not None:
                return len(record.input_ids)
            return len(record_prompt_ids(tokenizer, record, thinking, messages))

        return count

    def planned(self, settings: Settings, gpu: str | None = None) -> Settings:
        """Settings whose S is what this engine can run on `gpu` (this host's by default), so the
        launcher's K and every worker agree before any engine starts."""
        return settings

    def engine_args(self, settings: Settings, gpu: str | None = None) -> dict[str, Any] | None:
        """The kwargs the worker passes to the engine (`fleet engine-args`); None: it takes none."""
        return None

    def gpus_per_worker(self, settings: Settings) -> int:
        """The GPUs one engine spans as its settings ask (tensor parallelism); 1 where it cannot span."""
        return 1

    def spanning(self, settings: Settings, gpus: int) -> Settings:
        """Settings whose engine spans `gpus` GPUs (a worker pinned to that many: `--gpus-per-worker`);
        an engine that cannot, or whose settings ask for another count, is refused."""
        if gpus != self.gpus_per_worker(settings):
            raise ConfigError(f"engine {self.name} runs on one GPU: it cannot span {gpus} (--gpus-per-worker)")
        return settings

    def cpu_threads(self, settings: Settings) -> int | None:
        """Torch threads each CPU worker of this engine runs (None: the cores shared among the workers)."""
        return None

    def job_capacity(self, settings: Settings, gpu: str, context_tokens: float, **choices: Any) -> Any:
        """The capacity model's plan (fleet.model.capacity) for requests of `context_tokens` on a named GPU,
        with `choices` (mtp, radix, gpus: per engine) over the settings; None where this engine has none."""
        return None

    def validate_args(self, settings: Settings) -> str | None:
        """Check the engine args with the engine's own validation where it is installed; the
        detail for `fleet doctor`, None when there is nothing to validate. Raises on refusal."""
        return None

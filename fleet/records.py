"""Record schemas: the input forms of docs/architecture.md normalised to one shape, one generation's
request and result (what the worker, the prompt renderer and the engines pass), and the output record."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

#: stop (end of sequence or a stop string), length (max tokens or the context), error (the record
#: failed alone), repetition (the repetition stop ended a loop: fleet.model.repetition)
FinishReason = Literal["stop", "length", "error", "repetition"]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[Any] | None = None


class SamplingOverrides(BaseModel):
    """Per-record sampling: the record's `sampling` object or an OpenAI batch `body`."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    max_tokens: StrictInt | None = Field(None, ge=1)
    n: StrictInt | None = Field(None, ge=1, le=128)
    seed: StrictInt | None = None
    stop: list[StrictStr] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class InputRecord(BaseModel):
    """One prompt as stored in a chunk object; `pos` is its 0-based place in the input."""

    model_config = ConfigDict(extra="forbid")

    pos: int
    #: where it was in the input, 1-based: its line (JSONL) or row (Parquet)
    line: int
    id: str
    messages: list[Message] | None = None
    prompt: str | None = None
    #: pre-tokenized prompt: generated from exactly these ids, no template applied
    input_ids: list[StrictInt] | None = None
    sampling: SamplingOverrides | None = None
    #: input fields fleet does not read (metadata, source...), returned on the output as is
    extra: dict[str, Any] | None = None

    def sample_count(self, default_n: int) -> int:
        return (self.sampling.n if self.sampling and self.sampling.n else None) or default_n


class OutputRecord(BaseModel):
    """One generated sample. Field names are the export contract (docs/architecture.md, Records)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    sample: int = 0
    output: str = ""
    reasoning: str | None = None
    output_ids: list[int] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: FinishReason
    #: the sample ended inside its think block (no `</think>`): it has reasoning and no answer
    in_thinking: bool = False
    error: str | None = None
    chunk: int
    worker: str
    model: str | None = None
    cached_tokens: int | None = None
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    latency_s: float | None = None
    #: times the engine retracted this request for KV room (SGLang; without the radix cache
    #: each one prefills it again): a batch sized past the job's real context shows here
    retractions: int | None = None
    #: sha256 prefix of the prompt ids the engine saw: the tokens export checks its rebuild
    prompt_digest: str | None = None
    #: output positions at which an interrupted sample was continued from its checkpointed ids
    #: (docs/architecture.md, "Tokens as they are made"); None: generated in one go
    continued_at: list[int] | None = None
    #: the repeated block's length in tokens, when the repetition stop ended the sample
    repetition_period: int | None = None
    #: turns = all (fleet/model/turns.py): every generated turn in order, each with TURN_FIELDS; the
    #: top-level fields describe the last one. None: one turn (turns = last, or no conversation)
    turns: list[dict[str, Any]] | None = None
    #: the input's passthrough fields (InputRecord.extra); exports put them back at top level
    extra: dict[str, Any] | None = None
    pos: int = Field(0, description="place in the input, for ordering; not exported")


#: fleet's own export columns; `extra` is spread at top level (JSONL) or one JSON column (Parquet);
#: `turns` only where a record has them, so a turns = last job exports as it always did
EXPORT_FIELDS = [name for name in OutputRecord.model_fields if name not in ("pos", "extra", "turns")]
#: what a generated turn of a conversation keeps (OutputRecord.turns); `worker` made it
TURN_FIELDS = ("turn", "output", "reasoning", "output_ids", "prompt_tokens", "completion_tokens", "finish_reason",
               "in_thinking", "prompt_digest", "continued_at", "repetition_period", "worker")  # fmt: skip


#: Values that make a sampler a no-op: a job's sampling without one samples as if it were unset
#: (record_sampling), and the model's generation_config.json fills none (fleet.model.facts)
NEUTRAL = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """One request's final sampling (record_sampling): every value set, so an engine sends it as it
    is, translated to its own names (fleet.engines.wire), and fills nothing. A sampler left at its
    default is off (NEUTRAL); max_tokens and the seed have no default here: the job's max_tokens is
    resolved once, at enqueue (fleet.model.outputlen), and each sample's seed when its request is built."""

    max_tokens: int
    seed: int
    temperature: float = NEUTRAL["temperature"]
    top_p: float = NEUTRAL["top_p"]
    top_k: int = NEUTRAL["top_k"]
    min_p: float = NEUTRAL["min_p"]
    repetition_penalty: float = NEUTRAL["repetition_penalty"]
    presence_penalty: float = NEUTRAL["presence_penalty"]
    frequency_penalty: float = NEUTRAL["frequency_penalty"]
    stop: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Ending:
    """Where a sample's output ids already end it: `reason` (stop, length) after its first `length` ids."""

    reason: str
    length: int


def record_sampling(job: dict[str, Any], record: InputRecord | None, seed: int) -> Sampling:
    """One record's final sampling: the job's, as its manifest holds it (resolved at enqueue from the
    model's generation_config.json, the settings and the flags: fleet.engines.specs.job_config), with
    the record's own overrides and `seed`. A sampler the job's sampling lacks is off: a manifest written
    before the penalties existed has none, and the engines then sent none (docs/architecture.md, "Sampling").
    Its max_tokens it must hold (fleet.worker.run.generate.job_sampling refuses a manifest without one)."""
    values: dict[str, Any] = {k: NEUTRAL[k] if job.get(k) is None else job[k] for k in NEUTRAL}
    values["max_tokens"], values["stop"] = job["max_tokens"], job.get("stop")
    if record is not None and record.sampling:
        values.update({k: v for k in values if (v := getattr(record.sampling, k)) is not None})
    return Sampling(**values | {"stop": tuple(values["stop"] or ()) or None}, seed=seed)


def record_seed(job_seed: int, record: InputRecord, sample: int) -> int:
    """The seed of one sample: the record's own plus the sample number, else derived from the job's."""
    base = record.sampling.seed if record.sampling and record.sampling.seed is not None else None
    return base + sample if base is not None else derive_seed(job_seed, record.id, sample)


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
    #: output ids an earlier run made (from checkpoints): the engine continues after them, and
    #: the result covers them too (docs/architecture.md, "Tokens as they are made")
    prefix_ids: list[int] = field(default_factory=list)
    #: the engine's id for this request (abort by id); unique per run of the sample
    request_id: str = ""


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
    #: the output ended inside its think block (no </think>): reasoning only, no answer
    in_thinking: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenDelta:
    """What a request's stream yields: the output ids made since the last delta; the last
    delta also carries the whole result (finish reason, usage, engine facts)."""

    ids: list[int]
    result: GenResult | None = None


def prompt_digest(ids: list[int]) -> str:
    """A short fingerprint of the prompt ids an engine saw, stored on the record so an
    export that rebuilds the ids (re-rendering the template) can prove it got them exactly."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def derive_seed(job_seed: int, record_id: str, sample: int) -> int:
    """A per-request seed that a regenerated chunk asks for again (stable across processes)."""
    digest = hashlib.blake2b(f"{job_seed}\x00{record_id}\x00{sample}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & 0x7FFFFFFF


_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection on 64 bits whose output bits each depend on every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def draw(seed: int, position: int) -> float:
    """The uniform in [0, 1) that picks a sample's token at output `position`: a function of (seed,
    position) alone, so a sample continued at any position draws what its uninterrupted run drew
    there, never its first draws again (docs/architecture.md, "Tokens as they are made")."""
    return (mix64((seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64) >> 11) * 2.0**-53


def continued_seed(seed: int, position: int) -> int:
    """The seed of a request that continues a sample after `position` output ids, for an engine
    whose random stream starts afresh with each request (vLLM, SGLang): derived from (seed, position),
    so the continued tail does not replay the draws that made the sample's head."""
    if position == 0:
        return seed
    return mix64((seed << 32 ^ position) & _MASK64) & 0x7FFFFFFF

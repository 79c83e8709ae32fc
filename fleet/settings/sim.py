"""The sim engine's settings (FLEET_SIM__*).

One section of the settings part, beside the others: fleet.settings composes it, and the
sim engine (fleet.engines.sim) reads it, so the settings never import the engines.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field

from fleet.settings.engine import EngineSettings


class SimSettings(EngineSettings):
    """A simulated GPU: continuous batching with a slot limit and a fixed step time."""

    max_running: int = Field(256, ge=1, description="concurrent requests (engine slots)")
    step_s: float = Field(0.0005, ge=0, description="seconds per decode step (one token per running request)")
    prefill_s: float = Field(0.0, ge=0, description="seconds of prefill per request")
    prefill_s_per_token: float = Field(
        0.0, ge=0, description="seconds of a slot per token prefilled, the prompt's and a continued sample's ids "
        "alike: a continuation pays for its prefix again, as on a GPU (fleet bench preemption)",
    )
    start_s: float = Field(
        0.0, ge=0, description="seconds the engine takes to start, as a real one loads its weights for minutes "
        "(fleet bench preemption)",
    )
    mean_output_tokens: float = Field(256, gt=0, description="mean output length, tokens")
    sigma: float = Field(0.8, ge=0, description="log-normal spread of output length")
    vocab_size: int | None = Field(
        None, ge=1, description="token ids, for checking pre-tokenized input; unset: not checked"
    )
    fail_ids: list[str] = Field(
        default_factory=list, description="record ids the engine rejects (fault tests)"
    )
    engine_error_chunks: list[int] = Field(
        default_factory=list, description="chunk indexes whose run kills the engine (fault tests)"
    )
    fault_chunks: list[int] = Field(
        default_factory=list, validation_alias=AliasChoices("fault_chunks", "crash_chunks"),
        description="chunk indexes whose run fails by the chunk's own fault, spending attempts (fault tests; "
        "old name crash_chunks still read)",
    )
    kill_chunks: list[int] = Field(
        default_factory=list, description="chunk indexes whose run SIGKILLs the worker process (fault tests)"
    )
    stall_after_s: float | None = Field(
        None, ge=0, description="seconds after start when the engine stops making tokens without dying, its "
        "requests left waiting forever, as a hung GPU engine (fault tests of the watchdog)",
    )
    leak_process: bool = Field(
        False, description="the engine starts a helper process in a session of its own and never ends it, as "
        "an engine whose processes outlive a killed worker (fault tests)",
    )
    trace_dir: str | None = Field(
        None, description="directory where each process appends a line per finished sample to <pid>.jsonl "
        "(fault tests: which samples were made twice, and by which process)"
    )

    def requests_at_once(self) -> int:
        """S, the requests the engine runs at once."""
        return self.max_running

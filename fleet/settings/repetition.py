"""The repetition stop's settings (FLEET_REPETITION__*), part of a job's configuration; the
watch that applies them to a request's stream is fleet.model.repetition."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

#: Periods (block lengths in tokens) the watch looks for: the loops seen on Qwen3-family
#: models are blocks of a few tokens; a bound keeps the cost per token bounded too.
MAX_PERIOD = 64
#: Tokens a cycle must cover (all its copies together) before it stops a request. Healthy
#: text repeats short blocks too: period-1 runs (indentation, `=====` and `^^^^` rules, digit
#: strings), box-drawing rules, a list item or a line of code written a few times. In 2.2 M
#: tokens of standard-library source, licences and readmes (the tiny model's 1K-token
#: vocabulary, which splits text about three times finer than a production one) the longest
#: such cycle covers 238 tokens (a `^^^^` underline); tests/test_repetition.py holds the
#: margin. A loop stopped at 512 tokens instead of 32,768 still saves 98% of it, so a wide
#: margin costs little.
MIN_TOKENS = 512
#: Whole copies of the block a cycle must hold as well. At the default bound this is the same
#: 512 tokens for a 64-token block (8 x 64); it binds only for a raised max_period, where a
#: few copies of a long paragraph would otherwise cover MIN_TOKENS. A short block needs many
#: more copies anyway: a 3-token block covering 512 tokens is 170 copies.
MIN_REPEATS = 8


class RepetitionSettings(BaseModel):
    """The repetition stop of a job (FLEET_REPETITION__*): part of the job's configuration,
    since a stopped row keeps fewer tokens than an unstopped one."""

    enabled: bool = Field(True, description="abort a request whose output ends in an exact cycle (finish reason "
                          "`repetition`)")
    max_period: int = Field(MAX_PERIOD, ge=1, description="tokens: the longest repeated block looked for")
    min_tokens: int = Field(MIN_TOKENS, ge=2, description="tokens the cycle must cover (all its copies together) "
                            "before the request is stopped")
    min_repeats: int = Field(MIN_REPEATS, ge=2, description="whole copies of the block the cycle must hold too")

    def job_config(self) -> dict[str, Any] | None:
        """What the job's configuration records: the thresholds, or None when off (a job with
        the stop off is configured like one made before the stop existed)."""
        return self.model_dump() if self.enabled else None

    @classmethod
    def of_job(cls, config: dict[str, Any]) -> RepetitionSettings:
        """The stop a job was enqueued with (its manifest's config); off where none is recorded."""
        recorded = config.get("repetition")
        return cls.model_validate(recorded) if recorded else cls(enabled=False)

"""A record's prompt_tokens held to the prompt it was made from: the chunk's input record counted as its
worker counted it (EngineSpec.prompt_counter: pre-tokenized ids as given, else the prompt rendered by
the job's tokenizer; turn k of a conversation over the turns before it, fleet.model.turns). The count
also places the context's end (fleet.audit.checks), so a wrong one must not move that check.

Rendering costs a chat template per record: `fleet verify` and `fleet export` count, the worker's
commit does not (its counts are that very rendering's).
"""

from __future__ import annotations

from typing import Any

from fleet.engines.base import PromptCount
from fleet.engines.specs import spec_for
from fleet.errors import FleetError
from fleet.model.turns import turn_prompt
from fleet.records import InputRecord
from fleet.store.manifest import Manifest


class PromptTokens:
    """Counts prompts as a job's worker did; the tokenizer is loaded on first use."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self._count: PromptCount | None = None

    def count(self, record: InputRecord, before: list[dict[str, Any]] | None) -> int:
        """The prompt tokens of `record`, or of its turn after the turns `before` (None: not a conversation
        record). Raises FleetError when that prompt cannot be built."""
        if self._count is None:
            config = self.manifest.config
            self._count = spec_for(config.get("engine", "")).prompt_counter(config, self.manifest.job)
        if before is None:
            return self._count(record, None)
        try:
            messages = turn_prompt(record.messages or [], before)
        except ValueError as e:
            raise FleetError(str(e)) from e
        return self._count(record, messages)


def prompt_problems(out: dict[str, Any], counted: int) -> list[str]:
    if out["prompt_tokens"] == counted:
        return []
    return [f"prompt_tokens: {out['prompt_tokens']}, its prompt is {counted} tokens"]

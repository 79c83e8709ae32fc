"""What every engine's settings section answers (FLEET_<ENGINE>__*), whatever the engine.

Each engine's section (fleet/settings/<engine>.py) builds on it; fleet.settings composes
them, and the engines read them: the settings part never imports the engines.
"""

from __future__ import annotations

from abc import abstractmethod

from pydantic import BaseModel, Field

#: Output tokens between two deltas of one request's stream. SGLang and vLLM wake the worker's
#: loop once per delta and request; 16 keeps that cost out of sight (`fleet bench`) while a
#: stopped request loses at most 16 tokens more than its last checkpoint says.
DEFAULT_STREAM_INTERVAL = 16


class EngineSettings(BaseModel):
    """The contract of an engine's settings: how many requests it runs at once (S, which sizes
    K and the admission gate) and how often a request's stream reports its new tokens."""

    stream_interval: int = Field(
        DEFAULT_STREAM_INTERVAL, ge=1,
        description="output tokens between two deltas of a request's stream (SGLang's and vLLM's "
        "stream_interval; hf: decode steps; sim: simulated tokens)",
    )

    @abstractmethod
    def requests_at_once(self) -> int:
        """S, the requests the engine runs at once."""

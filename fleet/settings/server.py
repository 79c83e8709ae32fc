"""The server engine's settings (FLEET_SERVER__*).

One section of the settings part, beside the others: fleet.settings composes it, and the
server engine (fleet.engines.server) reads it, so the settings never import the engines.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleet.settings.engine import EngineSettings

#: S for the server engine where unset: requests one worker keeps in flight at the server
DEFAULT_SERVER_RUNNING = 64


class ServerSettings(EngineSettings):
    """An inference server that fleet's workers send requests to instead of embedding an engine
    (docs/architecture.md, "Engines": the server engine). FLEET_MODEL stays the model's own files
    (tokenizer, chat template, generation_config.json): prompts are rendered and counted by fleet."""

    base_url: str | None = Field(None, description="the server's root URL (http://host:8000), without /v1")
    api: Literal["auto", "vllm", "sglang", "openai"] = Field(
        "auto",
        description="vllm: /v1/completions with token-id prompts and returned token ids; sglang: native /generate "
        "with input_ids; openai: text prompts and text out (a stopped record restarts from token 0); auto: asked "
        "of the server at start (vLLM's /version, SGLang's /get_model_info, else openai)",
    )
    model: str | None = Field(None, description="the served model's name; unset: the one the server lists")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="the environment variable that holds the server's API key (sent as a bearer "
        "token where set); the key itself is never a setting"
    )
    max_running: int = Field(DEFAULT_SERVER_RUNNING, ge=1, description="requests a worker keeps in flight at once")
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds to connect to the server")
    read_timeout_s: float = Field(
        600.0, gt=0, description="seconds without a byte of a request's stream before the server counts as down"
    )
    start_timeout_s: float = Field(
        600.0, gt=0, description="seconds a starting worker waits for the server to answer (a server still loading)"
    )
    retries: int = Field(
        3, ge=0, description="times a request refused by a 5xx or a lost connection is sent again (doubling backoff "
        "from 0.5 s) before the server counts as down (EngineUnavailable: the chunk is requeued with backoff)"
    )

    def requests_at_once(self) -> int:
        return self.max_running

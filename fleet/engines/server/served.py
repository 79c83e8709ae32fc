"""What an inference server says about itself: which API it speaks, the model it serves, and that
model's context and revision where it reports them. Read when the engine starts and for the engine
identity (fleet.engines.server.spec), so a job never mixes servers that serve different models.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from fleet.engines.server.api import REFUSING_STATUSES, ApiName
from fleet.engines.server.client import get_json, message_of
from fleet.engines.server.refusal import refusal
from fleet.errors import ConfigError, EngineUnavailable
from fleet.settings import ServerSettings

log = logging.getLogger(__name__)
WAIT_POLL_S = 2.0


@dataclass(frozen=True)
class ServerFacts:
    api: ApiName
    #: the served model's name (what requests name)
    model: str
    #: where the server loaded it from (vLLM's `root`, SGLang's `model_path`)
    root: str | None = None
    #: the weights' revision where the server reports one (SGLang's `weight_version`)
    revision: str | None = None
    #: prompt + output tokens a request may hold (vLLM's `max_model_len`)
    context: int | None = None

    def identity(self) -> dict[str, Any]:
        """What shapes tokens: the API, the served model and its revision (not the URL: replicas of one
        deployment are one engine; not the context, which only clips)."""
        return {k: v for k, v in asdict(self).items() if k != "context"}


def server_facts(s: ServerSettings) -> ServerFacts:
    """Asked of the server now; a server that cannot be reached raises EngineUnavailable, one that
    refuses fleet's key or the model AccessRefused (a ConfigError: waiting would not help)."""
    if not s.base_url:
        raise ConfigError("engine server needs the server's URL: set FLEET_SERVER__BASE_URL (http://host:port)")
    try:
        return _ask(s)
    except httpx.HTTPStatusError as e:
        status = e.response.status_code
        if status in REFUSING_STATUSES:
            raise refusal(s, status, e.request.url.path, message_of(e.response.text), s.model) from e
        raise EngineUnavailable(f"the server at {s.base_url} refused {e.request.url.path}: "
                                f"{e.response.status_code}") from e
    except httpx.TransportError as e:
        raise EngineUnavailable(f"the server at {s.base_url} cannot be reached: {type(e).__name__}: {e}") from e


def _ask(s: ServerSettings) -> ServerFacts:
    api = s.api
    sglang = get_json(s, "/get_model_info") if api in ("auto", "sglang") else None
    if api == "auto":
        api = "sglang" if sglang is not None else "vllm" if get_json(s, "/version") is not None else "openai"
    models = (get_json(s, "/v1/models") or {}).get("data") or []
    names = [m.get("id") for m in models]
    if s.model is not None and names and s.model not in names:
        raise ConfigError(f"the server at {s.base_url} serves {names}, not server.model {s.model!r}")
    if s.model is None and len(names) != 1:
        raise ConfigError(f"the server at {s.base_url} serves {names or 'no model it lists'}: name one in "
                          "FLEET_SERVER__MODEL")
    model = s.model or names[0]
    card = next((m for m in models if m.get("id") == model), {})
    if sglang is not None:
        return ServerFacts(api, model, sglang.get("model_path"), sglang.get("weight_version"),
                           card.get("max_model_len"))
    return ServerFacts(api, model, card.get("root"), card.get("revision"), card.get("max_model_len"))


def wait_for_server(s: ServerSettings) -> ServerFacts:
    """The facts, once the server answers (a server still loading its model refuses connections), within
    `start_timeout_s`; then the last EngineUnavailable goes up."""
    deadline = time.monotonic() + s.start_timeout_s
    while True:
        try:
            return server_facts(s)
        except EngineUnavailable as e:
            if time.monotonic() >= deadline:
                raise
            log.info("waiting for the server: %s", e)
        time.sleep(WAIT_POLL_S)

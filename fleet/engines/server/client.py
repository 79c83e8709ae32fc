"""The server engine's HTTP: one streamed request (server-sent events) with its retries, and what
the server says about itself.

A request refused with a 5xx, or whose connection fails, before anything of its answer came, is sent
again (`server.retries`, backoff doubling from 0.5 s); past that, or once its answer has begun, the
error goes up for the engine to sort (fleet.engines.server.engine). Closing the stream closes the
request's connection: that is how a request is aborted (vLLM's and SGLang's servers abort a request
whose client went away).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from fleet.engines.server.api import RETRIED_STATUSES, ServerRefused
from fleet.settings import ServerSettings

BACKOFF_S = 0.5


def headers(s: ServerSettings) -> dict[str, str]:
    key = os.environ.get(s.api_key_env)
    return {"Authorization": f"Bearer {key}"} if key else {}


def timeout(s: ServerSettings) -> httpx.Timeout:
    return httpx.Timeout(connect=s.connect_timeout_s, read=s.read_timeout_s, write=s.read_timeout_s, pool=None)


def transient(error: Exception) -> bool:
    """Whether the server may answer the same request if asked again."""
    if isinstance(error, ServerRefused):
        return error.status >= 500 or error.status in RETRIED_STATUSES
    return isinstance(error, httpx.TransportError)


def message_of(body: str) -> str:
    """The server's own words in an error body: vLLM's `{"error": {"message"}}`, its and SGLang's auth
    middleware's `{"error": "Unauthorized"}`, FastAPI's `{"detail"}`, else the body."""
    try:
        error = json.loads(body)
    except ValueError:
        return body[:2000]
    message = error.get("error", error.get("detail", error)) if isinstance(error, dict) else error
    if isinstance(message, dict):
        message = message.get("message", message)
    return str(message)[:2000]


async def refused(response: httpx.Response) -> ServerRefused:
    return ServerRefused(response.status_code, message_of((await response.aread()).decode(errors="replace")))


async def stream_lines(client: httpx.AsyncClient, s: ServerSettings, path: str, body: dict[str, Any]
                       ) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of one streamed answer, in order; sent again while nothing came and the
    failure is transient, up to `s.retries` times."""
    attempt = 0
    while True:
        began = False
        try:
            async with client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    raise await refused(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    began = True
                    yield json.loads(data)
                return
        except Exception as e:
            if began or attempt >= s.retries or not transient(e):
                raise
        attempt += 1
        await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))


def get_json(s: ServerSettings, path: str) -> Any | None:
    """GET a JSON document (None: the server has no such path); connection errors go up."""
    text = get_text(s, path)
    return None if text is None else json.loads(text)


def get_text(s: ServerSettings, path: str) -> str | None:
    """GET a document's text (None: the server has no such path); connection errors go up."""
    assert s.base_url is not None
    response = httpx.get(s.base_url.rstrip("/") + path, headers=headers(s), timeout=timeout(s))
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.text

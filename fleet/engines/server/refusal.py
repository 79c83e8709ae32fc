"""What to fix when a server refuses fleet itself: one line per refusing status (401: the key,
403: its permission, 404: the model or the API), read from the status alone, the server's own
message quoted. vLLM's server guards every /v1 path with its `--api-key` (401 `Unauthorized`);
SGLang's every path but health and metrics (401 `Unauthorized`, 403 `Forbidden` for an admin path
without an admin key); vLLM answers a model it does not serve 404 (`NotFoundError`), and both a path
they do not have 404 (docs/architecture.md, "Engines": the server engine).
"""

from __future__ import annotations

import os

from fleet.errors import AccessRefused
from fleet.settings import ServerSettings


def refusal(s: ServerSettings, status: int, path: str, message: str, model: str | None = None) -> AccessRefused:
    """The one-line error for a 401, 403 or 404 from the server at `s.base_url` on `path`."""
    where, said = f"the server at {s.base_url}", f"{path}: {status} {message}".strip()
    keyed = bool(os.environ.get(s.api_key_env))
    if status == 401 and not keyed:
        fix = f"asks for an API key ({said}): put it in ${s.api_key_env} (FLEET_SERVER__API_KEY_ENV names the variable)"
    elif status == 401:
        fix = f"refuses the API key in ${s.api_key_env} ({said}): set it to a key the server accepts"
    elif status == 403:
        fix = f"forbids {path} to the API key in ${s.api_key_env} ({said}): use a key the server lets run it"
    else:
        named = f"model {model!r}" if model else "no model"
        fix = (f"has no {path} for {named} ({said}): set FLEET_SERVER__MODEL to a model it serves (GET /v1/models) "
               f"and FLEET_SERVER__API to the API it speaks (auto: asked of the server), now {s.api!r}")
    return AccessRefused(f"{where} {fix}")

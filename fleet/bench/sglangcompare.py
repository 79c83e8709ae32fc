"""Fleet against the bare SGLang Engine: the same prompts through `fleet run --engine sglang`
and through a plain `sglang.Engine` fed every request at once as streams, as the worker feeds it,
both greedy, same max tokens and the same engine kwargs (the worker's `engine_kwargs`, from the
usual FLEET_* settings: incremental streaming output, its stream interval).

The ratio of their output tok/s is what fleet's machinery costs around SGLang: the broker,
chunk reads and commits, templating on the worker, the admission gate. Each side's clock
starts after its engine is up (the bare loop times from its first request; fleet's from its
first chunk's start). Interleaved pairs, their median ratio (fleet.bench.pairs). Each side runs
in its own process, because `Engine.shutdown()` kills
every child of its caller.

On a machine without a GPU this runs the real Engine on the CPU where SGLang can be made to
(BENCHMARKS.md has the command: a test-side kernel loader, device="cpu", a bounded pool).
Run alone, this module is the bare loop: `python -m fleet.bench.sglangcompare --input
PROMPTS --max-tokens 64` prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import read_job, throughput
from fleet.bench.pairs import run_pairs
from fleet.bench.procs import json_from_stdout, read_requests, run_fleet, write_prompts
from fleet.bench.report import Section
from fleet.errors import ConfigError, FleetError
from fleet.store import open_store


def require_sglang() -> None:
    """A clear refusal where sglang is not installed, before any process is started."""
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError(
            "`fleet bench --engine sglang` on the CPU needs the sglang package (ops/sglang-venv.sh) and the "
            "test-side kernel loader on PYTHONPATH (tests/sglang_cpu): see BENCHMARKS.md"
        )


def bare_generate(prompts_path: str, max_tokens: int) -> dict[str, Any]:
    """A plain Engine with the worker's kwargs (incremental streaming, its stream interval), used
    as the worker uses it: every prompt rendered as fleet renders it, one streamed
    `async_generate` per request, all at once on the Engine's loop; timed from rendering, after
    the engine is up."""
    import asyncio

    import sglang

    from fleet.engines.sglang.engine import engine_kwargs
    from fleet.model.prompting import load_tokenizer, model_facts, render_ids
    from fleet.settings import load_settings

    settings = load_settings()
    kwargs = engine_kwargs(settings)
    engine = sglang.Engine(**kwargs)

    async def one(ids: list[int], params: dict[str, Any]) -> int:
        tokens = 0
        async for out in await engine.async_generate(input_ids=ids, sampling_params=params, stream=True):
            tokens += len(out.get("output_ids") or [])  # incremental: only the new ids
        return tokens

    try:
        tok = load_tokenizer(settings.model or "")
        eos = model_facts(settings)["sampling"]["eos_token_ids"]
        requests = read_requests(prompts_path, max_tokens, settings.enable_thinking)
        params = {"temperature": 0.0, "max_new_tokens": max_tokens, "stop_token_ids": eos}
        began = time.perf_counter()
        prompts = [render_ids(tok, r) for r in requests]  # templated as the worker templates them
        tokens = sum(engine.loop.run_until_complete(asyncio.gather(*(one(p, params) for p in prompts))))
        seconds = time.perf_counter() - began
    finally:
        engine.shutdown()
    return {"prompts": len(prompts), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "max_running_requests": kwargs["max_running_requests"]}  # fmt: skip


def run_bare(workdir: Path, prompts: Path, max_tokens: int, env: dict[str, str]) -> dict[str, Any]:
    args = ["--input", str(prompts), "--max-tokens", str(max_tokens)]
    done = subprocess.run([sys.executable, "-m", "fleet.bench.sglangcompare", *args], env=env,
                          capture_output=True, text=True, timeout=1200, cwd=workdir)  # fmt: skip
    if done.returncode != 0:
        raise FleetError(f"bare sglang loop exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json_from_stdout(done)


def run_fleet_side(workdir: Path, prompts: Path, n: int, max_tokens: int, chunk_size: int,
                   env: dict[str, str], i: int = 0) -> dict[str, Any]:  # fmt: skip
    data_dir = workdir / f"sglang-fleet-{i}"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {**env, "FLEET_DATA_DIR": str(data_dir), "FLEET_SAMPLING__MAX_TOKENS": str(max_tokens),
           "FLEET_SAMPLING__TEMPERATURE": "0", "FLEET_CHUNK_SIZE": str(chunk_size)}  # fmt: skip
    args = ["run", str(prompts), "--job", "sglang-bench", "--engine", "sglang", "--workers", "1"]
    run_fleet(args, env, 1200, workdir)
    chunks = -(-n // chunk_size)
    run = read_job(open_store(str(data_dir / "store")), "sglang-bench", chunks)
    return {"prompts": n, "tokens": run.tokens, "seconds": run.makespan_s, "tok_s": throughput(run), "chunks": chunks}


def measure_sglang_vs_bare(workdir: Path, env: dict[str, str], prompts_n: int, max_tokens: int,
                           chunk_size: int, pairs: int = 3, min_window_s: float = 0.0,
                           log: Path | None = None) -> Section:  # fmt: skip
    """Interleaved pairs on the same prompts and settings (fleet.bench.pairs), their median ratio."""
    require_sglang()
    workdir.mkdir(parents=True, exist_ok=True)

    def fleet(n: int, i: int) -> dict[str, Any]:
        prompts = write_prompts(workdir / f"prompts-{n}.jsonl", n)
        return run_fleet_side(workdir, prompts, n, max_tokens, chunk_size, env, i)

    def bare(n: int, i: int) -> dict[str, Any]:
        return run_bare(workdir, write_prompts(workdir / f"prompts-{n}.jsonl", n), max_tokens, env)

    result = run_pairs(fleet, bare, pairs, prompts_n, min_window_s, chunk_size, cap=8 * prompts_n, log=log)
    note = (f"{result.prompts} prompts, {max_tokens} max tokens, chunks of {chunk_size}, "
            f"S={result.bare[0]['max_running_requests']}")  # fmt: skip
    figures = result.figures("fleet tok/s / bare Engine tok/s", None, note, "fleet", "bare sglang.Engine (streamed)")
    data = {"max_tokens": max_tokens, "chunk_size": chunk_size, **result.data()}
    return Section("sglang", "fleet vs the bare SGLang Engine", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.sglangcompare", description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(bare_generate(args.input, args.max_tokens)))


if __name__ == "__main__":
    main()

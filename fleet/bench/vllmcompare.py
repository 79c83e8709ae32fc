"""Fleet against the bare vLLM engine: the tiny model through `fleet run --engine vllm` versus a
plain AsyncLLM loop that submits the same prompt ids at once and reads their DELTA streams, as
the worker does, with the same engine args (its stream interval included).

Both sides decode greedily with the same max tokens, so the ratio of their output tok/s is
what fleet's machinery costs on top of vLLM: the broker, chunk reads and commits, templating
on the worker, the admission gate and K chunk slots feeding one engine. Timing starts once
each engine has started: fleet's is its job window (first chunk start to last result), the
bare loop's from its first submit to its last output. The bare loop runs in its own process
like the worker does. Interleaved pairs, their median ratio: fleet.bench.pairs.

Run alone, this module is the bare loop: `python -m fleet.bench.vllmcompare --model DIR
--input PROMPTS --max-tokens 64 --out RESULT.json` (FLEET_VLLM__* set the engine) writes one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import read_job, throughput
from fleet.bench.pairs import run_pairs
from fleet.bench.procs import clean_env, read_requests, run_fleet, write_prompts
from fleet.bench.report import Section
from fleet.errors import FleetError
from fleet.store import open_store

VLLM_TARGET = 0.9
#: the engine both sides run: the dense tiny model in float32, a bounded KV cache, 32 at once
ENGINE_ENV = {
    "FLEET_VLLM__DTYPE": "float32",
    "FLEET_VLLM__KV_CACHE_MEMORY_BYTES": str(256 << 20),
    "FLEET_VLLM__MAX_NUM_SEQS": "32",
}


def bare_generate(model: str, prompts_path: str, max_tokens: int) -> dict[str, Any]:
    """A plain AsyncLLM loop over fleet's own rendering of the prompts, every request at once."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from fleet.engines.vllm.plan import engine_kwargs
    from fleet.model.prompting import load_tokenizer, model_facts, render_ids
    from fleet.settings import Settings

    settings = Settings(engine="vllm", model=model)
    tok = load_tokenizer(model)
    eos = model_facts(settings)["sampling"]["eos_token_ids"]
    ids = [render_ids(tok, r) for r in read_requests(prompts_path, max_tokens)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=eos,
                            output_kind=RequestOutputKind.DELTA)  # streamed, as the worker reads it

    async def run() -> tuple[int, float]:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(settings)))

        async def one(i: int, prompt: list[int]) -> int:
            tokens = 0
            async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"bare-{i}"):
                tokens += len(out.outputs[0].token_ids)  # DELTA: only the new ids
            return tokens

        try:
            await one(-1, ids[0])  # the first request pays one-time warm-up, as fleet's engine start does
            began = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(ids))))
            return tokens, time.perf_counter() - began
        finally:
            engine.shutdown()

    tokens, seconds = asyncio.run(run())
    return {"prompts": len(ids), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def run_bare(workdir: Path, model: Path, prompts: Path, max_tokens: int) -> dict[str, Any]:
    out = workdir / "vllm-bare.json"
    args = ["--model", str(model), "--input", str(prompts), "--max-tokens", str(max_tokens), "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "fleet.bench.vllmcompare", *args],
                          env=clean_env(workdir, ENGINE_ENV), capture_output=True, text=True, timeout=1200, cwd=workdir)
    if done.returncode != 0 or not out.is_file():
        raise FleetError(f"bare AsyncLLM loop exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def run_fleet_vllm(workdir: Path, model: Path, prompts: Path, n: int, max_tokens: int, chunk: int) -> dict[str, Any]:
    data_dir = workdir / "vllm-fleet"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = clean_env(workdir, {
        "FLEET_DATA_DIR": str(data_dir),
        "FLEET_SAMPLING__MAX_TOKENS": str(max_tokens),
        "FLEET_SAMPLING__TEMPERATURE": "0",
        "FLEET_CHUNK_SIZE": str(chunk),
        **ENGINE_ENV,
    })
    run_fleet(["run", str(prompts), "--job", "vllm", "--engine", "vllm", "--model", str(model), "--workers", "1"],
              env, 1200, workdir)
    chunks = -(-n // chunk)
    run = read_job(open_store(str(data_dir / "store")), "vllm", chunks)
    return {"prompts": n, "tokens": run.tokens, "seconds": run.makespan_s, "tok_s": throughput(run), "chunks": chunks}


def measure_vllm(prompts_n: int, max_tokens: int, chunk: int, workdir: Path, pairs: int = 3,
                 min_window_s: float = 0.0, log: Path | None = None) -> Section:  # fmt: skip
    """Interleaved pairs on the same prompts and engine (fleet.bench.pairs), their median ratio."""
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)

    def fleet(n: int, i: int) -> dict[str, Any]:
        return run_fleet_vllm(workdir, model, write_prompts(workdir / f"prompts-{n}.jsonl", n), n, max_tokens, chunk)

    def bare(n: int, i: int) -> dict[str, Any]:
        return run_bare(workdir, model, write_prompts(workdir / f"prompts-{n}.jsonl", n), max_tokens)

    result = run_pairs(fleet, bare, pairs, prompts_n, min_window_s, chunk, cap=8 * prompts_n, log=log)
    note = f"{result.prompts} prompts, {max_tokens} max tokens, chunks of {chunk}"
    figures = result.figures("fleet tok/s / bare AsyncLLM tok/s", VLLM_TARGET, note, "fleet",
                             "bare AsyncLLM loop (DELTA streams)")
    data = {"max_tokens": max_tokens, "chunk_size": chunk, "engine": ENGINE_ENV, **result.data()}
    return Section("vllm", "fleet vs bare engine (vllm tiny model, CPU)", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.vllmcompare", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", required=True, help="result JSON (vLLM prints its own lines to stdout)")
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(bare_generate(args.model, args.input, args.max_tokens)))


if __name__ == "__main__":
    main()

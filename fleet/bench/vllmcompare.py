"""Fleet against the bare vLLM engine: the tiny model through `fleet run --engine vllm` versus a
plain AsyncLLM loop that submits the same prompt ids at once, with the same engine args.

Both sides decode greedily with the same max tokens, so the ratio of their output tok/s is
what fleet's machinery costs on top of vLLM: the broker, chunk reads and commits, templating
on the worker, the admission gate and K chunk slots feeding one engine. Timing starts once
each engine has started: fleet's is its job window (first chunk start to last result), the
bare loop's from its first submit to its last output. The bare loop runs in its own process
like the worker does.

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
from fleet.bench.procs import clean_env, run_fleet, write_prompts
from fleet.bench.report import Figure, Section, at_least, best_of_each
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
    from fleet.records import GenRequest, Message, Sampling
    from fleet.settings import Settings

    settings = Settings(engine="vllm", model=model)
    tok = load_tokenizer(model)
    eos = model_facts(settings)["sampling"]["eos_token_ids"]
    records = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line]
    ids = [render_ids(tok, GenRequest(record_id=r["id"], chunk=0, sample=0, sampling=Sampling(),
                                      messages=[Message(**m) for m in r["messages"]], enable_thinking=True))
           for r in records]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=eos,
                            output_kind=RequestOutputKind.FINAL_ONLY)

    async def run() -> tuple[int, float]:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(settings)))

        async def one(i: int, prompt: list[int]) -> int:
            last = None
            async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"bare-{i}"):
                last = out
            return len(last.outputs[0].token_ids) if last else 0

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


def measure_vllm(prompts_n: int, max_tokens: int, chunk: int, workdir: Path, repeats: int = 2) -> Section:
    """Each side `repeats` times, alternating, and the best of each compared: two shared cores
    make single runs noisy."""
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)
    prompts = write_prompts(workdir / f"prompts-{prompts_n}.jsonl", prompts_n)
    bares, fleets = [], []
    for _ in range(repeats):
        bares.append(run_bare(workdir, model, prompts, max_tokens))
        fleets.append(run_fleet_vllm(workdir, model, prompts, prompts_n, max_tokens, chunk))
    bare, fleet, ratio = best_of_each(bares, fleets)
    figures = [
        at_least("fleet tok/s / bare AsyncLLM tok/s", round(ratio, 4), VLLM_TARGET,
                 note=f"best of {repeats}; {prompts_n} prompts, {max_tokens} max tokens, chunks of {chunk}"),
        Figure("fleet", fleet["tok_s"], "tok/s", note=f"{fleet['tokens']:,} tokens"),
        Figure("bare AsyncLLM loop", bare["tok_s"], "tok/s", note=f"{bare['tokens']:,} tokens"),
    ]
    data = {"prompts": prompts_n, "max_tokens": max_tokens, "chunk_size": chunk, "engine": ENGINE_ENV,
            "ratio": ratio, "bare": bares, "fleet": fleets}
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

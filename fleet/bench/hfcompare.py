"""Fleet against the bare engine: the tiny `hf` model through `fleet run` versus fleet's own
`HfEngine` object fed every prompt at once, in a process of its own, with no worker around it.

Both sides run the same engine code, batch size, max tokens and torch threads and decode
greedily, so the ratio of their output tok/s is what the worker costs around the engine:
Celery, the broker, chunk reads, the stream reading and checkpoints, the commit, the
worker's other threads taking the GIL from the batching loop. Both sides also count their
process's CPU seconds over the window (the worker's, sampled; the engine is in-process on
both sides), whose tokens-per-CPU-second ratio other processes on the machine barely move. (Before issue 24 the bare
side was a plain `model.generate` loop, which also counted the engine's own per-row
sampler and stopper as fleet's.) Interleaved pairs, their median ratio: fleet.bench.pairs.

Run alone, this module is the bare side: `python -m fleet.bench.hfcompare --model DIR
--input PROMPTS --batch 16 --max-tokens 96` prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import read_job, throughput
from fleet.bench.pairs import run_pairs
from fleet.bench.procs import (
    clean_env,
    cpu_between,
    json_from_stdout,
    read_requests,
    run_fleet,
    run_fleet_watching_workers,
    write_prompts,
)
from fleet.bench.profile import Profile
from fleet.bench.report import Section
from fleet.errors import FleetError
from fleet.store import open_store

HF_TARGET = 0.95
#: One torch thread on each side. With two threads on two shared cores, OpenMP's
#: spin-waiting made a run 45x slower whenever another process held one core.
TORCH_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLEET_HF__THREADS": "1"}


def bare_engine(model_dir: str, prompts_path: str, batch: int, max_tokens: int) -> dict[str, Any]:
    """fleet's HfEngine as the worker drives it (every request a stream read to its end, all at
    once on one loop), timed after the model is loaded."""
    from fleet.engines.specs import build_engine
    from fleet.settings import Settings

    settings = Settings(engine="hf", model=model_dir, hf={"max_batch": batch, "threads": 1})
    requests = read_requests(prompts_path, max_tokens)

    engine = build_engine(settings)

    async def run() -> tuple[int, float]:
        await engine.start()
        try:
            began, cpu = time.perf_counter(), time.process_time()
            results = await asyncio.gather(*(engine.generate(r) for r in requests))
            used.append(time.process_time() - cpu)
            return sum(r.completion_tokens for r in results), time.perf_counter() - began
        finally:
            await engine.shutdown()

    used: list[float] = []
    tokens, seconds = asyncio.run(run())
    return {"prompts": len(requests), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "cpu_s": used[0], "batches": getattr(engine, "batches", None)}  # fmt: skip


def run_bare(workdir: Path, model: Path, prompts: Path, profile: Profile) -> dict[str, Any]:
    args = ["--model", str(model), "--input", str(prompts), "--batch", str(profile.hf_batch),
            "--max-tokens", str(profile.hf_max_tokens)]
    done = subprocess.run([sys.executable, "-m", "fleet.bench.hfcompare", *args], env=clean_env(workdir, TORCH_THREADS),
                          capture_output=True, text=True, timeout=600, cwd=workdir)
    if done.returncode != 0:
        raise FleetError(f"bare HfEngine exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json_from_stdout(done)


def run_fleet_hf(workdir: Path, model: Path, prompts: Path, profile: Profile, n: int, i: int) -> dict[str, Any]:
    data_dir = workdir / "hf-fleet"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = clean_env(workdir, {
        "FLEET_DATA_DIR": str(data_dir),
        "FLEET_HF__MAX_BATCH": str(profile.hf_batch),
        "FLEET_SAMPLING__MAX_TOKENS": str(profile.hf_max_tokens),
        "FLEET_SAMPLING__TEMPERATURE": "0",
        "FLEET_CHUNK_SIZE": str(profile.hf_chunk_size),
        **TORCH_THREADS,
    })
    job = f"hf-{i}"
    args = ["run", str(prompts), "--job", job, "--engine", "hf", "--model", str(model), "--workers", "1"]
    cpu = run_fleet_watching_workers(args, env, 600, workdir)
    chunks = -(-n // profile.hf_chunk_size)
    run = read_job(open_store(str(data_dir / "store")), job, chunks)
    return {"prompts": n, "tokens": run.tokens, "seconds": run.makespan_s, "tok_s": throughput(run),
            "cpu_s": cpu_between(cpu, run.first_start, run.last_finish), "chunks": chunks}


def measure_hf(profile: Profile, workdir: Path) -> Section:
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)

    def fleet(n: int, i: int) -> dict[str, Any]:
        return run_fleet_hf(workdir, model, write_prompts(workdir / f"prompts-{n}.jsonl", n), profile, n, i)

    def bare(n: int, i: int) -> dict[str, Any]:
        return run_bare(workdir, model, write_prompts(workdir / f"prompts-{n}.jsonl", n), profile)

    pairs = run_pairs(fleet, bare, profile.hf_repeats, profile.hf_prompts, profile.hf_min_window_s,
                      profile.hf_chunk_size, cap=8 * profile.hf_prompts)
    note = f"{pairs.prompts} prompts, batch {profile.hf_batch}, {profile.hf_max_tokens} max tokens"
    figures = pairs.figures("fleet tok/s / bare HfEngine tok/s", HF_TARGET, note, "fleet", "bare HfEngine")
    data = {"batch": profile.hf_batch, "torch_threads": 1, "max_tokens": profile.hf_max_tokens,
            "chunk_size": profile.hf_chunk_size, **pairs.data()}
    return Section("hf", "fleet vs bare engine (hf tiny model, CPU)", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.hfcompare", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    print(json.dumps(bare_engine(args.model, args.input, args.batch, args.max_tokens)))


if __name__ == "__main__":
    main()

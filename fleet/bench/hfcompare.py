"""Fleet against the bare engine: the tiny `hf` model through `fleet run` versus fleet's own
`HfEngine` object fed every prompt at once, in a process of its own, with no worker around it.

Both sides run the same engine code, batch size, max tokens and torch threads and decode
greedily, so the ratio of their output tok/s is what the worker costs around the engine:
Celery, the broker, chunk reads, the stream reading and checkpoints, the commit, the
worker's other threads taking the GIL from the batching loop. Both sides also count their
process's CPU seconds over the window (the worker's, sampled; the engine is in-process on
both sides), whose tokens-per-CPU-second ratio other processes on the machine barely move. (Before issue 24 the bare
side was a plain `model.generate` loop, which also counted the engine's own per-row
sampler and stopper as fleet's.) Pairs (on a shared core where possible), their median ratio: fleet.bench.pairs.

Run alone, this module is the bare side: `python -m fleet.bench.hfcompare --model DIR
--input PROMPTS --batch 16 --max-tokens 96 --out RESULT.json` writes one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet.bench.feed import feed
from fleet.bench.pairs import Lane, run_pairs
from fleet.bench.procs import clean_env, read_requests, run_fleet, write_prompts
from fleet.bench.profile import Profile
from fleet.bench.report import Section
from fleet.bench.sides import bare_side, fleet_side
from fleet.bench.simjob import SimJob, SimShape
from fleet.bench.workercpu import profile_figures, profiled
from fleet.settings import Settings

HF_TARGET = 0.95
#: One torch thread on each side. With two threads on two shared cores, OpenMP's
#: spin-waiting made a run 45x slower whenever another process held one core.
TORCH_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLEET_HF__THREADS": "1"}


def bare_engine(model_dir: str, prompts_path: str, batch: int, max_tokens: int,
                until: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """fleet's HfEngine as the worker drives it (every request a stream read to its end, all at
    once on one loop; fleet.bench.feed), timed after the model is loaded."""
    from fleet.engines.specs import build_engine

    settings = Settings(engine="hf", model=model_dir, hf={"max_batch": batch, "threads": 1})
    requests = read_requests(prompts_path, max_tokens)
    engine = build_engine(settings)

    async def one(i: int) -> int:
        request = requests[i % len(requests)]
        result = await engine.generate(replace(request, record_id=f"{request.record_id}-{i}"))
        return result.completion_tokens

    async def run() -> dict[str, Any]:
        await engine.start()
        try:
            return await feed(one, len(requests), batch, until)
        finally:
            await engine.shutdown()

    return {**asyncio.run(run()), "batches": getattr(engine, "batches", None)}


def measure_hf(profile: Profile, workdir: Path, together: bool = True) -> Section:
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)

    def fleet(n: int, i: int, lane: Lane) -> dict[str, Any]:
        prompts = write_prompts(workdir / f"prompts-{n}.jsonl", n)
        env = clean_env(workdir, {
            "FLEET_HF__MAX_BATCH": str(profile.hf_batch),
            "FLEET_SAMPLING__MAX_TOKENS": str(profile.hf_max_tokens),
            "FLEET_SAMPLING__TEMPERATURE": "0",
            "FLEET_CHUNK_SIZE": str(profile.hf_chunk_size),
            **TORCH_THREADS,
        })  # fmt: skip
        args = ["run", str(prompts), "--engine", "hf", "--model", str(model), "--workers", "1"]
        return fleet_side(workdir, workdir / "hf-fleet", f"hf-{i}", args, env, n, profile.hf_chunk_size, lane)

    def bare(n: int, i: int, lane: Lane) -> dict[str, Any]:
        args = ["--model", str(model), "--input", str(write_prompts(workdir / f"prompts-{n}.jsonl", n)),
                "--batch", str(profile.hf_batch), "--max-tokens", str(profile.hf_max_tokens)]  # fmt: skip
        return bare_side(workdir, "fleet.bench.hfcompare", args, clean_env(workdir, TORCH_THREADS), lane, "hf")

    pairs = run_pairs(fleet, bare, profile.hf_repeats, profile.hf_prompts, profile.hf_min_window_s,
                      profile.hf_chunk_size, cap=8 * profile.hf_prompts, scratch=workdir, together=together)
    note = f"{pairs.prompts} prompts, batch {profile.hf_batch}, {profile.hf_max_tokens} max tokens"
    figures = pairs.figures("fleet tok/s / bare HfEngine tok/s", HF_TARGET, note, "fleet", "bare HfEngine")
    data = {"batch": profile.hf_batch, "torch_threads": 1, "max_tokens": profile.hf_max_tokens,
            "chunk_size": profile.hf_chunk_size, **pairs.data()}
    if profile.hf_profile:
        data["worker_profile"] = profile_worker(profile, workdir, model, pairs.prompts)
        figures += profile_figures(data["worker_profile"])
    return Section("hf", "fleet vs bare engine (hf tiny model, CPU)", figures, data)


def profile_worker(profile: Profile, workdir: Path, model: Path, prompts: int) -> dict[str, Any]:
    """One job of the pairs' size with the hf worker under fleet.bench.workerprof (its threads'
    CPU, its engine loop under cProfile): where the worker's CPU goes besides the engine's."""
    settings = Settings(engine="hf", chunk_size=profile.hf_chunk_size, hf={"max_batch": profile.hf_batch})
    out = workdir / "workerprof-hf.json"
    shape = SimShape(max_running=profile.hf_batch, chunk_size=profile.hf_chunk_size)  # sizes only: the engine is hf
    job = SimJob("prof-hf", shape, -(-prompts // profile.hf_chunk_size), workers=1, extra_env={
        "FLEET_ENGINE": "hf", "FLEET_MODEL": str(model), "FLEET_HF__MAX_BATCH": str(profile.hf_batch),
        "FLEET_SAMPLING__MAX_TOKENS": str(profile.hf_max_tokens), "FLEET_SAMPLING__TEMPERATURE": "0",
        **TORCH_THREADS})  # fmt: skip
    return profiled(job, workdir, out, settings.resolved_slots(), profile.hf_batch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.hfcompare", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--until", type=Path, help="keep every prompt running until this file exists")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(bare_engine(args.model, args.input, args.batch, args.max_tokens, args.until)))


if __name__ == "__main__":
    main()

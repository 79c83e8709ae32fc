"""Fleet against the bare vLLM engine: the tiny model through `fleet run --engine vllm` versus a
plain AsyncLLM loop that submits the same prompt ids at once and reads their DELTA streams, as
the worker does, with the same engine args (its stream interval included).

Both sides decode greedily with the same max tokens, so the ratio of their output tok/s is
what fleet's machinery costs on top of vLLM: the broker, chunk reads and commits, templating
on the worker, the admission gate and K chunk slots feeding one engine. The bare loop runs in
its own process like the worker does. Pairs, their median ratio, and the window each pair is
counted over: fleet.bench.pairs.

Each side's front end is timed too, over the same window: the worker process's own CPU seconds
(fleet.bench.procs.run_fleet_watching_workers) and the bare process's (its EngineCore, a child,
counted on neither side). With CPU held to the same amount on both sides, every CPU second
the front end spends is taken from the engine, so fleet's extra CPU per request and per token is the
share that explains the ratio, and the figure that carries to a GPU host. Short records weigh
the per-request part (`--max-tokens` sets their length).

Run alone, this module is the bare loop: `python -m fleet.bench.vllmcompare --model DIR
--input PROMPTS --max-tokens 64 --out RESULT.json` (FLEET_VLLM__* set the engine) writes one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from fleet.bench.feed import feed
from fleet.bench.pairs import Lane, run_pairs
from fleet.bench.procs import clean_env, read_requests, run_fleet, write_id_prompts
from fleet.bench.report import Section
from fleet.bench.sides import bare_side, fleet_side

VLLM_TARGET = 0.9
#: the engine both sides run: the dense tiny model in float32, a bounded KV cache, 32 at once
ENGINE_ENV = {
    "FLEET_VLLM__DTYPE": "float32",
    "FLEET_VLLM__KV_CACHE_MEMORY_BYTES": str(256 << 20),
    "FLEET_VLLM__MAX_NUM_SEQS": "32",
}
#: beside each other on a shared CPU (fleet.bench.sharedcore): one torch thread each, and no thread
#: binding of vLLM's own (its automatic binding reserves a CPU for the scheduler and pins the rest)
SHARED_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def bare_generate(model: str, prompts_path: str, max_tokens: int, until: Path | None = None) -> dict[str, Any]:
    """A plain AsyncLLM loop over the prompts' ids (fleet.bench.procs.write_id_prompts, as fleet's
    side reads them), every request at once (fleet.bench.feed)."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from fleet.engines.vllm.plan import engine_kwargs
    from fleet.model.facts import model_end_ids
    from fleet.model.rendering import load_tokenizer, render_ids
    from fleet.settings import Settings

    settings = Settings(engine="vllm", model=model)
    tok = load_tokenizer(model)
    eos = list(model_end_ids(settings.model or ""))
    ids = [render_ids(tok, r) for r in read_requests(prompts_path, max_tokens)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=eos,
                            output_kind=RequestOutputKind.DELTA)  # streamed, as the worker reads it

    async def run() -> dict[str, Any]:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(settings)))

        async def one(i: int) -> int:
            tokens = 0
            prompt = TokensPrompt(prompt_token_ids=ids[i % len(ids)])
            async for out in engine.generate(prompt, params, f"bare-{i}"):
                tokens += len(out.outputs[0].token_ids)  # DELTA: only the new ids
            return tokens

        try:
            await one(-1)  # the first request pays one-time warm-up, as fleet's engine start does
            return await feed(one, len(ids), settings.vllm.requests_at_once(), until)
        finally:
            engine.shutdown()

    return asyncio.run(run())


def measure_vllm(prompts_n: int, max_tokens: int, chunk: int, workdir: Path, pairs: int = 3,
                 min_window_s: float = 0.0, log: Path | None = None, together: bool = True) -> Section:  # fmt: skip
    """Pairs on the same prompts and engine (fleet.bench.pairs), their median ratio."""
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)
    engine_env = {**ENGINE_ENV, **(SHARED_ENV if together else {})}

    def fleet(n: int, i: int, lane: Lane) -> dict[str, Any]:
        prompts = write_id_prompts(workdir / f"ids-{n}.jsonl", n, model)
        env = clean_env(workdir, {"FLEET_SAMPLING__MAX_TOKENS": str(max_tokens), "FLEET_SAMPLING__TEMPERATURE": "0",
                                  "FLEET_CHUNK_SIZE": str(chunk), **engine_env})  # fmt: skip
        args = ["run", str(prompts), "--engine", "vllm", "--model", str(model), "--workers", "1"]
        return fleet_side(workdir, workdir / "vllm-fleet", "vllm", args, env, n, chunk, lane)

    def bare(n: int, i: int, lane: Lane) -> dict[str, Any]:
        args = ["--model", str(model), "--input", str(write_id_prompts(workdir / f"ids-{n}.jsonl", n, model)),
                "--max-tokens", str(max_tokens)]  # fmt: skip
        return bare_side(workdir, "fleet.bench.vllmcompare", args, clean_env(workdir, engine_env), lane, "vllm")

    result = run_pairs(fleet, bare, pairs, prompts_n, min_window_s, chunk, cap=8 * prompts_n, log=log,
                       scratch=workdir, together=together, capped=False)  # it spins: fleet.bench.sharedcore
    note = f"{result.prompts} prompts, {max_tokens} max tokens, chunks of {chunk}"
    figures = result.figures("fleet tok/s / bare AsyncLLM tok/s", VLLM_TARGET, note, "fleet",
                             "bare AsyncLLM loop (DELTA streams)")
    figures += result.front_end_figures()
    data = {"max_tokens": max_tokens, "chunk_size": chunk, "engine": engine_env, **result.data()}
    return Section("vllm", "fleet vs bare engine (vllm tiny model, CPU)", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.vllmcompare", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--until", type=Path, help="keep every prompt running until this file exists")
    parser.add_argument("--out", required=True, help="result JSON (vLLM prints its own lines to stdout)")
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(bare_generate(args.model, args.input, args.max_tokens, args.until)))


if __name__ == "__main__":
    main()

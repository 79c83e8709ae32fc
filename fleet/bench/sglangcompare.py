"""Fleet against the bare SGLang Engine: the same prompts through `fleet run --engine sglang`
and through a plain `sglang.Engine` fed every request at once as streams, as the worker feeds it,
both greedy, same max tokens and the same engine kwargs (the worker's `engine_kwargs`, from the
usual FLEET_* settings: incremental streaming output, its stream interval).

The ratio of their output tok/s is what fleet's machinery costs around SGLang: the broker,
chunk reads and commits, templating on the worker, the admission gate. Each side's clock
starts after its engine is up (the bare loop times from its first request; fleet's from its
first chunk's start). Pairs, their median ratio (fleet.bench.pairs). Each side runs
in its own process, because `Engine.shutdown()` kills
every child of its caller.

On a machine without a GPU this runs the real Engine on the CPU where SGLang can be made to
(BENCHMARKS.md has the command: a test-side kernel loader, device="cpu", a bounded pool).
Run alone, this module is the bare loop: `python -m fleet.bench.sglangcompare --input
PROMPTS --max-tokens 64 --out RESULT.json` writes one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from fleet.bench.feed import feed
from fleet.bench.pairs import Lane, run_pairs
from fleet.bench.procs import read_requests, write_id_prompts
from fleet.bench.report import Section
from fleet.bench.sides import bare_side, fleet_side
from fleet.errors import ConfigError
from fleet.settings import load_settings

#: beside each other on a shared CPU (fleet.bench.sharedcore): one torch thread per process
SHARED_ENV = {"OMP_NUM_THREADS": "1"}


def require_sglang() -> None:
    """A clear refusal where sglang is not installed, before any process is started."""
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError(
            "`fleet bench --engine sglang` on the CPU needs the sglang package (ops/sglang-venv.sh) and the "
            "test-side kernel loader on PYTHONPATH (tests/sglang_cpu): see BENCHMARKS.md"
        )


def bare_generate(prompts_path: str, max_tokens: int, until: Path | None = None) -> dict[str, Any]:
    """A plain Engine with the worker's kwargs (incremental streaming, its stream interval), used
    as the worker uses it: the prompts' ids as fleet's side reads them (fleet.bench.procs.write_id_prompts),
    one streamed `async_generate` per request, all at once on the Engine's loop (fleet.bench.feed),
    timed after the engine is up."""
    import sglang

    from fleet.engines.sglang.engine import engine_kwargs
    from fleet.model.facts import model_end_ids
    from fleet.model.rendering import load_tokenizer, render_ids
    settings = load_settings()
    kwargs = engine_kwargs(settings)
    engine = sglang.Engine(**kwargs)
    tok = load_tokenizer(settings.model or "")
    eos = list(model_end_ids(settings.model or ""))
    requests = read_requests(prompts_path, max_tokens, settings.enable_thinking)
    params = {"temperature": 0.0, "max_new_tokens": max_tokens, "stop_token_ids": eos}

    async def one(i: int) -> int:
        ids = render_ids(tok, requests[i % len(requests)])  # the record's ids, as the worker sends them
        tokens = 0
        async for out in await engine.async_generate(input_ids=ids, sampling_params=params, stream=True):
            tokens += len(out.get("output_ids") or [])  # incremental: only the new ids
        return tokens

    try:
        result = engine.loop.run_until_complete(feed(one, len(requests), kwargs["max_running_requests"], until))
    finally:
        engine.shutdown()
    return {**result, "max_running_requests": kwargs["max_running_requests"]}


def measure_sglang_vs_bare(workdir: Path, env: dict[str, str], prompts_n: int, max_tokens: int,
                           chunk_size: int, pairs: int = 3, min_window_s: float = 0.0,
                           log: Path | None = None, together: bool = True) -> Section:  # fmt: skip
    """Pairs on the same prompts and settings (fleet.bench.pairs), their median ratio."""
    require_sglang()
    workdir.mkdir(parents=True, exist_ok=True)
    model = load_settings().model or ""  # the FLEET_MODEL both sides run, which tokenizes the prompts
    env = {**env, **(SHARED_ENV if together else {})}

    def fleet(n: int, i: int, lane: Lane) -> dict[str, Any]:
        prompts = write_id_prompts(workdir / f"ids-{n}.jsonl", n, model)
        side_env = {**env, "FLEET_SAMPLING__MAX_TOKENS": str(max_tokens), "FLEET_SAMPLING__TEMPERATURE": "0",
                    "FLEET_CHUNK_SIZE": str(chunk_size)}  # fmt: skip
        args = ["run", str(prompts), "--engine", "sglang", "--workers", "1"]
        return fleet_side(workdir, workdir / "sglang-fleet", f"sglang-{i}", args, side_env, n, chunk_size, lane)

    def bare(n: int, i: int, lane: Lane) -> dict[str, Any]:
        args = ["--input", str(write_id_prompts(workdir / f"ids-{n}.jsonl", n, model)), "--max-tokens", str(max_tokens)]
        return bare_side(workdir, "fleet.bench.sglangcompare", args, env, lane, "sglang")

    result = run_pairs(fleet, bare, pairs, prompts_n, min_window_s, chunk_size, cap=8 * prompts_n, log=log,
                       scratch=workdir, together=together)  # fmt: skip
    note = (f"{result.prompts} prompts, {max_tokens} max tokens, chunks of {chunk_size}, "
            f"S={(result.raw[0]['bare'] if result.raw else result.bare[0]).get('max_running_requests')}")  # fmt: skip
    figures = result.figures("fleet tok/s / bare Engine tok/s", None, note, "fleet", "bare sglang.Engine (streamed)")
    figures += result.front_end_figures()
    data = {"max_tokens": max_tokens, "chunk_size": chunk_size, **result.data()}
    return Section("sglang", "fleet vs the bare SGLang Engine", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.sglangcompare", description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--until", type=Path, help="keep every prompt running until this file exists")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(bare_generate(args.input, args.max_tokens, args.until)))


if __name__ == "__main__":
    main()

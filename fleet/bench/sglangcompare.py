"""Fleet against the bare SGLang Engine: the same prompts through `fleet run --engine sglang`
and through a plain `sglang.Engine` fed every request at once, both greedy, same max tokens
and the same engine kwargs (the worker's `engine_kwargs`, from the usual FLEET_* settings).

The ratio of their output tok/s is what fleet's machinery costs around SGLang: the broker,
chunk reads and commits, templating on the worker, the admission gate. Each side's clock
starts after its engine is up (the bare loop times from its first request; fleet's from its
first chunk's start). Each side runs in its own process, because `Engine.shutdown()` kills
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
from fleet.bench.procs import json_from_stdout, run_fleet, write_prompts
from fleet.bench.report import Figure, Section, best_of_each
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
    """A plain Engine with the worker's kwargs: render every prompt as fleet does, hand them all
    to one `Engine.generate` call (SGLang batches them itself), count output tokens; timed from
    rendering, after the engine is up."""
    import sglang

    from fleet.engines.sglang.engine import engine_kwargs
    from fleet.model.prompting import load_tokenizer, model_facts, render_ids
    from fleet.records import GenRequest, Message, Sampling
    from fleet.settings import load_settings

    settings = load_settings()
    kwargs = engine_kwargs(settings)
    engine = sglang.Engine(**kwargs)
    try:
        tok = load_tokenizer(settings.model or "")
        eos = model_facts(settings)["sampling"]["eos_token_ids"]
        records = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line]
        params = {"temperature": 0.0, "max_new_tokens": max_tokens, "stop_token_ids": eos}
        began = time.perf_counter()
        prompts = [  # write_prompts' chat records, templated as the worker templates them
            render_ids(tok, GenRequest(record_id=r["id"], chunk=0, sample=0, sampling=Sampling(),
                                       messages=[Message(**m) for m in r["messages"]],
                                       enable_thinking=settings.enable_thinking))
            for r in records
        ]  # fmt: skip
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - began
    finally:
        engine.shutdown()
    tokens = sum(int(o["meta_info"]["completion_tokens"]) for o in outs)
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
                           chunk_size: int, repeats: int = 2) -> Section:  # fmt: skip
    """Both sides `repeats` times, alternating, in one run, on the same prompts and settings;
    each side's best run is compared (a shared CPU makes single runs noisy)."""
    require_sglang()
    workdir.mkdir(parents=True, exist_ok=True)
    prompts = write_prompts(workdir / f"prompts-{prompts_n}.jsonl", prompts_n)
    bares, fleets = [], []
    for i in range(repeats):
        bares.append(run_bare(workdir, prompts, max_tokens, env))
        fleets.append(run_fleet_side(workdir, prompts, prompts_n, max_tokens, chunk_size, env, i))
    bare, fleet, ratio = best_of_each(bares, fleets)
    note = (f"best of {repeats}; {prompts_n} prompts, {max_tokens} max tokens, chunks of {chunk_size}, "
            f"S={bare['max_running_requests']}")  # fmt: skip
    figures = [
        Figure("fleet tok/s / bare Engine tok/s", round(ratio, 4), "x", note=note),
        Figure("fleet", round(fleet["tok_s"], 1), "tok/s", note=f"{fleet['tokens']:,} tokens"),
        Figure("bare sglang.Engine", round(bare["tok_s"], 1), "tok/s", note=f"{bare['tokens']:,} tokens"),
    ]
    data = {"prompts": prompts_n, "max_tokens": max_tokens, "chunk_size": chunk_size, "ratio": ratio,
            "bare": bares, "fleet": fleets}  # fmt: skip
    return Section("sglang", "fleet vs the bare SGLang Engine", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.sglangcompare", description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(bare_generate(args.input, args.max_tokens)))


if __name__ == "__main__":
    main()

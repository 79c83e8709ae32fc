"""Where a worker's CPU goes on a real engine: one job of the bench's chat prompts through one worker
of the configured engine (the FLEET_* settings of this process: sglang or vllm, on the CPU), the
worker under fleet.bench.workerprof (its threads' own CPU clocks, its engine loop under cProfile).

`python -m fleet.bench.engineprof OUT.json --records 512 --max-tokens 96 --chunk-size 64` writes the
profile's report with the worker's CPU per output token (`us_per_token`, the sampler's own left out):
the front end's cost that BENCHMARKS.md compares with the bare engine's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from fleet.bench.procs import write_id_prompts
from fleet.bench.simjob import SimJob, SimShape
from fleet.bench.workercpu import profiled
from fleet.settings import load_settings


def profile_engine(out: Path, records: int, max_tokens: int, chunk_size: int, workdir: Path,
                   ids: bool = False) -> dict:  # fmt: skip
    settings = load_settings()
    env = {k: v for k, v in os.environ.items() if k.startswith("FLEET_")}
    env |= {"FLEET_SAMPLING__MAX_TOKENS": str(max_tokens), "FLEET_SAMPLING__TEMPERATURE": "0",
            "FLEET_CHUNK_SIZE": str(chunk_size)}
    settings = settings.model_copy(update={"chunk_size": chunk_size})
    running = settings.engine_max_running
    # SimShape gives the job's sizes and recovery cadences only: the engine is the settings' own
    chunks = -(-records // chunk_size)
    prompts = write_id_prompts(workdir / "ids.jsonl", chunks * chunk_size, settings.model or "") if ids else None
    job = SimJob(f"prof-{settings.engine}", SimShape(max_running=running, chunk_size=chunk_size), chunks,
                 workers=1, extra_env=env, ready_timeout_s=900, prompts=prompts)
    report = profiled(job, workdir, out, settings.resolved_slots(), running)
    report["engine"], report["max_tokens"], report["prompts"] = settings.engine, max_tokens, "ids" if ids else "chat"
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.engineprof", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--records", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--ids", action="store_true",
                        help="feed pre-tokenized prompts (the reference job's form): no chat rendering in the worker")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleet-engineprof-") as tmp:
        report = profile_engine(args.out.resolve().with_suffix(".raw.json"), args.records, args.max_tokens,
                                args.chunk_size, Path(tmp), args.ids)
    args.out.write_text(json.dumps(report, indent=1))
    loop = report.get("loop_cprofile") or {}
    print(f"{report['engine']}: {report['tokens']} tokens, worker CPU {report['us_per_token']:.1f} us per token; "
          f"threads {report['threads_s']}; loop areas {loop.get('by_area_self_s')}")


if __name__ == "__main__":
    main()
